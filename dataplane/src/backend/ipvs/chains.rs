//! The iptables rules around IPVS, for what IPVS cannot do itself: masquerading (traffic
//! from outside the pods to a ClusterIP, external traffic of policy Cluster, hairpin),
//! load-balancer source ranges and the drops of policy Local without local endpoints. A
//! fixed handful of rules per family that match the [`ipset`](super::ipset) sets, so they
//! do not grow with the number of Services; written whole with `iptables-restore
//! --noflush` (one atomic commit per table) when they change, which is only when the
//! options or the pod CIDRs do.
//!
//! Order in the kernel: nat PREROUTING/OUTPUT mark, filter INPUT drops (before IPVS's
//! LOCAL_IN hook), IPVS schedules and forwards, nat POSTROUTING masquerades what was
//! marked (IPVS keeps conntrack for it: `net.ipv4.vs.conntrack = 1`).

use std::fmt::Write as _;

use super::ipset::{SetName, SetRole};
use crate::backend::xtables::{canary_lines, missing_hooks, Hook, Table, MASQ_MARK};
use crate::backend::Family;

/// The prefix of every chain of the IPVS backend.
pub const PREFIX: &str = "KPX-IPVS-";
const SERVICES: &str = "KPX-IPVS-SERVICES";
const MASQ_NONLOCAL: &str = "KPX-IPVS-MASQ-NONLOCAL";
const MARK_MASQ: &str = "KPX-IPVS-MARK-MASQ";
const POSTROUTING: &str = "KPX-IPVS-POSTROUTING";
const FILTER: &str = "KPX-IPVS-FILTER";

/// The jumps from the built-in chains into kpx's.
const HOOKS: [Hook; 4] = [
    Hook {
        table: Table::Nat,
        builtin: "PREROUTING",
        spec: "-m comment --comment \"kpx ipvs services\" -j KPX-IPVS-SERVICES",
    },
    Hook {
        table: Table::Nat,
        builtin: "OUTPUT",
        spec: "-m comment --comment \"kpx ipvs services\" -j KPX-IPVS-SERVICES",
    },
    Hook {
        table: Table::Nat,
        builtin: "POSTROUTING",
        spec: "-m comment --comment \"kpx ipvs postrouting\" -j KPX-IPVS-POSTROUTING",
    },
    Hook {
        table: Table::Filter,
        builtin: "INPUT",
        spec: "-m comment --comment \"kpx ipvs firewall\" -j KPX-IPVS-FILTER",
    },
];

/// What the rules depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInputs {
    pub masquerade_all: bool,
    /// The matches of the family's pod traffic, which is not masqueraded to a ClusterIP
    /// ([`crate::backend::xtables::from_pods`]).
    pub from_pods: Vec<String>,
}

/// `iptables-restore --noflush` input for one family: kpx's chains, whole, and the hooks
/// that `saved` (that family's `iptables-save`) lacks. Rules are written as iptables-save
/// prints them (`--set-xmark` for MARK's `--or-mark`/`--xor-mark`), so a full sync can
/// tell that the kernel already holds them ([`crate::backend::xtables::already_held`]).
pub fn script(family: Family, inputs: &ChainInputs, saved: Option<&str>) -> String {
    let set = |role| SetName::new(role, family).to_string();
    let mut nat = vec![
        format!(
            "-A {SERVICES} -m set --match-set {} dst,dst -j {}",
            set(SetRole::ClusterIp),
            if inputs.masquerade_all { MARK_MASQ } else { MASQ_NONLOCAL }
        ),
        format!("-A {SERVICES} -m set --match-set {} dst,dst -j {MARK_MASQ}", set(SetRole::External)),
        format!(
            "-A {SERVICES} -m set --match-set {} dst,dst -m addrtype --src-type LOCAL -j {MARK_MASQ}",
            set(SetRole::ExternalLocal)
        ),
    ];
    nat.extend(inputs.from_pods.iter().map(|m| format!("-A {MASQ_NONLOCAL} {m} -j RETURN")));
    nat.push(format!("-A {MASQ_NONLOCAL} -j {MARK_MASQ}"));
    nat.push(format!("-A {MARK_MASQ} -j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}"));
    nat.push(format!(
        "-A {POSTROUTING} -m set --match-set {} dst,dst,src -j MASQUERADE --random-fully",
        set(SetRole::LoopBack)
    ));
    nat.push(format!("-A {POSTROUTING} -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"));
    nat.push(format!("-A {POSTROUTING} -j MARK --set-xmark {MASQ_MARK}/0x0"));
    nat.push(format!("-A {POSTROUTING} -j MASQUERADE --random-fully"));
    let filter = vec![
        format!(
            "-A {FILTER} -m set --match-set {} dst,dst -m set ! --match-set {} dst,dst,src -j DROP",
            set(SetRole::LoadBalancerFirewall),
            set(SetRole::LoadBalancerSource)
        ),
        format!("-A {FILTER} -m set --match-set {} dst,dst -j DROP", set(SetRole::Drop)),
    ];
    let mut s = String::new();
    for (table, chains, rules) in [
        (Table::Nat, &[SERVICES, MASQ_NONLOCAL, MARK_MASQ, POSTROUTING][..], nat),
        (Table::Filter, &[FILTER][..], filter),
    ] {
        let _ = writeln!(s, "*{}", table.name());
        for chain in chains {
            let _ = writeln!(s, ":{chain} - [0:0]");
        }
        s.push_str(&canary_lines(PREFIX, table));
        for rule in rules {
            let _ = writeln!(s, "{rule}");
        }
        for insert in missing_hooks(saved, &HOOKS, table) {
            let _ = writeln!(s, "{insert}");
        }
        let _ = writeln!(s, "COMMIT");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_match_sets_and_hooks_are_added_once() {
        let inputs = ChainInputs { masquerade_all: false, from_pods: vec!["-s 10.244.0.0/16".to_owned()] };
        let fresh = script(Family::V4, &inputs, None);
        assert!(fresh.contains("-A KPX-IPVS-SERVICES -m set --match-set KPX-CLUSTER-IP-4 dst,dst -j KPX-IPVS-MASQ-NONLOCAL\n"), "{fresh}");
        assert!(fresh.contains("-A KPX-IPVS-MASQ-NONLOCAL -s 10.244.0.0/16 -j RETURN\n"), "{fresh}");
        assert!(
            fresh.contains("-m set --match-set KPX-LOOP-BACK-4 dst,dst,src -j MASQUERADE --random-fully"),
            "{fresh}"
        );
        assert!(fresh.contains("-A KPX-IPVS-FILTER -m set --match-set KPX-LB-FIREWALL-4 dst,dst -m set ! --match-set KPX-LB-SOURCE-4 dst,dst,src -j DROP"), "{fresh}");
        assert_eq!(fresh.matches("-I ").count(), 4, "{fresh}");
        let saved =
            "*nat\n-A PREROUTING -m comment --comment \"kpx ipvs services\" -j KPX-IPVS-SERVICES\nCOMMIT\n";
        let again = script(Family::V4, &inputs, Some(saved));
        assert_eq!(again.matches("-I ").count(), 3, "{again}");
        let all = ChainInputs { masquerade_all: true, from_pods: vec![] };
        let v6 = script(Family::V6, &all, None);
        assert!(v6.contains("--match-set KPX-CLUSTER-IP-6 dst,dst -j KPX-IPVS-MARK-MASQ\n"), "{v6}");
    }

    /// `iptables-save` of a kernel after kpx's IPVS chains were restored into it (printed by
    /// iptables 1.8.9 (nf_tables): chains sorted, each chain's rules together).
    const SAVED: &str = "*filter\n\
:INPUT ACCEPT [0:0]\n\
:FORWARD ACCEPT [0:0]\n\
:OUTPUT ACCEPT [0:0]\n\
:KPX-IPVS-CANARY-FILTER - [0:0]\n\
:KPX-IPVS-FILTER - [0:0]\n\
-A INPUT -m comment --comment \"kpx ipvs firewall\" -j KPX-IPVS-FILTER\n\
-A KPX-IPVS-CANARY-FILTER -m comment --comment \"kpx canary\" -j RETURN\n\
-A KPX-IPVS-FILTER -m set --match-set KPX-LB-FIREWALL-4 dst,dst -m set ! --match-set KPX-LB-SOURCE-4 dst,dst,src -j DROP\n\
-A KPX-IPVS-FILTER -m set --match-set KPX-DROP-4 dst,dst -j DROP\n\
COMMIT\n\
*nat\n\
:PREROUTING ACCEPT [0:0]\n\
:INPUT ACCEPT [0:0]\n\
:OUTPUT ACCEPT [0:0]\n\
:POSTROUTING ACCEPT [0:0]\n\
:KPX-IPVS-CANARY-NAT - [0:0]\n\
:KPX-IPVS-MARK-MASQ - [0:0]\n\
:KPX-IPVS-MASQ-NONLOCAL - [0:0]\n\
:KPX-IPVS-POSTROUTING - [0:0]\n\
:KPX-IPVS-SERVICES - [0:0]\n\
-A PREROUTING -m comment --comment \"kpx ipvs services\" -j KPX-IPVS-SERVICES\n\
-A OUTPUT -m comment --comment \"kpx ipvs services\" -j KPX-IPVS-SERVICES\n\
-A POSTROUTING -m comment --comment \"kpx ipvs postrouting\" -j KPX-IPVS-POSTROUTING\n\
-A KPX-IPVS-CANARY-NAT -m comment --comment \"kpx canary\" -j RETURN\n\
-A KPX-IPVS-MARK-MASQ -j MARK --set-xmark 0x2000/0x2000\n\
-A KPX-IPVS-MASQ-NONLOCAL -s 10.244.0.0/16 -j RETURN\n\
-A KPX-IPVS-MASQ-NONLOCAL -j KPX-IPVS-MARK-MASQ\n\
-A KPX-IPVS-POSTROUTING -m set --match-set KPX-LOOP-BACK-4 dst,dst,src -j MASQUERADE --random-fully\n\
-A KPX-IPVS-POSTROUTING -m mark ! --mark 0x2000/0x2000 -j RETURN\n\
-A KPX-IPVS-POSTROUTING -j MARK --set-xmark 0x2000/0x0\n\
-A KPX-IPVS-POSTROUTING -j MASQUERADE --random-fully\n\
-A KPX-IPVS-SERVICES -m set --match-set KPX-CLUSTER-IP-4 dst,dst -j KPX-IPVS-MASQ-NONLOCAL\n\
-A KPX-IPVS-SERVICES -m set --match-set KPX-EXTERNAL-4 dst,dst -j KPX-IPVS-MARK-MASQ\n\
-A KPX-IPVS-SERVICES -m set --match-set KPX-EXTERNAL-LOCAL-4 dst,dst -m addrtype --src-type LOCAL -j KPX-IPVS-MARK-MASQ\n\
COMMIT\n\
";

    #[test]
    fn chains_the_kernel_holds_as_written_need_no_restore() {
        let inputs = ChainInputs { masquerade_all: false, from_pods: vec!["-s 10.244.0.0/16".to_owned()] };
        assert!(crate::backend::xtables::already_held(SAVED, &script(Family::V4, &inputs, Some(SAVED))));
        let all = ChainInputs { masquerade_all: true, ..inputs.clone() };
        assert!(!crate::backend::xtables::already_held(SAVED, &script(Family::V4, &all, Some(SAVED))));
        let no_hook =
            SAVED.replace("-A INPUT -m comment --comment \"kpx ipvs firewall\" -j KPX-IPVS-FILTER\n", "");
        assert!(!crate::backend::xtables::already_held(
            &no_hook,
            &script(Family::V4, &inputs, Some(&no_hook))
        ));
        let flushed = SAVED.replace("-A KPX-IPVS-FILTER -m set --match-set KPX-DROP-4 dst,dst -j DROP\n", "");
        assert!(!crate::backend::xtables::already_held(
            &flushed,
            &script(Family::V4, &inputs, Some(&flushed))
        ));
    }
}
