//! What a Service port means on a node, per IP family, whatever the backend:
//! its entry points and, for each, where the traffic goes. Every backend
//! renders these decisions and the packet tracer explains them; none makes its
//! own, so policy behaves the same everywhere.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::family::Family;
use crate::types::{Endpoint, ServicePort, ServiceView};

/// How an entry point is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    ClusterIp,
    ExternalIp,
    LoadBalancer,
    NodePort,
}

/// One entry point: `address:port` over the port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub address: IpAddr,
    pub port: u16,
}

impl Entry {
    pub fn is_external(&self) -> bool {
        self.kind != EntryKind::ClusterIp
    }
}

/// What happens to traffic that an endpoint set cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Pick one of the set's endpoints.
    Pick,
    /// Silently drop (a traffic policy Local without endpoints here).
    Drop,
    /// Reject at once (the Service has no endpoints at all).
    Reject,
}

/// One port of a Service in one family.
#[derive(Debug, Clone)]
pub struct PortFamily<'a> {
    pub view: &'a ServiceView,
    pub port: &'a ServicePort,
    pub family: Family,
    /// The cluster set: ClusterIP traffic, external traffic of policy Cluster, and external
    /// traffic of policy Local that comes from the node itself or its pods.
    pub cluster: Vec<&'a Endpoint>,
    /// The node's own endpoints, for external traffic of policy Local.
    pub local: Vec<&'a Endpoint>,
    pub entries: Vec<Entry>,
}

/// Every port of `view` in every family it has ClusterIPs of. NodePorts open on
/// `nodeport_addresses` (of the right family).
pub fn port_families<'a>(view: &'a ServiceView, nodeport_addresses: &[IpAddr]) -> Vec<PortFamily<'a>> {
    let mut out = Vec::new();
    for port in &view.ports {
        for family in Family::ALL {
            if !view.cluster_ips.iter().any(|ip| Family::of(ip) == family) {
                continue;
            }
            let mine =
                |ips: &[IpAddr]| ips.iter().filter(|a| Family::of(a) == family).copied().collect::<Vec<_>>();
            let of_family = |eps: &'a [Endpoint]| {
                eps.iter().filter(|e| Family::of(&e.address) == family).collect::<Vec<_>>()
            };
            let mut entries = Vec::new();
            let at = |kind, address| Entry { kind, address, port: port.port };
            entries.extend(mine(&view.cluster_ips).into_iter().map(|a| at(EntryKind::ClusterIp, a)));
            entries.extend(mine(&view.external_ips).into_iter().map(|a| at(EntryKind::ExternalIp, a)));
            entries.extend(mine(&view.load_balancer_ips).into_iter().map(|a| at(EntryKind::LoadBalancer, a)));
            if let Some(node_port) = port.node_port {
                entries.extend(mine(nodeport_addresses).into_iter().map(|address| Entry {
                    kind: EntryKind::NodePort,
                    address,
                    port: node_port,
                }));
            }
            out.push(PortFamily {
                view,
                port,
                family,
                cluster: of_family(&port.endpoints),
                local: if view.external_traffic_local {
                    of_family(&port.local_endpoints)
                } else {
                    Vec::new()
                },
                entries,
            });
        }
    }
    out
}

impl PortFamily<'_> {
    /// External traffic goes to the node's own endpoints and keeps its client address.
    pub fn external_local(&self) -> bool {
        self.view.external_traffic_local
    }

    /// Whether external traffic to an entry of `kind` is always masqueraded (policy Cluster).
    pub fn masquerade_external(&self, kind: EntryKind) -> bool {
        kind != EntryKind::ClusterIp && !self.external_local()
    }

    /// What the cluster set does for an entry of `kind`.
    pub fn cluster_action(&self, kind: EntryKind) -> Action {
        let internal_local = self.view.internal_traffic_local;
        if !self.cluster.is_empty() {
            Action::Pick
        } else if (self.local.is_empty() || kind == EntryKind::ClusterIp) && !internal_local {
            Action::Reject
        } else {
            Action::Drop
        }
    }

    /// What the node's own set does for external traffic of policy Local; `None` when the
    /// entry is not such or the cluster set already decides (no endpoints at all).
    pub fn local_action(&self, kind: EntryKind) -> Option<Action> {
        if kind == EntryKind::ClusterIp || !self.external_local() {
            return None;
        }
        if !self.local.is_empty() {
            Some(Action::Pick)
        } else if self.cluster.is_empty() {
            None
        } else {
            Some(Action::Drop)
        }
    }

    /// For a load-balancer entry with source ranges: the sources allowed (ranges of the family,
    /// and the load-balancer IP itself when one of `node_addresses` is inside them), as the
    /// fewest prefixes that cover them. `None`: every source is allowed.
    pub fn allowed_sources(&self, entry: &Entry, node_addresses: &[IpAddr]) -> Option<Vec<IpNet>> {
        let ranges = &self.view.load_balancer_source_ranges;
        if entry.kind != EntryKind::LoadBalancer || ranges.is_empty() {
            return None;
        }
        let mut allowed: Vec<IpNet> =
            ranges.iter().filter(|r| Family::of_net(r) == self.family).map(IpNet::trunc).collect();
        if node_addresses.iter().any(|n| allowed.iter().any(|r| r.contains(n))) {
            allowed.push(IpNet::from(entry.address));
        }
        // The same sources as the fewest prefixes: overlapping ones (a /19 inside a /16) are
        // one, which interval sets require.
        Some(IpNet::aggregate(&allowed))
    }

    /// Every endpoint this port may send to (both sets), without repeats.
    pub fn all_endpoints(&self) -> Vec<&Endpoint> {
        let mut all: Vec<&Endpoint> = self.cluster.iter().chain(&self.local).copied().collect();
        all.sort();
        all.dedup();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_source_ranges_are_one_prefix() {
        let mut view = ServiceView::new("c", "ns", "lb", vec!["10.96.0.1".parse().expect("ip")], vec![]);
        view.ports.push(ServicePort::new("http", crate::types::Protocol::Tcp, 80, vec![]));
        view.load_balancer_ips = vec!["192.0.2.1".parse().expect("ip")];
        view.load_balancer_source_ranges =
            ["198.51.0.0/16", "198.51.32.0/19", "203.0.113.0/25", "203.0.113.128/25"]
                .map(|r| r.parse().expect("cidr"))
                .to_vec();
        let pf = &port_families(&view, &[])[0];
        let entry = pf.entries.iter().find(|e| e.kind == EntryKind::LoadBalancer).expect("lb entry");
        let allowed: Vec<String> =
            pf.allowed_sources(entry, &[]).expect("ranges").iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["198.51.0.0/16", "203.0.113.0/24"]);
    }
}
