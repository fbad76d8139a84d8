//! What a Service port means on a node, per IP family, whatever the backend:
//! its entry points and, for each, where the traffic goes. Every backend
//! renders these decisions and the packet tracer explains them; none makes its
//! own, so policy behaves the same everywhere.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::family::Family;
use crate::node_context::NodeContext;
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

/// The endpoint sets of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointSet {
    /// `ServicePort::endpoints`: ClusterIP traffic; external traffic too unless the
    /// internal policy is Local.
    Cluster,
    /// `ServicePort::external_endpoints`: external traffic of an internal-policy-Local
    /// Service (policy Cluster, or policy Local from the node itself or its pods).
    External,
    /// `ServicePort::local_endpoints`: external traffic of policy Local from outside.
    Local,
}

/// One port of a Service in one family.
#[derive(Debug, Clone)]
pub struct PortFamily<'a> {
    pub view: &'a ServiceView,
    pub port: &'a ServicePort,
    pub family: Family,
    /// The cluster set: ClusterIP traffic (only this node's endpoints when the internal
    /// policy is Local) and, unless it is Local, external traffic of policy Cluster and
    /// external traffic of policy Local that comes from the node itself or its pods.
    pub cluster: Vec<&'a Endpoint>,
    /// Internal policy Local: the cluster-wide endpoints, for the external traffic that
    /// would otherwise use the cluster set.
    pub external: Vec<&'a Endpoint>,
    /// The node's own endpoints, for external traffic of policy Local.
    pub local: Vec<&'a Endpoint>,
    /// Whether some node has an endpoint of this family (none: traffic is rejected).
    pub has_endpoints: bool,
    pub entries: Vec<Entry>,
}

/// Every port of `view` in every family it has ClusterIPs of, on a node in `context`:
/// NodePorts open on its NodePort addresses (of the right family); external IPs are
/// entry points unless it ignores them (kube-proxy's `AllowServiceExternalIPs` off).
pub fn port_families<'a>(view: &'a ServiceView, context: &NodeContext) -> Vec<PortFamily<'a>> {
    let nodeport_addresses = &context.nodeport_addresses;
    let external_ips: &[IpAddr] = if context.ignore_external_ips { &[] } else { &view.external_ips };
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
            entries.extend(mine(external_ips).into_iter().map(|a| at(EntryKind::ExternalIp, a)));
            entries.extend(mine(&view.load_balancer_ips).into_iter().map(|a| at(EntryKind::LoadBalancer, a)));
            if let Some(node_port) = port.node_port {
                entries.extend(mine(nodeport_addresses).into_iter().map(|address| Entry {
                    kind: EntryKind::NodePort,
                    address,
                    port: node_port,
                }));
            }
            let cluster = of_family(&port.endpoints);
            let external =
                if view.internal_traffic_local { of_family(&port.external_endpoints) } else { Vec::new() };
            let local =
                if view.external_traffic_local { of_family(&port.local_endpoints) } else { Vec::new() };
            let has_endpoints = !cluster.is_empty()
                || !external.is_empty()
                || !local.is_empty()
                || (view.internal_traffic_local && port.endpoint_families.contains(&family));
            out.push(PortFamily { view, port, family, cluster, external, local, has_endpoints, entries });
        }
    }
    out
}

impl<'a> PortFamily<'a> {
    /// External traffic goes to the node's own endpoints and keeps its client address.
    pub fn external_local(&self) -> bool {
        self.view.external_traffic_local
    }

    /// Whether external traffic to an entry of `kind` is always masqueraded (policy Cluster).
    pub fn masquerade_external(&self, kind: EntryKind) -> bool {
        kind != EntryKind::ClusterIp && !self.external_local()
    }

    /// The set that traffic to an entry of `kind` picks from, unless [`Self::local_action`]
    /// sends it to the node's own: the cluster set, or for external entries of an
    /// internal-policy-Local Service the cluster-wide one. (That one is empty only when no
    /// node has an endpoint, and then so is the cluster set; a control plane that predates
    /// it never sends it, and external traffic keeps to the cluster set as it did.)
    pub fn main_set(&self, kind: EntryKind) -> EndpointSet {
        // `external` is only ever filled for internal-policy-Local Services.
        if kind != EntryKind::ClusterIp && !self.external.is_empty() {
            EndpointSet::External
        } else {
            EndpointSet::Cluster
        }
    }

    /// The endpoints of `set`.
    pub fn endpoints(&self, set: EndpointSet) -> &[&'a Endpoint] {
        match set {
            EndpointSet::Cluster => &self.cluster,
            EndpointSet::External => &self.external,
            EndpointSet::Local => &self.local,
        }
    }

    /// What traffic to an entry of `kind` does with its [`Self::main_set`]: pick one of its
    /// endpoints; without any, drop when other nodes have some (a traffic policy Local),
    /// reject when none has (kube-proxy's "has no endpoints").
    pub fn cluster_action(&self, kind: EntryKind) -> Action {
        if !self.endpoints(self.main_set(kind)).is_empty() {
            Action::Pick
        } else if self.has_endpoints {
            Action::Drop
        } else {
            Action::Reject
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
        } else if !self.has_endpoints {
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

    /// Every endpoint this port may send to (every set), without repeats.
    pub fn all_endpoints(&self) -> Vec<&Endpoint> {
        let mut all: Vec<&Endpoint> =
            self.cluster.iter().chain(&self.external).chain(&self.local).copied().collect();
        all.sort();
        all.dedup();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::endpoint_on;

    #[test]
    fn overlapping_source_ranges_are_one_prefix() {
        let mut view = ServiceView::new("c", "ns", "lb", vec!["10.96.0.1".parse().expect("ip")], vec![]);
        view.ports.push(ServicePort::new("http", crate::types::Protocol::Tcp, 80, vec![]));
        view.load_balancer_ips = vec!["192.0.2.1".parse().expect("ip")];
        view.load_balancer_source_ranges =
            ["198.51.0.0/16", "198.51.32.0/19", "203.0.113.0/25", "203.0.113.128/25"]
                .map(|r| r.parse().expect("cidr"))
                .to_vec();
        let pf = &port_families(&view, &NodeContext::default())[0];
        let entry = pf.entries.iter().find(|e| e.kind == EntryKind::LoadBalancer).expect("lb entry");
        let allowed: Vec<String> =
            pf.allowed_sources(entry, &[]).expect("ranges").iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["198.51.0.0/16", "203.0.113.0/24"]);
    }

    /// An internal-policy-Local NodePort Service: this node's endpoints, the cluster-wide
    /// ones, and the families that have endpoints somewhere.
    fn itp_node_port(here: &[&str], all: &[&str], families: &[Family]) -> ServiceView {
        let mut port = ServicePort::new(
            "http",
            crate::types::Protocol::Tcp,
            80,
            here.iter().map(|a| endpoint_on(a, "n1")).collect(),
        );
        port.node_port = Some(30080);
        port.external_endpoints = all.iter().map(|a| endpoint_on(a, "n2")).collect();
        port.endpoint_families = families.to_vec();
        let mut view = ServiceView::new("c", "ns", "itp", vec!["10.96.0.1".parse().expect("ip")], vec![port]);
        view.internal_traffic_local = true;
        view
    }

    fn decisions(view: &ServiceView) -> [(EndpointSet, Action, usize); 2] {
        let context =
            NodeContext { nodeport_addresses: vec!["10.0.0.1".parse().expect("ip")], ..Default::default() };
        let pf = &port_families(view, &context)[0];
        [EntryKind::ClusterIp, EntryKind::NodePort].map(|kind| {
            let set = pf.main_set(kind);
            (set, pf.cluster_action(kind), pf.endpoints(set).len())
        })
    }

    #[test]
    fn internal_policy_local_keeps_external_traffic_on_the_cluster_wide_set() {
        use Action::*;
        use EndpointSet::*;
        let both = itp_node_port(&["10.244.1.1"], &["10.244.1.1", "10.244.2.1"], &[Family::V4]);
        assert_eq!(decisions(&both), [(Cluster, Pick, 1), (External, Pick, 2)]);
        let elsewhere = itp_node_port(&[], &["10.244.2.1"], &[Family::V4]);
        assert_eq!(decisions(&elsewhere), [(Cluster, Drop, 0), (External, Pick, 1)]);
        let nowhere = itp_node_port(&[], &[], &[]);
        assert_eq!(decisions(&nowhere), [(Cluster, Reject, 0), (Cluster, Reject, 0)]);
        // Without external entry points a control plane sends only the families.
        let mut cluster_ip_only = itp_node_port(&[], &[], &[Family::V4]);
        cluster_ip_only.ports[0].node_port = None;
        let pf = &port_families(&cluster_ip_only, &NodeContext::default())[0];
        assert_eq!(pf.cluster_action(EntryKind::ClusterIp), Drop);
        // A family with endpoints elsewhere does not speak for the other one.
        let v6_only = itp_node_port(&[], &[], &[Family::V6]);
        assert_eq!(decisions(&v6_only)[0].1, Reject);
        // A control plane that sends no cluster-wide set: external traffic keeps to this node's.
        let older = itp_node_port(&["10.244.1.1"], &[], &[]);
        assert_eq!(decisions(&older), [(Cluster, Pick, 1), (Cluster, Pick, 1)]);
    }
}
