//! What kpx believes its iptables chains hold, and the `iptables-restore
//! --noflush` input that takes them to a new desired state: per family, one
//! block per table (each committed atomically). A change rewrites only the
//! chains of the Services that changed, and adds or deletes only their rules
//! in the shared chains.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use super::names::PREFIX;
use super::service::{self, ChainKey, ServiceRules, SharedRule};
use super::skeleton::{self, HOOKS};
use crate::backend::owners::Owners;
use crate::backend::xtables::{self, from_pods, Table};
use crate::backend::{Family, NodeContext};
use crate::state::{ChangeSet, NodeState};

#[derive(Debug, Default)]
pub struct Programmed {
    services: HashMap<Arc<str>, ServiceRules>,
    owners: Owners,
    /// The node context everything was rendered in.
    context: NodeContext,
}

/// The restore input per family, and the bookkeeping to record once the kernel took it.
#[derive(Debug, Default)]
pub struct Plan {
    pub scripts: BTreeMap<Family, String>,
    services: Vec<(String, Option<ServiceRules>)>,
    /// The node context changed: only a full sync can rewrite the fixed chains.
    pub needs_full_sync: bool,
    /// A full sync's chains the kernel already held exactly as wanted (not written).
    pub unchanged_chains: usize,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.scripts.is_empty() && !self.needs_full_sync
    }
}

/// The lines of one table block.
#[derive(Default)]
struct Block {
    declare: BTreeSet<String>,
    fill: Vec<String>,
    delete_rules: Vec<String>,
    add_rules: Vec<String>,
    remove_chains: BTreeSet<String>,
}

#[derive(Default)]
struct Script {
    blocks: BTreeMap<(Family, Table), Block>,
}

impl Script {
    fn block(&mut self, family: Family, table: Table) -> &mut Block {
        self.blocks.entry((family, table)).or_default()
    }

    fn write_chain(&mut self, key: &ChainKey, rules: &[String]) {
        let block = self.block(key.0, key.1);
        block.declare.insert(key.2.clone());
        block.fill.extend(rules.iter().map(|r| format!("-A {} {r}", key.2)));
    }

    fn remove_chain(&mut self, key: &ChainKey) {
        let block = self.block(key.0, key.1);
        block.declare.insert(key.2.clone());
        block.remove_chains.insert(key.2.clone());
    }

    /// Leaves out every chain written whole that the kernel already holds as wanted
    /// (`saved`: `iptables-save` per family; rules compared as the text iptables-save
    /// prints, which is how kpx writes them): a full sync over intact rules writes none
    /// of them. A chain's own rules must be there in order, then the rules Services share
    /// in it (a ClusterIP's jump in `KPX-SERVICES`) in any order: changes append those as
    /// they come, so their order is no one's. Returns how many chains were left out.
    fn leave_unchanged(&mut self, saved: &BTreeMap<Family, String>) -> usize {
        let mut left_out = 0;
        for ((family, table), block) in &mut self.blocks {
            let Some(text) = saved.get(family) else { continue };
            let held: HashSet<String> =
                xtables::saved_chains(text).into_iter().filter(|(t, _)| t == table).map(|(_, c)| c).collect();
            let held_rules = xtables::by_chain(xtables::saved_rules(text, *table));
            let own = xtables::by_chain(block.fill.iter().map(String::as_str));
            let shared = xtables::by_chain(block.add_rules.iter().map(String::as_str));
            let same: HashSet<String> = block
                .declare
                .iter()
                .filter(|chain| !block.remove_chains.contains(*chain) && held.contains(*chain))
                .filter(|chain| {
                    let shared = shared.get(chain.as_str()).cloned().unwrap_or_default();
                    held_as_wanted(
                        xtables::rules_of(&own, chain),
                        shared,
                        xtables::rules_of(&held_rules, chain),
                    )
                })
                .cloned()
                .collect();
            left_out += same.len();
            block.declare.retain(|chain| !same.contains(chain));
            block.fill.retain(|line| !same.contains(xtables::chain_of(line)));
            block.add_rules.retain(|line| !same.contains(xtables::chain_of(line)));
        }
        left_out
    }

    fn finish(self) -> BTreeMap<Family, String> {
        let mut out: BTreeMap<Family, String> = BTreeMap::new();
        for ((family, table), b) in self.blocks {
            if b.declare.is_empty()
                && b.fill.is_empty()
                && b.delete_rules.is_empty()
                && b.add_rules.is_empty()
            {
                continue;
            }
            let s = out.entry(family).or_default();
            let _ = writeln!(s, "*{}", table.name());
            for chain in &b.declare {
                let _ = writeln!(s, ":{chain} - [0:0]");
            }
            for line in b.fill.iter().chain(&b.delete_rules).chain(&b.add_rules) {
                let _ = writeln!(s, "{line}");
            }
            for chain in &b.remove_chains {
                let _ = writeln!(s, "-X {chain}");
            }
            let _ = writeln!(s, "COMMIT");
        }
        out
    }
}

/// Whether a chain holding `have` holds what is wanted: its `own` rules first, in order,
/// then the `shared` ones in any order.
fn held_as_wanted(own: &[&str], mut shared: Vec<&str>, have: &[&str]) -> bool {
    if have.len() != own.len() + shared.len() || have[..own.len()] != *own {
        return false;
    }
    let mut rest = have[own.len()..].to_vec();
    rest.sort_unstable();
    shared.sort_unstable();
    rest == shared
}

impl Programmed {
    /// Restore input that makes kpx's chains hold exactly `desired`, given what
    /// `iptables-save` shows now (per family): stale kpx chains are removed, missing hooks added.
    pub fn full(
        desired: &NodeState,
        context: &NodeContext,
        saved: &BTreeMap<Family, String>,
    ) -> (Programmed, Plan) {
        let empty = Programmed { context: context.clone(), ..Default::default() };
        let all = ChangeSet { services: desired.services.keys().cloned().collect(), node: false };
        let (mut plan, mut script) = empty.plan_script(desired, &all);
        let mut wanted: BTreeSet<(Family, Table, String)> = BTreeSet::new();
        for family in Family::ALL {
            let localhost_nodeports =
                family == Family::V4 && context.nodeport_addresses.iter().any(IpAddr::is_loopback);
            for chain in
                skeleton::fixed_chains(&from_pods(context.local.matcher(family)), localhost_nodeports)
            {
                let key = (family, chain.table, chain.name.to_owned());
                script.write_chain(&key, &chain.rules);
                wanted.insert(key);
            }
        }
        for (_, rules) in &plan.services {
            for key in rules.iter().flat_map(|r| r.chains.keys()) {
                wanted.insert(key.clone());
            }
        }
        for family in &Family::ALL {
            let text = saved.get(family).map_or("", String::as_str);
            for key in &xtables::saved_chains(text) {
                let full_key = (*family, key.0, key.1.clone());
                if key.1.starts_with(PREFIX) && !wanted.contains(&full_key) {
                    script.remove_chain(&full_key);
                }
            }
            for table in Table::ALL {
                let hooks = xtables::missing_hooks(Some(text), &HOOKS, table);
                script.block(*family, table).add_rules.extend(hooks);
            }
        }
        plan.unchanged_chains = script.leave_unchanged(saved);
        plan.scripts = script.finish();
        let mut programmed = empty;
        programmed.commit(std::mem::take(&mut plan.services).into_iter().collect());
        (programmed, plan)
    }

    /// The restore input for the Services in `changes`.
    pub fn plan(&self, desired: &NodeState, context: &NodeContext, changes: &ChangeSet) -> Plan {
        if *context != self.context {
            return Plan { needs_full_sync: true, ..Default::default() };
        }
        let (mut plan, script) = self.plan_script(desired, changes);
        plan.scripts = script.finish();
        plan
    }

    fn plan_script(&self, desired: &NodeState, changes: &ChangeSet) -> (Plan, Script) {
        let mut plan = Plan::default();
        let mut script = Script::default();
        let mut claims = self.owners.begin(
            changes
                .services
                .iter()
                .filter_map(|n| self.services.get(n.as_str()).map(|r| (n.as_str(), &r.entries[..]))),
        );
        let mut deleted: BTreeSet<SharedRule> = BTreeSet::new();
        let mut added: BTreeSet<SharedRule> = BTreeSet::new();
        for name in &changes.services {
            let old = self.services.get(name.as_str());
            let new = desired.services.get(name).map(|s| {
                let mut rules = service::service_rules(&s.value, &self.context);
                let taken = claims.claim(name, &rules.entries);
                rules.shared.retain(|(entry, _)| taken.contains(entry));
                rules.entries = taken;
                rules
            });
            let old_shared: BTreeSet<&SharedRule> =
                old.iter().flat_map(|r| r.shared.iter().map(|(_, s)| s)).collect();
            let new_shared: BTreeSet<&SharedRule> =
                new.iter().flat_map(|r| r.shared.iter().map(|(_, s)| s)).collect();
            deleted.extend(old_shared.difference(&new_shared).map(|r| (*r).clone()));
            added.extend(new_shared.difference(&old_shared).map(|r| (*r).clone()));
            let empty = BTreeMap::new();
            let old_chains = old.map_or(&empty, |r| &r.chains);
            let new_chains = new.as_ref().map_or(&empty, |r| &r.chains);
            for (key, rules) in new_chains {
                if old_chains.get(key) != Some(rules) {
                    script.write_chain(key, rules);
                }
            }
            for key in old_chains.keys().filter(|k| !new_chains.contains_key(*k)) {
                script.remove_chain(key);
            }
            plan.services.push((name.clone(), new));
        }
        for rule in deleted {
            script
                .block(rule.family, rule.table)
                .delete_rules
                .push(format!("-D {} {}", rule.chain, rule.spec));
        }
        for rule in added {
            script.block(rule.family, rule.table).add_rules.push(format!("-A {} {}", rule.chain, rule.spec));
        }
        (plan, script)
    }

    /// Records a plan the kernel accepted.
    pub fn commit(&mut self, services: Vec<(String, Option<ServiceRules>)>) {
        for (name, rules) in services {
            let (name, old) = crate::backend::owners::take_named(&mut self.services, name);
            self.owners.commit(
                &name,
                old.as_ref().map(|r| &r.entries[..]),
                rules.as_ref().map(|r| &r.entries[..]),
            );
            if let Some(rules) = rules {
                self.services.insert(name, rules);
            }
        }
    }

    pub fn take_services(plan: &mut Plan) -> Vec<(String, Option<ServiceRules>)> {
        std::mem::take(&mut plan.services)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::{changed, no_context, state};

    #[test]
    fn one_endpoint_change_rewrites_only_that_services_chains() {
        let before =
            state(&[("a", "10.96.0.1", &["10.0.0.1", "10.0.0.2"]), ("b", "10.96.0.2", &["10.0.0.9"])]);
        let (mut programmed, full) = Programmed::full(&before, &no_context(), &BTreeMap::new());
        let full_v4 = &full.scripts[&Family::V4];
        assert!(
            full_v4.contains("-I PREROUTING 1 -m comment --comment \"kpx service portals\" -j KPX-PORTALS")
        );
        let after =
            state(&[("a", "10.96.0.1", &["10.0.0.1", "10.0.0.3"]), ("b", "10.96.0.2", &["10.0.0.9"])]);
        let mut plan = programmed.plan(&after, &no_context(), &changed(&["a"]));
        let script = &plan.scripts[&Family::V4];
        assert!(!plan.scripts.contains_key(&Family::V6));
        // a's pick chain and its two changed endpoint chains; nothing of b; no shared rule touched.
        assert_eq!(script.matches("\n:").count() + usize::from(script.starts_with(':')), 3, "{script}");
        assert_eq!(script.matches("-X KPX-SEP-").count(), 1, "{script}");
        assert!(
            script.contains("--to-destination 10.0.0.3:8080") && !script.contains("10.0.0.9"),
            "{script}"
        );
        assert!(!script.contains("-A KPX-SERVICES") && !script.contains("-D KPX-SERVICES"), "{script}");
        programmed.commit(Programmed::take_services(&mut plan));
        assert!(programmed.plan(&after, &no_context(), &changed(&["a"])).is_empty());
    }

    #[test]
    fn a_removed_service_loses_its_rules_and_chains() {
        let before = state(&[("a", "10.96.0.1", &["10.0.0.1"])]);
        let (programmed, _) = Programmed::full(&before, &no_context(), &BTreeMap::new());
        let plan = programmed.plan(&NodeState::default(), &no_context(), &changed(&["a"]));
        let script = &plan.scripts[&Family::V4];
        assert!(script.contains("-D KPX-SERVICES -d 10.96.0.1/32"), "{script}");
        assert_eq!(script.matches("-X KPX-").count(), 2, "{script}");
    }
}
