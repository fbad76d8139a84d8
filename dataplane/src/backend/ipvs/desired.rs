//! What IPVS should hold for a node: one virtual service per entry point (ClusterIP,
//! external IP, load-balancer IP, NodePort on each node address) of every Service port and
//! family, its destinations the endpoints `categorize` chose, and the addresses the dummy
//! interface must carry so the node accepts traffic to them. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpx_proto::categorize::{self, Action, EntryKind};
use kpx_proto::types::{Endpoint, Protocol};

use super::netlink::{
    Destination, ServiceKey, VirtualService, FLAG_PERSISTENT, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};
use crate::backend::ProxyOptions;
use crate::state::NodeState;

/// Everything IPVS should hold.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DesiredIpvs {
    pub services: BTreeMap<ServiceKey, (VirtualService, Vec<Destination>)>,
    /// Service addresses the node must accept traffic for (bound to the dummy interface).
    pub addresses: BTreeSet<IpAddr>,
}

fn protocol(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => PROTO_TCP,
        Protocol::Udp => PROTO_UDP,
        Protocol::Sctp => PROTO_SCTP,
    }
}

fn destinations(endpoints: &[&Endpoint]) -> Vec<Destination> {
    let mut out: Vec<Destination> = endpoints
        .iter()
        .map(|e| Destination { address: e.address, port: e.port, weight: 1, active: 0, inactive: 0 })
        .collect();
    out.sort_by_key(|d| (d.address, d.port));
    out.dedup_by_key(|d| (d.address, d.port));
    out
}

/// The IPVS table for `state`, every virtual service using `scheduler`.
pub fn desired(state: &NodeState, options: &ProxyOptions, scheduler: &str) -> DesiredIpvs {
    let node = state.node.as_ref().map(|n| &n.value);
    let nodeport_addresses = options.nodeport_addresses(node);
    let mut out = DesiredIpvs::default();
    for view in state.services.values().map(|v| &v.value) {
        let (flags, timeout) = match view.session_affinity_timeout {
            Some(seconds) => (FLAG_PERSISTENT, seconds),
            None => (0, 0),
        };
        for pf in categorize::port_families(view, &nodeport_addresses) {
            for entry in &pf.entries {
                // Policy-Local external traffic goes to this node's endpoints only (traffic
                // from the node or its pods included, for now: that needs filtering rules).
                let endpoints = match pf.local_action(entry.kind) {
                    Some(Action::Pick) => destinations(&pf.local),
                    Some(Action::Drop | Action::Reject) => Vec::new(),
                    None if pf.cluster_action(entry.kind) == Action::Pick => destinations(&pf.cluster),
                    None => Vec::new(),
                };
                let key = ServiceKey {
                    address: entry.address,
                    protocol: protocol(pf.port.protocol),
                    port: entry.port,
                };
                let service = VirtualService { key, scheduler: scheduler.to_owned(), flags, timeout };
                out.services.insert(key, (service, endpoints));
                if entry.kind != EntryKind::NodePort {
                    out.addresses.insert(entry.address);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures;
    use crate::state::Versioned;
    use kpx_proto::types::NodeConfig;

    #[test]
    fn every_entry_is_a_virtual_service_with_the_chosen_endpoints() {
        let mut view = fixtures::web(&["10.244.1.2"]);
        view.ports[0].node_port = Some(30080);
        view.session_affinity_timeout = Some(600);
        let mut state = NodeState::default();
        state.services.insert(view.resource_name(), Versioned { version: "1".into(), value: view });
        let node = NodeConfig {
            name: "n1".into(),
            addresses: vec!["10.0.0.1".parse().expect("ip")],
            ..Default::default()
        };
        state.node = Some(Versioned { version: "1".into(), value: node });
        let want = desired(&state, &fixtures::NO, "rr");
        let keys: Vec<String> = want.services.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["10.0.0.1:30080/tcp", "10.96.0.10:80/tcp"]);
        for (service, dests) in want.services.values() {
            assert_eq!(
                (service.flags, service.timeout, service.scheduler.as_str()),
                (FLAG_PERSISTENT, 600, "rr")
            );
            assert_eq!(dests.iter().map(|d| d.address.to_string()).collect::<Vec<_>>(), ["10.244.1.2"]);
        }
        let vip: IpAddr = "10.96.0.10".parse().expect("ip");
        assert_eq!(want.addresses, [vip].into(), "NodePorts use the node's own addresses");
    }

    #[test]
    fn a_service_without_endpoints_has_a_virtual_service_without_destinations() {
        let state = fixtures::state(&[("web", "10.96.0.10", &[])]);
        let want = desired(&state, &fixtures::NO, "rr");
        assert_eq!(want.services.len(), 1);
        assert!(want.services.values().all(|(_, d)| d.is_empty()));
    }
}
