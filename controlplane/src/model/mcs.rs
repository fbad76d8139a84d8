//! The Multi-Cluster Services objects (KEP-1645, `multicluster.x-k8s.io`) as the control
//! plane keeps them: a cluster's [`ServiceExport`]s (which of its Services the
//! clusterset may use) and [`ServiceImport`]s (what the clusterset offers under a name,
//! at which ClusterSetIPs: the API objects are the record of those addresses).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx_proto::types::Protocol;

use super::{ClusterAffinity, Family, ObjectKey, SlicePort, TrafficPolicy};

/// The version of `multicluster.x-k8s.io` an API server is spoken to in: v1beta1
/// (mcs-api v0.5.0 and later) where it is served, else v1alpha1, whose ServiceImport has
/// none of [`ImportSpec`]'s v1beta1 fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum McsVersion {
    V1Alpha1,
    #[default]
    V1Beta1,
}

impl McsVersion {
    pub fn name(self) -> &'static str {
        match self {
            McsVersion::V1Alpha1 => "v1alpha1",
            McsVersion::V1Beta1 => "v1beta1",
        }
    }

    /// The version named `version` (`v1beta1`, `v1alpha1`), if kpx speaks it.
    pub fn named(version: &str) -> Option<McsVersion> {
        match version {
            "v1alpha1" => Some(McsVersion::V1Alpha1),
            "v1beta1" => Some(McsVersion::V1Beta1),
            _ => None,
        }
    }
}

/// A `ServiceExport`: the Service of the same namespace and name may be imported.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceExport {
    pub key: ObjectKey,
    /// `metadata.creationTimestamp`, in seconds since the epoch (the oldest export wins a
    /// conflict).
    pub created: i64,
    /// `spec.exportedLabels`: what the import carries of them, from the export that wins.
    pub labels: BTreeMap<String, String>,
    /// `spec.exportedAnnotations`, likewise.
    pub annotations: BTreeMap<String, String>,
    /// kpx's extension `service.kpx.io/affinity` on the export: which cluster's
    /// endpoints this cluster's nodes prefer for the import.
    pub cluster_affinity: ClusterAffinity,
    /// `status.conditions` as the API holds them (what the MCS controller last wrote).
    pub conditions: Vec<Condition>,
}

/// A condition of an MCS object's status (`metav1.Condition`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Condition {
    /// `type`: `Valid`, `Conflict`, …
    pub kind: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
    /// `lastTransitionTime` as written (RFC 3339): kept while the status stays.
    pub last_transition: String,
}

impl Condition {
    /// Whether it says the same as `other`, whenever each was written.
    pub fn means(&self, other: &Condition) -> bool {
        (&self.kind, self.status, &self.reason, &self.message)
            == (&other.kind, other.status, &other.reason, &other.message)
    }
}

/// How an import is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImportType {
    /// Through an IP of the clusterset (`type: ClusterSetIP`).
    #[default]
    ClusterSetIp,
    /// Its endpoints directly (the exported Services are headless).
    Headless,
}

/// A port of an import.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ImportPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// `appProtocol` (v1beta1).
    pub app_protocol: Option<String>,
}

/// What a ServiceImport says of the Service it imports: its spec and the metadata the
/// exports give it (what kpx writes, and compares with what a cluster holds).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImportSpec {
    pub import_type: ImportType,
    /// `spec.ips`: the ClusterSetIPs, at most one per family (none for Headless, or while
    /// none is allocated yet).
    pub ips: Vec<IpAddr>,
    pub ports: Vec<ImportPort>,
    /// `spec.sessionAffinity: ClientIP` with this timeout in seconds.
    pub session_affinity_timeout: Option<u32>,
    /// Its labels, but for [`MANAGED_BY`].
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `spec.ipFamilies` (v1beta1): those of `ips`, in their order, for ClusterSetIP; the
    /// exported Services' for Headless.
    pub ip_families: Vec<Family>,
    /// `spec.internalTrafficPolicy` (v1beta1): the exported Services'.
    pub internal_traffic_policy: Option<TrafficPolicy>,
    /// `spec.trafficDistribution` (v1beta1): the exported Services'.
    pub traffic_distribution: Option<String>,
    /// `status.clusters` (v1beta1): the clusters whose endpoints it has, by name.
    pub clusters: Vec<String>,
}

impl ImportSpec {
    /// What of it an API server speaking `version` keeps: v1alpha1 has no field of v1beta1.
    pub fn as_served(&self, version: McsVersion) -> ImportSpec {
        match version {
            McsVersion::V1Beta1 => self.clone(),
            McsVersion::V1Alpha1 => ImportSpec {
                ports: (self.ports.iter()).map(|p| ImportPort { app_protocol: None, ..p.clone() }).collect(),
                ip_families: Vec::new(),
                internal_traffic_policy: None,
                traffic_distribution: None,
                clusters: Vec::new(),
                ..self.clone()
            },
        }
    }
}

/// A `ServiceImport` as read from a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceImport {
    pub key: ObjectKey,
    pub spec: ImportSpec,
    /// Labelled [`MANAGED_BY`]: kpx wrote it, and deletes it when nothing is exported.
    pub managed: bool,
    /// `metadata.uid`: what the MCS EndpointSlices of the import name as their owner.
    pub uid: String,
    /// The version it was read in.
    pub version: McsVersion,
}

/// An MCS EndpointSlice: in an importing cluster, the endpoints of one exporting
/// cluster for a ServiceImport (label `multicluster.kubernetes.io/service-name`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct McsSlice {
    pub key: ObjectKey,
    pub spec: McsSliceSpec,
    /// `endpointslice.kubernetes.io/managed-by` is kpx's ([`SLICE_MANAGER`]).
    pub managed: bool,
}

/// What an MCS EndpointSlice says (what kpx writes, and compares with what a cluster holds).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct McsSliceSpec {
    /// The import's name (in the slice's namespace).
    pub service: String,
    /// `multicluster.kubernetes.io/source-cluster`.
    pub source_cluster: String,
    /// `addressType`: `IPv4` or `IPv6`.
    pub ipv6: bool,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<McsEndpoint>,
}

/// An endpoint of an MCS EndpointSlice: its addresses and conditions, as in its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McsEndpoint {
    pub addresses: Vec<IpAddr>,
    /// The source's `hostname` (`<hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local`).
    pub hostname: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

/// The `endpointslice.kubernetes.io/managed-by` of the MCS EndpointSlices kpx writes.
pub const SLICE_MANAGER: &str = "kpx-controlplane.kpx.io";

/// The label (`key`, `value`) kpx puts on the ServiceImports it writes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kpx-controlplane");
