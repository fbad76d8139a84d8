use super::*;
use crate::model::ClusterState;
use crate::source::manifest::state_of;
use kpx_proto::types::{NodeConfig, ServiceView};
use std::collections::BTreeMap;

const WEB: &str = "c/ns/web";

fn build(yaml: &str, previous: &Snapshot) -> Snapshot {
    let clusters = [("c".to_owned(), Arc::new(state_of(yaml)))].into_iter().collect();
    Snapshot::build(&clusters, previous, &BuildOptions::default())
}

/// Node objects: `name` or `name@zone`.
fn nodes(list: &[&str]) -> String {
    list.iter()
        .map(|n| match n.split_once('@') {
            Some((name, zone)) => {
                format!("kind: Node\nmetadata: {{name: {name}, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n---\n")
            }
            None => format!("kind: Node\nmetadata: {{name: {n}}}\n---\n"),
        })
        .collect()
}

/// Service `ns/web` with `spec` entries and one IPv4 slice with `endpoints`.
fn web(spec: &str, endpoints: &str) -> String {
    format!(
        "kind: Service\nmetadata: {{name: web, namespace: ns}}\nspec: {{clusterIP: 10.96.0.1, {spec}}}\n---\n\
         kind: EndpointSlice\nmetadata: {{name: web-1, namespace: ns, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{endpoints}]\n"
    )
}

const NODE_PORT: &str = "type: NodePort, ports: [{name: http, port: 80, nodePort: 30080}]";
const PORT: &str = "ports: [{name: http, port: 80}]";

fn resource<'a>(snap: &'a Snapshot, node: &str) -> &'a Arc<Resource> {
    snap.get(ResourceType::ServiceView, node, WEB).expect("web")
}

fn view(snap: &Snapshot, node: &str) -> ServiceView {
    ServiceView::decode(resource(snap, node).body()).expect("valid view")
}

fn addrs(endpoints: &[kpx_proto::types::Endpoint]) -> Vec<String> {
    endpoints.iter().map(|e| format!("{}{}", e.address, if e.terminating { "(t)" } else { "" })).collect()
}

/// `for_node` agrees with `get` for every node.
fn check_for_node(snap: &Snapshot, node: &str) {
    let listed: Vec<&Arc<Resource>> = snap.for_node(ResourceType::ServiceView, node).collect();
    assert_eq!(listed.len(), snap.service_count());
    for r in listed {
        let got = snap.get(ResourceType::ServiceView, node, &r.name).expect("listed resource");
        assert!(Arc::ptr_eq(r, got), "{node}: {}", r.name);
    }
}

#[test]
fn external_local_node_gets_local_endpoints_others_share_the_default() {
    let yaml = format!(
        "{}{}",
        nodes(&["n1", "n2"]),
        web(&format!("externalTrafficPolicy: Local, {NODE_PORT}"), "{addresses: [10.0.0.1], nodeName: n1}")
    );
    let snap = build(&yaml, &Snapshot::default());
    let n1 = view(&snap, "n1");
    assert!(n1.external_traffic_local);
    assert_eq!(addrs(&n1.ports[0].local_endpoints), ["10.0.0.1"]);
    assert_eq!(addrs(&n1.ports[0].endpoints), ["10.0.0.1"]);
    let n2 = view(&snap, "n2");
    assert!(n2.external_traffic_local && n2.ports[0].local_endpoints.is_empty());
    assert_eq!(addrs(&n2.ports[0].endpoints), ["10.0.0.1"]);
    assert!(Arc::ptr_eq(resource(&snap, "n2"), resource(&snap, "no-node-object")));
    assert_ne!(resource(&snap, "n1").version, resource(&snap, "n2").version);
    assert_eq!(snap.variant_count(), 1);
    for node in ["n1", "n2", "no-node-object"] {
        check_for_node(&snap, node);
    }
}

#[test]
fn internal_local_node_gets_only_its_endpoints() {
    let yaml = format!(
        "{}{}",
        nodes(&["n1", "n2", "n3"]),
        web(
            &format!("internalTrafficPolicy: Local, {PORT}"),
            "{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}, \
             {addresses: [10.0.0.3], nodeName: n2}"
        )
    );
    let snap = build(&yaml, &Snapshot::default());
    assert_eq!(addrs(&view(&snap, "n1").ports[0].endpoints), ["10.0.0.1"]);
    assert_eq!(addrs(&view(&snap, "n2").ports[0].endpoints), ["10.0.0.2", "10.0.0.3"]);
    let n3 = view(&snap, "n3");
    assert!(n3.internal_traffic_local && n3.ports[0].endpoints.is_empty());
    assert!(Arc::ptr_eq(resource(&snap, "n3"), resource(&snap, "no-node-object")));
    assert_eq!(snap.variant_count(), 2);
}

#[test]
fn zone_hints_give_one_variant_per_zone() {
    let yaml = format!(
        "{}{}",
        nodes(&["n1@a", "n2@a", "n3@b", "n4"]),
        web(
            PORT,
            "{addresses: [10.0.0.1], nodeName: n1, hints: {forZones: [{name: a}]}}, \
             {addresses: [10.0.0.2], nodeName: n3, hints: {forZones: [{name: b}]}}, \
             {addresses: [10.0.0.3], nodeName: n9, hints: {forZones: [{name: z}]}}"
        )
    );
    let snap = build(&yaml, &Snapshot::default());
    assert_eq!(addrs(&view(&snap, "n1").ports[0].endpoints), ["10.0.0.1"]);
    assert!(Arc::ptr_eq(resource(&snap, "n1"), resource(&snap, "n2")), "one variant for zone a");
    assert_eq!(addrs(&view(&snap, "n3").ports[0].endpoints), ["10.0.0.2"]);
    let everything = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    assert_eq!(addrs(&view(&snap, "n4").ports[0].endpoints), everything, "no zone: no hints");
    assert!(Arc::ptr_eq(resource(&snap, "n4"), resource(&snap, "no-node-object")));
    // Zones a and b only: no node is in zone z.
    assert_eq!(snap.variant_count(), 2);
    for node in ["n1", "n3", "n4"] {
        check_for_node(&snap, node);
    }
}

#[test]
fn node_hints_share_identical_variants() {
    let yaml = format!(
        "{}{}",
        nodes(&["n1@a", "n2@a", "n3@a"]),
        web(
            PORT,
            "{addresses: [10.0.0.1], nodeName: n1, hints: {forNodes: [{name: n1}, {name: n2}], forZones: [{name: a}]}}, \
             {addresses: [10.0.0.2], nodeName: n3, hints: {forNodes: [{name: n3}], forZones: [{name: a}]}}"
        )
    );
    let snap = build(&yaml, &Snapshot::default());
    assert_eq!(addrs(&view(&snap, "n1").ports[0].endpoints), ["10.0.0.1"]);
    assert!(Arc::ptr_eq(resource(&snap, "n1"), resource(&snap, "n2")), "interned by content");
    assert_eq!(addrs(&view(&snap, "n3").ports[0].endpoints), ["10.0.0.2"]);
    // Every ready endpoint hints zone a, so the zone's other nodes get all of them: the default.
    assert_eq!(addrs(&view(&snap, "stranger").ports[0].endpoints), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(snap.variant_count(), 3);
}

#[test]
fn terminating_fallback_is_separate_for_cluster_and_local_endpoints() {
    let terminating = "conditions: {ready: false, serving: true, terminating: true}";
    let yaml = format!(
        "{}{}",
        nodes(&["n1", "n2"]),
        web(
            &format!("externalTrafficPolicy: Local, {NODE_PORT}"),
            &format!("{{addresses: [10.0.0.1], nodeName: n1}}, {{addresses: [10.0.0.2], nodeName: n2, {terminating}}}")
        )
    );
    let snap = build(&yaml, &Snapshot::default());
    let n2 = view(&snap, "n2");
    assert_eq!(addrs(&n2.ports[0].endpoints), ["10.0.0.1"], "a ready endpoint exists in the cluster");
    assert_eq!(addrs(&n2.ports[0].local_endpoints), ["10.0.0.2(t)"], "none ready on n2");
    assert_eq!(addrs(&view(&snap, "n1").ports[0].local_endpoints), ["10.0.0.1"]);
}

#[test]
fn a_node_without_node_object_still_gets_its_local_endpoints() {
    let yaml =
        web(&format!("externalTrafficPolicy: Local, {NODE_PORT}"), "{addresses: [10.0.0.1], nodeName: n1}");
    let snap = build(&yaml, &Snapshot::default());
    assert_eq!(addrs(&view(&snap, "n1").ports[0].local_endpoints), ["10.0.0.1"]);
    assert!(view(&snap, "n2").ports[0].local_endpoints.is_empty());
}

#[test]
fn unchanged_resources_and_variants_keep_their_arcs() {
    let yaml = format!(
        "{}{}---\nkind: Service\nmetadata: {{name: other, namespace: ns}}\nspec: {{clusterIP: 10.96.0.2, {PORT}}}\n",
        nodes(&["n1@a", "n2@b"]),
        web(
            &format!("externalTrafficPolicy: Local, {NODE_PORT}"),
            "{addresses: [10.0.0.1], nodeName: n1, hints: {forZones: [{name: a}]}}, \
             {addresses: [10.0.0.2], nodeName: n2, hints: {forZones: [{name: b}]}}"
        )
    );
    let first = build(&yaml, &Snapshot::default());
    let second = build(&yaml, &first);
    for node in ["n1", "n2", "stranger"] {
        let (a, b) = (
            first.for_node(ResourceType::ServiceView, node),
            second.for_node(ResourceType::ServiceView, node),
        );
        for (x, y) in a.zip(b) {
            assert!(Arc::ptr_eq(x, y), "{node}: {}", x.name);
        }
        let configs = |s: &Snapshot| s.get(ResourceType::NodeConfig, node, node).map(Arc::as_ptr);
        assert_eq!(configs(&first), configs(&second));
    }
    assert!(first.variant_count() > 0);
    assert_eq!(first.variant_count(), second.variant_count());
}

#[test]
fn node_configs_carry_the_cluster_cidrs() {
    let clusters = [("c".to_owned(), Arc::new(state_of(&nodes(&["n1"]))))].into_iter().collect();
    let options =
        BuildOptions { cluster_cidrs: vec!["10.244.0.0/16".parse().expect("cidr")], ..Default::default() };
    let snap = Snapshot::build(&clusters, &Snapshot::default(), &options);
    let config = snap.get(ResourceType::NodeConfig, "n1", "n1").expect("n1");
    assert_eq!(NodeConfig::decode(config.body()).expect("valid").cluster_cidrs, options.cluster_cidrs);
    assert!(snap.get(ResourceType::NodeConfig, "n1", "n2").is_none());
}

/// Two clusters: each with a node and Service `ns/web` (global or not) whose endpoint is `ep`.
fn two_clusters(east: &str, west: &str) -> BTreeMap<String, Arc<ClusterState>> {
    [("east", east, "node-e", "10.1.0.1"), ("west", west, "node-w", "10.2.0.1")]
        .into_iter()
        .map(|(cluster, annotations, node, ep)| {
            let yaml = format!(
                "{}{}",
                nodes(&[node]),
                web(PORT, &format!("{{addresses: [{ep}], conditions: {{ready: true}}}}")).replace(
                    "metadata: {name: web, namespace: ns}",
                    &format!("metadata: {{name: web, namespace: ns, annotations: {{{annotations}}}}}")
                )
            );
            (cluster.to_owned(), Arc::new(state_of(&yaml)))
        })
        .collect()
}

fn endpoints_of(snap: &Snapshot, node: &str, name: &str) -> Vec<String> {
    let r = snap.get(ResourceType::ServiceView, node, name).expect("the view");
    let view = ServiceView::decode(r.body()).expect("valid view");
    view.ports[0]
        .endpoints
        .iter()
        .map(|e| format!("{}@{}", e.address, if e.cluster().is_empty() { "home" } else { e.cluster() }))
        .collect()
}

#[test]
fn with_several_clusters_a_node_gets_its_own_clusters_services_only() {
    let clusters = two_clusters("", "");
    let snap = Snapshot::build(&clusters, &Snapshot::default(), &BuildOptions::default());
    let names = |node: &str| -> Vec<String> {
        snap.for_node(ResourceType::ServiceView, node).map(|r| r.name.clone()).collect()
    };
    assert_eq!(names("node-e"), ["east/ns/web"]);
    assert_eq!(names("node-w"), ["west/ns/web"]);
    assert!(names("stranger").is_empty(), "a node no cluster knows gets nothing");
    assert!(snap.get(ResourceType::ServiceView, "node-e", "west/ns/web").is_none());
    assert_eq!(snap.count_for_node(ResourceType::ServiceView, "node-e"), 1);
    assert_eq!(
        endpoints_of(&snap, "node-e", "east/ns/web"),
        ["10.1.0.1@home"],
        "not global: own endpoints only"
    );
    let after: Vec<String> = snap
        .for_node_after(ResourceType::ServiceView, "node-w", Some("east/zzz"))
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(after, ["west/ns/web"]);
}

#[test]
fn a_global_service_has_every_clusters_endpoints_with_affinity_and_withdrawal() {
    let global = "service.kpx.io/global: 'true'";
    let clusters = two_clusters(global, global);
    let snap = Snapshot::build(&clusters, &Snapshot::default(), &BuildOptions::default());
    assert_eq!(endpoints_of(&snap, "node-e", "east/ns/web"), ["10.1.0.1@home", "10.2.0.1@west"]);
    assert_eq!(endpoints_of(&snap, "node-w", "west/ns/web"), ["10.1.0.1@east", "10.2.0.1@home"]);

    // Only one side global: not merged.
    let half = two_clusters(global, "");
    let snap = Snapshot::build(&half, &Snapshot::default(), &BuildOptions::default());
    assert_eq!(endpoints_of(&snap, "node-e", "east/ns/web"), ["10.1.0.1@home"]);

    // Affinity local: own endpoints while there are some ready ones.
    let local = format!("{global}, service.kpx.io/affinity: local");
    let clusters = two_clusters(&local, global);
    let snap = Snapshot::build(&clusters, &Snapshot::default(), &BuildOptions::default());
    assert_eq!(endpoints_of(&snap, "node-e", "east/ns/web"), ["10.1.0.1@home"]);
    let mut no_local = two_clusters(&local, global);
    let east = state_of(&format!(
        "{}{}",
        nodes(&["node-e"]),
        web(PORT, "{addresses: [10.1.0.1], conditions: {ready: false}}").replace(
            "metadata: {name: web, namespace: ns}",
            &format!("metadata: {{name: web, namespace: ns, annotations: {{{local}}}}}")
        )
    ));
    no_local.insert("east".into(), Arc::new(east));
    let snap = Snapshot::build(&no_local, &Snapshot::default(), &BuildOptions::default());
    assert_eq!(
        endpoints_of(&snap, "node-e", "east/ns/web"),
        ["10.2.0.1@west"],
        "falls back to the remote cluster"
    );

    // A withdrawn cluster's endpoints are no longer offered to the others; its own nodes keep theirs.
    let clusters = two_clusters(global, global);
    let options = BuildOptions { withdrawn: ["west".to_owned()].into(), ..Default::default() };
    let snap = Snapshot::build(&clusters, &Snapshot::default(), &options);
    assert_eq!(endpoints_of(&snap, "node-e", "east/ns/web"), ["10.1.0.1@home"]);
    assert_eq!(endpoints_of(&snap, "node-w", "west/ns/web"), ["10.1.0.1@east", "10.2.0.1@home"]);
}

/// A Service labelled with a `service-proxy-name`: for the agents of that name only.
fn labelled(name: &str, ip: &str, proxy: &str) -> String {
    format!(
        "kind: Service\nmetadata: {{name: {name}, namespace: ns, labels: {{service.kubernetes.io/service-proxy-name: {proxy}}}}}\n\
         spec: {{clusterIP: {ip}, {PORT}}}\n---\n"
    )
}

fn names<'a>(snap: &'a Snapshot, who: Audience<'a>) -> Vec<&'a str> {
    snap.for_node(ResourceType::ServiceView, who).map(|r| r.name.as_str()).collect()
}

#[test]
fn each_service_proxy_name_gets_its_own_services_only() {
    let yaml = format!(
        "{}---\n{}{}",
        web(PORT, ""),
        labelled("b1", "10.96.0.2", "kpx-b"),
        labelled("c1", "10.96.0.3", "kpx-c")
    );
    let snap = build(&yaml, &Snapshot::default());
    let (plain, b, nobody) = (
        Audience::from("n1"),
        Audience { node: "n1", proxy: "kpx-b" },
        Audience { node: "n1", proxy: "kpx-z" },
    );
    assert_eq!(names(&snap, plain), [WEB]);
    assert_eq!(names(&snap, b), ["c/ns/b1"]);
    assert!(names(&snap, nobody).is_empty());
    assert_eq!(snap.count_for_node(ResourceType::ServiceView, plain), 1);
    assert_eq!(snap.count_for_node(ResourceType::ServiceView, b), 1);
    assert_eq!(snap.count_for_node(ResourceType::ServiceView, nobody), 0);
    assert!(snap.get(ResourceType::ServiceView, plain, "c/ns/b1").is_none());
    assert!(snap.get(ResourceType::ServiceView, b, WEB).is_none());
    assert!(snap.get(ResourceType::ServiceView, b, "c/ns/b1").is_some());
    assert_eq!((snap.service_count(), snap.proxy_name("c/ns/c1")), (3, "kpx-c"));
    assert!(snap.default_view("c/ns/c1").is_some());

    // Relabelled: it moves from kpx-c's agents to kpx-b's, and the change is recorded.
    let moved = format!(
        "{}---\n{}{}",
        web(PORT, ""),
        labelled("b1", "10.96.0.2", "kpx-b"),
        labelled("c1", "10.96.0.3", "kpx-b")
    );
    let next = build(&moved, &snap);
    assert_eq!(names(&next, b), ["c/ns/b1", "c/ns/c1"]);
    assert!(names(&next, Audience { node: "n1", proxy: "kpx-c" }).is_empty());
    let changed = next.changed_since(snap.generation(), ResourceType::ServiceView).expect("known");
    assert_eq!(changed, HashSet::from(["c/ns/c1"]));
    assert_eq!(Snapshot::differences(&snap, &next, ResourceType::ServiceView, b), ["c/ns/c1"]);

    // Label taken off: it is everybody's without a name; gone: nobody's.
    let plain_again = format!("{}---\n{}", web(PORT, ""), "kind: Service\nmetadata: {name: b1, namespace: ns}\nspec: {clusterIP: 10.96.0.2, ports: [{name: http, port: 80}]}\n");
    let last = build(&plain_again, &next);
    assert_eq!(names(&last, plain), ["c/ns/b1", WEB]);
    assert!(names(&last, b).is_empty());
    assert_eq!((last.service_count(), last.proxy_name("c/ns/b1")), (2, ""));
}
