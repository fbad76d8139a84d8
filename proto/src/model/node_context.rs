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
    /// How pod traffic is told from other traffic (kube-proxy's `detectLocalMode`).
    pub local_mode: LocalMode,
    /// `--service-proxy-name`: the agent handles only the Services labelled
    /// `service.kubernetes.io/service-proxy-name` with it (`None`: only those without).
    pub service_proxy_name: Option<String>,
    /// kube-proxy's `AllowServiceExternalIPs` gate off: Services' `externalIPs` are not
    /// entry points on this node.
    pub ignore_external_ips: bool,
}

/// kube-proxy's `detectLocalMode`: what tells pod traffic from other traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LocalMode {
    /// The source is inside the cluster CIDR (the agent's, else the control plane's; the
    /// node's pod CIDRs when neither is set).
    #[default]
    ClusterCidr,
    /// The source is inside this node's pod CIDRs (`spec.podCIDRs` of its Node).
    NodeCidr,
    /// The packet came in on this interface (a bridge the pods hang off).
    BridgeInterface(String),
    /// The packet came in on an interface whose name starts with this (pods' veths).
    InterfaceNamePrefix(String),
}

/// Why an interface name (or prefix) cannot be matched on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an interface name: 1 to 15 of the characters a-z A-Z 0-9 . _ - @")]
pub struct BadInterfaceName(pub String);

impl LocalMode {
    /// The mode an interface is named for, the name checked (rules quote it as is).
    pub fn interface(name: &str, prefix: bool) -> Result<LocalMode, BadInterfaceName> {
        let fits = (1..=15).contains(&name.len())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
        if !fits {
            return Err(BadInterfaceName(name.to_owned()));
        }
        Ok(if prefix {
            LocalMode::InterfaceNamePrefix(name.to_owned())
        } else {
            LocalMode::BridgeInterface(name.to_owned())
        })
    }
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

/// kube-proxy's local-traffic detector: which packets come from pods. By source prefix,
/// where a family without prefixes has no detector (nothing is known to be pod traffic);
/// or by the interface the packet came in on, which holds for both families.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LocalDetector {
    /// Sources inside these prefixes (host bits cleared, sorted, without repeats).
    Cidrs(Vec<IpNet>),
    /// Packets that came in on this interface, or (`prefix`) on any whose name starts so.
    Interface { name: String, prefix: bool },
}

impl Default for LocalDetector {
    fn default() -> Self {
        LocalDetector::Cidrs(Vec::new())
    }
}

/// One family's test of "from a pod", for a backend to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalMatch<'a> {
    /// The source is inside one of these prefixes.
    Sources(&'a [IpNet]),
    /// The input interface is `name` (or, `prefix`, starts with it).
    Interface { name: &'a str, prefix: bool },
}

impl LocalDetector {
    /// A detector over `cidrs`.
    pub fn new(cidrs: impl IntoIterator<Item = IpNet>) -> Self {
        let mut cidrs: Vec<IpNet> = cidrs.into_iter().map(|c| c.trunc()).collect();
        cidrs.sort();
        cidrs.dedup();
        LocalDetector::Cidrs(cidrs)
    }

    /// Every prefix, both families (none for an interface detector).
    pub fn cidrs(&self) -> &[IpNet] {
        match self {
            LocalDetector::Cidrs(cidrs) => cidrs,
            LocalDetector::Interface { .. } => &[],
        }
    }

    /// The prefixes of one family.
    pub fn of_family(&self, family: Family) -> Vec<IpNet> {
        self.cidrs().iter().filter(|c| Family::of_net(c) == family).copied().collect()
    }

    /// Whether `family` has a detector at all.
    pub fn knows(&self, family: Family) -> bool {
        match self {
            LocalDetector::Cidrs(cidrs) => cidrs.iter().any(|c| Family::of_net(c) == family),
            LocalDetector::Interface { .. } => true,
        }
    }

    /// The test a backend renders for `family`; `None` when the family has no detector.
    pub fn matcher(&self, family: Family) -> Option<LocalMatch<'_>> {
        match self {
            LocalDetector::Cidrs(_) if !self.knows(family) => None,
            LocalDetector::Cidrs(cidrs) => {
                // Sorted: IPv4 prefixes come before IPv6 ones.
                let split = cidrs.partition_point(|c| Family::of_net(c) == Family::V4);
                Some(LocalMatch::Sources(if family == Family::V4 {
                    &cidrs[..split]
                } else {
                    &cidrs[split..]
                }))
            }
            LocalDetector::Interface { name, prefix } => {
                Some(LocalMatch::Interface { name, prefix: *prefix })
            }
        }
    }

    /// Whether `source` is pod traffic; `None` when the address alone does not say (an
    /// interface detector).
    pub fn is_local(&self, source: &IpAddr) -> Option<bool> {
        match self {
            LocalDetector::Cidrs(cidrs) => Some(cidrs.iter().any(|c| c.contains(source))),
            LocalDetector::Interface { .. } => None,
        }
    }

    /// What it goes by, for people: the prefixes, or `iifname NAME` (`NAME*` for a prefix).
    pub fn describe(&self) -> String {
        match self {
            LocalDetector::Cidrs(cidrs) => {
                cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            }
            LocalDetector::Interface { name, prefix } => {
                format!("iifname {name}{}", if *prefix { "*" } else { "" })
            }
        }
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
    /// The cluster's ServiceCIDR ranges, merged (none overlaps another).
    pub service_cidrs: Vec<IpNet>,
    /// Services' `externalIPs` are left out (kube-proxy's `AllowServiceExternalIPs` off).
    pub ignore_external_ips: bool,
}

impl NodeContext {
    /// The context of a node with config `node` (`None`: not known yet) under `settings`.
    /// `--cluster-cidr` of the agent wins over the node config's local-traffic CIDRs.
    pub fn derive(settings: &ProxySettings, node: Option<&NodeConfig>) -> NodeContext {
        NodeContext::derive_on(settings, node, &[])
    }

    /// The same, on a node whose interfaces hold `interface_addresses` (its local
    /// addresses, loopback and link-local left out): NodePorts open on every one of them
    /// too (all, or those inside the prefixes), as kube-proxy's iptables and IPVS modes
    /// open them on every local address; `primary` is the node config's.
    pub fn derive_on(
        settings: &ProxySettings,
        node: Option<&NodeConfig>,
        interface_addresses: &[IpAddr],
    ) -> NodeContext {
        let node_addresses: Vec<IpAddr> = node.map(|n| n.addresses.clone()).unwrap_or_default();
        let nodeport_addresses = match settings.nodeport_addresses {
            NodePortAddresses::Primary => settings.nodeport_addresses.select(&node_addresses),
            _ => {
                let mut local = node_addresses.clone();
                local.extend(interface_addresses.iter().filter(|a| !node_addresses.contains(a)));
                settings.nodeport_addresses.select(&local)
            }
        };
        let local = match &settings.local_mode {
            LocalMode::ClusterCidr if settings.cluster_cidrs.is_empty() => {
                LocalDetector::new(node.map(|n| n.local_traffic_cidrs().to_vec()).unwrap_or_default())
            }
            LocalMode::ClusterCidr => LocalDetector::new(settings.cluster_cidrs.iter().copied()),
            LocalMode::NodeCidr => LocalDetector::new(node.map(|n| n.pod_cidrs.clone()).unwrap_or_default()),
            LocalMode::BridgeInterface(name) => {
                LocalDetector::Interface { name: name.clone(), prefix: false }
            }
            LocalMode::InterfaceNamePrefix(name) => {
                LocalDetector::Interface { name: name.clone(), prefix: true }
            }
        };
        let service_cidrs = IpNet::aggregate(&node.map(|n| n.service_cidrs.clone()).unwrap_or_default());
        NodeContext {
            node_addresses,
            nodeport_addresses,
            local,
            masquerade_all: settings.masquerade_all,
            service_cidrs,
            ignore_external_ips: settings.ignore_external_ips,
        }
    }
}

#[cfg(test)]
mod tests;
