//! What one Service puts into kpx's iptables chains, kube-proxy's way:
//!
//! ```text
//! nat KPX-SERVICES   -d VIP -p tcp --dport 80 -j KPX-SVC-…          (ClusterIP)
//!                    -d EXTIP/LBIP … -j KPX-EXT-… | KPX-FW-…        (external / load-balancer IP)
//! nat KPX-NODEPORTS  -d NODEIP -p tcp --dport 30080 -j KPX-EXT-…
//! nat KPX-SVC-…      [-d VIP … -j KPX-MASQ-NONLOCAL]  -m statistic --probability 1/(n-i) -j KPX-SEP-…
//! nat KPX-EXT-…      policy Cluster: -j KPX-MARK-MASQ; -j KPX-SVC-…
//!                    policy Local: pods → KPX-SVC, the node → masquerade + KPX-SVC, others → KPX-SVL-…
//! nat KPX-FW-…       -s RANGE -j KPX-EXT-…; -j KPX-MARK-DROP
//! nat KPX-SEP-…      -s EP -j KPX-MARK-MASQ (hairpin); -j DNAT --to-destination EP:PORT
//! filter KPX-REJECT  -d ADDR -p tcp --dport P -j REJECT                (no endpoints)
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::node_context::NodeContext;
use kpx_proto::policy::{self, Action, EndpointSet, Entry, EntryKind, PortFamily};
use kpx_proto::types::{Endpoint, ServiceView};

use super::names::{self, ChainKind};
use crate::backend::owners::EntryKey;
use crate::backend::xtables::{from_pods, Table};
use crate::backend::Family;

/// A rule in a chain that all Services share (`KPX-SERVICES`, `KPX-NODEPORTS`, `KPX-REJECT`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedRule {
    pub family: Family,
    pub table: Table,
    pub chain: &'static str,
    pub spec: String,
}

/// A chain of a Service's own: (family, table, name).
pub type ChainKey = (Family, Table, String);

/// Everything one Service needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Each entry point: the keys this Service owns.
    pub entries: Vec<EntryKey>,
    /// Rules in shared chains, under the entry they belong to.
    pub shared: Vec<(EntryKey, SharedRule)>,
    /// Its own chains and their rules.
    pub chains: BTreeMap<ChainKey, Vec<String>>,
}

pub fn host(address: &IpAddr) -> String {
    format!("{}", IpNet::from(*address))
}

fn socket(address: &IpAddr, port: u16) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

fn full_mask(family: Family) -> &'static str {
    match family {
        Family::V4 => "255.255.255.255",
        Family::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    }
}

/// Everything `view` needs on a node in `ctx`.
pub fn service_rules(view: &ServiceView, ctx: &NodeContext) -> ServiceRules {
    let mut rules = ServiceRules::default();
    for pf in policy::port_families(view, ctx) {
        PortRenderer { pf: &pf, ctx, rules: &mut rules }.render();
    }
    rules
}

struct PortRenderer<'a> {
    pf: &'a PortFamily<'a>,
    ctx: &'a NodeContext,
    rules: &'a mut ServiceRules,
}

impl PortRenderer<'_> {
    fn chain(&mut self, name: &str, rules: Vec<String>) {
        self.rules.chains.insert((self.pf.family, Table::Nat, name.to_owned()), rules);
    }

    /// The matches of this family's pod traffic (empty without a detector).
    fn pod_matches(&self) -> Vec<String> {
        from_pods(self.ctx.local.matcher(self.pf.family))
    }

    fn render(mut self) {
        let pf = self.pf;
        let (view, port, proto) = (pf.view, pf.port, pf.port.protocol);
        let svc = names::port_chain(ChainKind::Svc, view, port);
        let svl = names::port_chain(ChainKind::Svl, view, port);
        let svx = names::port_chain(ChainKind::Svx, view, port);
        let ext = names::port_chain(ChainKind::Ext, view, port);
        let fw = names::port_chain(ChainKind::Fw, view, port);
        for ep in pf.all_endpoints() {
            self.endpoint_chain(ep);
        }
        if !pf.cluster.is_empty() {
            let mut rules = Vec::new();
            // As kube-proxy: masqueradeAll marks traffic to the ClusterIP only, so a pod's
            // traffic to a policy-Local external address that comes here keeps its address.
            let masquerade = if self.ctx.masquerade_all {
                Some(names::MARK_MASQ)
            } else {
                self.ctx.local.knows(pf.family).then_some(names::MASQ_NONLOCAL)
            };
            if let Some(masquerade) = masquerade {
                for entry in pf.entries.iter().filter(|e| e.kind == EntryKind::ClusterIp) {
                    rules.push(format!(
                        "-d {} -p {proto} {} -m {proto} --dport {} -j {masquerade}",
                        host(&entry.address),
                        names::comment(view, port, "cluster IP"),
                        entry.port,
                    ));
                }
            }
            self.pick_rules(&mut rules, &pf.cluster);
            self.chain(&svc, rules);
        }
        if pf.external_local() && !pf.local.is_empty() {
            let mut rules = Vec::new();
            // Policy-Local external traffic keeps its client address, masqueradeAll or not.
            self.pick_rules(&mut rules, &pf.local);
            self.chain(&svl, rules);
        }
        let has_external = pf.entries.iter().any(Entry::is_external);
        // External traffic that does not go to the node's own endpoints picks from this.
        let external_set = if pf.main_set(EntryKind::NodePort) == EndpointSet::External {
            let mut rules = Vec::new();
            self.pick_rules(&mut rules, &pf.external);
            self.chain(&svx, rules);
            svx
        } else {
            svc.clone()
        };
        let external_target = self.external_target(&external_set, &svl, &ext, has_external);
        let has_firewall =
            pf.entries.iter().any(|e| pf.allowed_sources(e, &self.ctx.node_addresses).is_some());
        if has_firewall {
            if let Target::Jump(to) = &external_target {
                let mut rules = Vec::new();
                for entry in &pf.entries {
                    for source in pf.allowed_sources(entry, &self.ctx.node_addresses).unwrap_or_default() {
                        let rule = format!("-s {source} -j {to}");
                        if !rules.contains(&rule) {
                            rules.push(rule);
                        }
                    }
                }
                rules.push(format!("-j {}", names::MARK_DROP));
                self.chain(&fw, rules);
            }
        }
        for entry in &pf.entries {
            let entry_key = EntryKey { address: entry.address, protocol: pf.port.protocol, port: entry.port };
            self.rules.entries.push(entry_key);
            let target = if entry.is_external() {
                match &external_target {
                    Target::Jump(_) if pf.allowed_sources(entry, &self.ctx.node_addresses).is_some() => {
                        Target::Jump(fw.clone())
                    }
                    other => other.clone(),
                }
            } else {
                match pf.cluster_action(EntryKind::ClusterIp) {
                    Action::Pick => Target::Jump(svc.clone()),
                    Action::Drop => Target::Jump(names::MARK_DROP.to_owned()),
                    Action::Reject => Target::Reject,
                }
            };
            self.entry_rule(entry, entry_key, target);
        }
    }

    /// Where external entries go; `svc` is the chain of the set they pick from when they do
    /// not go to the node's own endpoints (`svl`).
    fn external_target(&mut self, svc: &str, svl: &str, ext: &str, has_external: bool) -> Target {
        let pf = self.pf;
        if !has_external {
            return Target::Reject;
        }
        let mark_masq = format!("-j {}", names::MARK_MASQ);
        let from_cluster = |action: Action| match action {
            Action::Pick => Target::Jump(svc.to_owned()),
            Action::Drop => Target::Jump(names::MARK_DROP.to_owned()),
            Action::Reject => Target::Reject,
        };
        if !pf.external_local() {
            return match from_cluster(pf.cluster_action(EntryKind::NodePort)) {
                Target::Jump(to) if to == svc => {
                    self.chain(ext, vec![mark_masq, format!("-j {svc}")]);
                    Target::Jump(ext.to_owned())
                }
                other => other,
            };
        }
        let Some(local) = pf.local_action(EntryKind::NodePort) else {
            return from_cluster(pf.cluster_action(EntryKind::NodePort));
        };
        let cluster_to = match pf.cluster_action(EntryKind::NodePort) {
            Action::Pick => svc.to_owned(),
            _ => names::MARK_DROP.to_owned(),
        };
        let mut rules = Vec::new();
        for from_pod in self.pod_matches() {
            rules.push(format!("{from_pod} -j {cluster_to}"));
        }
        rules.push(format!("-m addrtype --src-type LOCAL {mark_masq}"));
        rules.push(format!("-m addrtype --src-type LOCAL -j {cluster_to}"));
        rules.push(match local {
            Action::Pick => format!("-j {svl}"),
            _ => format!("-j {}", names::MARK_DROP),
        });
        self.chain(ext, rules);
        Target::Jump(ext.to_owned())
    }

    fn entry_rule(&mut self, entry: &Entry, key: EntryKey, target: Target) {
        let (view, port, proto) = (self.pf.view, self.pf.port, self.pf.port.protocol);
        let (chain, what) = match entry.kind {
            EntryKind::ClusterIp => (names::SERVICES, "cluster IP"),
            EntryKind::ExternalIp => (names::SERVICES, "external IP"),
            EntryKind::LoadBalancer => (names::SERVICES, "loadbalancer IP"),
            EntryKind::NodePort => (names::NODEPORTS, ""),
        };
        let matches = format!("-d {} -p {proto} -m {proto} --dport {}", host(&entry.address), entry.port);
        let rule = match target {
            Target::Jump(to) => SharedRule {
                family: self.pf.family,
                table: Table::Nat,
                chain,
                spec: format!("{matches} {} -j {to}", names::comment(view, port, what)),
            },
            Target::Reject => SharedRule {
                family: self.pf.family,
                table: Table::Filter,
                chain: names::REJECT,
                // The reject type written out, as iptables-save prints the default.
                spec: format!(
                    "{matches} {} -j REJECT --reject-with {}",
                    names::comment(view, port, "has no endpoints"),
                    match self.pf.family {
                        Family::V4 => "icmp-port-unreachable",
                        Family::V6 => "icmp6-port-unreachable",
                    }
                ),
            },
        };
        self.rules.shared.push((key, rule));
    }

    /// Affinity checks, then `statistic` picks: endpoint i of n with probability 1/(n-i);
    /// first the mark for masquerade when `masquerade` (`masqueradeAll`, cluster chains).
    fn pick_rules(&self, rules: &mut Vec<String>, endpoints: &[&Endpoint]) {
        let (view, port, family) = (self.pf.view, self.pf.port, self.pf.family);
        let chains: Vec<String> = endpoints
            .iter()
            .map(|e| names::endpoint_chain(view, port, &socket(&e.address, e.port)))
            .collect();
        if let Some(timeout) = view.session_affinity_timeout {
            for (ep, chain) in endpoints.iter().zip(&chains) {
                rules.push(format!(
                    "{} -m recent --name {chain} --mask {} --rsource --rcheck --seconds {timeout} --reap -j {chain}",
                    names::comment(view, port, &format!("-> {}", socket(&ep.address, ep.port))),
                    full_mask(family)
                ));
            }
        }
        let n = endpoints.len();
        for (i, (ep, chain)) in endpoints.iter().zip(&chains).enumerate() {
            let comment = names::comment(view, port, &format!("-> {}", socket(&ep.address, ep.port)));
            if i + 1 < n {
                let probability = saved_probability(n - i);
                rules.push(format!(
                    "{comment} -m statistic --mode random --probability {probability:.11} -j {chain}"
                ));
            } else {
                rules.push(format!("{comment} -j {chain}"));
            }
        }
    }

    fn endpoint_chain(&mut self, ep: &Endpoint) {
        let (view, port, family) = (self.pf.view, self.pf.port, self.pf.family);
        let proto = port.protocol;
        let target = socket(&ep.address, ep.port);
        let chain = names::endpoint_chain(view, port, &target);
        let comment = names::comment(view, port, "");
        // As iptables-save prints them (header fields first, then the matches in order), so
        // that a full sync finds them unchanged.
        let mut rules = vec![format!("-s {} {comment} -j {}", host(&ep.address), names::MARK_MASQ)];
        let affinity = view
            .session_affinity_timeout
            .map(|_| format!(" -m recent --name {chain} --mask {} --rsource --set", full_mask(family)))
            .unwrap_or_default();
        rules.push(format!("-p {proto} {comment}{affinity} -m {proto} -j DNAT --to-destination {target}"));
        self.chain(&chain, rules);
    }
}

/// 1/`n` as the kernel keeps it (`statistic` stores a probability as a 31-bit fraction)
/// and iptables-save prints it: written so, a rule reads back exactly as written.
fn saved_probability(n: usize) -> f64 {
    const ONE: f64 = 2_147_483_648.0;
    (ONE / n as f64).round() / ONE
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Jump(String),
    Reject,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::web as view;

    #[test]
    fn a_cluster_ip_picks_with_kube_proxy_probabilities() {
        let rules =
            service_rules(&view(&["10.244.0.1", "10.244.0.2", "10.244.0.3"]), &NodeContext::default());
        assert_eq!(rules.shared.len(), 1);
        let jump = &rules.shared[0].1;
        assert_eq!(jump.chain, "KPX-SERVICES");
        assert!(jump.spec.starts_with("-d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment \"ns/web:http cluster IP\" -j KPX-SVC-"), "{}", jump.spec);
        let svc = rules.chains.iter().find(|(k, _)| k.2.starts_with("KPX-SVC-")).expect("svc chain").1;
        assert_eq!(svc.len(), 3);
        assert!(svc[0].contains("--probability 0.33333333349"), "{svc:?}");
        assert!(svc[1].contains("--probability 0.50000000000"), "{svc:?}");
        assert!(!svc[2].contains("statistic"), "{svc:?}");
        let seps: Vec<_> = rules.chains.iter().filter(|(k, _)| k.2.starts_with("KPX-SEP-")).collect();
        assert_eq!(seps.len(), 3);
        assert!(
            seps.iter().any(|(_, r)| r[1].ends_with("-j DNAT --to-destination 10.244.0.1:8080")),
            "{seps:?}"
        );
    }

    #[test]
    fn no_endpoints_is_a_reject_rule_in_the_filter_table() {
        let rules = service_rules(&view(&[]), &NodeContext::default());
        assert_eq!(rules.shared.len(), 1);
        assert_eq!(rules.shared[0].1.table, Table::Filter);
        assert!(rules.shared[0].1.spec.ends_with("-j REJECT --reject-with icmp-port-unreachable"));
        assert!(rules.chains.is_empty());
    }

    #[test]
    fn external_policy_local_goes_through_ext_and_svl() {
        let mut v = view(&["10.244.0.1", "10.244.0.2"]);
        v.external_traffic_local = true;
        v.ports[0].node_port = Some(30080);
        v.ports[0].local_endpoints = vec![v.ports[0].endpoints[0].clone()];
        let ctx = crate::backend::fixtures::node_context();
        let rules = service_rules(&v, &ctx);
        let np = rules.shared.iter().find(|(_, r)| r.chain == "KPX-NODEPORTS").expect("nodeport rule");
        assert!(
            np.1.spec.contains("-d 10.0.0.1/32 -p tcp -m tcp --dport 30080")
                && np.1.spec.contains("-j KPX-EXT-")
        );
        let ext = rules.chains.iter().find(|(k, _)| k.2.starts_with("KPX-EXT-")).expect("ext").1;
        assert!(ext[0].starts_with("-s 10.244.0.0/16 -j KPX-SVC-"), "{ext:?}");
        assert!(ext[3].starts_with("-j KPX-SVL-"), "{ext:?}");
    }
}
