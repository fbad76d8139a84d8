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
                hostname: None,
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
