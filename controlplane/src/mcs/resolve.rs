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
//!   values loses to the older claim; exports whose port sets differ at all are in
//!   conflict (`PortConflict`), as the KEP's current text and sig-multicluster's
//!   conformance suite ask;
//! - the import's IP families are those of all the valid exports, the oldest's first
//!   (families that differ are an `IPFamilyConflict`); its `internalTrafficPolicy` and
//!   `trafficDistribution` are the oldest export's;
//! - when any property conflicts, every export of the name says so (the field and the
//!   clusters), not only the younger ones.
//!
//! Pure: the same exports and Services give the same resolution, so conditions change
//! only when their meaning does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::model::{Family, ImportPort, ImportType, Service, ServiceExport, ServiceType, TrafficPolicy};

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
    /// The IP families of the exported Services, the oldest export's first.
    pub ip_families: Vec<Family>,
    pub internal_traffic_policy: TrafficPolicy,
    pub traffic_distribution: Option<String>,
    /// Per port of the import: the clusters whose exported Service has exactly that port
    /// (name, protocol, number), whose endpoints alone serve it.
    pub port_clusters: Vec<Vec<String>>,
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
    InternalTrafficPolicy,
    TrafficDistribution,
    IpFamily,
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
            Field::InternalTrafficPolicy => "InternalTrafficPolicyConflict",
            Field::TrafficDistribution => "TrafficDistributionConflict",
            Field::IpFamily => "IPFamilyConflict",
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
    ip_families: Vec<Family>,
    internal_traffic_policy: TrafficPolicy,
    traffic_distribution: Option<String>,
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
            Some(s) => offers.push(Offer::of(cluster, export, s)),
        }
    }
    // Oldest first; ties by cluster name.
    offers.sort_by(|a, b| (a.export.created, a.cluster).cmp(&(b.export.created, b.cluster)));
    let Some(winner) = offers.first() else { return resolution };
    let mut conflicts = Conflicts::default();
    for offer in &offers[1..] {
        conflicts.of_properties(winner, offer);
    }
    let ports = conflicts.union_of_ports(&offers);
    resolution.conflicts = conflicts.found.into_values().collect();
    resolution.import = Some(import_of(&offers, ports));
    resolution
}

impl<'a> Offer<'a> {
    fn of(cluster: &'a str, export: &'a ServiceExport, s: &Service) -> Offer<'a> {
        Offer {
            cluster,
            export,
            import_type: import_type(s),
            affinity: s.session_affinity_timeout,
            ports: (s.ports.iter())
                .map(|p| ImportPort {
                    name: p.name.clone(),
                    protocol: p.protocol,
                    port: p.port,
                    app_protocol: p.app_protocol.clone(),
                })
                .collect(),
            ip_families: s.ip_families.clone(),
            internal_traffic_policy: s.internal_traffic_policy,
            traffic_distribution: s.traffic_distribution.clone(),
        }
    }
}

/// The conflicts found so far among the valid exports of a name.
#[derive(Default)]
struct Conflicts<'a> {
    found: BTreeMap<(Field, String), Conflict>,
    /// Clusters that lost a port to an older claim (their port sets differ, said so).
    lost_a_port: BTreeSet<&'a str>,
}

impl<'a> Conflicts<'a> {
    fn lose(&mut self, field: Field, detail: String, winner: &str, loser: &str) {
        let conflict = self.found.entry((field, detail.clone())).or_insert_with(|| Conflict {
            field,
            winner: winner.to_owned(),
            losers: BTreeSet::new(),
            detail,
        });
        conflict.losers.insert(loser.to_owned());
    }

    /// Where `offer` differs from the oldest, `winner`, in anything but its ports.
    fn of_properties(&mut self, winner: &Offer<'_>, offer: &Offer<'_>) {
        let mut lose = |field, detail| self.lose(field, detail, winner.cluster, offer.cluster);
        if offer.import_type != winner.import_type {
            lose(Field::Type, format!("headless is {}", winner.import_type == ImportType::Headless));
        }
        match (winner.affinity, offer.affinity) {
            (Some(_), None) | (None, Some(_)) => {
                let affinity = if winner.affinity.is_some() { "ClientIP" } else { "None" };
                lose(Field::SessionAffinity, format!("sessionAffinity {affinity}"));
            }
            (Some(a), Some(b)) if a != b => {
                lose(Field::SessionAffinityConfig, format!("sessionAffinityConfig timeout {a} s"));
            }
            _ => {}
        }
        if offer.export.labels != winner.export.labels {
            lose(Field::Labels, "exportedLabels".into());
        }
        if offer.export.annotations != winner.export.annotations {
            lose(Field::Annotations, "exportedAnnotations".into());
        }
        if offer.internal_traffic_policy != winner.internal_traffic_policy {
            let detail = format!("internalTrafficPolicy {:?}", winner.internal_traffic_policy);
            lose(Field::InternalTrafficPolicy, detail);
        }
        if offer.traffic_distribution != winner.traffic_distribution {
            let distribution = winner.traffic_distribution.as_deref().unwrap_or("unset");
            lose(Field::TrafficDistribution, format!("trafficDistribution {distribution}"));
        }
        if sorted(&offer.ip_families) != sorted(&winner.ip_families) {
            lose(Field::IpFamily, format!("ipFamilies {}", families(&winner.ip_families)));
        }
    }

    /// The union of the offers' ports: each offer's in turn, oldest first; a port that
    /// clashes with one already taken (same name, or same number and protocol, other
    /// values) loses; an offer whose port set differs from the oldest's otherwise is in
    /// conflict too.
    fn union_of_ports(&mut self, offers: &[Offer<'a>]) -> Vec<ImportPort> {
        let mut ports: Vec<(ImportPort, &str)> = Vec::new();
        for offer in offers {
            for port in &offer.ports {
                let clash = ports.iter().find(|(taken, _)| {
                    taken != port
                        && (taken.name == port.name
                            || (taken.port, taken.protocol) == (port.port, port.protocol))
                });
                match clash {
                    Some((taken, owner)) => {
                        let detail = format!("port {:?} is {}/{}", taken.name, taken.port, taken.protocol);
                        self.lose(Field::Port, detail, owner, offer.cluster);
                        self.lost_a_port.insert(offer.cluster);
                    }
                    None if ports.iter().any(|(taken, _)| taken == port) => {}
                    None => ports.push((port.clone(), offer.cluster)),
                }
            }
        }
        let winner = &offers[0];
        for offer in &offers[1..] {
            if sorted(&offer.ports) != sorted(&winner.ports) && !self.lost_a_port.contains(offer.cluster) {
                let detail = format!("ports are {}", ports_text(&winner.ports));
                self.lose(Field::Port, detail, winner.cluster, offer.cluster);
            }
        }
        ports.into_iter().map(|(p, _)| p).collect()
    }
}

/// The import of `offers` (oldest first, at least one) with `ports`: the oldest's
/// properties, every offer's families, and which clusters serve each port.
fn import_of(offers: &[Offer<'_>], ports: Vec<ImportPort>) -> Import {
    let winner = &offers[0];
    let mut clusters: Vec<String> = offers.iter().map(|o| o.cluster.to_owned()).collect();
    clusters.sort();
    let mut ip_families = winner.ip_families.clone();
    for family in offers.iter().flat_map(|o| &o.ip_families) {
        if !ip_families.contains(family) {
            ip_families.push(*family);
        }
    }
    let port_clusters = (ports.iter())
        .map(|port| {
            let mut serving: Vec<String> = (offers.iter())
                .filter(|o| o.ports.iter().any(|p| same_port(p, port)))
                .map(|o| o.cluster.to_owned())
                .collect();
            serving.sort();
            serving
        })
        .collect();
    Import {
        import_type: winner.import_type,
        ports,
        session_affinity_timeout: winner.affinity,
        labels: winner.export.labels.clone(),
        annotations: winner.export.annotations.clone(),
        clusters,
        ip_families,
        internal_traffic_policy: winner.internal_traffic_policy,
        traffic_distribution: winner.traffic_distribution.clone(),
        port_clusters,
    }
}

/// Whether two ports are the same port of a Service: name, protocol and number
/// (`appProtocol` is a hint, not what traffic is matched on).
fn same_port(a: &ImportPort, b: &ImportPort) -> bool {
    (&a.name, a.protocol, a.port) == (&b.name, b.protocol, b.port)
}

fn sorted<T: Ord + Clone>(items: &[T]) -> Vec<T> {
    let mut items = items.to_vec();
    items.sort();
    items
}

fn families(families: &[Family]) -> String {
    let names: Vec<&str> = (families.iter())
        .map(|f| match f {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
        .collect();
    format!("[{}]", names.join(", "))
}

fn ports_text(ports: &[ImportPort]) -> String {
    let ports: Vec<String> =
        ports.iter().map(|p| format!("{:?} {}/{}", p.name, p.port, p.protocol)).collect();
    format!("[{}]", ports.join(", "))
}

#[cfg(test)]
mod tests;
