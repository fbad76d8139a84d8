//! Plain, already validated values of kpx's resources.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// L4 protocol of a Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The lower-case name nft and iptables use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Service as one node must program it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
}

impl ServiceView {
    /// The xDS resource name: `<cluster>/<namespace>/<name>`.
    pub fn resource_name(&self) -> String {
        service_resource_name(&self.cluster, &self.namespace, &self.name)
    }
}

/// The xDS resource name of a Service: `<cluster>/<namespace>/<name>`.
pub fn service_resource_name(cluster: &str, namespace: &str, name: &str) -> String {
    format!("{cluster}/{namespace}/{name}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub address: IpAddr,
    pub port: u16,
    pub node_name: String,
    pub terminating: bool,
}

/// What a node needs to know about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeConfig {
    pub name: String,
    pub addresses: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNet>,
    pub zone: String,
}
