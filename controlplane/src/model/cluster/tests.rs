use super::*;
use crate::source::manifest::state_of;

fn key(name: &str) -> ObjectKey {
    ObjectKey { namespace: "ns".into(), name: name.into() }
}

fn service(name: &str, global: bool) -> Service {
    Service { key: key(name), global, ..Service::default() }
}

fn slice(name: &str, service: &str, address: &str) -> EndpointSlice {
    EndpointSlice {
        namespace: "ns".into(),
        name: name.into(),
        service_name: service.into(),
        headless: false,
        ports: vec![],
        endpoints: vec![crate::model::SliceEndpoint {
            addresses: vec![address.parse().expect("ip")],
            hostname: None,
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            zone_hints: vec![],
            node_hints: vec![],
        }],
    }
}

fn names(keys: &BTreeSet<ObjectKey>) -> Vec<&str> {
    keys.iter().map(|k| k.name.as_str()).collect()
}

fn with(f: impl FnOnce(&mut ObjectChanges)) -> ObjectChanges {
    let mut changes = ObjectChanges::default();
    f(&mut changes);
    changes
}

#[test]
fn changes_touch_their_services_and_the_index_follows() {
    let mut cluster = Cluster::default();
    let touched = cluster.apply(with(|c| {
        c.services.insert(key("a"), Some(service("a", false)));
        c.services.insert(key("b"), Some(service("b", true)));
        c.slices.insert(key("s1"), Some(slice("s1", "a", "10.0.0.1")));
    }));
    assert_eq!(names(&touched.services), ["a", "b"]);
    assert_eq!(names(&touched.shared), ["b"], "only global Services are shared");
    assert_eq!(cluster.slices_of(&key("a")).len(), 1);

    // The slice moves to b: both are touched, and b is shared.
    let touched = cluster.apply(with(|c| {
        c.slices.insert(key("s1"), Some(slice("s1", "b", "10.0.0.1")));
    }));
    assert_eq!(names(&touched.services), ["a", "b"]);
    assert_eq!(names(&touched.shared), ["b"]);
    assert!(cluster.slices_of(&key("a")).is_empty());
    assert_eq!(cluster.slices_of(&key("b"))[0].name, "s1");

    // The same again: nothing.
    let touched = cluster.apply(with(|c| {
        c.slices.insert(key("s1"), Some(slice("s1", "b", "10.0.0.1")));
        c.services.insert(key("a"), Some(service("a", false)));
    }));
    assert!(touched.is_empty(), "{touched:?}");

    // A Service that stops being global is still shared, once.
    let touched = cluster.apply(with(|c| {
        c.services.insert(key("b"), Some(service("b", false)));
    }));
    assert_eq!(names(&touched.shared), ["b"]);
    let touched = cluster.apply(with(|c| {
        c.slices.insert(key("s1"), None);
        c.nodes.insert("n1".into(), None);
    }));
    assert_eq!((names(&touched.services), names(&touched.shared)), (vec!["b"], vec![]));
    assert!(touched.nodes.is_empty(), "deleting an unknown node changes nothing");
    assert!(cluster.slices_of(&key("b")).is_empty());
}

#[test]
fn a_replace_touches_only_what_differs_and_rebuilds_the_index() {
    let yaml = "kind: Service\nmetadata: {name: a, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\n\
                    kind: EndpointSlice\nmetadata: {name: a-1, namespace: ns, labels: {kubernetes.io/service-name: a}}\n\
                    addressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}]\n---\n\
                    kind: Node\nmetadata: {name: n1}\n";
    let mut cluster = Cluster::default();
    let first = cluster.replace(state_of(yaml));
    assert_eq!((names(&first.services), first.nodes.len()), (vec!["a"], 1));
    assert!(cluster.replace(state_of(yaml)).is_empty(), "an identical relist touches nothing");
    let moved = yaml.replace("10.0.0.1", "10.0.0.2");
    let touched = cluster.replace(state_of(&moved));
    assert_eq!((names(&touched.services), touched.nodes.len()), (vec!["a"], 0));
    assert_eq!(cluster.slices_of(&key("a"))[0].endpoints[0].addresses[0].to_string(), "10.0.0.2");
    let touched = cluster.replace(ClusterState::default());
    assert_eq!((names(&touched.services), touched.nodes.len()), (vec!["a"], 1));
    assert!(cluster.slices_of(&key("a")).is_empty());
}

#[test]
fn an_export_import_or_exported_services_change_touches_the_name_for_imports() {
    let export = |name: &str| crate::model::ServiceExport { key: key(name), ..Default::default() };
    let mut cluster = Cluster::default();
    let touched = cluster.apply(with(|c| {
        c.services.insert(key("web"), Some(service("web", false)));
        c.services.insert(key("db"), Some(service("db", false)));
        c.exports.insert(key("web"), Some(export("web")));
    }));
    assert_eq!(names(&touched.exported), ["web"], "the export, not the unexported db");
    let touched = cluster.apply(with(|c| {
        c.slices.insert(key("web-1"), Some(slice("web-1", "web", "10.0.0.1")));
        c.slices.insert(key("db-1"), Some(slice("db-1", "db", "10.0.0.2")));
    }));
    assert_eq!(names(&touched.exported), ["web"], "an exported Service's slice");
    let import = crate::model::ServiceImport { key: key("db"), ..Default::default() };
    let touched = cluster.apply(with(|c| {
        c.imports.insert(key("db"), Some(import.clone()));
    }));
    assert_eq!(names(&touched.exported), ["db"], "an import, exported here or not");

    // A replace touches the same: what differs, for exported or imported names only.
    let mut next = cluster.state().clone();
    next.exports.remove(&key("web"));
    next.slices.insert(key("db-1"), slice("db-1", "db", "10.0.0.9"));
    let touched = cluster.replace(next.clone());
    assert_eq!(names(&touched.exported), ["web"], "web unexported; db's slice is no export's");
    assert!(cluster.replace(next).is_empty(), "an identical replace touches nothing");
}
