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
use crate::model::{Cluster, Condition, ImportPort, ImportType, ObjectKey, ServiceImport};

/// The spec and metadata kpx gives a ServiceImport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportObject {
    pub import_type: ImportType,
    pub ips: Vec<IpAddr>,
    pub ports: Vec<ImportPort>,
    pub session_affinity_timeout: Option<u32>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The clusters whose exports it is made of (`status.clusters`).
    pub clusters: Vec<String>,
}

impl ImportObject {
    /// Whether the import the API holds is this one, as kpx wrote it.
    pub fn is(&self, held: &ServiceImport) -> bool {
        held.managed
            && (self.import_type, &self.ips, &self.ports, self.session_affinity_timeout)
                == (held.import_type, &held.ips, &held.ports, held.session_affinity_timeout)
            && (&self.labels, &self.annotations) == (&held.labels, &held.annotations)
    }
}

/// One write to one cluster's API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Create or update (server-side apply) the ServiceImport `key`.
    ApplyImport { cluster: String, key: ObjectKey, import: ImportObject },
    /// Delete the ServiceImport `key` kpx wrote.
    DeleteImport { cluster: String, key: ObjectKey },
    /// Set the conditions of the ServiceExport `key` (status subresource).
    ExportConditions { cluster: String, key: ObjectKey, conditions: Vec<Condition> },
}

impl Write {
    /// `cluster`, kind and `namespace/name` of what it writes, for logs and retries.
    pub fn target(&self) -> (&str, &'static str, &ObjectKey) {
        match self {
            Write::ApplyImport { cluster, key, .. } | Write::DeleteImport { cluster, key } => {
                (cluster, "ServiceImport", key)
            }
            Write::ExportConditions { cluster, key, .. } => (cluster, "ServiceExport", key),
        }
    }
}

/// What to write, and what could not be planned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub writes: Vec<Write>,
    /// Per name: why an import has no address of some family (the range is full).
    pub unallocated: BTreeMap<ObjectKey, AllocateError>,
    /// Every import with its exporting clusters and conflicts (what kpxctl and the
    /// metrics show), by name.
    pub imports: BTreeMap<ObjectKey, Resolution>,
}

/// The plan for `clusters`: kpx writes to those in `writable` (its Kubernetes sources),
/// allocating ClusterSetIPs from `cidrs` (one per family); `now` is the
/// `lastTransitionTime` of a condition that changes.
pub fn plan(
    clusters: &BTreeMap<String, Cluster>,
    writable: &BTreeSet<String>,
    cidrs: &[IpNet],
    now: &str,
) -> Plan {
    let mut names: BTreeSet<&ObjectKey> = BTreeSet::new();
    let mut taken: BTreeSet<IpAddr> = BTreeSet::new();
    for model in clusters.values() {
        names.extend(model.state().exports.keys());
        names.extend(model.state().imports.iter().filter(|(_, i)| i.managed).map(|(k, _)| k));
        taken.extend(model.state().imports.values().flat_map(|i| i.ips.iter().copied()));
    }
    let mut out = Plan::default();
    for key in names {
        let exports: Vec<_> = (clusters.iter())
            .filter_map(|(c, m)| Some((c.as_str(), m.state().exports.get(key)?, m.service(key))))
            .collect();
        let resolution = resolve(exports.iter().copied());
        for &(cluster, export, _) in exports.iter().filter(|(c, _, _)| writable.contains(*c)) {
            let conditions = conditions(&resolution, cluster, &export.conditions, now);
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
                let ips = if import.import_type == ImportType::ClusterSetIp {
                    let holding: Vec<IpAddr> =
                        clusters.keys().filter_map(|c| held(c)).flat_map(|i| i.ips.iter().copied()).collect();
                    let mut ips = Vec::new();
                    for &cidr in cidrs {
                        match allocate(cidr, key, &holding, &taken) {
                            Ok(ip) => {
                                taken.insert(ip);
                                ips.push(ip);
                            }
                            Err(e) => {
                                out.unallocated.insert(key.clone(), e);
                            }
                        }
                    }
                    ips
                } else {
                    Vec::new()
                };
                let object = ImportObject {
                    import_type: import.import_type,
                    ips,
                    ports: import.ports.clone(),
                    session_affinity_timeout: import.session_affinity_timeout,
                    labels: import.labels.clone(),
                    annotations: import.annotations.clone(),
                    clusters: import.clusters.clone(),
                };
                for cluster in writable {
                    if !held(cluster).is_some_and(|h| object.is(h)) {
                        let (cluster, key, import) = (cluster.clone(), key.clone(), object.clone());
                        out.writes.push(Write::ApplyImport { cluster, key, import });
                    }
                }
            }
            None => {
                for cluster in writable.iter().filter(|c| held(c).is_some_and(|i| i.managed)) {
                    out.writes.push(Write::DeleteImport { cluster: cluster.clone(), key: key.clone() });
                }
            }
        }
        if resolution.import.is_some() || !resolution.invalid.is_empty() {
            out.imports.insert(key.clone(), resolution);
        }
    }
    out
}

/// The `Valid` and `Conflict` conditions of `cluster`'s export, each keeping its
/// `lastTransitionTime` from `held` while its status stays.
fn conditions(resolution: &Resolution, cluster: &str, held: &[Condition], now: &str) -> Vec<Condition> {
    let valid = match resolution.invalid.get(cluster) {
        Some(why) => (false, why.reason().to_owned(), why.message().to_owned()),
        None => (true, "Valid".to_owned(), "the Service is exported".to_owned()),
    };
    let conflict = match resolution.conflict_condition() {
        Some((reason, message)) => (true, reason, message),
        None => (false, "NoConflicts".to_owned(), "no conflict among the exports of this name".to_owned()),
    };
    [("Valid", valid), ("Conflict", conflict)]
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
