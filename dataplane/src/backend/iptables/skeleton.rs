//! The fixed chains of kpx's iptables layout and their hooks in the built-in chains.

use super::names::{self, DROP_MARK, MASQ_MARK};
use crate::backend::xtables::{Hook, Table, CANARY_RULE};

/// A fixed chain and its rules.
pub struct FixedChain {
    pub table: Table,
    pub name: &'static str,
    pub rules: Vec<String>,
}

/// The hooks, each inserted first in its built-in chain in this order when missing (so in
/// FORWARD, `KPX-FILTER` ends up before `KPX-FORWARD`).
pub const HOOKS: [Hook; 7] = [
    Hook {
        table: Table::Nat,
        builtin: "PREROUTING",
        spec: "-m comment --comment \"kpx service portals\" -j KPX-PORTALS",
    },
    Hook {
        table: Table::Nat,
        builtin: "OUTPUT",
        spec: "-m comment --comment \"kpx service portals\" -j KPX-PORTALS",
    },
    Hook {
        table: Table::Nat,
        builtin: "POSTROUTING",
        spec: "-m comment --comment \"kpx postrouting rules\" -j KPX-POSTROUTING",
    },
    Hook {
        table: Table::Filter,
        builtin: "INPUT",
        spec: "-m comment --comment \"kpx firewall\" -j KPX-FILTER",
    },
    Hook {
        table: Table::Filter,
        builtin: "FORWARD",
        spec: "-m comment --comment \"kpx forwarding rules\" -j KPX-FORWARD",
    },
    Hook {
        table: Table::Filter,
        builtin: "FORWARD",
        spec: "-m comment --comment \"kpx firewall\" -j KPX-FILTER",
    },
    Hook {
        table: Table::Filter,
        builtin: "OUTPUT",
        spec: "-m comment --comment \"kpx firewall\" -j KPX-FILTER",
    },
];

/// The fixed chains of one family; `from_pods` are the matches of its pod traffic
/// ([`crate::backend::xtables::from_pods`]); `localhost_nodeports`: NodePorts are open on
/// 127.0.0.1 (IPv4), so `route_localnet` is set and packets to 127.0.0.0/8 from elsewhere
/// that no NodePort translated are dropped.
pub fn fixed_chains(from_pods: &[String], localhost_nodeports: bool) -> Vec<FixedChain> {
    let chain = |table, name, rules: Vec<String>| FixedChain { table, name, rules };
    let mut masq_nonlocal: Vec<String> = from_pods.iter().map(|m| format!("{m} -j RETURN")).collect();
    masq_nonlocal.push(format!("-j {}", names::MARK_MASQ));
    vec![
        chain(
            Table::Nat,
            names::PORTALS,
            vec![
                format!("-j {}", names::SERVICES),
                format!("-m addrtype --dst-type LOCAL -j {}", names::NODEPORTS),
            ],
        ),
        chain(Table::Nat, names::SERVICES, vec![]),
        chain(Table::Nat, names::NODEPORTS, vec![]),
        chain(Table::Nat, names::MARK_MASQ, vec![format!("-j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}")]),
        chain(Table::Nat, names::MARK_DROP, vec![format!("-j MARK --set-xmark {DROP_MARK}/{DROP_MARK}")]),
        chain(Table::Nat, names::MASQ_NONLOCAL, masq_nonlocal),
        chain(
            Table::Nat,
            names::POSTROUTING,
            vec![
                format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
                format!("-j MARK --set-xmark {MASQ_MARK}/0x0"),
                "-j MASQUERADE --random-fully".to_owned(),
            ],
        ),
        chain(
            Table::Filter,
            names::FILTER,
            [
                format!("-m mark --mark {DROP_MARK}/{DROP_MARK} -j DROP"),
                format!("-m conntrack --ctstate NEW -j {}", names::REJECT),
            ]
            .into_iter()
            .chain(localhost_nodeports.then(|| {
                "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
                    .to_owned()
            }))
            .collect(),
        ),
        chain(Table::Filter, names::REJECT, vec![]),
        chain(
            Table::Filter,
            names::FORWARD,
            vec![
                // Packets conntrack cannot place (out of window) would reach a pod or a client
                // untranslated and be answered with a reset.
                "-m conntrack --ctstate INVALID -j DROP".to_owned(),
                // Left to KPX-FILTER, whichever hook comes first.
                format!("-m mark --mark {DROP_MARK}/{DROP_MARK} -j RETURN"),
                format!("-m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"),
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".to_owned(),
            ],
        ),
        chain(Table::Nat, names::CANARY_NAT, vec![CANARY_RULE.to_owned()]),
        chain(Table::Filter, names::CANARY_FILTER, vec![CANARY_RULE.to_owned()]),
    ]
}
