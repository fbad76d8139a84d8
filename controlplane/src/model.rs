//! The cluster model: the parts of Services, EndpointSlices and Nodes that
//! kpx uses, already validated. Every source (manifest folder, Kubernetes API)
//! produces a [`ClusterState`]; nothing downstream knows where it came from.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::types::Protocol;

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
}

impl ClusterState {
    /// The EndpointSlices of every Service, found in one pass (not one scan per Service).
    pub fn slices_by_service(&self) -> HashMap<ObjectKey, Vec<&EndpointSlice>> {
        let mut index: HashMap<ObjectKey, Vec<&EndpointSlice>> = HashMap::new();
        for slice in self.slices.values() {
            let key = ObjectKey { namespace: slice.namespace.clone(), name: slice.service_name.clone() };
            index.entry(key).or_default().push(slice);
        }
        index
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub key: ObjectKey,
    pub service_type: ServiceType,
    /// Empty for headless Services (`clusterIP: None`).
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    /// The `service.kubernetes.io/service-proxy-name` label: such Services belong to another proxy.
    pub proxy_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    pub namespace: String,
    pub name: String,
    /// The owning Service (label `kubernetes.io/service-name`).
    pub service_name: String,
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
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub addresses: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNet>,
    pub zone: Option<String>,
}
