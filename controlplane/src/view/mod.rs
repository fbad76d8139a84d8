//! Per-node views: kube-proxy's endpoint selection, done centrally.
//!
//! Pure functions of the cluster model. A Service whose meaning does not
//! depend on the node (every Service until traffic policies and topology come
//! in) has one view shared by all nodes, so it is encoded once and the same
//! bytes (the same content-hash version) go to every node.

use std::collections::BTreeSet;

use kpx_proto::types::{Endpoint, NodeConfig, ServicePort, ServiceView};

use crate::model::{EndpointSlice, Node, Service, ServiceType};

/// Whether kpx programs this Service at all.
pub fn is_proxied(svc: &Service) -> bool {
    svc.service_type != ServiceType::ExternalName && !svc.cluster_ips.is_empty() && svc.proxy_name.is_none()
}

/// The view of one Service that every node shares; `slices` are the Service's
/// EndpointSlices (see [`crate::model::ClusterState::slices_by_service`]).
pub fn shared_view(cluster: &str, svc: &Service, slices: &[&EndpointSlice]) -> ServiceView {
    let ports = svc
        .ports
        .iter()
        .map(|port| ServicePort {
            name: port.name.clone(),
            protocol: port.protocol,
            port: port.port,
            endpoints: select_endpoints(svc, port, slices),
        })
        .collect();
    ServiceView {
        cluster: cluster.to_owned(),
        namespace: svc.key.namespace.clone(),
        name: svc.key.name.clone(),
        cluster_ips: svc.cluster_ips.clone(),
        ports,
    }
}

/// The endpoints of one Service port: the ready ones; when there are none,
/// the serving-and-terminating ones (so connections drain gracefully). The
/// target port comes from the slice port of the same name and protocol, which
/// is how a named `targetPort` resolves per endpoint. Sorted and deduplicated
/// so equal content gives equal bytes.
fn select_endpoints(
    svc: &Service,
    port: &crate::model::ServicePort,
    slices: &[&EndpointSlice],
) -> Vec<Endpoint> {
    let families: BTreeSet<bool> = svc.cluster_ips.iter().map(|ip| ip.is_ipv4()).collect();
    let mut ready = BTreeSet::new();
    let mut terminating = BTreeSet::new();
    for slice in slices {
        let Some(slice_port) =
            slice.ports.iter().find(|p| p.name == port.name && p.protocol == port.protocol)
        else {
            continue;
        };
        for ep in &slice.endpoints {
            for address in &ep.addresses {
                if !families.contains(&address.is_ipv4()) {
                    continue;
                }
                let endpoint = Endpoint {
                    address: *address,
                    port: slice_port.port,
                    node_name: ep.node_name.clone().unwrap_or_default(),
                    terminating: false,
                };
                if ep.ready && !ep.terminating {
                    ready.insert(endpoint);
                } else if ep.serving && ep.terminating {
                    terminating.insert(Endpoint { terminating: true, ..endpoint });
                }
            }
        }
    }
    if ready.is_empty() {
        terminating.into_iter().collect()
    } else {
        ready.into_iter().collect()
    }
}

/// The node config of a Node object.
pub fn node_config(node: &Node) -> NodeConfig {
    NodeConfig {
        name: node.name.clone(),
        addresses: node.addresses.clone(),
        pod_cidrs: node.pod_cidrs.clone(),
        zone: node.zone.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterState, ObjectKey, SliceEndpoint, SlicePort};
    use kpx_proto::types::Protocol;

    fn svc(ips: &[&str]) -> Service {
        Service {
            key: ObjectKey { namespace: "ns".into(), name: "web".into() },
            service_type: ServiceType::ClusterIp,
            cluster_ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
            ports: vec![crate::model::ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80 }],
            proxy_name: None,
        }
    }

    fn ep(addr: &str, ready: bool, serving: bool, terminating: bool) -> SliceEndpoint {
        SliceEndpoint {
            addresses: vec![addr.parse().expect("ip")],
            ready,
            serving,
            terminating,
            node_name: Some("n1".into()),
            zone: None,
        }
    }

    fn state_with(svc: &Service, slices: Vec<(&str, u16, Vec<SliceEndpoint>)>) -> ClusterState {
        let mut state = ClusterState::default();
        state.services.insert(svc.key.clone(), svc.clone());
        for (name, port, endpoints) in slices {
            state.slices.insert(
                ObjectKey { namespace: "ns".into(), name: name.into() },
                EndpointSlice {
                    namespace: "ns".into(),
                    name: name.into(),
                    service_name: "web".into(),
                    ports: vec![SlicePort { name: "http".into(), protocol: Protocol::Tcp, port }],
                    endpoints,
                },
            );
        }
        state
    }

    fn view_of(svc: &Service, state: &ClusterState) -> ServiceView {
        let index = state.slices_by_service();
        shared_view("c", svc, index.get(&svc.key).map_or(&[][..], Vec::as_slice))
    }

    fn addrs(view: &ServiceView) -> Vec<String> {
        view.ports[0].endpoints.iter().map(|e| format!("{}:{}", e.address, e.port)).collect()
    }

    #[test]
    fn ready_endpoints_from_all_slices_with_their_own_target_ports() {
        let s = svc(&["10.96.0.1"]);
        let state = state_with(
            &s,
            vec![
                ("a", 8080, vec![ep("10.0.0.2", true, true, false), ep("10.0.0.1", true, true, false)]),
                ("b", 9090, vec![ep("10.0.0.3", true, true, false), ep("10.0.0.4", false, false, false)]),
            ],
        );
        assert_eq!(addrs(&view_of(&s, &state)), ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:9090"]);
    }

    #[test]
    fn terminating_serving_endpoints_only_when_none_is_ready() {
        let s = svc(&["10.96.0.1"]);
        let both = state_with(
            &s,
            vec![("a", 80, vec![ep("10.0.0.1", true, true, false), ep("10.0.0.2", false, true, true)])],
        );
        assert_eq!(addrs(&view_of(&s, &both)), ["10.0.0.1:80"]);
        let only_terminating = state_with(
            &s,
            vec![("a", 80, vec![ep("10.0.0.2", false, true, true), ep("10.0.0.3", false, false, true)])],
        );
        let view = view_of(&s, &only_terminating);
        assert_eq!(addrs(&view), ["10.0.0.2:80"]);
        assert!(view.ports[0].endpoints[0].terminating);
    }

    #[test]
    fn headless_external_name_and_other_proxies_are_ignored() {
        assert!(is_proxied(&svc(&["10.96.0.1"])));
        assert!(!is_proxied(&svc(&[])));
        assert!(!is_proxied(&Service { service_type: ServiceType::ExternalName, ..svc(&["10.96.0.1"]) }));
        assert!(!is_proxied(&Service { proxy_name: Some("other".into()), ..svc(&["10.96.0.1"]) }));
    }

    #[test]
    fn endpoints_of_another_family_are_left_out() {
        let s = svc(&["10.96.0.1"]);
        let state = state_with(&s, vec![("a", 80, vec![ep("10.0.0.1", true, true, false)])]);
        let mut v6 = state.clone();
        v6.slices.values_mut().for_each(|sl| sl.endpoints = vec![ep("fd00::1", true, true, false)]);
        assert_eq!(addrs(&view_of(&s, &state)).len(), 1);
        assert!(addrs(&view_of(&s, &v6)).is_empty());
    }
}
