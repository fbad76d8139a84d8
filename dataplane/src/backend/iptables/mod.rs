//! The iptables backend: kube-proxy's proven chain layout under kpx's own
//! `KPX-` prefix, for iptables-nft and iptables-legacy, IPv4 and IPv6.
//!
//! [`names`] names chains and quotes comments, [`skeleton`] holds the fixed
//! chains and hooks, [`service`] renders one Service (pure, tested as text),
//! [`programmed`] keeps what is programmed and diffs it into `iptables-restore
//! --noflush` input, which [`crate::exec::iptables`] feeds to the tools.

pub mod names;
pub mod programmed;
pub mod service;
pub mod skeleton;

use super::incremental::{self, Incremental, Planned};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use crate::backend::{xtables, Backend, BackendError, Family, NodeContext};
use crate::exec::iptables::Iptables;
use crate::state::{ChangeSet, NodeState};

use programmed::{Plan, Programmed};

pub struct IptablesBackend {
    iptables: Box<dyn Iptables>,
    /// What the kernel holds, as far as we know; `None` after a failure or before the first sync.
    programmed: Option<Programmed>,
    /// With NodePorts on 127.0.0.1 (kube-proxy's `localhostNodePorts`). The
    /// `route_localnet` they need is one of the node's settings (`crate::node_sysctls`),
    /// made and kept by the agent, not here.
    localhost_nodeports: bool,
}

impl IptablesBackend {
    pub fn new(iptables: Box<dyn Iptables>) -> Self {
        IptablesBackend { iptables, programmed: None, localhost_nodeports: false }
    }

    /// Also opens NodePorts on 127.0.0.1; the fixed chains then drop packets to
    /// 127.0.0.0/8 from elsewhere that no NodePort translated (as kube-proxy does, so
    /// loopback-only listeners stay loopback-only).
    pub fn with_localhost_nodeports(mut self) -> Self {
        self.localhost_nodeports = true;
        self
    }

    /// The node as the rules see it: with localhost NodePorts, 127.0.0.1 is one of the
    /// NodePort addresses.
    fn rendered<'c>(&self, context: &'c NodeContext) -> Cow<'c, NodeContext> {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        if !self.localhost_nodeports || context.nodeport_addresses.contains(&loopback) {
            return Cow::Borrowed(context);
        }
        let mut with = context.clone();
        with.nodeport_addresses.push(loopback);
        Cow::Owned(with)
    }

    /// Runs the scripts of every family; IPv4 first.
    fn run(&mut self, scripts: &BTreeMap<Family, String>) -> Result<(), BackendError> {
        for (family, script) in scripts {
            self.iptables.restore(*family, script)?;
        }
        Ok(())
    }
}

impl Incremental for IptablesBackend {
    type Plan = Plan;

    fn plan(&mut self, desired: &NodeState, context: &NodeContext, changes: &ChangeSet) -> Planned<Plan> {
        let Some(programmed) = self.programmed.as_ref() else { return Planned::FullSync };
        let plan = programmed.plan(desired, &self.rendered(context), changes);
        let (needs_full_sync, empty) = (plan.needs_full_sync, plan.is_empty());
        Planned::unless(plan, needs_full_sync, empty)
    }

    fn write(&mut self, plan: &mut Plan) -> Result<(), BackendError> {
        let scripts = std::mem::take(&mut plan.scripts);
        self.run(&scripts)
    }

    fn commit(&mut self, mut plan: Plan) {
        if let Some(programmed) = self.programmed.as_mut() {
            programmed.commit(Programmed::take_services(&mut plan));
        }
    }

    fn forget(&mut self) {
        self.programmed = None;
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
        incremental::apply(self, desired, context, changes)
    }

    fn full_sync(&mut self, desired: &NodeState, context: &NodeContext) -> Result<(), BackendError> {
        self.programmed = None;
        let mut saved = BTreeMap::new();
        for family in Family::ALL {
            saved.insert(family, self.iptables.save(family)?);
        }
        let started = std::time::Instant::now();
        let (programmed, plan) = Programmed::full(desired, &self.rendered(context), &saved);
        self.run(&plan.scripts)?;
        tracing::info!(
            unchanged_chains = plan.unchanged_chains,
            restore_bytes = plan.scripts.values().map(String::len).sum::<usize>(),
            write_ms = started.elapsed().as_millis() as u64,
            "full sync written"
        );
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

    fn holds_rules(&mut self) -> Result<bool, BackendError> {
        for family in Family::ALL {
            let saved = self.iptables.save(family)?;
            if xtables::saved_chains(&saved).iter().any(|(_, chain)| chain.starts_with(names::PREFIX)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn intact(&mut self) -> Result<bool, BackendError> {
        if self.programmed.is_none() {
            return Ok(true);
        }
        Ok(xtables::canaries_intact(self.iptables.as_mut(), names::PREFIX)?)
    }

    fn dump(&mut self) -> Result<String, BackendError> {
        let mut out = String::new();
        for family in Family::ALL {
            out.push_str(&xtables::owned_lines(&self.iptables.save(family)?, names::PREFIX));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::{changed, no_context, node_context, state};
    use crate::exec::fake::FakeIptables;

    fn service_rules(ipt: &FakeIptables) -> Vec<String> {
        ipt.rules(Family::V4, "nat", names::SERVICES)
    }

    #[test]
    fn the_canaries_tell_a_flushed_table_in_either_family() {
        let ipt = FakeIptables::new();
        let mut b = IptablesBackend::new(Box::new(ipt.clone()));
        assert!(b.intact().expect("check"), "nothing programmed: nothing to miss");
        let desired = state(&[("a", "10.96.0.1", &["10.244.0.1"])]);
        b.full_sync(&desired, &node_context()).expect("full sync");
        assert!(b.intact().expect("check"));
        for (family, table, chain) in
            [(Family::V6, "filter", names::CANARY_FILTER), (Family::V4, "nat", names::CANARY_NAT)]
        {
            // What `iptables -F` leaves: the chain, without its rule.
            ipt.clone().restore(family, &format!("*{table}\n:{chain} - [0:0]\nCOMMIT\n")).expect("flush");
            assert!(!b.intact().expect("check"), "{family:?} {table}");
            b.full_sync(&desired, &node_context()).expect("full sync");
            assert!(b.intact().expect("check"), "programmed again");
        }
    }

    #[test]
    fn programs_beside_foreign_chains_and_cleans_up_only_its_own() {
        let ipt = FakeIptables::new();
        let mut foreign = ipt.clone();
        foreign
            .restore(Family::V4, "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")
            .expect("kube-proxy's");
        let mut b = IptablesBackend::new(Box::new(ipt.clone()));
        let desired = state(&[("a", "10.96.0.1", &["10.244.0.1"]), ("b", "10.96.0.2", &["10.244.0.2"])]);
        b.full_sync(&desired, &node_context()).expect("full sync");
        assert_eq!(service_rules(&ipt).len(), 2);
        let prerouting = ipt.rules(Family::V4, "nat", "PREROUTING");
        assert_eq!(prerouting.len(), 2, "kpx's hook first, kube-proxy's kept: {prerouting:?}");
        assert!(prerouting[0].ends_with("-j KPX-PORTALS"), "{prerouting:?}");
        assert_eq!(
            ipt.rules(Family::V4, "nat", names::MASQ_NONLOCAL),
            ["-s 10.244.0.0/16 -j RETURN", "-j KPX-MARK-MASQ"],
            "the node context's pod CIDRs"
        );

        let restores = ipt.restores();
        let after =
            state(&[("a", "10.96.0.1", &["10.244.0.1", "10.244.0.3"]), ("b", "10.96.0.2", &["10.244.0.2"])]);
        b.apply(&after, &node_context(), &changed(&["a"])).expect("apply");
        assert_eq!(ipt.restores(), restores + 1, "one restore for one family");
        let dump = b.dump().expect("dump");
        assert!(dump.contains("--to-destination 10.244.0.3:8080") && !dump.contains("KUBE-"), "{dump}");

        b.full_sync(&after, &node_context()).expect("again");
        assert_eq!(ipt.rules(Family::V4, "nat", "PREROUTING").len(), 2, "hooks are not added twice");
        b.cleanup().expect("cleanup");
        assert!(ipt.chains(Family::V4, "nat") == ["KUBE-SERVICES"], "{:?}", ipt.chains(Family::V4, "nat"));
        assert_eq!(ipt.rules(Family::V4, "nat", "PREROUTING"), ["-j KUBE-SERVICES"]);
        assert!(ipt.chains(Family::V4, "filter").is_empty());
    }

    #[test]
    fn another_context_or_a_refused_restore_makes_the_next_apply_a_full_sync() {
        let ipt = FakeIptables::new();
        let mut b = IptablesBackend::new(Box::new(ipt.clone()));
        let desired = state(&[("a", "10.96.0.1", &["10.244.0.1"])]);
        b.full_sync(&desired, &no_context()).expect("full sync");
        assert_eq!(ipt.rules(Family::V4, "nat", names::MASQ_NONLOCAL), ["-j KPX-MARK-MASQ"]);
        b.apply(&desired, &node_context(), &changed(&[])).expect("the node's pod CIDRs became known");
        assert_eq!(ipt.rules(Family::V4, "nat", names::MASQ_NONLOCAL).len(), 2);
        ipt.fail_next("iptables-restore: line 3 failed");
        let two = state(&[("a", "10.96.0.1", &["10.244.0.1"]), ("b", "10.96.0.2", &["10.244.0.2"])]);
        let err = b.apply(&two, &node_context(), &changed(&["b"])).expect_err("refused");
        assert!(err.to_string().contains("line 3 failed"), "{err}");
        assert_eq!(service_rules(&ipt).len(), 1);
        b.apply(&two, &node_context(), &changed(&[]))
            .expect("a full sync: nothing is trusted after a failure");
        assert_eq!(service_rules(&ipt).len(), 2);
    }
}
