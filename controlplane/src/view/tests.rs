//! Views built from manifests: the selection rules themselves are table-tested in `select`.

use super::*;
use crate::model::{Cluster, ClusterState, ObjectKey};
use crate::source::manifest::state_of;

/// A Service `ns/web` with `spec` (YAML flow mapping entries) and its slices.
fn manifests(spec: &str, slices: &[(&str, &str)]) -> String {
    let mut text = format!("kind: Service\nmetadata: {{name: web, namespace: ns}}\nspec: {{{spec}}}\n");
    for (i, (address_type, endpoints)) in slices.iter().enumerate() {
        text.push_str(&format!(
            "---\nkind: EndpointSlice\nmetadata: {{name: web-{i}, namespace: ns, labels: {{kubernetes.io/service-name: web}}}}\n\
             addressType: {address_type}\nports: [{{name: http, port: {}}}]\nendpoints: [{endpoints}]\n",
            8080 + i
        ));
    }
    text
}

fn web(state: &ClusterState) -> &Service {
    state.services.get(&ObjectKey { namespace: "ns".into(), name: "web".into() }).expect("web")
}

fn view_at(state: &ClusterState, at: Locality<'_>) -> ServiceView {
    let cluster = Cluster::new(state.clone());
    let svc = web(state);
    view_for("c", svc, &cluster.slices_of(&svc.key), at)
}

fn addrs(endpoints: &[kpx_proto::types::Endpoint]) -> Vec<String> {
    endpoints
        .iter()
        .map(|e| format!("{}:{}{}", e.address, e.port, if e.terminating { "(t)" } else { "" }))
        .collect()
}

fn node(name: &str) -> Locality<'_> {
    Locality { node: Some(name), zone: None }
}

const PORTS: &str = "ports: [{name: http, port: 80}]";

#[test]
fn ready_endpoints_from_all_slices_with_their_own_target_ports() {
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, {PORTS}"),
        &[
            ("IPv4", "{addresses: [10.0.0.2]}, {addresses: [10.0.0.1]}"),
            ("IPv4", "{addresses: [10.0.0.3]}, {addresses: [10.0.0.4], conditions: {ready: false}}"),
        ],
    ));
    let view = view_at(&state, Locality::UNKNOWN);
    assert_eq!(addrs(&view.ports[0].endpoints), ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8081"]);
}

#[test]
fn terminating_serving_endpoints_only_when_none_is_ready() {
    let term = "conditions: {ready: false, serving: true, terminating: true}";
    let both = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, {PORTS}"),
        &[("IPv4", &format!("{{addresses: [10.0.0.1]}}, {{addresses: [10.0.0.2], {term}}}"))],
    ));
    assert_eq!(addrs(&view_at(&both, Locality::UNKNOWN).ports[0].endpoints), ["10.0.0.1:8080"]);
    let only = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, {PORTS}"),
        &[(
            "IPv4",
            &format!(
                "{{addresses: [10.0.0.2], {term}}}, \
                 {{addresses: [10.0.0.3], conditions: {{ready: false, serving: false, terminating: true}}}}"
            ),
        )],
    ));
    assert_eq!(addrs(&view_at(&only, Locality::UNKNOWN).ports[0].endpoints), ["10.0.0.2:8080(t)"]);
}

#[test]
fn an_endpoint_its_slice_calls_ready_is_used_even_while_terminating() {
    // publishNotReadyAddresses: the EndpointSlice controller writes every endpoint ready,
    // also those of terminating pods (serving false); kube-proxy takes `ready` as written.
    let published = "conditions: {ready: true, serving: false, terminating: true}";
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, publishNotReadyAddresses: true, {PORTS}"),
        &[("IPv4", &format!("{{addresses: [10.0.0.1], {published}}}, {{addresses: [10.0.0.2]}}"))],
    ));
    assert_eq!(
        addrs(&view_at(&state, Locality::UNKNOWN).ports[0].endpoints),
        ["10.0.0.1:8080", "10.0.0.2:8080"]
    );
}

#[test]
fn a_udp_port_names_the_serving_endpoints_it_does_not_use() {
    let slice = "{addresses: [10.0.0.1]}, {addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}}, \
                 {addresses: [10.0.0.3], conditions: {ready: false, serving: false, terminating: true}}";
    let udp =
        manifests("clusterIP: 10.96.0.1, ports: [{name: http, port: 53, protocol: UDP}]", &[("IPv4", slice)])
            .replace("ports: [{name: http, port: 8080}]", "ports: [{name: http, port: 8080, protocol: UDP}]");
    let udp = state_of(&udp);
    let view = view_at(&udp, Locality::UNKNOWN);
    assert_eq!(addrs(&view.ports[0].endpoints), ["10.0.0.1:8080"]);
    assert_eq!(
        addrs(&view.ports[0].serving_endpoints),
        ["10.0.0.2:8080(t)"],
        "serving, not in use; 10.0.0.3 no longer serves"
    );
    let tcp = state_of(&manifests(&format!("clusterIP: 10.96.0.1, {PORTS}"), &[("IPv4", slice)]));
    assert!(view_at(&tcp, Locality::UNKNOWN).ports[0].serving_endpoints.is_empty(), "UDP only");
}

#[test]
fn the_terminating_fallback_is_per_ip_family() {
    let state = state_of(&manifests(
        &format!("clusterIPs: [10.96.0.1, 'fd00::1'], {PORTS}"),
        &[
            ("IPv4", "{addresses: [10.0.0.1]}"),
            (
                "IPv6",
                "{addresses: ['fd00::5'], conditions: {ready: false, serving: true, terminating: true}}",
            ),
        ],
    ));
    assert_eq!(
        addrs(&view_at(&state, Locality::UNKNOWN).ports[0].endpoints),
        ["10.0.0.1:8080", "fd00::5:8081(t)"]
    );
}

#[test]
fn an_address_listed_twice_counts_once_and_ready_wins() {
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, {PORTS}"),
        &[(
            "IPv4",
            "{addresses: [10.0.0.1], conditions: {ready: false}}, {addresses: [10.0.0.1], nodeName: n1}",
        )],
    ));
    let view = view_at(&state, Locality::UNKNOWN);
    assert_eq!(addrs(&view.ports[0].endpoints), ["10.0.0.1:8080"]);
    assert_eq!(view.ports[0].endpoints[0].node_name(), "n1");
}

#[test]
fn an_address_listed_twice_with_none_ready_counts_as_the_serving_entry() {
    // A reused pod IP: the old pod terminating and no longer serving, the new one
    // terminating too but serving (no endpoint is ready: the serving ones are used).
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, {PORTS}"),
        &[(
            "IPv4",
            "{addresses: [10.0.0.2], conditions: {ready: false, serving: false, terminating: true}, nodeName: old}, \
             {addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}, nodeName: new}",
        )],
    ));
    let view = view_at(&state, Locality::UNKNOWN);
    assert_eq!(addrs(&view.ports[0].endpoints), ["10.0.0.2:8080(t)"]);
    assert_eq!(view.ports[0].endpoints[0].node_name(), "new");
}

#[test]
fn headless_and_external_name_are_ignored_and_a_proxy_name_travels_in_the_view() {
    let svc = |ips: &[&str]| Service {
        cluster_ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
        ..Service::default()
    };
    assert!(is_proxied(&svc(&["10.96.0.1"])));
    assert!(!is_proxied(&svc(&[])));
    assert!(!is_proxied(&Service { service_type: ServiceType::ExternalName, ..svc(&["10.96.0.1"]) }));
    assert!(!is_proxied(&Service { headless_label: true, ..svc(&["10.96.0.1"]) }));
    let other = Service { proxy_name: Some("other".into()), ..svc(&["10.96.0.1"]) };
    assert!(is_proxied(&other), "served, to the agents named so");
    let view = ViewBuilder::new("c", &other, &[]).view(Locality::UNKNOWN);
    assert_eq!(view.service_proxy_name.as_deref(), Some("other"));
}

#[test]
fn endpoints_of_another_family_are_left_out() {
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, {PORTS}"),
        &[("IPv4", "{addresses: [10.0.0.1]}"), ("IPv6", "{addresses: ['fd00::1']}")],
    ));
    assert_eq!(addrs(&view_at(&state, Locality::UNKNOWN).ports[0].endpoints), ["10.0.0.1:8080"]);
}

#[test]
fn copies_entry_points_source_ranges_and_affinity() {
    let state = state_of(&format!(
        "{}status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.2}}, {{ip: 203.0.113.1}}, {{ip: 203.0.113.2}}]}}}}\n",
        manifests(
            "type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{name: http, port: 80, nodePort: 30080}], \
             externalIPs: [192.0.2.9, 192.0.2.1], loadBalancerSourceRanges: [10.1.0.0/16, 10.0.0.0/16], \
             externalTrafficPolicy: Local, healthCheckNodePort: 31000, sessionAffinity: ClientIP",
            &[],
        )
    ));
    let view = view_at(&state, Locality::UNKNOWN);
    assert_eq!(view.ports[0].node_port, Some(30080));
    let strings = |list: &[IpAddr]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(strings(&view.external_ips), ["192.0.2.1", "192.0.2.9"]);
    assert_eq!(strings(&view.load_balancer_ips), ["203.0.113.1", "203.0.113.2"]);
    let ranges: Vec<String> = view.load_balancer_source_ranges.iter().map(ToString::to_string).collect();
    assert_eq!(ranges, ["10.0.0.0/16", "10.1.0.0/16"]);
    assert!(view.external_traffic_local && !view.internal_traffic_local);
    assert_eq!(view.health_check_node_port, Some(31000));
    assert_eq!(view.session_affinity_timeout, Some(10800));
}

#[test]
fn local_external_policy_without_entry_point_is_cluster() {
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, externalTrafficPolicy: Local, healthCheckNodePort: 31000, {PORTS}"),
        &[("IPv4", "{addresses: [10.0.0.1], nodeName: n1}")],
    ));
    let view = view_at(&state, node("n1"));
    assert!(!view.external_traffic_local);
    assert!(view.ports[0].local_endpoints.is_empty());
    assert_eq!(view.health_check_node_port, None);
    assert_eq!(view, view_at(&state, Locality::UNKNOWN));
}

#[test]
fn external_local_gives_each_node_its_own_endpoints() {
    let state = state_of(&manifests(
        "type: NodePort, clusterIP: 10.96.0.1, externalTrafficPolicy: Local, \
         ports: [{name: http, port: 80, nodePort: 30080}]",
        &[("IPv4", "{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}")],
    ));
    let n1 = view_at(&state, node("n1"));
    assert!(n1.external_traffic_local);
    assert_eq!(addrs(&n1.ports[0].endpoints), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(addrs(&n1.ports[0].local_endpoints), ["10.0.0.1:8080"]);
    assert!(view_at(&state, node("n3")).ports[0].local_endpoints.is_empty());
    assert_eq!(view_at(&state, node("n3")), view_at(&state, Locality::UNKNOWN));
    assert_eq!(view_at(&state, Locality::UNKNOWN).health_check_node_port, None, "NodePort: no health check");
}

#[test]
fn internal_local_keeps_only_this_nodes_endpoints() {
    let state = state_of(&manifests(
        &format!("clusterIP: 10.96.0.1, internalTrafficPolicy: Local, {PORTS}"),
        &[("IPv4", "{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}")],
    ));
    let n2 = view_at(&state, node("n2"));
    assert!(n2.internal_traffic_local);
    assert_eq!(addrs(&n2.ports[0].endpoints), ["10.0.0.2:8080"]);
    assert!(n2.ports[0].local_endpoints.is_empty(), "external policy is Cluster");
    assert!(view_at(&state, Locality::UNKNOWN).ports[0].endpoints.is_empty());
}

/// Every node and zone outside `localities` gets exactly the default view.
#[test]
fn localities_name_every_node_and_zone_whose_view_differs() {
    let hinted = "{addresses: [10.0.0.1], nodeName: n1, hints: {forZones: [{name: a}], forNodes: [{name: n1}]}}, \
                  {addresses: [10.0.0.2], nodeName: n2, hints: {forZones: [{name: b}], forNodes: [{name: n3}]}}";
    let plain = "{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}";
    let cases = [
        (format!("clusterIP: 10.96.0.1, {PORTS}"), plain, &[][..], &[][..]),
        (format!("clusterIP: 10.96.0.1, {PORTS}"), hinted, &["n1", "n3"][..], &["a", "b"][..]),
        (format!("clusterIP: 10.96.0.1, internalTrafficPolicy: Local, {PORTS}"), plain, &["n1", "n2"], &[]),
        (format!("clusterIP: 10.96.0.1, externalTrafficPolicy: Local, {PORTS}"), plain, &[], &[]),
        (
            "clusterIP: 10.96.0.1, externalTrafficPolicy: Local, externalIPs: [192.0.2.1], ports: [{name: http, port: 80}]"
                .into(),
            plain,
            &["n1", "n2"],
            &[],
        ),
        (format!("clusterIP: 10.96.0.1, internalTrafficPolicy: Local, {PORTS}"), hinted, &["n1", "n2", "n3"], &["a", "b"]),
    ];
    for (spec, endpoints, nodes, zones) in cases {
        let state = state_of(&manifests(&spec, &[("IPv4", endpoints)]));
        let cluster = Cluster::new(state.clone());
        let slices = cluster.slices_of(&web(&state).key);
        let builder = ViewBuilder::new("c", web(&state), &slices);
        let localities = builder.localities();
        assert_eq!(localities.nodes.iter().copied().collect::<Vec<_>>(), nodes, "{spec} / {endpoints}");
        assert_eq!(localities.zones.iter().copied().collect::<Vec<_>>(), zones, "{spec} / {endpoints}");
        assert_eq!(builder.varies_by_node(), !localities.is_empty(), "{spec}");
        let default = builder.view(Locality::UNKNOWN);
        for other in ["n4", "n5"] {
            for zone in [None, Some("c")] {
                assert_eq!(builder.view(Locality { node: Some(other), zone }), default, "{spec} at {other}");
            }
        }
        // A node outside `nodes` gets its zone's view.
        for zone in zones {
            let zone_view = builder.view(Locality { node: None, zone: Some(zone) });
            assert_eq!(builder.view(Locality { node: Some("n4"), zone: Some(zone) }), zone_view, "{spec}");
        }
    }
}

#[test]
fn node_config_carries_the_cluster_cidrs() {
    let state = state_of("kind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: a}}\nspec: {podCIDR: 10.244.1.0/24}\n");
    let cidrs: Vec<IpNet> = vec!["10.244.0.0/16".parse().expect("cidr")];
    let config = node_config(&state.nodes["n1"], &cidrs, Vec::new());
    assert_eq!((config.zone.as_str(), config.cluster_cidrs.as_slice()), ("a", cidrs.as_slice()));
    assert_eq!(config.local_traffic_cidrs(), cidrs.as_slice());
}

#[test]
fn every_node_config_carries_the_service_cidrs_and_follows_them() {
    let nodes = "kind: Node\nmetadata: {name: n1}\n---\nkind: Node\nmetadata: {name: n2}\n";
    let cidr = |name: &str, cidrs: &str| {
        format!("---\nkind: ServiceCIDR\nmetadata: {{name: {name}}}\nspec: {{cidrs: [{cidrs}]}}\n")
    };
    let state = state_of(&format!(
        "{nodes}{}{}",
        cidr("kubernetes", "10.96.0.0/16"),
        cidr("extra", "10.100.0.0/24, 10.96.0.0/16")
    ));
    let shown = |s: &ClusterState| s.service_ranges().iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(shown(&state), ["10.96.0.0/16", "10.100.0.0/24"], "sorted, without repeats");
    let mut cluster = Cluster::new(state.clone());
    let mut changes = crate::model::ObjectChanges::default();
    changes.service_cidrs.insert("extra".into(), None);
    let touched = cluster.apply(changes);
    assert_eq!(touched.nodes.len(), 2, "every node's config changes");
    assert_eq!(shown(cluster.state()), ["10.96.0.0/16"]);
    let config = node_config(&cluster.state().nodes["n1"], &[], cluster.state().service_ranges());
    assert_eq!(config.service_cidrs.len(), 1);
    let mut same = crate::model::ObjectChanges::default();
    same.service_cidrs.insert(
        "again".into(),
        Some(crate::model::ServiceCidr {
            name: "again".into(),
            cidrs: vec!["10.96.0.0/16".parse().expect("cidr")],
        }),
    );
    assert!(cluster.apply(same).nodes.is_empty(), "the same ranges: no node changes");
}

/// What, spec, endpoints, nodes (`name@zone`), zones with a variant, nodes with a variant.
type VariantCase<'a> = (&'a str, &'a str, &'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);

/// Which zones and nodes get a variant of their own: only where the view differs from
/// what they would get otherwise, and zones only where some node is.
#[test]
fn service_views_keep_only_the_variants_that_differ() {
    let zoned = "{addresses: [10.0.0.1], nodeName: n1, hints: {forZones: [{name: a}]}}, \
                 {addresses: [10.0.0.2], nodeName: n2, hints: {forZones: [{name: b}]}}";
    let local = "{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}";
    let same_zone = "{addresses: [10.0.0.1], nodeName: n1, hints: {forZones: [{name: a}], forNodes: [{name: n1}]}}, \
                     {addresses: [10.0.0.2], nodeName: n1, hints: {forZones: [{name: a}], forNodes: [{name: n1}]}}";
    let itp = format!("clusterIP: 10.96.0.1, internalTrafficPolicy: Local, {PORTS}");
    let plain = format!("clusterIP: 10.96.0.1, {PORTS}");
    #[rustfmt::skip]
    let cases: Vec<VariantCase<'_>> = vec![
        // (what, spec, endpoints, nodes as name@zone, zones with a variant, nodes with a variant)
        ("no locality", &plain, local, &["n1@a", "n2@b"], &[], &[]),
        ("zone hints, both zones have nodes", &plain, zoned, &["n1@a", "n2@b"], &["a", "b"], &[]),
        ("zone hints, zone b has no node", &plain, zoned, &["n1@a"], &["a"], &[]),
        ("node-local: each node with endpoints", &itp, local, &["n1@a", "n2@b", "n3@b"], &[], &["n1", "n2"]),
        ("node hints equal to the zone's view: no node variant", &plain, same_zone, &["n1@a"], &[], &[]),
    ];
    for (what, spec, endpoints, nodes, zones, node_variants) in cases {
        let mut yaml = manifests(spec, &[("IPv4", endpoints)]);
        for n in nodes {
            let (name, zone) = n.split_once('@').expect("name@zone");
            yaml.push_str(&format!(
                "---\nkind: Node\nmetadata: {{name: {name}, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n"
            ));
        }
        let state = state_of(&yaml);
        let clusters: std::collections::BTreeMap<String, Cluster> =
            [("c".to_owned(), Cluster::new(state))].into();
        let placement = Placement::of(&clusters, false);
        let inputs = Inputs {
            clusters: &clusters,
            placement: &placement,
            withdrawn: &Default::default(),
            cluster_cidrs: &[],
        };
        let views = inputs
            .service_views("c", &ObjectKey { namespace: "ns".into(), name: "web".into() })
            .expect("served");
        let got_zones: Vec<&str> = views.zones.iter().map(|(z, _)| z.as_str()).collect();
        let got_nodes: Vec<&str> = views.nodes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!((got_zones.as_slice(), got_nodes.as_slice()), (zones, node_variants), "{what}");
        assert_eq!(views.varies, what != "no locality", "{what}");
    }
}

/// A global Service gets the slices of the other clusters that mark it global too and are
/// not withdrawn.
#[test]
fn a_global_service_draws_on_the_clusters_that_share_it() {
    let global = "service.kpx.io/global: 'true'";
    let cluster = |annotations: &str, address: &str| {
        let yaml = manifests(
            &format!("clusterIP: 10.96.0.1, {PORTS}"),
            &[("IPv4", &format!("{{addresses: [{address}]}}"))],
        )
        .replace(
            "metadata: {name: web, namespace: ns}",
            &format!("metadata: {{name: web, namespace: ns, annotations: {{{annotations}}}}}"),
        );
        Cluster::new(state_of(&yaml))
    };
    let clusters: std::collections::BTreeMap<String, Cluster> = [
        ("a".to_owned(), cluster(global, "10.1.0.1")),
        ("b".to_owned(), cluster(global, "10.2.0.1")),
        ("c".to_owned(), cluster("", "10.3.0.1")),
        ("d".to_owned(), cluster(global, "10.4.0.1")),
    ]
    .into();
    let placement = Placement::of(&clusters, true);
    let withdrawn = ["d".to_owned()].into();
    let inputs =
        Inputs { clusters: &clusters, placement: &placement, withdrawn: &withdrawn, cluster_cidrs: &[] };
    let key = ObjectKey { namespace: "ns".into(), name: "web".into() };
    let remote = |c: &str| -> Vec<&str> {
        let svc = clusters[c].service(&key).expect("web");
        inputs.remote_slices(c, svc).into_iter().map(|(peer, _)| peer).collect()
    };
    assert_eq!(remote("a"), ["b"], "c does not mark it global, d is withdrawn");
    assert_eq!(remote("d"), ["a", "b"], "a withdrawn cluster's own nodes still get the others'");
    assert!(remote("c").is_empty(), "not global: its own endpoints only");
    let views = inputs.service_views("a", &key).expect("served");
    assert_eq!(addrs(&views.default.ports[0].endpoints), ["10.1.0.1:8080", "10.2.0.1:8080"]);
}
