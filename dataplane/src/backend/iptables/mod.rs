//! The iptables backend: kube-proxy's proven chain layout under kpx's own
//! `KPX-` prefix, for iptables-nft and iptables-legacy, IPv4 and IPv6.
//!
//! [`names`] names chains and quotes comments, [`skeleton`] holds the fixed
//! chains and hooks, [`service`] renders one Service (pure, tested as text),
//! [`ruleset`] keeps what is programmed and diffs it into `iptables-restore
//! --noflush` input, [`runner`] is the only code that runs the tools.

pub mod names;
pub mod ruleset;
pub mod runner;
pub mod service;
pub mod skeleton;

use std::collections::BTreeMap;

pub use runner::{IptablesMode, IptablesProcess, RestoreRunner};

use crate::backend::{Backend, BackendError, Family, ProxyOptions};
use crate::state::{ChangeSet, NodeState};

use ruleset::Programmed;

pub struct IptablesBackend<R: RestoreRunner> {
    runner: R,
    options: ProxyOptions,
    /// What the kernel holds, as far as we know; `None` after a failure or before the first sync.
    programmed: Option<Programmed>,
}

impl<R: RestoreRunner> IptablesBackend<R> {
    pub fn new(runner: R, options: ProxyOptions) -> Self {
        IptablesBackend { runner, options, programmed: None }
    }

    /// Runs the scripts of every family; IPv4 first.
    fn run(&mut self, scripts: &BTreeMap<Family, String>) -> Result<(), BackendError> {
        for (family, script) in scripts {
            self.runner.restore(*family, script)?;
        }
        Ok(())
    }
}

impl<R: RestoreRunner + Send> Backend for IptablesBackend<R> {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn apply(&mut self, desired: &NodeState, changes: &ChangeSet) -> Result<(), BackendError> {
        let Some(programmed) = self.programmed.as_ref() else {
            return self.full_sync(desired);
        };
        let mut plan = programmed.plan(desired, changes, &self.options);
        if plan.needs_full_sync {
            return self.full_sync(desired);
        }
        if plan.is_empty() {
            return Ok(());
        }
        let scripts = std::mem::take(&mut plan.scripts);
        match self.run(&scripts) {
            Ok(()) => {
                if let Some(programmed) = self.programmed.as_mut() {
                    programmed.commit(Programmed::take_services(&mut plan));
                }
                Ok(())
            }
            Err(e) => {
                self.programmed = None;
                Err(e)
            }
        }
    }

    fn full_sync(&mut self, desired: &NodeState) -> Result<(), BackendError> {
        self.programmed = None;
        let mut saved = BTreeMap::new();
        for family in Family::ALL {
            saved.insert(family, self.runner.save(family)?);
        }
        let (programmed, plan) = Programmed::full(desired, &self.options, &saved);
        self.run(&plan.scripts)?;
        self.programmed = Some(programmed);
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.programmed = None;
        for family in Family::ALL {
            let saved = self.runner.save(family)?;
            let script = ruleset::cleanup_script(&saved, names::PREFIX);
            if !script.is_empty() {
                self.runner.restore(family, &script)?;
            }
        }
        Ok(())
    }

    fn dump(&mut self) -> Result<String, BackendError> {
        let mut out = String::new();
        for family in Family::ALL {
            let saved = self.runner.save(family)?;
            for line in saved.lines() {
                if line.starts_with('*') || line.contains(names::PREFIX) || line == "COMMIT" {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        Ok(out)
    }
}
