//! What the clusterset imports, as the admin API shows it (`kpxctl imports`): for every
//! name exported or imported anywhere, the import as the clusters hold it (type,
//! ClusterSetIPs, ports), the clusters that hold it, those whose exports it is made of,
//! its conflicts and the exports that are not valid. Made from the API objects, whether
//! kpx writes them or another MCS controller does.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::resolve::resolve;
use crate::model::{Cluster, ImportPort, ImportType, ObjectKey};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub key: ObjectKey,
    /// As the first cluster that holds the import has it; else as the exports make it.
    pub import_type: Option<ImportType>,
    pub ips: Vec<IpAddr>,
    pub ports: Vec<ImportPort>,
    /// The clusters whose valid exports it is made of.
    pub exported_by: Vec<String>,
    /// The clusters that hold a ServiceImport of the name.
    pub imported_in: Vec<String>,
    /// Each conflict among the exports: the field, the winner and the others.
    pub conflicts: Vec<String>,
    /// `cluster: reason` of each export that is not valid.
    pub invalid: Vec<String>,
}

/// The report of every name exported or imported in `clusters`.
pub fn report<'a>(
    clusters: impl IntoIterator<Item = (&'a String, &'a Cluster)> + Clone,
) -> Vec<ImportReport> {
    let mut names: BTreeSet<&ObjectKey> = BTreeSet::new();
    for (_, model) in clusters.clone() {
        names.extend(model.state().exports.keys());
        names.extend(model.state().imports.keys());
    }
    names
        .into_iter()
        .map(|key| {
            let exports: Vec<_> = (clusters.clone().into_iter())
                .filter_map(|(c, m)| Some((c.as_str(), m.state().exports.get(key)?, m.service(key))))
                .collect();
            let resolution = resolve(exports);
            let held: Vec<(&String, &crate::model::ServiceImport)> = (clusters.clone().into_iter())
                .filter_map(|(c, m)| Some((c, m.state().imports.get(key)?)))
                .collect();
            let (import_type, ips, ports) = match (held.first(), &resolution.import) {
                (Some((_, i)), _) => (Some(i.spec.import_type), i.spec.ips.clone(), i.spec.ports.clone()),
                (None, Some(i)) => (Some(i.import_type), Vec::new(), i.ports.clone()),
                (None, None) => (None, Vec::new(), Vec::new()),
            };
            ImportReport {
                key: key.clone(),
                import_type,
                ips,
                ports,
                exported_by: resolution.import.as_ref().map(|i| i.clusters.clone()).unwrap_or_default(),
                imported_in: held.iter().map(|(c, _)| (*c).clone()).collect(),
                conflicts: resolution.conflicts.iter().map(ToString::to_string).collect(),
                invalid: resolution.invalid.iter().map(|(c, why)| format!("{c}: {}", why.reason())).collect(),
            }
        })
        .collect()
}
