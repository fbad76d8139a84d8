use super::*;
use crate::source::manifest::state_of;

fn key() -> ObjectKey {
    ObjectKey { namespace: "ns".into(), name: "web".into() }
}

/// Service ns/web with `port`, a slice `web-1` of one endpoint, and its export made at `created`.
fn exported(port: u16, created: &str) -> String {
    format!(
        "kind: Service\nmetadata: {{name: web, namespace: ns}}\nspec: {{clusterIP: 10.96.0.1, ports: [{{name: http, port: {port}}}]}}\n---\n\
         kind: EndpointSlice\nmetadata: {{name: web-1, namespace: ns, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.1.0.{}], hostname: web-0}}]\n---\n\
         apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {{name: web, namespace: ns, creationTimestamp: '{created}'}}\n---\n",
        port % 256
    )
}

fn models(clusters: &[(&str, String)]) -> BTreeMap<String, Cluster> {
    clusters.iter().map(|(c, yaml)| ((*c).to_owned(), Cluster::new(state_of(yaml)))).collect()
}

fn writable(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn cidrs() -> Vec<IpNet> {
    vec!["10.200.0.0/24".parse().expect("cidr")]
}

/// The clusters' models after `plan`'s writes took effect, as the API would hold them.
fn written(mut clusters: BTreeMap<String, Cluster>, plan: &Plan) -> BTreeMap<String, Cluster> {
    let mut changes: BTreeMap<String, crate::model::ObjectChanges> = BTreeMap::new();
    for write in &plan.writes {
        match write {
            Write::ApplyImport { cluster, key, import } => {
                let held = ServiceImport {
                    key: key.clone(),
                    spec: import.clone(),
                    managed: true,
                    uid: format!("uid-{cluster}-{key}"),
                    version: crate::model::McsVersion::V1Beta1,
                };
                changes.entry(cluster.clone()).or_default().imports.insert(key.clone(), Some(held));
            }
            Write::DeleteImport { cluster, key } => {
                changes.entry(cluster.clone()).or_default().imports.insert(key.clone(), None);
            }
            Write::ApplySlice { cluster, key, slice } => {
                let held =
                    crate::model::McsSlice { key: key.clone(), spec: slice.spec.clone(), managed: true };
                changes.entry(cluster.clone()).or_default().mcs_slices.insert(key.clone(), Some(held));
            }
            Write::DeleteSlice { cluster, key } => {
                changes.entry(cluster.clone()).or_default().mcs_slices.insert(key.clone(), None);
            }
            Write::ExportConditions { cluster, key, conditions } => {
                let model = &clusters[cluster];
                let export = model.state().exports[key].clone();
                let export = crate::model::ServiceExport { conditions: conditions.clone(), ..export };
                changes.entry(cluster.clone()).or_default().exports.insert(key.clone(), Some(export));
            }
        }
    }
    for (cluster, change) in changes {
        clusters.get_mut(&cluster).expect("a cluster").apply(change);
    }
    clusters
}

/// Writes plan after plan until one is empty (an import's slices follow once it exists);
/// the writes of every round.
fn settle(
    mut clusters: BTreeMap<String, Cluster>,
    all: &BTreeSet<String>,
) -> (BTreeMap<String, Cluster>, Vec<Write>) {
    let mut writes = Vec::new();
    for _ in 0..4 {
        let p = plan(&clusters, all, &cidrs(), &MissingNamespaces::new(), "T9");
        if p.writes.is_empty() {
            return (clusters, writes);
        }
        writes.extend(p.writes.iter().cloned());
        clusters = written(clusters, &p);
    }
    panic!("no settled plan after four rounds: {writes:?}");
}

fn condition<'a>(plan: &'a Plan, cluster: &str, kind: &str) -> &'a Condition {
    plan.writes
        .iter()
        .find_map(|w| match w {
            Write::ExportConditions { cluster: c, conditions, .. } if c == cluster => {
                conditions.iter().find(|k| k.kind == kind)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {kind} condition for {cluster}: {plan:?}"))
}

#[test]
fn every_cluster_gets_one_import_at_one_address_and_then_nothing_is_written() {
    let clusters = models(&[
        ("east", exported(80, "2026-01-01T00:00:00Z")),
        ("west", exported(80, "2026-02-01T00:00:00Z")),
        ("south", String::new()),
    ]);
    let all = writable(&["east", "south", "west"]);
    let first = plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T1");
    let imports: Vec<(&str, &ImportSpec)> = (first.writes.iter())
        .filter_map(|w| match w {
            Write::ApplyImport { cluster, import, .. } => Some((cluster.as_str(), import)),
            _ => None,
        })
        .collect();
    assert_eq!(imports.iter().map(|(c, _)| *c).collect::<Vec<_>>(), ["east", "south", "west"]);
    let ip = imports[0].1.ips[0];
    assert!(cidrs()[0].contains(&ip), "{ip}");
    assert!(imports.iter().all(|(_, i)| i.ips == [ip] && i.ports.len() == 1), "{imports:?}");
    let valid = condition(&first, "west", "Valid");
    assert!(valid.status && valid.last_transition == "T1", "{valid:?}");
    assert!(!condition(&first, "east", "Conflict").status);

    let clusters = written(clusters, &first);
    let (clusters, writes) = settle(clusters, &all);
    let slices: Vec<String> = (writes.iter())
        .filter_map(|w| match w {
            Write::ApplySlice { cluster, key, slice } => Some(format!(
                "{cluster}:{}:{}:{}",
                key.name, slice.spec.source_cluster, slice.spec.endpoints[0].addresses[0]
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        slices,
        [
            "east:web-1-east:east:10.1.0.80",
            "east:web-1-west:west:10.1.0.80",
            "south:web-1-east:east:10.1.0.80",
            "south:web-1-west:west:10.1.0.80",
            "west:web-1-east:east:10.1.0.80",
            "west:web-1-west:west:10.1.0.80"
        ],
        "once the imports exist: an MCS slice per exporting cluster's slice, in every cluster"
    );
    assert!(
        writes.iter().all(|w| !matches!(w, Write::ApplySlice { slice, .. } if slice.spec.endpoints[0].hostname.as_deref() != Some("web-0"))),
        "each endpoint's hostname carried, for <hostname>.<cluster>.<svc>.<ns> in DNS"
    );
    let owner = |c: &str| clusters[c].state().imports[&key()].uid.clone();
    assert!(writes.iter().all(|w| match w {
        Write::ApplySlice { cluster, slice, .. } => slice.owner_uid == owner(cluster),
        _ => true,
    }));
    assert_eq!(
        plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T2").writes,
        [],
        "all written: nothing to write"
    );

    // West unexports: its MCS slices leave every cluster.
    let mut clusters = clusters;
    let mut west = clusters["west"].state().clone();
    west.exports.clear();
    clusters.get_mut("west").expect("west").replace(west);
    let p = plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T3");
    let deleted: Vec<String> = (p.writes.iter())
        .filter_map(|w| match w {
            Write::DeleteSlice { cluster, key } => Some(format!("{cluster}:{}", key.name)),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["east:web-1-west", "south:web-1-west", "west:web-1-west"]);
}

#[test]
fn an_address_an_import_holds_is_kept_and_a_write_to_one_cluster_only_is_planned() {
    let held = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\n\
                metadata: {name: web, namespace: ns, labels: {app.kubernetes.io/managed-by: kpx-controlplane}}\n\
                spec: {type: ClusterSetIP, ips: [10.200.0.77], ports: [{name: http, protocol: TCP, port: 80}]}\n---\n";
    let clusters = models(&[
        ("east", format!("{}{held}", exported(80, "2026-01-01T00:00:00Z"))),
        ("west", String::new()),
    ]);
    let p = plan(&clusters, &writable(&["east", "west"]), &cidrs(), &MissingNamespaces::new(), "T1");
    let applies: Vec<(&str, Vec<IpAddr>)> = (p.writes.iter())
        .filter_map(|w| match w {
            Write::ApplyImport { cluster, import, .. } => Some((cluster.as_str(), import.ips.clone())),
            _ => None,
        })
        .collect();
    let ip: IpAddr = "10.200.0.77".parse().expect("ip");
    assert_eq!(
        applies,
        [("west", vec![ip])],
        "east's import is as kpx would write it; west gets the same address"
    );
}

#[test]
fn conflicts_and_invalid_exports_are_conditions_on_every_export_and_kept_while_they_last() {
    let external = "kind: Service\nmetadata: {name: web, namespace: ns}\nspec: {type: ExternalName, externalName: x.example}\n---\n\
                    apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: web, namespace: ns}\n---\n";
    let clusters = models(&[
        ("east", exported(80, "2026-01-01T00:00:00Z")),
        ("west", exported(80, "2026-02-01T00:00:00Z").replace("port: 80}]}", "port: 8080}]}")),
        ("north", external.to_owned()),
    ]);
    let all = writable(&["east", "north", "west"]);
    let first = plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T1");
    for cluster in ["east", "west"] {
        let conflict = condition(&first, cluster, "Conflict");
        assert!(conflict.status && conflict.reason == "PortConflict", "{cluster}: {conflict:?}");
        assert!(conflict.message.contains("east") && conflict.message.contains("west"), "{conflict:?}");
    }
    let invalid = condition(&first, "north", "Valid");
    assert!(!invalid.status && invalid.reason == "InvalidServiceType", "{invalid:?}");

    // Written, then west agrees: only west's and east's Conflict change; Valid keeps T1.
    let clusters = written(clusters, &first);
    let mut clusters = clusters;
    let agree = state_of(&exported(80, "2026-02-01T00:00:00Z"));
    let mut west = clusters["west"].state().clone();
    west.services = agree.services;
    clusters.get_mut("west").expect("west").replace(west);
    let next = plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T2");
    let conflict = condition(&next, "west", "Conflict");
    assert!(!conflict.status && conflict.last_transition == "T2", "{conflict:?}");
    assert_eq!(condition(&next, "west", "Valid").last_transition, "T1", "Valid kept its time");
    // Every export of the name carries the conflict, north's (not valid) too.
    assert!(!condition(&next, "north", "Conflict").status);
    assert_eq!(condition(&next, "north", "Valid").last_transition, "T1");
    let clusters = written(clusters, &next);
    assert_eq!(
        plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T3").writes,
        [],
        "written: nothing more"
    );
}

#[test]
fn when_nothing_is_exported_kpx_deletes_the_imports_it_wrote_and_no_others() {
    let clusters = models(&[("east", exported(80, "2026-01-01T00:00:00Z")), ("west", String::new())]);
    let all = writable(&["east", "west"]);
    let (mut clusters, _) = settle(clusters, &all);
    let mut east = clusters["east"].state().clone();
    east.exports.clear();
    // An import another controller wrote stays.
    let other =
        ServiceImport { key: ObjectKey { namespace: "ns".into(), name: "db".into() }, ..Default::default() };
    east.imports.insert(other.key.clone(), other);
    clusters.get_mut("east").expect("east").replace(east);
    let p = plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T2");
    let said: Vec<String> = (p.writes.iter())
        .map(|w| {
            let (cluster, kind, key) = w.target();
            format!(
                "{} {cluster} {kind} {}",
                if matches!(w, Write::DeleteImport { .. } | Write::DeleteSlice { .. }) {
                    "delete"
                } else {
                    "write"
                },
                key.name
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            "delete east ServiceImport web",
            "delete east EndpointSlice web-1-east",
            "delete west ServiceImport web",
            "delete west EndpointSlice web-1-east"
        ]
    );
}

#[test]
fn an_import_waiting_for_its_namespace_makes_every_export_pending_until_it_is_written() {
    let clusters = models(&[("east", exported(80, "2026-01-01T00:00:00Z")), ("west", String::new())]);
    let all = writable(&["east", "west"]);
    let missing: MissingNamespaces = [("west".to_owned(), key())].into();
    let p = plan(&clusters, &all, &cidrs(), &missing, "T1");
    let ready = condition(&p, "east", "Ready");
    assert!(!ready.status && ready.reason == "Pending" && ready.message.contains("west"), "{ready:?}");
    assert!(
        p.writes.iter().any(|w| matches!(w, Write::ApplyImport { cluster, .. } if cluster == "west")),
        "west's import is still planned: the writer tries again"
    );
    let clusters = written(clusters, &p);
    let p = plan(&clusters, &all, &cidrs(), &MissingNamespaces::new(), "T2");
    let ready = condition(&p, "east", "Ready");
    assert!(ready.status && ready.reason == "Exported" && ready.last_transition == "T2", "{ready:?}");

    let external = "kind: Service\nmetadata: {name: web, namespace: ns}\nspec: {type: ExternalName, externalName: x.example}\n---\n\
                    apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: web, namespace: ns}\n---\n";
    let invalid = models(&[("east", external.to_owned())]);
    let p = plan(&invalid, &writable(&["east"]), &cidrs(), &MissingNamespaces::new(), "T1");
    assert_eq!(condition(&p, "east", "Ready").reason, "Failed", "not valid: not ready");
}
