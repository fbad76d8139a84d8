//! The nftables backend: kpx's own `inet kpx` table, where every lookup is a
//! map lookup (O(1) in the number of Services) and one endpoint change is a
//! handful of element updates.
//!
//! [`render`] names the table's sets and maps, [`skeleton`] writes its fixed
//! chains, [`service`] turns a Service into the elements it needs and
//! [`affinity`] into its session-affinity chains (all pure, tested as text);
//! [`ruleset`] keeps what is programmed and diffs it into one transaction;
//! [`runner`] is the only code that touches the kernel.

pub mod affinity;
pub mod library;
pub mod render;
pub mod ruleset;
pub mod runner;
pub mod service;
pub mod skeleton;

pub use library::NftLibrary;
pub use runner::{NftProcess, NftRunner};

use crate::backend::{Backend, BackendError, ProxyOptions};
use crate::state::{ChangeSet, NodeState};

use ruleset::Programmed;

pub struct NftablesBackend<R: NftRunner> {
    runner: R,
    options: ProxyOptions,
    /// What the kernel holds, as far as we know; `None` after a failure or before the first sync.
    programmed: Option<Programmed>,
}

impl<R: NftRunner> NftablesBackend<R> {
    pub fn new(runner: R, options: ProxyOptions) -> Self {
        NftablesBackend { runner, options, programmed: None }
    }
}

impl<R: NftRunner + Send> Backend for NftablesBackend<R> {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn apply(&mut self, desired: &NodeState, changes: &ChangeSet) -> Result<(), BackendError> {
        let Some(programmed) = self.programmed.as_mut() else {
            return self.full_sync(desired);
        };
        let plan = programmed.plan(desired, changes, &self.options);
        if plan.needs_full_sync {
            return self.full_sync(desired);
        }
        if plan.is_empty() {
            return Ok(());
        }
        match self.runner.run(&plan.script) {
            Ok(()) => {
                programmed.commit(plan);
                Ok(())
            }
            Err(e) => {
                self.programmed = None;
                Err(e)
            }
        }
    }

    fn full_sync(&mut self, desired: &NodeState) -> Result<(), BackendError> {
        let (programmed, script) = Programmed::full(desired, &self.options);
        self.programmed = None;
        self.runner.run(&script)?;
        self.programmed = Some(programmed);
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.programmed = None;
        self.runner.run(&render::cleanup_script())
    }

    fn dump(&mut self) -> Result<String, BackendError> {
        self.runner.list_table()
    }
}
