//! The cluster model: the parts of Services, EndpointSlices and Nodes that
//! kpx uses, already validated. Every source (manifest folder, Kubernetes API)
//! produces a [`ClusterState`] and then [`ObjectChanges`]; nothing downstream knows
//! where they came from. [`Cluster`] keeps one cluster's state with its slices indexed
//! by Service, and says which Services and Nodes a change touched.

mod changes;
mod cluster;
mod mcs;

pub use changes::{diff_by_key, ObjectChanges};
pub use cluster::{Cluster, Touched};
pub use mcs::{
    Condition, ImportPort, ImportSpec, ImportType, McsEndpoint, McsSlice, McsSliceSpec, McsVersion,
    ServiceExport, ServiceImport, MANAGED_BY, SLICE_MANAGER,
};

use std::collections::BTreeMap;
use std::net::IpAddr;

pub use kpx_proto::family::Family;

use ipnet::IpNet;
use kpx_proto::types::Protocol;

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Everything one cluster says, as one consistent snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub services: BTreeMap<ObjectKey, Service>,
    /// EndpointSlices by their own key.
    pub slices: BTreeMap<ObjectKey, EndpointSlice>,
    pub nodes: BTreeMap<String, Node>,
    /// ServiceCIDRs (`networking.k8s.io/v1`) by name.
    pub service_cidrs: BTreeMap<String, ServiceCidr>,
    /// ServiceExports (`multicluster.x-k8s.io`), by the key of the Service they export.
    pub exports: BTreeMap<ObjectKey, ServiceExport>,
    /// ServiceImports, by key.
    pub imports: BTreeMap<ObjectKey, ServiceImport>,
    /// MCS EndpointSlices (an import's endpoints from each exporting cluster), by their own key.
    pub mcs_slices: BTreeMap<ObjectKey, McsSlice>,
}

/// A `ServiceCIDR`: the ranges ClusterIPs are allocated from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCidr {
    pub name: String,
    /// `spec.cidrs`: one per IP family.
    pub cidrs: Vec<IpNet>,
}

impl ClusterState {
    /// Every ServiceCIDR's ranges, sorted, without repeats.
    pub fn service_ranges(&self) -> Vec<IpNet> {
        let mut all: Vec<IpNet> = self.service_cidrs.values().flat_map(|s| s.cidrs.iter().copied()).collect();
        all.sort();
        all.dedup();
        all
    }
}

impl ClusterState {
    /// The key of an EndpointSlice in [`ClusterState::slices`].
    pub fn slice_key(slice: &EndpointSlice) -> ObjectKey {
        ObjectKey { namespace: slice.namespace.clone(), name: slice.name.clone() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServiceType {
    #[default]
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

/// `externalTrafficPolicy` / `internalTrafficPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Service {
    pub key: ObjectKey,
    pub service_type: ServiceType,
    /// Empty for headless Services (`clusterIP: None`).
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    /// The `service.kubernetes.io/service-proxy-name` label: such Services belong to another proxy.
    pub proxy_name: Option<String>,
    /// The `service.kubernetes.io/headless` label: left alone, as kube-proxy does.
    pub headless_label: bool,
    /// `spec.externalIPs`, each of a family the Service has a ClusterIP of (those of
    /// another family are ignored, and logged, as kube-proxy does).
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` (VIP mode only), each of a family the Service has
    /// a ClusterIP of (others ignored and logged).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges`, host bits cleared.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// `spec.externalTrafficPolicy` as written; see [`Service::external_traffic_local`].
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` with this timeout in seconds.
    pub session_affinity_timeout: Option<u32>,
    /// Annotation `service.kpx.io/global: "true"`: one Service with the Services of the
    /// same namespace/name marked global in the other clusters, endpoints from all.
    pub global: bool,
    /// Annotation `service.kpx.io/affinity` (global Services).
    pub cluster_affinity: ClusterAffinity,
    /// Annotation `service.kpx.io/ipvs-scheduler`: the IPVS scheduler for this Service.
    pub ipvs_scheduler: Option<String>,
    /// `spec.ipFamilies` (headless Services have them too); when absent, those of
    /// `cluster_ips`.
    pub ip_families: Vec<Family>,
    /// `spec.trafficDistribution` as written (`PreferClose`, …): what an import carries.
    pub traffic_distribution: Option<String>,
}

/// Which cluster's endpoints a global Service prefers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClusterAffinity {
    /// All clusters' endpoints alike.
    #[default]
    None,
    /// Its own cluster's, others' only while it has no ready endpoint.
    Local,
    /// Other clusters', its own only while they have no ready endpoint.
    Remote,
}

impl Service {
    /// Whether traffic can reach the Service from outside: a NodePort, a
    /// load-balancer IP or an external IP.
    pub fn has_external_entry_point(&self) -> bool {
        self.ports.iter().any(|p| p.node_port.is_some())
            || !self.load_balancer_ips.is_empty()
            || !self.external_ips.is_empty()
    }

    /// `externalTrafficPolicy: Local` where it has an effect (kube-proxy honours it
    /// only for Services with an external entry point).
    pub fn external_traffic_local(&self) -> bool {
        self.external_traffic_policy == TrafficPolicy::Local && self.has_external_entry_point()
    }

    pub fn internal_traffic_local(&self) -> bool {
        self.internal_traffic_policy == TrafficPolicy::Local
    }

    /// `spec.healthCheckNodePort` where kube-proxy serves it: LoadBalancer
    /// Services whose external traffic policy is (effectively) Local.
    pub fn effective_health_check_node_port(&self) -> Option<u16> {
        let applies = self.service_type == ServiceType::LoadBalancer && self.external_traffic_local();
        self.health_check_node_port.filter(|_| applies)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// NodePort and LoadBalancer Services only.
    pub node_port: Option<u16>,
    /// `appProtocol`: what an import's port carries.
    pub app_protocol: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    pub namespace: String,
    pub name: String,
    /// The owning Service (label `kubernetes.io/service-name`).
    pub service_name: String,
    /// Labelled `service.kubernetes.io/headless`: no proxy uses its endpoints (kube-proxy
    /// does not watch such slices), but an MCS export carries them to the clusterset.
    pub headless: bool,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
}

/// A port of an EndpointSlice: the target port resolved for the endpoints of that slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub addresses: Vec<IpAddr>,
    /// `hostname` (a StatefulSet's pod): what MCS EndpointSlices carry for DNS.
    pub hostname: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// `hints.forZones[].name`: the zones whose nodes should prefer this endpoint.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes[].name`: the nodes that should prefer this endpoint.
    pub node_hints: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub addresses: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNet>,
    pub zone: Option<String>,
    /// A deletion timestamp, or the cluster autoscaler's `ToBeDeletedByClusterAutoscaler`
    /// taint: the node is leaving and load balancers should stop sending to it.
    pub being_deleted: bool,
}
