//! One exported name across the clusterset: from each cluster's ServiceExport of
//! `namespace/name` and the Service it names there, the ServiceImport every cluster gets
//! and the conditions of each export, by KEP-1645's "Constraints and Conflict
//! Resolution":
//! - an export whose Service is missing or of type ExternalName is not valid, and takes
//!   no part in the import;
//! - among the valid ones, the oldest export (by `creationTimestamp`, ties by cluster
//!   name) wins every property the exports disagree on: headless or not, session
//!   affinity and its timeout, each port, the exported labels and annotations;
//! - the import's ports are the union of the exported ports; a port that another port
//!   of the import already claims (its name, or its number and protocol) with other
//!   values is a conflict, and the older claim stays;
//! - when any property conflicts, every export of the name says so (the field and the
//!   clusters), not only the younger ones.
//!
//! Pure: the same exports and Services give the same resolution, so conditions change
//! only when their meaning does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::model::{ImportPort, ImportType, Service, ServiceExport, ServiceType};

/// The ServiceImport every cluster of the clusterset gets for one exported name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub import_type: ImportType,
    /// The union of the exported ports, in the order the winning exports give them.
    pub ports: Vec<ImportPort>,
    /// `sessionAffinity: ClientIP` with this timeout in seconds (`None`: no affinity).
    pub session_affinity_timeout: Option<u32>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The clusters whose endpoints it has: those of the valid exports, by name.
    pub clusters: Vec<String>,
}

/// A property exports can disagree on; its name is the condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    Port,
    Type,
    SessionAffinity,
    SessionAffinityConfig,
    /// `spec.exportedLabels` differ.
    Labels,
    /// `spec.exportedAnnotations` differ.
    Annotations,
}

impl Field {
    /// The condition reason, as the MCS API names it.
    pub fn reason(self) -> &'static str {
        match self {
            Field::Port => "PortConflict",
            Field::Type => "TypeConflict",
            Field::SessionAffinity => "SessionAffinityConflict",
            Field::SessionAffinityConfig => "SessionAffinityConfigConflict",
            Field::Labels => "LabelsConflict",
            Field::Annotations => "AnnotationsConflict",
        }
    }
}

/// Why an export is not valid (condition `Valid=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// No Service of the export's namespace and name in its cluster.
    NoService,
    /// The Service is of type ExternalName.
    ExternalName,
}

impl Invalid {
    pub fn reason(self) -> &'static str {
        match self {
            Invalid::NoService => "NoService",
            Invalid::ExternalName => "InvalidServiceType",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Invalid::NoService => "no Service of this namespace and name in this cluster",
            Invalid::ExternalName => "the Service is of type ExternalName, which cannot be exported",
        }
    }
}

/// One conflict: the field, the cluster whose export won it, and those that lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub field: Field,
    pub winner: String,
    pub losers: BTreeSet<String>,
    /// What was contended (a port, a type, a timeout), for the message.
    pub detail: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let losers: Vec<&str> = self.losers.iter().map(String::as_str).collect();
        write!(
            f,
            "{}: {} (cluster {} exported it first; {} differ)",
            self.field.reason(),
            self.detail,
            self.winner,
            losers.join(", ")
        )
    }
}

/// The resolution of one exported name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolution {
    /// `None` when no export is valid (no import, or the import is removed).
    pub import: Option<Import>,
    /// Per exporting cluster: why its export is not valid.
    pub invalid: BTreeMap<String, Invalid>,
    /// Every conflict among the valid exports, by field; each export of the name carries
    /// them all (`Conflict=True`), none means `Conflict=False`.
    pub conflicts: Vec<Conflict>,
}

impl Resolution {
    /// The `Conflict` condition's reason (the fields, comma-separated) and message, or
    /// `None` when nothing conflicts.
    pub fn conflict_condition(&self) -> Option<(String, String)> {
        if self.conflicts.is_empty() {
            return None;
        }
        let fields: BTreeSet<Field> = self.conflicts.iter().map(|c| c.field).collect();
        let reason = fields.iter().map(|f| f.reason()).collect::<Vec<_>>().join(",");
        let message = self.conflicts.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        Some((reason, message))
    }
}

/// What an export offers, read from its Service.
struct Offer<'a> {
    cluster: &'a str,
    export: &'a ServiceExport,
    import_type: ImportType,
    affinity: Option<u32>,
    ports: Vec<ImportPort>,
}

fn import_type(service: &Service) -> ImportType {
    if service.cluster_ips.is_empty() {
        ImportType::Headless
    } else {
        ImportType::ClusterSetIp
    }
}

/// Resolves one exported name from its exports, each with its cluster and the Service
/// it names there (`None`: there is none).
pub fn resolve<'a>(
    exports: impl IntoIterator<Item = (&'a str, &'a ServiceExport, Option<&'a Service>)>,
) -> Resolution {
    let mut resolution = Resolution::default();
    let mut offers: Vec<Offer<'a>> = Vec::new();
    for (cluster, export, service) in exports {
        match service {
            None => {
                resolution.invalid.insert(cluster.to_owned(), Invalid::NoService);
            }
            Some(s) if s.service_type == ServiceType::ExternalName => {
                resolution.invalid.insert(cluster.to_owned(), Invalid::ExternalName);
            }
            Some(s) => offers.push(Offer {
                cluster,
                export,
                import_type: import_type(s),
                affinity: s.session_affinity_timeout,
                ports: (s.ports.iter())
                    .map(|p| ImportPort { name: p.name.clone(), protocol: p.protocol, port: p.port })
                    .collect(),
            }),
        }
    }
    // Oldest first; ties by cluster name.
    offers.sort_by(|a, b| (a.export.created, a.cluster).cmp(&(b.export.created, b.cluster)));
    let Some(winner) = offers.first() else { return resolution };

    let mut conflicts: BTreeMap<(Field, String), Conflict> = BTreeMap::new();
    let mut lose = |field: Field, detail: String, winner: &str, loser: &str| {
        let conflict = conflicts.entry((field, detail.clone())).or_insert_with(|| Conflict {
            field,
            winner: winner.to_owned(),
            losers: BTreeSet::new(),
            detail,
        });
        conflict.losers.insert(loser.to_owned());
    };
    for offer in &offers[1..] {
        if offer.import_type != winner.import_type {
            let detail = format!("headless is {}", winner.import_type == ImportType::Headless);
            lose(Field::Type, detail, winner.cluster, offer.cluster);
        }
        match (winner.affinity, offer.affinity) {
            (Some(_), None) | (None, Some(_)) => {
                let detail = format!(
                    "sessionAffinity {}",
                    if winner.affinity.is_some() { "ClientIP" } else { "None" }
                );
                lose(Field::SessionAffinity, detail, winner.cluster, offer.cluster);
            }
            (Some(a), Some(b)) if a != b => {
                let detail = format!("sessionAffinityConfig timeout {a} s");
                lose(Field::SessionAffinityConfig, detail, winner.cluster, offer.cluster);
            }
            _ => {}
        }
        if offer.export.labels != winner.export.labels {
            lose(Field::Labels, "exportedLabels".into(), winner.cluster, offer.cluster);
        }
        if offer.export.annotations != winner.export.annotations {
            lose(Field::Annotations, "exportedAnnotations".into(), winner.cluster, offer.cluster);
        }
    }

    // The union of ports: each offer's ports in turn, oldest first; a port that clashes
    // with one already taken (same name, or same number and protocol, other values) loses.
    let mut ports: Vec<(ImportPort, &str)> = Vec::new();
    for offer in &offers {
        for port in &offer.ports {
            let clash = ports.iter().find(|(taken, _)| {
                taken != port
                    && (taken.name == port.name || (taken.port, taken.protocol) == (port.port, port.protocol))
            });
            match clash {
                Some((taken, owner)) => {
                    let detail = format!("port {:?} is {}/{}", taken.name, taken.port, taken.protocol);
                    lose(Field::Port, detail, owner, offer.cluster);
                }
                None if ports.iter().any(|(taken, _)| taken == port) => {}
                None => ports.push((port.clone(), offer.cluster)),
            }
        }
    }
    resolution.conflicts = conflicts.into_values().collect();
    let mut clusters: Vec<String> = offers.iter().map(|o| o.cluster.to_owned()).collect();
    clusters.sort();
    resolution.import = Some(Import {
        import_type: winner.import_type,
        ports: ports.into_iter().map(|(p, _)| p).collect(),
        session_affinity_timeout: winner.affinity,
        labels: winner.export.labels.clone(),
        annotations: winner.export.annotations.clone(),
        clusters,
    });
    resolution
}

#[cfg(test)]
mod tests;
