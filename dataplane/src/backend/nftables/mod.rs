//! The nftables backend: kpx's own `inet kpx` table, where every lookup is a
//! map lookup (O(1) in the number of Services) and one endpoint change is a
//! handful of element updates.
//!
//! [`render`] names the table's sets and maps, [`skeleton`] writes its fixed
//! chains, [`service`] turns a Service into the elements it needs and
//! [`affinity`] into its session-affinity chains (all pure, tested as text);
//! [`ruleset`] keeps what is programmed and diffs it into one transaction,
//! which [`crate::exec::nft`] runs.

pub mod affinity;
pub mod render;
pub mod ruleset;
pub mod service;
pub mod skeleton;

use crate::backend::{Backend, BackendError, NodeContext};
use crate::exec::nft::Nft;
use crate::state::{ChangeSet, NodeState};

use ruleset::Programmed;

pub struct NftablesBackend {
    nft: Box<dyn Nft>,
    /// What the kernel holds, as far as we know; `None` after a failure or before the first sync.
    programmed: Option<Programmed>,
}

impl NftablesBackend {
    pub fn new(nft: Box<dyn Nft>) -> Self {
        NftablesBackend { nft, programmed: None }
    }
}

impl Backend for NftablesBackend {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn apply(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
        changes: &ChangeSet,
    ) -> Result<(), BackendError> {
        let Some(programmed) = self.programmed.as_mut() else {
            return self.full_sync(desired, context);
        };
        let plan = programmed.plan(desired, context, changes);
        if plan.needs_full_sync {
            return self.full_sync(desired, context);
        }
        if plan.is_empty() {
            return Ok(());
        }
        match self.nft.run(&plan.script) {
            Ok(()) => {
                programmed.commit(plan);
                Ok(())
            }
            Err(e) => {
                self.programmed = None;
                Err(e.into())
            }
        }
    }

    fn full_sync(&mut self, desired: &NodeState, context: &NodeContext) -> Result<(), BackendError> {
        let (programmed, script) = Programmed::full(desired, context);
        self.programmed = None;
        self.nft.run(&script)?;
        self.programmed = Some(programmed);
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.programmed = None;
        Ok(self.nft.run(&render::cleanup_script())?)
    }

    fn dump(&mut self) -> Result<String, BackendError> {
        Ok(self.nft.list_table()?)
    }

    fn holds_rules(&mut self) -> Result<bool, BackendError> {
        Ok(!self.nft.list_table()?.trim().is_empty())
    }

    fn intact(&mut self) -> Result<bool, BackendError> {
        if self.programmed.is_none() {
            return Ok(true);
        }
        Ok(self.nft.list_chain(skeleton::CANARY)?.contains(skeleton::CANARY_COMMENT))
    }
}
