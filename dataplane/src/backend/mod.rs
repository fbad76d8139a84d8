//! The one seam between the node's desired state and the kernel.
//!
//! A backend receives the whole desired [`NodeState`], the [`NodeContext`] it is to be
//! programmed in (derived once by the agent for every backend alike) and what changed
//! since its last successful apply, and makes the kernel match in one atomic step through
//! [`crate::exec`]. After a failure it must not trust its idea of the kernel: the next
//! apply is a full sync. No backend decides policy: [`kpx_proto::policy`] does, for all.

#[cfg(any(test, feature = "fake"))]
pub mod fixtures;
pub mod incremental;
pub mod iptables;
pub mod ipvs;
pub mod kube_proxy;
pub mod nftables;
pub mod owners;
pub mod rules_text;
pub mod xtables;

pub use kpx_proto::family::Family;
pub use kpx_proto::node_context::NodeContext;

use crate::exec::ExecError;
use crate::state::{ChangeSet, NodeState};

/// A backend could not make the kernel match.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Kernel(#[from] ExecError),
}

impl From<crate::exec::ipvs::IpvsError> for BackendError {
    fn from(e: crate::exec::ipvs::IpvsError) -> Self {
        BackendError::Kernel(ExecError::Ipvs(e))
    }
}

pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// Makes the kernel match `desired` in `context`; `changes` says what differs from the
    /// last successful apply. A context other than the last one programmed is a full sync.
    /// All or nothing.
    fn apply(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
        changes: &ChangeSet,
    ) -> Result<(), BackendError>;

    /// Programs everything from scratch, atomically.
    fn full_sync(&mut self, desired: &NodeState, context: &NodeContext) -> Result<(), BackendError>;

    /// Removes everything this backend owns, and nothing else.
    fn cleanup(&mut self) -> Result<(), BackendError>;

    /// The rules as programmed, in the tool's own text.
    fn dump(&mut self) -> Result<String, BackendError>;

    /// Whether the kernel holds rules of kpx's (from an earlier run): an empty store beside
    /// them is suspicious, not truth.
    fn holds_rules(&mut self) -> Result<bool, BackendError>;

    /// Whether kpx's rules are still in the kernel as it left them, by a cheap canary (a
    /// rule in each table kpx writes that no packet reaches): false once something flushed
    /// or deleted them behind kpx's back (`nft flush ruleset`, `iptables -F`, a firewall
    /// reload), and the agent programs everything again. True before the first sync.
    fn intact(&mut self) -> Result<bool, BackendError> {
        Ok(true)
    }

    /// Work that is due with time rather than with a change (the IPVS backend removes
    /// drained destinations); called every few seconds.
    fn housekeeping(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
}
