//! The iptables backend: kube-proxy's proven chain layout under kpx's own
//! `KPX-` prefix, for iptables-nft and iptables-legacy, IPv4 and IPv6.
//!
//! [`names`] names chains and quotes comments, [`skeleton`] holds the fixed
//! chains and hooks, [`service`] renders one Service (pure, tested as text),
//! [`ruleset`] keeps what is programmed and diffs it into `iptables-restore
//! --noflush` input, which [`crate::exec::iptables`] feeds to the tools.

pub mod names;
pub mod ruleset;
pub mod service;
pub mod skeleton;

use std::collections::BTreeMap;

use crate::backend::{xtables, Backend, BackendError, Family, NodeContext};
use crate::exec::iptables::Iptables;
use crate::state::{ChangeSet, NodeState};

use ruleset::Programmed;

pub struct IptablesBackend {
    iptables: Box<dyn Iptables>,
    /// What the kernel holds, as far as we know; `None` after a failure or before the first sync.
    programmed: Option<Programmed>,
}

impl IptablesBackend {
    pub fn new(iptables: Box<dyn Iptables>) -> Self {
        IptablesBackend { iptables, programmed: None }
    }

    /// Runs the scripts of every family; IPv4 first.
    fn run(&mut self, scripts: &BTreeMap<Family, String>) -> Result<(), BackendError> {
        for (family, script) in scripts {
            self.iptables.restore(*family, script)?;
        }
        Ok(())
    }
}

impl Backend for IptablesBackend {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn apply(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
        changes: &ChangeSet,
    ) -> Result<(), BackendError> {
        let Some(programmed) = self.programmed.as_ref() else {
            return self.full_sync(desired, context);
        };
        let mut plan = programmed.plan(desired, context, changes);
        if plan.needs_full_sync {
            return self.full_sync(desired, context);
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

    fn full_sync(&mut self, desired: &NodeState, context: &NodeContext) -> Result<(), BackendError> {
        self.programmed = None;
        let mut saved = BTreeMap::new();
        for family in Family::ALL {
            saved.insert(family, self.iptables.save(family)?);
        }
        let (programmed, plan) = Programmed::full(desired, context, &saved);
        self.run(&plan.scripts)?;
        self.programmed = Some(programmed);
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.programmed = None;
        for family in Family::ALL {
            let saved = self.iptables.save(family)?;
            let script = xtables::cleanup_script(&saved, names::PREFIX);
            if !script.is_empty() {
                self.iptables.restore(family, &script)?;
            }
        }
        Ok(())
    }

    fn dump(&mut self) -> Result<String, BackendError> {
        let mut out = String::new();
        for family in Family::ALL {
            out.push_str(&xtables::owned_lines(&self.iptables.save(family)?, names::PREFIX));
        }
        Ok(out)
    }
}
