use kpx_proto::types::Protocol;

use super::*;
use crate::model::{ObjectKey, ServicePort};

/// An export of `cluster`, made `created` seconds after the epoch.
fn export(cluster: &str, created: i64) -> (String, ServiceExport) {
    (cluster.to_owned(), ServiceExport { created, ..Default::default() })
}

fn service(ports: &[(&str, Protocol, u16)]) -> Service {
    Service {
        key: ObjectKey { namespace: "ns".into(), name: "web".into() },
        cluster_ips: vec!["10.96.0.10".parse().expect("ip")],
        ports: (ports.iter())
            .map(|(name, protocol, port)| ServicePort {
                name: (*name).into(),
                protocol: *protocol,
                port: *port,
                node_port: None,
                app_protocol: None,
            })
            .collect(),
        ..Default::default()
    }
}

fn headless(ports: &[(&str, Protocol, u16)]) -> Service {
    Service { cluster_ips: Vec::new(), ..service(ports) }
}

fn port(name: &str, protocol: Protocol, port: u16) -> ImportPort {
    ImportPort { name: name.into(), protocol, port, app_protocol: None }
}

const TCP: Protocol = Protocol::Tcp;
const UDP: Protocol = Protocol::Udp;

#[test]
fn one_export_is_imported_as_its_service_is() {
    let a = export("a", 100);
    let web = service(&[("http", TCP, 80), ("dns", UDP, 53)]);
    let r = resolve([(a.0.as_str(), &a.1, Some(&web))]);
    let import = r.import.clone().expect("an import");
    assert_eq!(import.import_type, ImportType::ClusterSetIp);
    assert_eq!(import.ports, [port("http", TCP, 80), port("dns", UDP, 53)]);
    assert_eq!(import.clusters, ["a"]);
    assert!(r.conflicts.is_empty() && r.invalid.is_empty());
    assert_eq!(r.conflict_condition(), None);
}

#[test]
fn the_ports_are_the_union_of_the_exported_ports() {
    let (a, b) = (export("a", 100), export("b", 200));
    let (web_a, web_b) =
        (service(&[("http", TCP, 80)]), service(&[("http", TCP, 80), ("metrics", TCP, 9090)]));
    let r = resolve([(b.0.as_str(), &b.1, Some(&web_b)), (a.0.as_str(), &a.1, Some(&web_a))]);
    let import = r.import.clone().expect("an import");
    assert_eq!(import.ports, [port("http", TCP, 80), port("metrics", TCP, 9090)]);
    assert_eq!(import.clusters, ["a", "b"]);
    // The port sets differ: a conflict on every export, though nothing clashes.
    let (reason, message) = r.conflict_condition().expect("a conflict");
    assert_eq!(reason, "PortConflict");
    assert_eq!(message, "PortConflict: ports are [\"http\" 80/tcp] (cluster a exported it first; b differ)");
    // Each port is served by the clusters that have it.
    assert_eq!(import.port_clusters, [vec!["a", "b"], vec!["b"]]);
    // The same ports in another order are the same ports.
    let web_c = service(&[("metrics", TCP, 9090), ("http", TCP, 80)]);
    let r = resolve([(b.0.as_str(), &b.1, Some(&web_b)), ("c", &export("c", 300).1, Some(&web_c))]);
    assert!(r.conflicts.is_empty(), "{:?}", r.conflicts);
}

#[test]
fn a_port_of_one_name_with_another_number_is_a_conflict_the_oldest_export_wins() {
    let (a, b) = (export("a", 100), export("b", 200));
    let (web_a, web_b) = (service(&[("http", TCP, 80)]), service(&[("http", TCP, 8080)]));
    let r = resolve([(b.0.as_str(), &b.1, Some(&web_b)), (a.0.as_str(), &a.1, Some(&web_a))]);
    assert_eq!(r.import.clone().expect("an import").ports, [port("http", TCP, 80)]);
    let (reason, message) = r.conflict_condition().expect("a conflict");
    assert_eq!(reason, "PortConflict");
    assert_eq!(message, "PortConflict: port \"http\" is 80/tcp (cluster a exported it first; b differ)");
}

#[test]
fn a_port_number_with_another_protocol_name_pair_is_a_conflict() {
    let (a, b) = (export("a", 100), export("b", 200));
    let (web_a, web_b) = (service(&[("http", TCP, 80)]), service(&[("web", TCP, 80)]));
    let r = resolve([(a.0.as_str(), &a.1, Some(&web_a)), (b.0.as_str(), &b.1, Some(&web_b))]);
    assert_eq!(r.import.clone().expect("an import").ports, [port("http", TCP, 80)]);
    assert_eq!(r.conflicts.len(), 1);
    assert_eq!((r.conflicts[0].field, r.conflicts[0].winner.as_str()), (Field::Port, "a"));
    // The same number over another protocol is another port.
    let web_c = service(&[("dns", UDP, 80)]);
    let c = export("c", 300);
    let r = resolve([(a.0.as_str(), &a.1, Some(&web_a)), (c.0.as_str(), &c.1, Some(&web_c))]);
    assert_eq!(r.import.clone().expect("an import").ports, [port("http", TCP, 80), port("dns", UDP, 80)]);
    assert_eq!(r.conflicts.len(), 1, "the sets differ, nothing clashes: {:?}", r.conflicts);
    assert_eq!(r.conflicts[0].detail, "ports are [\"http\" 80/tcp]");
}

#[test]
fn a_port_one_cluster_gives_another_number_is_served_by_the_winner_alone() {
    // sig-multicluster's StrictPortConflict: "tcp" is 42 in a, 4242 in b.
    let (a, b) = (export("a", 100), export("b", 200));
    let (web_a, web_b) = (service(&[("tcp", TCP, 42), ("udp", UDP, 42)]), service(&[("tcp", TCP, 4242)]));
    let r = resolve([(a.0.as_str(), &a.1, Some(&web_a)), (b.0.as_str(), &b.1, Some(&web_b))]);
    let import = r.import.expect("an import");
    assert_eq!(import.ports, [port("tcp", TCP, 42), port("udp", UDP, 42)]);
    assert_eq!(import.port_clusters, [vec!["a"], vec!["a"]]);
    // Another name: both ports, each served by its own cluster.
    let web_b = service(&[("tcp2", TCP, 4242)]);
    let r = resolve([(a.0.as_str(), &a.1, Some(&web_a)), (b.0.as_str(), &b.1, Some(&web_b))]);
    let import = r.import.expect("an import");
    assert_eq!(import.ports, [port("tcp", TCP, 42), port("udp", UDP, 42), port("tcp2", TCP, 4242)]);
    assert_eq!(import.port_clusters, [vec!["a"], vec!["a"], vec!["b"]]);
}

#[test]
fn families_policies_and_distribution_come_from_the_oldest_and_differences_conflict() {
    let (a, b) = (export("a", 100), export("b", 200));
    let web_a = Service {
        ip_families: vec![Family::V4],
        internal_traffic_policy: TrafficPolicy::Local,
        traffic_distribution: Some("PreferClose".into()),
        ..service(&[("http", TCP, 80)])
    };
    let r = resolve([(a.0.as_str(), &a.1, Some(&web_a)), (b.0.as_str(), &b.1, Some(&web_a))]);
    assert!(r.conflicts.is_empty(), "{:?}", r.conflicts);
    let web_b = Service {
        ip_families: vec![Family::V6, Family::V4],
        internal_traffic_policy: TrafficPolicy::Cluster,
        traffic_distribution: None,
        ..web_a.clone()
    };
    let r = resolve([(b.0.as_str(), &b.1, Some(&web_b)), (a.0.as_str(), &a.1, Some(&web_a))]);
    let import = r.import.clone().expect("an import");
    assert_eq!(import.ip_families, [Family::V4, Family::V6], "the oldest's first, then the others'");
    assert_eq!(import.internal_traffic_policy, TrafficPolicy::Local);
    assert_eq!(import.traffic_distribution.as_deref(), Some("PreferClose"));
    let (reason, _) = r.conflict_condition().expect("conflicts");
    assert_eq!(reason, "InternalTrafficPolicyConflict,TrafficDistributionConflict,IPFamilyConflict");
}

#[test]
fn exports_of_one_age_are_ordered_by_cluster_name() {
    let (a, b) = (export("a", 100), export("b", 100));
    let (web_a, web_b) = (service(&[("http", TCP, 80)]), service(&[("http", TCP, 81)]));
    for order in [
        [(a.0.as_str(), &a.1, Some(&web_a)), (b.0.as_str(), &b.1, Some(&web_b))],
        [(b.0.as_str(), &b.1, Some(&web_b)), (a.0.as_str(), &a.1, Some(&web_a))],
    ] {
        let r = resolve(order);
        assert_eq!(r.import.clone().expect("an import").ports, [port("http", TCP, 80)]);
        assert_eq!(r.conflicts[0].winner, "a");
    }
}

#[test]
fn headless_against_not_is_a_type_conflict_the_oldest_export_wins() {
    let (a, b) = (export("a", 100), export("b", 200));
    let (web_a, web_b) = (headless(&[("http", TCP, 80)]), service(&[("http", TCP, 80)]));
    let r = resolve([(b.0.as_str(), &b.1, Some(&web_b)), (a.0.as_str(), &a.1, Some(&web_a))]);
    assert_eq!(r.import.clone().expect("an import").import_type, ImportType::Headless);
    let (reason, message) = r.conflict_condition().expect("a conflict");
    assert_eq!(reason, "TypeConflict");
    assert!(message.contains("cluster a exported it first; b differ"), "{message}");
}

#[test]
fn session_affinity_and_its_timeout_come_from_the_oldest_export() {
    let (a, b, c) = (export("a", 100), export("b", 200), export("c", 300));
    let affinity = |timeout| Service { session_affinity_timeout: timeout, ..service(&[("http", TCP, 80)]) };
    let (web_a, web_b, web_c) = (affinity(Some(100)), affinity(None), affinity(Some(200)));
    let r = resolve([
        (a.0.as_str(), &a.1, Some(&web_a)),
        (b.0.as_str(), &b.1, Some(&web_b)),
        (c.0.as_str(), &c.1, Some(&web_c)),
    ]);
    assert_eq!(r.import.clone().expect("an import").session_affinity_timeout, Some(100));
    let (reason, message) = r.conflict_condition().expect("conflicts");
    assert_eq!(reason, "SessionAffinityConflict,SessionAffinityConfigConflict");
    assert!(
        message.contains("sessionAffinity ClientIP (cluster a exported it first; b differ)"),
        "{message}"
    );
    assert!(message.contains("timeout 100 s (cluster a exported it first; c differ)"), "{message}");
}

#[test]
fn an_export_without_a_valid_service_takes_no_part() {
    let (a, b, c) = (export("a", 100), export("b", 50), export("c", 10));
    let web_a = service(&[("http", TCP, 80)]);
    let external = Service { service_type: ServiceType::ExternalName, ..service(&[("http", TCP, 81)]) };
    let r = resolve([
        (a.0.as_str(), &a.1, Some(&web_a)),
        (b.0.as_str(), &b.1, None),
        (c.0.as_str(), &c.1, Some(&external)),
    ]);
    assert_eq!(r.invalid.get("b"), Some(&Invalid::NoService));
    assert_eq!(r.invalid.get("c"), Some(&Invalid::ExternalName));
    assert_eq!(Invalid::ExternalName.reason(), "InvalidServiceType");
    let import = r.import.clone().expect("an import of the valid one");
    assert_eq!((import.clusters, import.ports), (vec!["a".to_owned()], vec![port("http", TCP, 80)]));
    assert!(r.conflicts.is_empty(), "the older invalid exports win nothing");
    let r = resolve([(b.0.as_str(), &b.1, None), (c.0.as_str(), &c.1, Some(&external))]);
    assert_eq!(r.import, None, "no valid export: no import");
}

#[test]
fn the_import_carries_the_winning_exports_labels_and_annotations() {
    let mut a = export("a", 100);
    a.1.labels.insert("tier".into(), "web".into());
    a.1.annotations.insert("owner".into(), "team-a".into());
    let mut b = export("b", 200);
    b.1.labels.insert("tier".into(), "other".into());
    let web = service(&[("http", TCP, 80)]);
    let r = resolve([(b.0.as_str(), &b.1, Some(&web)), (a.0.as_str(), &a.1, Some(&web))]);
    let import = r.import.clone().expect("an import");
    assert_eq!(import.labels, a.1.labels);
    assert_eq!(import.annotations, a.1.annotations);
    let (reason, _) = r.conflict_condition().expect("they differ: a conflict");
    assert_eq!(reason, "LabelsConflict,AnnotationsConflict");
}

mod properties {
    //! For any exports: the resolution does not depend on the order they are read in,
    //! every valid export's port is in the import or named by a conflict, and the import's
    //! ports never clash with each other.

    use proptest::prelude::*;

    use super::*;

    /// A port as drawn: its name, whether UDP, its number.
    type Drawn = (String, bool, u16);
    /// An export as drawn: its age, its Service's ports (`None`: no Service), headless.
    type Offered = (i64, Option<Vec<Drawn>>, bool);

    fn offer() -> impl Strategy<Value = Offered> {
        let port = (prop::sample::select(vec!["http", "dns", "metrics"]), any::<bool>(), 79u16..82);
        let ports = prop::collection::vec(port.prop_map(|(n, udp, p)| (n.to_owned(), udp, p)), 1..3);
        (0i64..3, prop::option::weighted(0.85, ports), any::<bool>())
    }

    fn build(offers: &[Offered]) -> Vec<((String, ServiceExport), Option<Service>)> {
        (offers.iter().enumerate())
            .map(|(i, (created, ports, is_headless))| {
                let service = ports.as_ref().map(|ports| {
                    let mut ports: Vec<Drawn> = ports.clone();
                    // A Service's own ports have distinct names and distinct number/protocol pairs.
                    ports.sort();
                    ports.dedup_by(|a, b| a.0 == b.0 || (a.1, a.2) == (b.1, b.2));
                    let ports: Vec<(&str, Protocol, u16)> = (ports.iter())
                        .map(|(n, udp, p)| (n.as_str(), if *udp { UDP } else { TCP }, *p))
                        .collect();
                    if *is_headless {
                        headless(&ports)
                    } else {
                        service(&ports)
                    }
                });
                (export(&format!("c{i}"), *created), service)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn any_exports_resolve_alike_in_any_order(offers in prop::collection::vec(offer(), 1..5)) {
            let exports = build(&offers);
            let forward = resolve(exports.iter().map(|(e, s)| (e.0.as_str(), &e.1, s.as_ref())));
            let backward = resolve(exports.iter().rev().map(|(e, s)| (e.0.as_str(), &e.1, s.as_ref())));
            prop_assert_eq!(&forward, &backward);
            if let Some(import) = &forward.import {
                for (i, a) in import.ports.iter().enumerate() {
                    for b in &import.ports[i + 1..] {
                        prop_assert!(a.name != b.name && (a.port, a.protocol) != (b.port, b.protocol), "{:?}", import.ports);
                    }
                }
                for (export, service) in &exports {
                    let Some(service) = service else { continue };
                    for p in &service.ports {
                        let wanted = port(&p.name, p.protocol, p.port);
                        let in_conflict = forward.conflicts.iter().any(|c| c.field == Field::Port && c.losers.contains(&export.0));
                        prop_assert!(import.ports.contains(&wanted) || in_conflict, "{:?} of {}", wanted, export.0);
                    }
                }
            }
        }
    }
}
