//! The Multi-Cluster Services objects (KEP-1645, `multicluster.x-k8s.io`) as the control
//! plane keeps them: a cluster's [`ServiceExport`]s (which of its Services the
//! clusterset may use) and [`ServiceImport`]s (what the clusterset offers under a name,
//! at which ClusterSetIPs: the API objects are the record of those addresses).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx_proto::types::Protocol;

use super::{ClusterAffinity, ObjectKey, SlicePort};

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
