//! The one seam between the node's desired state and the kernel.
//!
//! A backend receives the whole desired [`NodeState`] and what changed since
//! its last successful apply, and makes the kernel match in one atomic step.
//! After a failure it must not trust its idea of the kernel: the next apply is
//! a full sync.

pub use kpx_proto::categorize;
#[cfg(test)]
pub mod fixtures;
pub mod iptables;
pub mod nftables;
pub mod owners;

pub use kpx_proto::family::Family;

use crate::state::{ChangeSet, NodeState};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{tool} refused the update: {message}")]
    Refused { tool: &'static str, message: String },
    #[error("cannot run {tool}: {source}")]
    Spawn { tool: &'static str, source: std::io::Error },
}

pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// Makes the kernel match `desired`; `changes` says what differs from the
    /// last successful apply. All or nothing.
    fn apply(&mut self, desired: &NodeState, changes: &ChangeSet) -> Result<(), BackendError>;

    /// Programs everything from scratch, atomically.
    fn full_sync(&mut self, desired: &NodeState) -> Result<(), BackendError>;

    /// Removes everything this backend owns, and nothing else.
    fn cleanup(&mut self) -> Result<(), BackendError>;

    /// The rules as programmed, in the tool's own text.
    fn dump(&mut self) -> Result<String, BackendError>;
}

/// The node agent's proxy settings, the same for every backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyOptions {
    /// kube-proxy's `masqueradeAll`: masquerade all Service traffic.
    pub masquerade_all: bool,
    /// NodePorts open on the node's addresses inside these prefixes; empty: all of its addresses.
    pub nodeport_cidrs: Vec<ipnet::IpNet>,
    /// Pod traffic comes from these prefixes (local-traffic detection); empty: what the
    /// control plane's node config says.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
}

impl ProxyOptions {
    /// The prefixes of pod traffic on this node.
    pub fn local_cidrs(&self, node: Option<&kpx_proto::types::NodeConfig>) -> Vec<ipnet::IpNet> {
        if !self.cluster_cidrs.is_empty() {
            return self.cluster_cidrs.iter().map(|c| c.trunc()).collect();
        }
        node.map(|n| n.local_traffic_cidrs().iter().map(|c| c.trunc()).collect()).unwrap_or_default()
    }
}

/// The backends a node agent can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Nftables,
    Iptables,
    Ipvs,
}

impl BackendKind {
    pub fn create(
        self,
        options: ProxyOptions,
        iptables_mode: iptables::IptablesMode,
    ) -> Result<Box<dyn Backend>, String> {
        match self {
            BackendKind::Nftables => {
                Ok(Box::new(nftables::NftablesBackend::new(nftables::runner::best_runner(), options)))
            }
            BackendKind::Iptables => {
                let mode = iptables_mode.resolve();
                tracing::info!(?mode, "iptables flavour");
                Ok(Box::new(iptables::IptablesBackend::new(iptables::IptablesProcess { mode }, options)))
            }
            other => Err(format!("--backend {other:?}: not available in this build yet (use nftables)")),
        }
    }
}
