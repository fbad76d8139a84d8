//! Plain, already validated values of kpx's resources.

use crate::names::Origin;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::family::Family;

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

    /// The name the Kubernetes API uses (`TCP`, `UDP`, `SCTP`).
    pub fn api_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Service as one node must program it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceView {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    /// Empty: every source may use the load-balancer IPs.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// externalTrafficPolicy: Local (see `ServicePort::local_endpoints`).
    pub external_traffic_local: bool,
    /// internalTrafficPolicy: Local (`ServicePort::endpoints` holds only this node's).
    pub internal_traffic_local: bool,
    pub health_check_node_port: Option<u16>,
    /// sessionAffinity: ClientIP timeout in seconds.
    pub session_affinity_timeout: Option<u32>,
    /// The IPVS scheduler this Service asks for (one of [`IPVS_SCHEDULERS`]); `None`: the
    /// node agent's default.
    pub ipvs_scheduler: Option<String>,
    /// The `service.kubernetes.io/service-proxy-name` label: for the agents started with
    /// `--service-proxy-name` this name only; `None`: for those started without.
    pub service_proxy_name: Option<String>,
}

/// The IPVS schedulers kpx offers: round robin, weighted round robin, least connections,
/// weighted least connections, source hashing, destination hashing, Maglev hashing.
pub const IPVS_SCHEDULERS: [&str; 7] = ["rr", "wrr", "lc", "wlc", "sh", "dh", "mh"];

impl ServiceView {
    /// A view with only the fields every Service has; the rest empty.
    pub fn new(
        cluster: &str,
        namespace: &str,
        name: &str,
        cluster_ips: Vec<IpAddr>,
        ports: Vec<ServicePort>,
    ) -> Self {
        ServiceView {
            cluster: cluster.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            cluster_ips,
            ports,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            external_traffic_local: false,
            internal_traffic_local: false,
            health_check_node_port: None,
            session_affinity_timeout: None,
            ipvs_scheduler: None,
            service_proxy_name: None,
        }
    }

    /// The xDS resource name: `<cluster>/<namespace>/<name>`.
    pub fn resource_name(&self) -> String {
        service_resource_name(&self.cluster, &self.namespace, &self.name)
    }
}

/// The xDS resource name of a Service: `<cluster>/<namespace>/<name>`.
pub fn service_resource_name(cluster: &str, namespace: &str, name: &str) -> String {
    format!("{cluster}/{namespace}/{name}")
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// For ClusterIP traffic, and for external traffic unless the Service is external-traffic-local.
    pub endpoints: Vec<Endpoint>,
    pub node_port: Option<u16>,
    /// This node's endpoints for external traffic (external-traffic-local Services only).
    pub local_endpoints: Vec<Endpoint>,
    /// Internal-traffic-local Services with external entry points only: the cluster-wide
    /// endpoints, for external traffic (see `kpx.v1.ServicePort.external_endpoints`).
    pub external_endpoints: Vec<Endpoint>,
    /// Internal-traffic-local Services only: the families in which some node has an
    /// endpoint (none anywhere: rejected rather than dropped).
    pub endpoint_families: Vec<Family>,
    /// UDP ports only: the other serving endpoints, which no rule uses but whose conntrack
    /// flows are kept (see `kpx.v1.ServicePort.serving_endpoints`).
    pub serving_endpoints: Vec<Endpoint>,
}

impl ServicePort {
    /// A port with endpoints and nothing else.
    pub fn new(name: &str, protocol: Protocol, port: u16, endpoints: Vec<Endpoint>) -> Self {
        ServicePort {
            name: name.to_owned(),
            protocol,
            port,
            endpoints,
            node_port: None,
            local_endpoints: Vec::new(),
            external_endpoints: Vec::new(),
            endpoint_families: Vec::new(),
            serving_endpoints: Vec::new(),
        }
    }
}

/// 32 bytes: a quarter-million of them is most of what a node agent holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub address: IpAddr,
    pub port: u16,
    /// Its node, and the cluster it comes from when not the Service's own; shared.
    pub origin: Origin,
    pub terminating: bool,
}

impl Endpoint {
    pub fn new(address: IpAddr, port: u16, node_name: &str, cluster: &str, terminating: bool) -> Endpoint {
        Endpoint { address, port, origin: Origin::of(node_name, cluster), terminating }
    }

    pub fn node_name(&self) -> &str {
        self.origin.node_name()
    }

    /// The cluster it comes from when not the Service's own ("" otherwise).
    pub fn cluster(&self) -> &str {
        self.origin.cluster()
    }
}

/// What a node needs to know about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeConfig {
    pub name: String,
    pub addresses: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNet>,
    pub zone: String,
    /// The cluster's pod CIDRs; when empty, `pod_cidrs` detect local traffic.
    pub cluster_cidrs: Vec<IpNet>,
    /// The Node has a deletion timestamp or the `ToBeDeletedByClusterAutoscaler` taint:
    /// not eligible for load-balancer traffic (`/healthz` answers 503).
    pub being_deleted: bool,
    /// The cluster's ServiceCIDR ranges (see `kpx.v1.NodeConfig.service_cidrs`).
    pub service_cidrs: Vec<IpNet>,
}

impl NodeConfig {
    /// The CIDRs whose sources count as pod traffic (kube-proxy's local-traffic detector).
    pub fn local_traffic_cidrs(&self) -> &[IpNet] {
        if self.cluster_cidrs.is_empty() {
            &self.pod_cidrs
        } else {
            &self.cluster_cidrs
        }
    }
}
