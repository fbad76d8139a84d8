//! What the clusterset's MCS controller must write, from every cluster's model as it is:
//! for each exported name, the ServiceImport every writable cluster gets (its ClusterSetIP
//! from [`allocate`], kept while any cluster's import holds it), and the conditions of
//! each export (`Valid`, `Conflict`); for a name nothing exports any more, the deletion of
//! the imports kpx wrote. Only what differs from the objects the API holds is written
//! (a condition that means the same is left with its `lastTransitionTime`), so a plan of
//! a clusterset in order is empty, and writing is level-triggered: a write that failed
//! is in the next plan again.
//!
//! Pure; made only once every source has sent its first state (a cluster not yet read
//! would look as if it exported nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::allocate::{allocate, AllocateError};
use super::resolve::{resolve, Resolution};
use crate::model::{
    Cluster, Condition, Family, ImportSpec, ImportType, McsEndpoint, McsSlice, McsSliceSpec, ObjectKey,
    ServiceImport,
};

/// Whether `held` is `spec` as kpx wrote it (as much of it as its version has).
fn holds(held: &ServiceImport, spec: &ImportSpec) -> bool {
    held.managed && held.spec == spec.as_served(held.version)
}

/// An MCS EndpointSlice as kpx writes it: the endpoints of one slice of one exporting
/// cluster, in an importing cluster, owned by the import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceObject {
    pub spec: McsSliceSpec,
    /// The import's `metadata.uid` (its owner reference).
    pub owner_uid: String,
}

impl SliceObject {
    /// Whether the slice the API holds is this one, as kpx wrote it.
    pub fn is(&self, held: &McsSlice) -> bool {
        held.managed && held.spec == self.spec
    }
}

/// The name of the MCS EndpointSlice of `source_cluster`'s slice `source`: one per
/// source slice, which no slice of the importing cluster's own is named.
pub fn slice_name(source: &str, source_cluster: &str) -> String {
    format!("{source}-{source_cluster}")
}

/// One write to one cluster's API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Create or update (server-side apply) the ServiceImport `key`.
    ApplyImport { cluster: String, key: ObjectKey, import: ImportSpec },
    /// Delete the ServiceImport `key` kpx wrote.
    DeleteImport { cluster: String, key: ObjectKey },
    /// Set the conditions of the ServiceExport `key` (status subresource).
    ExportConditions { cluster: String, key: ObjectKey, conditions: Vec<Condition> },
    /// Create or update (server-side apply) the MCS EndpointSlice `key`.
    ApplySlice { cluster: String, key: ObjectKey, slice: SliceObject },
    /// Delete the MCS EndpointSlice `key` kpx wrote.
    DeleteSlice { cluster: String, key: ObjectKey },
}

impl Write {
    /// `cluster`, kind and `namespace/name` of what it writes, for logs and retries.
    pub fn target(&self) -> (&str, &'static str, &ObjectKey) {
        match self {
            Write::ApplyImport { cluster, key, .. } | Write::DeleteImport { cluster, key } => {
                (cluster, "ServiceImport", key)
            }
            Write::ExportConditions { cluster, key, .. } => (cluster, "ServiceExport", key),
            Write::ApplySlice { cluster, key, .. } | Write::DeleteSlice { cluster, key } => {
                (cluster, "EndpointSlice", key)
            }
        }
    }
}

/// What to write, and what could not be planned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub writes: Vec<Write>,
    /// Per name: why an import has no address of some family (the range is full).
    pub unallocated: BTreeMap<ObjectKey, AllocateError>,
}

/// Where an import could not be written because its namespace does not exist:
/// (cluster, the import's key), as the writer last found.
pub type MissingNamespaces = BTreeSet<(String, ObjectKey)>;

/// The plan for `clusters`: kpx writes to those in `writable` (its Kubernetes sources),
/// allocating ClusterSetIPs from `cidrs` (one per family); `missing` says where an
/// import waits for its namespace; `now` is the `lastTransitionTime` of a condition
/// that changes.
pub fn plan(
    clusters: &BTreeMap<String, Cluster>,
    writable: &BTreeSet<String>,
    cidrs: &[IpNet],
    missing: &MissingNamespaces,
    now: &str,
) -> Plan {
    let mut names: BTreeSet<&ObjectKey> = BTreeSet::new();
    // Names of which kpx's MCS EndpointSlices are left (owned, not borrowed: made here).
    let mut owners: BTreeSet<ObjectKey> = BTreeSet::new();
    let mut taken: BTreeSet<IpAddr> = BTreeSet::new();
    for model in clusters.values() {
        names.extend(model.state().exports.keys());
        names.extend(model.state().imports.iter().filter(|(_, i)| i.managed).map(|(k, _)| k));
        let sliced = model.state().mcs_slices.values().filter(|s| s.managed);
        owners.extend(
            sliced.map(|s| ObjectKey { namespace: s.key.namespace.clone(), name: s.spec.service.clone() }),
        );
        taken.extend(model.state().imports.values().flat_map(|i| i.spec.ips.iter().copied()));
    }
    let owners: Vec<ObjectKey> = owners.into_iter().filter(|k| !names.contains(k)).collect();
    names.extend(owners.iter());
    let mut out = Plan::default();
    for key in names {
        let exports: Vec<_> = (clusters.iter())
            .filter_map(|(c, m)| Some((c.as_str(), m.state().exports.get(key)?, m.service(key))))
            .collect();
        let resolution = resolve(exports.iter().copied());
        let waiting: Vec<&str> = (writable.iter())
            .filter(|c| missing.contains(&((*c).clone(), key.clone())))
            .map(String::as_str)
            .collect();
        for &(cluster, export, _) in exports.iter().filter(|(c, _, _)| writable.contains(*c)) {
            let conditions = conditions(&resolution, cluster, &waiting, &export.conditions, now);
            let same = conditions.len() == export.conditions.len()
                && conditions.iter().zip(&export.conditions).all(|(a, b)| a.means(b));
            if !same {
                let (cluster, key) = (cluster.to_owned(), key.clone());
                out.writes.push(Write::ExportConditions { cluster, key, conditions });
            }
        }
        let held = |c: &str| clusters.get(c).and_then(|m| m.state().imports.get(key));
        match &resolution.import {
            Some(import) => {
                let (ips, ip_families) = if import.import_type == ImportType::ClusterSetIp {
                    let holding: Vec<IpAddr> = clusters
                        .keys()
                        .filter_map(|c| held(c))
                        .flat_map(|i| i.spec.ips.iter().copied())
                        .collect();
                    let ips = clusterset_ips(
                        cidrs,
                        key,
                        &import.ip_families,
                        &holding,
                        &mut taken,
                        &mut out.unallocated,
                    );
                    let families = ips.iter().map(Family::of).collect();
                    (ips, families)
                } else {
                    (Vec::new(), import.ip_families.clone())
                };
                let object = ImportSpec {
                    import_type: import.import_type,
                    ips,
                    ports: import.ports.clone(),
                    session_affinity_timeout: import.session_affinity_timeout,
                    labels: import.labels.clone(),
                    annotations: import.annotations.clone(),
                    ip_families,
                    internal_traffic_policy: Some(import.internal_traffic_policy),
                    traffic_distribution: import.traffic_distribution.clone(),
                    clusters: import.clusters.clone(),
                };
                for cluster in writable {
                    if !held(cluster).is_some_and(|h| holds(h, &object)) {
                        let (cluster, key, import) = (cluster.clone(), key.clone(), object.clone());
                        out.writes.push(Write::ApplyImport { cluster, key, import });
                    }
                    // Its slices once it exists (they name it as their owner).
                    let owner = held(cluster).map(|i| i.uid.as_str()).filter(|uid| !uid.is_empty());
                    let wanted =
                        owner.map(|uid| slices(clusters, key, &import.clusters, uid)).unwrap_or_default();
                    sync_slices(clusters, cluster, key, wanted, &mut out.writes);
                }
            }
            None => {
                for cluster in writable {
                    if held(cluster).is_some_and(|i| i.managed) {
                        out.writes.push(Write::DeleteImport { cluster: cluster.clone(), key: key.clone() });
                    }
                    sync_slices(clusters, cluster, key, BTreeMap::new(), &mut out.writes);
                }
            }
        }
    }
    out
}

/// The ClusterSetIPs of import `key`, one per family of `families` (the exported
/// Services'; every range of `cidrs` when they say none) from the range of `cidrs` of
/// that family: those it `holds`, else new ones, added to `taken`; a family without a
/// range, or a range without room, is said in `unallocated`.
fn clusterset_ips(
    cidrs: &[IpNet],
    key: &ObjectKey,
    families: &[Family],
    holds: &[IpAddr],
    taken: &mut BTreeSet<IpAddr>,
    unallocated: &mut BTreeMap<ObjectKey, AllocateError>,
) -> Vec<IpAddr> {
    let families: Vec<Family> =
        if families.is_empty() { cidrs.iter().map(Family::of_net).collect() } else { families.to_vec() };
    let mut ips = Vec::new();
    for family in families {
        let Some(&cidr) = cidrs.iter().find(|c| Family::of_net(c) == family) else {
            let name = if family == Family::V4 { "IPv4" } else { "IPv6" };
            unallocated.insert(key.clone(), AllocateError::NoRange(name));
            continue;
        };
        match allocate(cidr, key, holds, taken) {
            Ok(ip) => {
                taken.insert(ip);
                ips.push(ip);
            }
            Err(e) => {
                unallocated.insert(key.clone(), e);
            }
        }
    }
    ips
}

/// The MCS EndpointSlices of import `key` owned by `uid`: one per slice of each
/// exporting cluster's Service, by name.
fn slices(
    clusters: &BTreeMap<String, Cluster>,
    key: &ObjectKey,
    exporters: &[String],
    uid: &str,
) -> BTreeMap<ObjectKey, SliceObject> {
    let mut out = BTreeMap::new();
    for source_cluster in exporters {
        let Some(model) = clusters.get(source_cluster) else { continue };
        for source in model.exported_slices_of(key) {
            let endpoints: Vec<McsEndpoint> = (source.endpoints.iter())
                .map(|e| McsEndpoint {
                    addresses: e.addresses.clone(),
                    hostname: e.hostname.clone(),
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                })
                .collect();
            let name = slice_name(&source.name, source_cluster);
            let slice = SliceObject {
                spec: McsSliceSpec {
                    service: key.name.clone(),
                    source_cluster: source_cluster.clone(),
                    ipv6: endpoints.iter().flat_map(|e| &e.addresses).any(IpAddr::is_ipv6),
                    ports: source.ports.clone(),
                    endpoints,
                },
                owner_uid: uid.to_owned(),
            };
            out.insert(ObjectKey { namespace: key.namespace.clone(), name }, slice);
        }
    }
    out
}

/// The writes that make `cluster`'s MCS EndpointSlices of `key` those `wanted`.
fn sync_slices(
    clusters: &BTreeMap<String, Cluster>,
    cluster: &str,
    key: &ObjectKey,
    wanted: BTreeMap<ObjectKey, SliceObject>,
    writes: &mut Vec<Write>,
) {
    let Some(model) = clusters.get(cluster) else { return };
    let held = &model.state().mcs_slices;
    let ours =
        held.values().filter(|s| s.managed && s.spec.service == key.name && s.key.namespace == key.namespace);
    for gone in ours.filter(|s| !wanted.contains_key(&s.key)) {
        writes.push(Write::DeleteSlice { cluster: cluster.to_owned(), key: gone.key.clone() });
    }
    for (name, slice) in wanted {
        if !held.get(&name).is_some_and(|h| slice.is(h)) {
            writes.push(Write::ApplySlice { cluster: cluster.to_owned(), key: name, slice });
        }
    }
}

/// The `Valid`, `Conflict` and `Ready` conditions of `cluster`'s export (`Ready` as the
/// API's later versions define it: the import is in every cluster; not while the export
/// is not valid, or the namespace is missing in the clusters `waiting`), each keeping its
/// `lastTransitionTime` from `held` while its status stays.
fn conditions(
    resolution: &Resolution,
    cluster: &str,
    waiting: &[&str],
    held: &[Condition],
    now: &str,
) -> Vec<Condition> {
    let valid = match resolution.invalid.get(cluster) {
        Some(why) => (false, why.reason().to_owned(), why.message().to_owned()),
        None => (true, "Valid".to_owned(), "the Service is exported".to_owned()),
    };
    let conflict = match resolution.conflict_condition() {
        Some((reason, message)) => (true, reason, message),
        None => (false, "NoConflicts".to_owned(), "no conflict among the exports of this name".to_owned()),
    };
    let ready = match (resolution.invalid.contains_key(cluster), waiting) {
        (true, _) => {
            (false, "Failed".to_owned(), "the export is not valid (see the Valid condition)".to_owned())
        }
        (false, []) => (true, "Exported".to_owned(), "imported in every cluster".to_owned()),
        (false, waiting) => (
            false,
            "Pending".to_owned(),
            format!(
                "the namespace does not exist in cluster {}: imported there once it does",
                waiting.join(", ")
            ),
        ),
    };
    [("Valid", valid), ("Conflict", conflict), ("Ready", ready)]
        .into_iter()
        .map(|(kind, (status, reason, message))| {
            let kept = held.iter().find(|c| c.kind == kind && c.status == status);
            Condition {
                kind: kind.to_owned(),
                status,
                reason,
                message,
                last_transition: kept.map_or_else(|| now.to_owned(), |c| c.last_transition.clone()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
