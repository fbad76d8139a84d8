//! Strategies of valid kpx resources, for property tests here and in the other crates
//! (feature `testing`): Services with any mix of ports, protocols, families, endpoints,
//! NodePorts, external and load-balancer IPs, source ranges, traffic policies and affinity.

use std::net::IpAddr;

use ipnet::IpNet;
use proptest::prelude::*;

use crate::types::{Endpoint, NodeConfig, Protocol, ServicePort, ServiceView, IPVS_SCHEDULERS};

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9.-]{0,11}[a-z0-9]?"
}

fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)]
}

/// An address of one family from a small pool (so that Services share some).
fn address(v4: bool, first: u8) -> impl Strategy<Value = IpAddr> {
    (0u8..4, 1u8..20).prop_map(move |(a, b)| {
        if v4 {
            IpAddr::from([10, first, a, b])
        } else {
            IpAddr::from([0xfd00, u16::from(first), 0, 0, 0, 0, u16::from(a), u16::from(b)])
        }
    })
}

/// An endpoint on port 8080 of `node` (for hand-written cases).
pub fn endpoint_on(address: &str, node: &str) -> Endpoint {
    Endpoint::new(address.parse().expect("ip"), 8080, node, "", false)
}

fn endpoint(v4: bool) -> impl Strategy<Value = Endpoint> {
    (
        address(v4, 244),
        1u16..=65535,
        prop_oneof![Just(String::new()), Just("n1".to_owned()), Just("n2".to_owned())],
        any::<bool>(),
    )
        .prop_map(|(address, port, node_name, terminating)| {
            Endpoint::new(address, port, &node_name, "", terminating)
        })
}

fn port(families: (bool, bool), local: bool) -> impl Strategy<Value = ServicePort> {
    let eps = move |n: usize| {
        let v4 = if families.0 {
            prop::collection::vec(endpoint(true), 0..n).boxed()
        } else {
            Just(vec![]).boxed()
        };
        let v6 = if families.1 {
            prop::collection::vec(endpoint(false), 0..n).boxed()
        } else {
            Just(vec![]).boxed()
        };
        (v4, v6).prop_map(|(mut a, b)| {
            a.extend(b);
            a.sort();
            a.dedup_by_key(|e| (e.address, e.port));
            a
        })
    };
    (
        prop_oneof![Just(String::new()), "[a-z]{1,8}"],
        protocol(),
        1u16..=65535,
        eps(5),
        prop::option::of(30000u16..32768),
        eps(if local { 3 } else { 1 }),
        eps(3),
    )
        .prop_map(
            move |(name, protocol, port, endpoints, node_port, local_endpoints, external_endpoints)| {
                ServicePort {
                    name,
                    protocol,
                    port,
                    endpoints,
                    node_port,
                    local_endpoints: if local { local_endpoints } else { Vec::new() },
                    // Kept only for internal-traffic-local views (see `valid_view`).
                    external_endpoints,
                    endpoint_families: Vec::new(),
                    serving_endpoints: Vec::new(),
                }
            },
        )
}

/// A valid Service view: what a control plane may send.
pub fn valid_view() -> impl Strategy<Value = ServiceView> {
    (prop_oneof![Just((true, false)), Just((false, true)), Just((true, true))], any::<bool>()).prop_flat_map(
        |(families, local)| {
            let ip = move |first: u8| {
                let v4 =
                    if families.0 { address(true, first).prop_map(Some).boxed() } else { Just(None).boxed() };
                let v6 = if families.1 {
                    address(false, first).prop_map(Some).boxed()
                } else {
                    Just(None).boxed()
                };
                (v4, v6).prop_map(|(a, b)| a.into_iter().chain(b).collect::<Vec<IpAddr>>())
            };
            let some = move |first: u8| prop::option::of(ip(first)).prop_map(Option::unwrap_or_default);
            let ranges = prop::collection::vec(
                (0u8..255, 8u8..=32)
                    .prop_map(|(a, len)| IpNet::new(IpAddr::from([198, 51, a, 0]), len).map(|n| n.trunc())),
                0..3,
            )
            .prop_map(|r| r.into_iter().flatten().collect::<Vec<_>>());
            (
                (name(), name(), ip(96), prop::collection::vec(port(families, local), 1..4)),
                (some(200), some(201), ranges),
                (
                    any::<bool>(),
                    prop::option::of(1u16..20000),
                    prop::option::of(1u32..=86400),
                    prop::option::of(prop::sample::select(IPVS_SCHEDULERS.to_vec())),
                ),
            )
                .prop_map(
                    move |(
                        (namespace, name, cluster_ips, mut ports),
                        (external_ips, load_balancer_ips, ranges),
                        (itl, hc, sa, sched),
                    )| {
                        // Port numbers and names are unique within a Service.
                        ports.sort_by_key(|p| (p.port, p.protocol));
                        ports.dedup_by_key(|p| (p.port, p.protocol));
                        let mut seen = std::collections::BTreeSet::new();
                        for (i, p) in ports.iter_mut().enumerate() {
                            if !seen.insert(p.name.clone()) {
                                p.name = format!("p{i}");
                            }
                        }
                        let mut view = ServiceView::new("c", &namespace, &name, cluster_ips, ports);
                        view.external_ips = external_ips;
                        view.load_balancer_ips = load_balancer_ips;
                        view.load_balancer_source_ranges = ranges;
                        view.external_traffic_local = local;
                        view.internal_traffic_local = itl;
                        for p in &mut view.ports {
                            if itl {
                                // Families with endpoints somewhere: at least those listed here.
                                let mut families: Vec<crate::family::Family> = p
                                    .endpoints
                                    .iter()
                                    .chain(&p.external_endpoints)
                                    .map(|e| crate::family::Family::of(&e.address))
                                    .collect();
                                families.sort();
                                families.dedup();
                                p.endpoint_families = families;
                            } else {
                                p.external_endpoints.clear();
                            }
                        }
                        view.health_check_node_port = hc.map(|p| p + 30000).filter(|_| local);
                        view.session_affinity_timeout = sa;
                        view.ipvs_scheduler = sched.map(str::to_owned);
                        view
                    },
                )
        },
    )
}

/// A node config with addresses and pod CIDRs of both families.
pub fn node_config() -> impl Strategy<Value = NodeConfig> {
    (prop::collection::vec(prop_oneof![address(true, 0), address(false, 0)], 0..3), any::<bool>()).prop_map(
        |(addresses, cidrs)| NodeConfig {
            name: "n1".into(),
            addresses,
            pod_cidrs: if cidrs {
                vec!["10.244.0.0/16".parse().expect("cidr"), "fd00:244::/48".parse().expect("cidr")]
            } else {
                Vec::new()
            },
            ..Default::default()
        },
    )
}
