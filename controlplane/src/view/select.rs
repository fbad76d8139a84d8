//! kube-proxy's `CategorizeEndpoints` for one Service port and one IP family:
//! which endpoints a node sends cluster traffic to, which it sends external
//! traffic to when a traffic policy is Local, and whether any node has one.
//!
//! kube-proxy runs one proxier per IP family, so every decision here (topology,
//! the fallback to terminating endpoints) is taken per family by the caller.

use std::collections::HashSet;
use std::net::IpAddr;

use kpx_proto::types::Endpoint;

use super::Locality;
use crate::model::SliceEndpoint;

/// One `address:port` of a Service port, with the slice endpoint it comes from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate<'a> {
    pub address: IpAddr,
    pub port: u16,
    pub source: &'a SliceEndpoint,
    /// The cluster it comes from, when not the Service's own (a global Service).
    pub cluster: Option<&'a str>,
}

impl Candidate<'_> {
    /// `ready` as the slice says it, as kube-proxy takes it: a terminating endpoint the
    /// EndpointSlice controller calls ready (a Service with `publishNotReadyAddresses`
    /// makes every endpoint ready, terminating or not) is used like any ready one.
    pub fn ready(&self) -> bool {
        self.source.ready
    }

    /// How usable the endpoint is, for choosing between two entries of one address: ready,
    /// then serving.
    pub fn usability(&self) -> (bool, bool) {
        (self.ready(), self.source.serving)
    }

    fn serving_terminating(&self) -> bool {
        self.source.serving && self.source.terminating
    }

    fn is_on(&self, node: Option<&str>) -> bool {
        node.is_some_and(|n| self.source.node_name.as_deref() == Some(n))
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::new(
            self.address,
            self.port,
            self.source.node_name.as_deref().unwrap_or_default(),
            self.cluster.unwrap_or_default(),
            !self.ready(),
        )
    }
}

/// The traffic policies in effect for a Service port.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Policy {
    pub internal_local: bool,
    pub external_local: bool,
    /// The port has external entry points (a NodePort, external or load-balancer IPs).
    pub external_entries: bool,
}

/// What one node uses, unsorted.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Selected {
    /// ClusterIP traffic (and external traffic unless a policy is Local): this node's
    /// endpoints when the internal policy is Local, else the cluster-wide set.
    pub cluster: Vec<Endpoint>,
    /// Internal policy Local on a port with external entry points: the cluster-wide set,
    /// for external traffic; empty otherwise.
    pub external: Vec<Endpoint>,
    /// External traffic under `externalTrafficPolicy: Local`; empty otherwise.
    pub local: Vec<Endpoint>,
    /// Some node has an endpoint to use (ready, or serving and terminating).
    pub any: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    Any,
    SameNode,
    SameZone,
}

/// Chooses the endpoints of one family of one Service port for a node at `at`.
pub(super) fn categorize(candidates: &[Candidate<'_>], policy: Policy, at: Locality<'_>) -> Selected {
    let local = || {
        let mut chosen = pick(candidates, |c| c.ready() && c.is_on(at.node));
        if chosen.is_empty() {
            chosen = pick(candidates, |c| c.serving_terminating() && c.is_on(at.node));
        }
        chosen
    };
    let cluster_wide = || {
        let topology = topology(candidates, at);
        let mut chosen = pick(candidates, |c| c.ready() && available(c, topology, at));
        if chosen.is_empty() {
            // Topology is only used when this node has a ready endpoint to use,
            // so an empty set means nothing is ready anywhere.
            chosen = pick(candidates, Candidate::serving_terminating);
        }
        chosen
    };
    let local_set = if policy.external_local { local() } else { Vec::new() };
    if !policy.internal_local {
        // The cluster-wide set is empty exactly when nothing anywhere can be used.
        let cluster = cluster_wide();
        return Selected { any: !cluster.is_empty(), cluster, external: Vec::new(), local: local_set };
    }
    // Topology hints are not applied to node-local traffic.
    let external = if policy.external_entries { cluster_wide() } else { Vec::new() };
    let any = candidates.iter().any(|c| c.ready() || c.serving_terminating());
    Selected { cluster: local(), external, local: local_set, any }
}

/// The serving endpoints (ready, or serving and terminating) that `selected` does not use:
/// a node keeps its UDP conntrack flows to them (kube-proxy deletes a flow only once its
/// endpoint stops serving).
pub(super) fn serving_unused(candidates: &[Candidate<'_>], selected: &Selected) -> Vec<Endpoint> {
    let used: HashSet<(IpAddr, u16)> = selected
        .cluster
        .iter()
        .chain(&selected.external)
        .chain(&selected.local)
        .map(|e| (e.address, e.port))
        .collect();
    pick(candidates, |c| (c.ready() || c.source.serving) && !used.contains(&(c.address, c.port)))
}

fn pick<'a>(candidates: &[Candidate<'a>], keep: impl Fn(&Candidate<'a>) -> bool) -> Vec<Endpoint> {
    candidates.iter().filter(|c| keep(c)).map(Candidate::endpoint).collect()
}

/// kube-proxy's `topologyModeFromHints`: hints are used only when every ready
/// endpoint has them and at least one is meant for this node (or its zone);
/// node hints win over zone hints.
fn topology(candidates: &[Candidate<'_>], at: Locality<'_>) -> Topology {
    let (mut all_nodes, mut for_node) = (true, false);
    let (mut all_zones, mut for_zone) = (true, false);
    for c in candidates.iter().filter(|c| c.ready()) {
        let hints = &c.source;
        if hints.node_hints.is_empty() {
            all_nodes = false;
        } else if at.node.is_some_and(|n| hints.node_hints.iter().any(|h| h == n)) {
            for_node = true;
        }
        if hints.zone_hints.is_empty() {
            all_zones = false;
        } else if at.zone.is_some_and(|z| hints.zone_hints.iter().any(|h| h == z)) {
            for_zone = true;
        }
    }
    if all_nodes && for_node {
        Topology::SameNode
    } else if all_zones && for_zone {
        Topology::SameZone
    } else {
        Topology::Any
    }
}

fn available(c: &Candidate<'_>, topology: Topology, at: Locality<'_>) -> bool {
    let named = |hints: &[String], want: Option<&str>| want.is_some_and(|w| hints.iter().any(|h| h == w));
    match topology {
        Topology::Any => true,
        Topology::SameNode => named(&c.source.node_hints, at.node),
        Topology::SameZone => named(&c.source.zone_hints, at.zone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `address node state [z:zone,…] [n:node,…]`; state is R (ready), T
    /// (serving and terminating), D (terminating, not serving) or N (not ready).
    fn endpoints(specs: &[&str]) -> Vec<SliceEndpoint> {
        specs
            .iter()
            .map(|spec| {
                let words: Vec<&str> = spec.split_whitespace().collect();
                let hints = |prefix: &str| -> Vec<String> {
                    words
                        .iter()
                        .filter_map(|w| w.strip_prefix(prefix))
                        .flat_map(|list| list.split(','))
                        .map(str::to_owned)
                        .collect()
                };
                let (ready, serving, terminating) = match words[2] {
                    "R" => (true, true, false),
                    "T" => (false, true, true),
                    "D" => (false, false, true),
                    _ => (false, false, false),
                };
                SliceEndpoint {
                    addresses: vec![words[0].parse().expect("address")],
                    ready,
                    serving,
                    terminating,
                    node_name: (words[1] != "-").then(|| words[1].to_owned()),
                    zone: None,
                    zone_hints: hints("z:"),
                    node_hints: hints("n:"),
                }
            })
            .collect()
    }

    fn show(list: &[Endpoint]) -> Vec<String> {
        let mut out: Vec<String> =
            list.iter().map(|e| format!("{}{}", e.address, if e.terminating { "(t)" } else { "" })).collect();
        out.sort();
        out
    }

    fn select(specs: &[&str], policy: Policy, at: Locality<'_>) -> Selected {
        let eps = endpoints(specs);
        let candidates: Vec<Candidate<'_>> = eps
            .iter()
            .map(|e| Candidate { address: e.addresses[0], port: 80, source: e, cluster: None })
            .collect();
        categorize(&candidates, policy, at)
    }

    fn run(specs: &[&str], policy: Policy, at: Locality<'_>) -> (Vec<String>, Vec<String>) {
        let selected = select(specs, policy, at);
        (show(&selected.cluster), show(&selected.local))
    }

    const CLUSTER: Policy = Policy { internal_local: false, external_local: false, external_entries: false };
    const ITP: Policy = Policy { internal_local: true, external_local: false, external_entries: false };
    const ETP: Policy = Policy { internal_local: false, external_local: true, external_entries: true };
    const BOTH: Policy = Policy { internal_local: true, external_local: true, external_entries: true };
    /// Internal policy Local with external entry points of policy Cluster.
    const ITP_NODEPORT: Policy = Policy { external_entries: true, ..ITP };

    fn at<'a>(node: &'a str, zone: &'a str) -> Locality<'a> {
        Locality { node: (!node.is_empty()).then_some(node), zone: (!zone.is_empty()).then_some(zone) }
    }

    /// Name, endpoints, policy, node, expected cluster endpoints, expected local endpoints.
    type Case<'a> = (&'a str, Vec<&'a str>, Policy, Locality<'a>, &'a [&'a str], &'a [&'a str]);

    #[test]
    fn categorize_table() {
        let zoned = ["10.0.0.1 n1 R z:a", "10.0.0.2 n2 R z:b", "10.0.0.3 n3 R z:a"];
        let noded = ["10.0.0.1 n1 R n:n1 z:a", "10.0.0.2 n2 R n:n2 z:a", "10.0.0.3 n3 R n:n1 z:b"];
        #[rustfmt::skip]
        let cases: Vec<Case<'_>> = vec![
            ("ready only", vec!["10.0.0.1 n1 R", "10.0.0.2 n2 T", "10.0.0.3 n2 N"], CLUSTER, at("n1", ""),
             &["10.0.0.1"], &[]),
            ("terminating when none ready", vec!["10.0.0.2 n2 T", "10.0.0.3 n2 N", "10.0.0.4 n2 D"], CLUSTER,
             Locality::UNKNOWN, &["10.0.0.2(t)"], &[]),
            ("zone hints for the node's zone", zoned.to_vec(), CLUSTER, at("n9", "a"),
             &["10.0.0.1", "10.0.0.3"], &[]),
            ("zone hints, node without zone", zoned.to_vec(), CLUSTER, at("n9", ""),
             &["10.0.0.1", "10.0.0.2", "10.0.0.3"], &[]),
            ("zone hints for no endpoint of this zone", zoned.to_vec(), CLUSTER, at("n9", "c"),
             &["10.0.0.1", "10.0.0.2", "10.0.0.3"], &[]),
            ("a ready endpoint without zone hint disables them",
             vec!["10.0.0.1 n1 R z:a", "10.0.0.2 n2 R"], CLUSTER, at("n1", "a"), &["10.0.0.1", "10.0.0.2"], &[]),
            ("hints of terminating endpoints do not count",
             vec!["10.0.0.1 n1 R z:a", "10.0.0.2 n2 R z:b", "10.0.0.3 n2 T"], CLUSTER, at("n1", "a"),
             &["10.0.0.1"], &[]),
            ("node hints win over zone hints", noded.to_vec(), CLUSTER, at("n1", "a"),
             &["10.0.0.1", "10.0.0.3"], &[]),
            ("node hints not for this node: zone hints", noded.to_vec(), CLUSTER, at("n4", "a"),
             &["10.0.0.1", "10.0.0.2"], &[]),
            ("node hints without a node", noded.to_vec(), CLUSTER, Locality::UNKNOWN,
             &["10.0.0.1", "10.0.0.2", "10.0.0.3"], &[]),
            ("a ready endpoint without node hint disables them",
             vec!["10.0.0.1 n1 R n:n1", "10.0.0.2 n2 R"], CLUSTER, at("n1", ""), &["10.0.0.1", "10.0.0.2"], &[]),
            ("internal local: this node's ready ones, no hints", noded.to_vec(), ITP, at("n2", "a"),
             &["10.0.0.2"], &[]),
            ("internal local: nothing here", vec!["10.0.0.1 n1 R"], ITP, at("n2", ""), &[], &[]),
            ("internal local: unknown node", vec!["10.0.0.1 n1 R"], ITP, Locality::UNKNOWN, &[], &[]),
            ("internal local: local terminating although ready elsewhere",
             vec!["10.0.0.1 n1 R", "10.0.0.2 n2 T"], ITP, at("n2", ""), &["10.0.0.2(t)"], &[]),
            ("external local: cluster set and local set", vec!["10.0.0.1 n1 R", "10.0.0.2 n2 R"], ETP,
             at("n1", ""), &["10.0.0.1", "10.0.0.2"], &["10.0.0.1"]),
            ("external local: none on this node", vec!["10.0.0.1 n1 R"], ETP, at("n2", ""), &["10.0.0.1"], &[]),
            ("external local: local terminating while the cluster set is ready",
             vec!["10.0.0.1 n1 R", "10.0.0.2 n2 T", "10.0.0.3 n2 N"], ETP, at("n2", ""),
             &["10.0.0.1"], &["10.0.0.2(t)"]),
            ("external local: local ready while the cluster set uses zone hints",
             vec!["10.0.0.1 n1 R z:a", "10.0.0.2 n2 R z:b"], ETP, at("n2", "a"), &["10.0.0.1"], &["10.0.0.2"]),
            ("external local: all terminating", vec!["10.0.0.1 n1 T", "10.0.0.2 n2 T"], ETP, at("n2", ""),
             &["10.0.0.1(t)", "10.0.0.2(t)"], &["10.0.0.2(t)"]),
            ("both local", vec!["10.0.0.1 n1 R", "10.0.0.2 n2 R", "10.0.0.3 n2 T"], BOTH, at("n2", ""),
             &["10.0.0.2"], &["10.0.0.2"]),
            ("endpoints without a node are never local", vec!["10.0.0.1 - R"], BOTH, at("n1", ""), &[], &[]),
        ];
        for (name, specs, policy, locality, cluster, local) in cases {
            let (got_cluster, got_local) = run(&specs, policy, locality);
            assert_eq!(got_cluster, cluster, "{name}: cluster endpoints");
            assert_eq!(got_local, local, "{name}: local endpoints");
        }
    }

    #[test]
    fn internal_local_with_external_entries_gives_external_traffic_the_cluster_wide_set() {
        let eps = ["10.0.0.1 n1 R z:a", "10.0.0.2 n2 R z:b", "10.0.0.3 n2 T"];
        let s = select(&eps, ITP_NODEPORT, at("n1", "a"));
        assert_eq!(show(&s.cluster), ["10.0.0.1"], "ClusterIP: this node's");
        assert_eq!(show(&s.external), ["10.0.0.1"], "external: cluster-wide, zone hints applied");
        let s = select(&eps, ITP_NODEPORT, at("n3", ""));
        assert_eq!(
            (show(&s.cluster), show(&s.external), s.any),
            (vec![], vec!["10.0.0.1".into(), "10.0.0.2".into()], true)
        );
        // Policy Local for external traffic too: the cluster-wide set is the pods' short circuit.
        let s = select(&eps, BOTH, at("n3", ""));
        assert_eq!((s.cluster.len(), s.local.len(), show(&s.external).len()), (0, 0, 2));
        // Without external entry points it is not sent.
        let s = select(&eps, ITP, at("n3", ""));
        assert!(s.external.is_empty() && s.any);
    }

    #[test]
    fn whether_any_node_has_an_endpoint() {
        for policy in [CLUSTER, ITP, ITP_NODEPORT, ETP, BOTH] {
            assert!(!select(&[], policy, at("n1", "")).any, "{policy:?}: none");
            assert!(
                !select(&["10.0.0.1 n2 N", "10.0.0.2 n2 D"], policy, at("n1", "")).any,
                "{policy:?}: unusable"
            );
            assert!(select(&["10.0.0.1 n2 T"], policy, at("n1", "")).any, "{policy:?}: serving, terminating");
            assert!(select(&["10.0.0.1 n2 R"], policy, at("n1", "")).any, "{policy:?}: elsewhere");
        }
    }
}
