use std::time::Duration;

use kpx_proto::types::ServiceView;
use kpx_proto::ResourceType;

use super::tracker::{ChangeSet, ServiceRef, Tracker};
use super::*;
use crate::model::{ClusterState, ObjectChanges, ObjectKey};
use crate::source::manifest::state_of;
use crate::source::{Reachability, SourceEvent};

/// Service `ns/<name>` (annotations as YAML flow entries) with one ready endpoint per
/// address, all on `node`.
fn service(name: &str, annotations: &str, addresses: &[&str], node: &str) -> String {
    let endpoints: Vec<String> =
        addresses.iter().map(|a| format!("{{addresses: [{a}], nodeName: {node}}}")).collect();
    format!(
        "kind: Service\nmetadata: {{name: {name}, namespace: ns, annotations: {{{annotations}}}}}\n\
         spec: {{clusterIP: 10.96.0.1, ports: [{{name: http, port: 80}}]}}\n---\n\
         kind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: ns, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n---\n",
        endpoints.join(", ")
    )
}

fn node(name: &str, zone: Option<&str>, address: &str) -> String {
    let labels = zone.map_or(String::new(), |z| format!(", labels: {{topology.kubernetes.io/zone: {z}}}"));
    format!("kind: Node\nmetadata: {{name: {name}{labels}}}\nstatus: {{addresses: [{{type: InternalIP, address: {address}}}]}}\n---\n")
}

const GLOBAL: &str = "service.kpx.io/global: 'true'";

/// Every object of `yaml` as an upsert.
fn upserts(yaml: &str) -> ObjectChanges {
    ObjectChanges::between(&Default::default(), &state_of(yaml))
}

fn key(name: &str) -> ObjectKey {
    ObjectKey { namespace: "ns".into(), name: name.into() }
}

fn touched(changes: &ChangeSet) -> Vec<String> {
    changes.services.iter().map(|(c, k)| format!("{c}/{k}")).collect()
}

fn tracker(clusters: &[(&str, &str)]) -> Tracker {
    let mut tracker = Tracker::new(clusters.iter().map(|(c, _)| (*c).to_owned()), vec![]);
    for (cluster, yaml) in clusters {
        tracker.apply(cluster, SourceEvent::Replace(state_of(yaml)), &mut ChangeSet::default());
    }
    tracker
}

#[test]
fn a_slice_change_touches_its_service_before_and_after_a_move() {
    let yaml = format!("{}{}", service("a", "", &["10.0.0.1"], "n1"), service("b", "", &["10.0.0.2"], "n1"));
    let mut t = tracker(&[("c", &yaml)]);
    let mut changes = ChangeSet::default();
    let moved = state_of(&yaml).slices[&key("a-1")].clone();
    let moved = crate::model::EndpointSlice { service_name: "b".into(), ..moved };
    t.apply(
        "c",
        SourceEvent::Apply(ObjectChanges {
            slices: [(key("a-1"), Some(moved))].into(),
            ..Default::default()
        }),
        &mut changes,
    );
    assert_eq!(touched(&changes), ["c/ns/a", "c/ns/b"]);
    assert!(changes.nodes.is_empty());
    let views = t.views(&changes);
    let a = views.services.iter().find(|(n, _)| n == "c/ns/a").and_then(|(_, v)| v.as_ref()).expect("a");
    assert!(a.default.ports[0].endpoints.is_empty(), "a lost its slice");
}

#[test]
fn a_global_service_change_touches_the_same_service_in_the_clusters_that_have_it() {
    let east = format!(
        "{}{}",
        service("web", GLOBAL, &["10.1.0.1"], "ne"),
        service("other", "", &["10.1.0.2"], "ne")
    );
    let west = service("web", GLOBAL, &["10.2.0.1"], "nw");
    let south = service("other", "", &["10.3.0.1"], "ns");
    let mut t = tracker(&[("east", &east), ("west", &west), ("south", &south)]);
    let mut changes = ChangeSet::default();
    t.apply("east", SourceEvent::Apply(upserts(&service("web", GLOBAL, &["10.1.0.9"], "ne"))), &mut changes);
    assert_eq!(touched(&changes), ["east/ns/web", "west/ns/web"], "south has no web");
    let mut changes = ChangeSet::default();
    t.apply("east", SourceEvent::Apply(upserts(&service("other", "", &["10.1.0.9"], "ne"))), &mut changes);
    assert_eq!(touched(&changes), ["east/ns/other"], "not global: its own cluster only");
    let mut changes = ChangeSet::default();
    t.set_withdrawn(["west".to_owned()].into(), &mut changes);
    assert_eq!(touched(&changes), ["east/ns/web", "west/ns/web"], "withdrawal touches every global Service");
    let mut again = ChangeSet::default();
    t.set_withdrawn(["west".to_owned()].into(), &mut again);
    assert!(again.is_empty());
}

#[test]
fn a_node_change_touches_its_config_and_a_zone_change_the_services_that_vary() {
    let hinted = "kind: Service\nmetadata: {name: hinted, namespace: ns}\nspec: {clusterIP: 10.96.0.2, ports: [{name: http, port: 80}]}\n---\n\
                  kind: EndpointSlice\nmetadata: {name: hinted-1, namespace: ns, labels: {kubernetes.io/service-name: hinted}}\n\
                  addressType: IPv4\nports: [{name: http, port: 8080}]\n\
                  endpoints: [{addresses: [10.0.0.1], hints: {forZones: [{name: a}]}}, {addresses: [10.0.0.2], hints: {forZones: [{name: b}]}}]\n---\n";
    let yaml = format!(
        "{}{hinted}{}{}",
        service("plain", "", &["10.0.0.3"], "n1"),
        node("n1", Some("a"), "192.0.2.1"),
        node("n2", Some("b"), "192.0.2.2")
    );
    let mut t = tracker(&[("c", &yaml)]);
    t.views(&t.everything());
    let mut changes = ChangeSet::default();
    t.apply("c", SourceEvent::Apply(upserts(&node("n1", Some("a"), "192.0.2.9"))), &mut changes);
    assert_eq!(changes.nodes.iter().collect::<Vec<_>>(), ["n1"]);
    assert!(changes.services.is_empty() && changes.moved.is_empty() && !changes.zones_moved);
    let views = t.views(&changes);
    assert!(views.services.is_empty(), "an address change computes no Service view");
    let config = views.node_configs[0].1.as_ref().expect("n1's config");
    assert_eq!(config.addresses[0].to_string(), "192.0.2.9");

    let mut changes = ChangeSet::default();
    t.apply("c", SourceEvent::Apply(upserts(&node("n2", Some("c"), "192.0.2.2"))), &mut changes);
    assert!(changes.zones_moved);
    assert_eq!(changes.moved.iter().collect::<Vec<_>>(), ["n2"]);
    let views = t.views(&changes);
    let names: Vec<&str> = views.services.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["c/ns/hinted"], "only the Service whose views vary by zone");
    let hinted = views.services[0].1.as_ref().expect("served");
    assert_eq!(hinted.zones.len(), 1, "zone b has no node any more: only zone a's variant");
}

#[test]
fn an_identical_replace_touches_nothing_and_events_of_unknown_sources_are_ignored() {
    let yaml = format!("{}{}", service("a", "", &["10.0.0.1"], "n1"), node("n1", None, "192.0.2.1"));
    let mut t = tracker(&[("c", &yaml), ("d", "")]);
    let mut changes = ChangeSet::default();
    t.apply("c", SourceEvent::Replace(state_of(&yaml)), &mut changes);
    assert!(changes.is_empty(), "{changes:?}");
    t.apply("nope", SourceEvent::Replace(state_of(&yaml)), &mut changes);
    assert!(changes.is_empty());
    assert!(t.synced());
    let mut fresh = Tracker::new(["c".to_owned()], vec![]);
    fresh.apply("c", SourceEvent::Apply(upserts(&yaml)), &mut changes);
    assert!(changes.is_empty() && !fresh.synced(), "changes before a first state are not taken");
    let everything: Vec<ServiceRef> = t.everything().services.into_iter().collect();
    assert_eq!(everything, [("c".to_owned(), key("a"))]);
}

#[test]
fn withdrawal_is_due_after_the_grace_period() {
    let now = Instant::now();
    let grace = Duration::from_secs(60);
    let since =
        [("a", None), ("b", Some(now - Duration::from_secs(61))), ("c", Some(now - Duration::from_secs(10)))];
    let (withdrawn, next) = withdrawn_at(since, grace, now);
    assert_eq!(withdrawn.into_iter().collect::<Vec<_>>(), ["b"]);
    assert_eq!(next, Some(now + Duration::from_secs(50)), "c's turn comes next");
    let (withdrawn, next) = withdrawn_at([("b", Some(now))], Duration::MAX, now);
    assert!(withdrawn.is_empty() && next.is_none(), "an endless grace period never ends");
}

/// A publisher of `clusters`, its event sender and reachability senders.
struct Running {
    events: mpsc::Sender<Update>,
    reachability: BTreeMap<String, watch::Sender<Reachability>>,
    snapshots: SnapshotReceiver,
    status: StatusReceiver,
}

fn start(clusters: &[&str], grace: Duration) -> Running {
    let (publisher, snapshots, status) = Publisher::new(
        clusters.iter().map(|c| (*c).to_owned()),
        BuildOptions::default(),
        grace,
        Arc::new(ControlPlaneMetrics::default()),
    );
    let (events, events_rx) = mpsc::channel(16);
    let mut reachability = BTreeMap::new();
    let mut receivers = BTreeMap::new();
    for cluster in clusters {
        let (tx, rx) = watch::channel(Reachability::default());
        reachability.insert((*cluster).to_owned(), tx);
        receivers.insert((*cluster).to_owned(), rx);
    }
    tokio::spawn(publisher.run(events_rx, receivers));
    Running { events, reachability, snapshots, status }
}

impl Running {
    async fn send(&self, cluster: &str, event: SourceEvent) {
        self.events.send(Update { cluster: cluster.into(), event }).await.expect("publisher runs");
    }

    /// The next snapshot published.
    async fn next(&mut self) -> Arc<Snapshot> {
        tokio::time::timeout(Duration::from_secs(5), self.snapshots.changed())
            .await
            .expect("a snapshot within 5 s")
            .expect("publisher runs");
        self.snapshots.borrow_and_update().clone().expect("a snapshot")
    }
}

fn endpoints(snapshot: &Snapshot, node: &str, name: &str) -> Vec<String> {
    let resource = snapshot.get(ResourceType::ServiceView, node, name).expect("the view");
    let view = ServiceView::decode(resource.body()).expect("valid");
    view.ports[0].endpoints.iter().map(|e| e.address.to_string()).collect()
}

#[tokio::test]
async fn nothing_is_published_until_every_source_has_sent_its_first_state() {
    let mut p = start(&["east", "west"], Duration::from_secs(300));
    p.send("east", SourceEvent::Replace(state_of(&service("web", "", &["10.1.0.1"], "ne")))).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(p.snapshots.borrow().is_none(), "west has not sent its state");
    let status = p.status.borrow().clone();
    assert!(status["east"].synced && !status["west"].synced, "{status:?}");
    assert_eq!(status["east"].services, 1);
    p.send("west", SourceEvent::Replace(ClusterState::default())).await;
    let first = p.next().await;
    assert_eq!(first.generation(), 1);
    assert_eq!(first.service_count(), 1);
}

#[tokio::test]
async fn an_identical_relist_publishes_nothing_and_a_change_only_what_it_touched() {
    let yaml = format!("{}{}", service("a", "", &["10.0.0.1"], "n1"), service("b", "", &["10.0.0.2"], "n1"));
    let mut p = start(&["c"], Duration::from_secs(300));
    p.send("c", SourceEvent::Replace(state_of(&yaml))).await;
    let first = p.next().await;
    p.send("c", SourceEvent::Replace(state_of(&yaml))).await;
    p.send("c", SourceEvent::Apply(upserts(&service("b", "", &["10.0.0.3"], "n1")))).await;
    let second = p.next().await;
    assert_eq!(second.generation(), first.generation() + 1, "the relist made no snapshot");
    let changed = second.changed_since(first.generation(), ResourceType::ServiceView).expect("known");
    assert_eq!(changed.into_iter().collect::<Vec<_>>(), ["c/ns/b"]);
    let a = |s: &Snapshot| Arc::clone(s.get(ResourceType::ServiceView, "n1", "c/ns/a").expect("a"));
    assert!(Arc::ptr_eq(&a(&first), &a(&second)), "a's view is shared, not built again");
    assert_eq!(endpoints(&second, "n1", "c/ns/b"), ["10.0.0.3"]);
}

#[tokio::test]
async fn events_waiting_together_make_one_snapshot() {
    let (publisher, mut snapshots, _status) =
        Publisher::new(["c".to_owned()], BuildOptions::default(), Duration::from_secs(300), Arc::default());
    let (events, events_rx) = mpsc::channel(16);
    let update = |event| Update { cluster: "c".into(), event };
    events
        .send(update(SourceEvent::Replace(state_of(&service("a", "", &["10.0.0.1"], "n1")))))
        .await
        .expect("sent");
    for address in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
        events
            .send(update(SourceEvent::Apply(upserts(&service("a", "", &[address], "n1")))))
            .await
            .expect("sent");
    }
    let (_reach, reach_rx) = watch::channel(Reachability::default());
    tokio::spawn(publisher.run(events_rx, [("c".to_owned(), reach_rx)].into()));
    tokio::time::timeout(Duration::from_secs(5), snapshots.changed()).await.expect("in time").expect("runs");
    let snapshot = snapshots.borrow_and_update().clone().expect("published");
    assert_eq!(snapshot.generation(), 1, "one snapshot for all four events");
    assert_eq!(endpoints(&snapshot, "n1", "c/ns/a"), ["10.0.0.4"]);
}

#[tokio::test]
async fn an_unreachable_clusters_endpoints_are_withdrawn_after_the_grace_period_and_come_back() {
    let east = format!("{}{}", service("web", GLOBAL, &["10.1.0.1"], "ne"), node("ne", None, "192.0.2.1"));
    let west = format!("{}{}", service("web", GLOBAL, &["10.2.0.1"], "nw"), node("nw", None, "192.0.2.2"));
    let mut p = start(&["east", "west"], Duration::from_millis(300));
    p.send("east", SourceEvent::Replace(state_of(&east))).await;
    p.send("west", SourceEvent::Replace(state_of(&west))).await;
    let both = p.next().await;
    assert_eq!(endpoints(&both, "ne", "east/ns/web"), ["10.1.0.1", "10.2.0.1"]);
    let lost = Instant::now();
    p.reachability["west"].send_replace(Reachability { unreachable_since: Some(lost) });
    let withdrawn = p.next().await;
    assert!(lost.elapsed() >= Duration::from_millis(300), "not before the grace period");
    assert_eq!(endpoints(&withdrawn, "ne", "east/ns/web"), ["10.1.0.1"]);
    assert_eq!(
        endpoints(&withdrawn, "nw", "west/ns/web"),
        ["10.1.0.1", "10.2.0.1"],
        "its own nodes keep theirs"
    );
    p.reachability["west"].send_replace(Reachability::default());
    let back = p.next().await;
    assert_eq!(endpoints(&back, "ne", "east/ns/web"), ["10.1.0.1", "10.2.0.1"]);
}

#[test]
fn views_in_parts_are_the_views_of_everything() {
    let yaml: String = (0..5).map(|i| service(&format!("s{i}"), "", &["10.0.0.1"], "n1")).collect::<String>()
        + &node("n1", None, "192.0.2.1");
    let mut t = tracker(&[("c", &yaml)]);
    let all = t.everything();
    let whole = t.views(&all);
    let mut parts = Vec::new();
    t.views_in_parts(&all, 2, |part| parts.push(part));
    assert_eq!(parts.iter().map(|p| p.services.len()).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(parts.iter().map(|p| p.node_configs.len()).collect::<Vec<_>>(), [1, 0, 0], "nodes once");
    let names = |services: &[(String, Option<crate::view::ServiceViews>)]| -> Vec<String> {
        services.iter().map(|(n, _)| n.clone()).collect()
    };
    let joined: Vec<String> = parts.iter().flat_map(|p| names(&p.services)).collect();
    assert_eq!(joined, names(&whole.services));
    let mut nodes_only = Vec::new();
    let touched = ChangeSet { nodes: ["n1".to_owned()].into(), ..Default::default() };
    t.views_in_parts(&touched, 2, |part| nodes_only.push(part));
    assert_eq!((nodes_only.len(), nodes_only[0].node_configs.len()), (1, 1), "a part even without Services");
}

/// `ns/web`'s ServiceExport, made at `created` (RFC 3339).
fn export(created: &str) -> String {
    format!(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n\
         metadata: {{name: web, namespace: ns, creationTimestamp: '{created}'}}\n---\n"
    )
}

/// `ns/web`'s ServiceImport of `import_type` at `ips`.
fn import(import_type: &str, ips: &str) -> String {
    format!(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {{name: web, namespace: ns}}\n\
         spec: {{type: {import_type}, ips: [{ips}], ports: [{{name: http, protocol: TCP, port: 80}}]}}\n---\n"
    )
}

/// The endpoints of the import view `name` among `changes`' views, as "address@cluster"
/// (`home` for the importing cluster's own); `None` when it is not served.
fn import_endpoints(t: &mut Tracker, changes: &ChangeSet, name: &str) -> Option<Vec<String>> {
    let views = t.views(changes);
    let (_, views) = views.services.into_iter().find(|(n, _)| n == name)?;
    let view = views?.default;
    assert_eq!(view.cluster_ips[0].to_string(), "10.200.0.10", "{name}: at the ClusterSetIP");
    Some(
        (view.ports[0].endpoints.iter())
            .map(|e| format!("{}@{}", e.address, if e.cluster().is_empty() { "home" } else { e.cluster() }))
            .collect(),
    )
}

#[test]
fn an_import_is_served_over_the_endpoints_of_every_valid_export_and_follows_them() {
    let east = format!(
        "{}{}{}",
        service("web", "", &["10.1.0.1"], "ne"),
        export("2026-01-01T00:00:00Z"),
        import("ClusterSetIP", "10.200.0.10")
    );
    let west = format!("{}{}", service("web", "", &["10.2.0.1"], "nw"), export("2026-02-01T00:00:00Z"));
    let south_import = import("ClusterSetIP", "10.200.0.10");
    let mut t = tracker(&[("east", &east), ("west", &west), ("south", &south_import)]);
    let all = t.everything();
    assert_eq!(
        import_endpoints(&mut t, &all, "east/ns/web.clusterset").expect("east imports"),
        ["10.1.0.1@home", "10.2.0.1@west"]
    );
    assert_eq!(
        import_endpoints(&mut t, &all, "south/ns/web.clusterset").expect("south imports"),
        ["10.1.0.1@east", "10.2.0.1@west"],
        "a cluster that exports nothing gets every exporter's endpoints"
    );
    assert!(import_endpoints(&mut t, &all, "west/ns/web.clusterset").is_none(), "west holds no import");

    // The import's session affinity (not its Services') is the view's.
    let sticky = import("ClusterSetIP", "10.200.0.10").replace("ports:", "sessionAffinity: ClientIP, ports:");
    let mut changes = ChangeSet::default();
    t.apply("south", SourceEvent::Apply(upserts(&sticky)), &mut changes);
    let views = t.views(&changes);
    let south =
        views.services.iter().find(|(n, _)| n == "south/ns/web.clusterset").and_then(|(_, v)| v.as_ref());
    assert_eq!(south.expect("served").default.session_affinity_timeout, Some(10800));
    t.apply("south", SourceEvent::Apply(upserts(&south_import)), &mut ChangeSet::default());

    // A change of an exported Service's slices touches every cluster's import.
    let mut changes = ChangeSet::default();
    t.apply("west", SourceEvent::Apply(upserts(&service("web", "", &["10.2.0.9"], "nw"))), &mut changes);
    assert_eq!(
        touched(&changes),
        ["east/ns/web.clusterset", "south/ns/web.clusterset", "west/ns/web", "west/ns/web.clusterset"]
    );
    assert_eq!(
        import_endpoints(&mut t, &changes, "south/ns/web.clusterset").expect("served"),
        ["10.1.0.1@east", "10.2.0.9@west"]
    );

    // Unexported in west: its endpoints leave the imports.
    let mut changes = ChangeSet::default();
    let unexport = ObjectChanges { exports: [(key("web"), None)].into(), ..Default::default() };
    t.apply("west", SourceEvent::Apply(unexport), &mut changes);
    assert_eq!(
        import_endpoints(&mut t, &changes, "east/ns/web.clusterset").expect("served"),
        ["10.1.0.1@home"]
    );

    // Exported again over an ExternalName Service: not valid, no endpoints of west.
    let external = "kind: Service\nmetadata: {name: web, namespace: ns}\nspec: {type: ExternalName, externalName: web.example}\n---\n";
    let mut changes = ChangeSet::default();
    t.apply(
        "west",
        SourceEvent::Apply(upserts(&format!("{external}{}", export("2026-02-01T00:00:00Z")))),
        &mut changes,
    );
    assert_eq!(
        import_endpoints(&mut t, &changes, "east/ns/web.clusterset").expect("served"),
        ["10.1.0.1@home"]
    );

    // West valid again, then withdrawn: east's import keeps its own endpoints only.
    let mut changes = ChangeSet::default();
    t.apply("west", SourceEvent::Apply(upserts(&service("web", "", &["10.2.0.9"], "nw"))), &mut changes);
    assert_eq!(
        import_endpoints(&mut t, &changes, "east/ns/web.clusterset").expect("served"),
        ["10.1.0.1@home", "10.2.0.9@west"]
    );
    let mut changes = ChangeSet::default();
    t.set_withdrawn(["west".to_owned()].into(), &mut changes);
    assert_eq!(
        import_endpoints(&mut t, &changes, "east/ns/web.clusterset").expect("served"),
        ["10.1.0.1@home"]
    );
    t.set_withdrawn(BTreeSet::new(), &mut ChangeSet::default());

    // Headless, or no valid export anywhere: no view; the import deleted: none either.
    let mut changes = ChangeSet::default();
    t.apply("east", SourceEvent::Apply(upserts(&import("Headless", ""))), &mut changes);
    assert!(
        import_endpoints(&mut t, &changes, "east/ns/web.clusterset").is_none(),
        "headless: nothing to program"
    );
    let mut changes = ChangeSet::default();
    let gone = ObjectChanges { imports: [(key("web"), None)].into(), ..Default::default() };
    t.apply("south", SourceEvent::Apply(gone), &mut changes);
    assert!(import_endpoints(&mut t, &changes, "south/ns/web.clusterset").is_none(), "no import: no view");
}
