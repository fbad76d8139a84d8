//! What every backend and the packet tracer need to know about the node, derived
//! once from the node agent's settings and the node's config ([`NodeContext::derive`]),
//! so that no backend works it out for itself (and none can disagree with another).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::family::Family;
use crate::types::NodeConfig;

/// The node agent's settings that decide how Services are proxied, the same for every
/// backend (kube-proxy's `masqueradeAll`, `nodePortAddresses`, `clusterCIDR`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// Masquerade all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// Which of the node's addresses NodePorts open on.
    pub nodeport_addresses: NodePortAddresses,
    /// Pod traffic comes from these prefixes; empty: what the node's config says.
    pub cluster_cidrs: Vec<IpNet>,
}

/// kube-proxy's `nodePortAddresses`: which of the node's addresses NodePorts open on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every one (kube-proxy's default with iptables and IPVS).
    #[default]
    All,
    /// The node's primary address of each family: the first its config lists, InternalIPs
    /// coming before ExternalIPs (`"primary"`; kube-proxy's default with nftables).
    Primary,
    /// Those inside these prefixes.
    Cidrs(Vec<IpNet>),
}

impl NodePortAddresses {
    /// Which of `addresses` (as the node config lists them) NodePorts open on.
    pub fn select(&self, addresses: &[IpAddr]) -> Vec<IpAddr> {
        match self {
            NodePortAddresses::All => addresses.to_vec(),
            NodePortAddresses::Primary => Family::ALL
                .into_iter()
                .filter_map(|f| addresses.iter().find(|a| Family::of(a) == f))
                .copied()
                .collect(),
            NodePortAddresses::Cidrs(cidrs) => {
                addresses.iter().filter(|a| cidrs.iter().any(|c| c.contains(*a))).copied().collect()
            }
        }
    }
}

/// kube-proxy's local-traffic detector: traffic from these prefixes comes from pods.
/// A family without prefixes has no detector (nothing is known to be pod traffic).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LocalDetector {
    cidrs: Vec<IpNet>,
}

impl LocalDetector {
    /// A detector over `cidrs` (host bits cleared, sorted, without repeats).
    pub fn new(cidrs: impl IntoIterator<Item = IpNet>) -> Self {
        let mut cidrs: Vec<IpNet> = cidrs.into_iter().map(|c| c.trunc()).collect();
        cidrs.sort();
        cidrs.dedup();
        LocalDetector { cidrs }
    }

    /// Every prefix, both families.
    pub fn cidrs(&self) -> &[IpNet] {
        &self.cidrs
    }

    /// The prefixes of one family.
    pub fn of_family(&self, family: Family) -> Vec<IpNet> {
        self.cidrs.iter().filter(|c| Family::of_net(c) == family).copied().collect()
    }

    /// Whether `family` has a detector at all.
    pub fn knows(&self, family: Family) -> bool {
        self.cidrs.iter().any(|c| Family::of_net(c) == family)
    }

    /// Whether `source` is pod traffic.
    pub fn is_local(&self, source: &IpAddr) -> bool {
        self.cidrs.iter().any(|c| c.contains(source))
    }
}

/// The node as the backends and the tracer see it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NodeContext {
    /// All of the node's addresses (a load-balancer IP is reachable from the node when one
    /// of them is inside the Service's source ranges).
    pub node_addresses: Vec<IpAddr>,
    /// Where NodePorts are open: the node's addresses inside `--nodeport-addresses`.
    pub nodeport_addresses: Vec<IpAddr>,
    /// Which sources are pods.
    pub local: LocalDetector,
    /// kube-proxy's `masqueradeAll`.
    pub masquerade_all: bool,
}

impl NodeContext {
    /// The context of a node with config `node` (`None`: not known yet) under `settings`.
    /// `--cluster-cidr` of the agent wins over the node config's local-traffic CIDRs.
    pub fn derive(settings: &ProxySettings, node: Option<&NodeConfig>) -> NodeContext {
        let node_addresses: Vec<IpAddr> = node.map(|n| n.addresses.clone()).unwrap_or_default();
        let nodeport_addresses = settings.nodeport_addresses.select(&node_addresses);
        let local = if settings.cluster_cidrs.is_empty() {
            LocalDetector::new(node.map(|n| n.local_traffic_cidrs().to_vec()).unwrap_or_default())
        } else {
            LocalDetector::new(settings.cluster_cidrs.iter().copied())
        };
        NodeContext { node_addresses, nodeport_addresses, local, masquerade_all: settings.masquerade_all }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeConfig {
        NodeConfig {
            name: "n1".into(),
            addresses: vec!["10.0.0.1".parse().expect("ip"), "192.168.1.1".parse().expect("ip")],
            pod_cidrs: vec!["10.244.1.0/24".parse().expect("cidr")],
            ..Default::default()
        }
    }

    #[test]
    fn nodeport_addresses_are_the_node_addresses_inside_the_prefixes() {
        let all = NodeContext::derive(&ProxySettings::default(), Some(&node()));
        assert_eq!(all.nodeport_addresses, all.node_addresses);
        let settings = ProxySettings {
            nodeport_addresses: NodePortAddresses::Cidrs(vec!["10.0.0.0/8".parse().expect("cidr")]),
            ..Default::default()
        };
        let some = NodeContext::derive(&settings, Some(&node()));
        assert_eq!(some.nodeport_addresses, vec!["10.0.0.1".parse::<IpAddr>().expect("ip")]);
        assert_eq!(some.node_addresses.len(), 2, "every node address still counts as the node's");
        assert_eq!(NodeContext::derive(&settings, None), NodeContext::default());
    }

    #[test]
    fn primary_node_port_addresses_are_the_first_of_each_family() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let mut node = node();
        node.addresses = vec![ip("10.0.0.1"), ip("fd00::1"), ip("10.0.1.1"), ip("fd00::2"), ip("192.0.2.1")];
        let settings = ProxySettings { nodeport_addresses: NodePortAddresses::Primary, ..Default::default() };
        let context = NodeContext::derive(&settings, Some(&node));
        assert_eq!(context.nodeport_addresses, [ip("10.0.0.1"), ip("fd00::1")]);
        node.addresses.retain(IpAddr::is_ipv6);
        assert_eq!(NodeContext::derive(&settings, Some(&node)).nodeport_addresses, [ip("fd00::1")]);
    }

    #[test]
    fn the_agents_cluster_cidr_wins_over_the_node_configs() {
        let from_node = NodeContext::derive(&ProxySettings::default(), Some(&node()));
        assert_eq!(from_node.local.cidrs(), ["10.244.1.0/24".parse::<IpNet>().expect("cidr")]);
        let mut with_cluster = node();
        with_cluster.cluster_cidrs = vec!["10.244.0.0/16".parse().expect("cidr")];
        let cluster = NodeContext::derive(&ProxySettings::default(), Some(&with_cluster));
        assert_eq!(cluster.local.cidrs(), ["10.244.0.0/16".parse::<IpNet>().expect("cidr")]);
        let settings = ProxySettings {
            cluster_cidrs: vec!["10.32.0.1/12".parse().expect("cidr"), "fd00:10::/56".parse().expect("cidr")],
            masquerade_all: true,
            ..Default::default()
        };
        let flag = NodeContext::derive(&settings, Some(&with_cluster));
        assert_eq!(flag.local.of_family(Family::V4), ["10.32.0.0/12".parse::<IpNet>().expect("cidr")]);
        assert!(flag.local.knows(Family::V6) && flag.masquerade_all);
        assert!(flag.local.is_local(&"10.40.0.9".parse().expect("ip")));
        assert!(!flag.local.is_local(&"10.244.0.9".parse().expect("ip")), "the node's CIDRs no longer count");
    }
}
