//! The change tracker: every cluster's model, kept up to date by the sources' events, and
//! what the events touched ([`ChangeSet`]), so that only those views are computed again.
//!
//! What touches what:
//! - a Service change touches that Service; an EndpointSlice change touches the Service it
//!   belongs to (before and after, if it moved);
//! - a change of a Service marked global also touches the same namespace/name in every
//!   other cluster (whose global Service may draw on it);
//! - a change of a ServiceExport or ServiceImport, or of an exported Service or its
//!   slices, touches the import of that name in every cluster;
//! - a change of the withdrawn clusters touches every global Service and every import;
//! - a Node change touches that node's config; if the node changed zones, every Service
//!   whose views vary by locality is computed again (rare); a change of its home cluster
//!   changes only which Services it gets, which the snapshot looks up.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use super::SourceStatus;
use crate::model::{Cluster, ObjectKey};
use crate::source::SourceEvent;
use crate::view::{Inputs, Placement, ViewChanges};

/// A Service of one cluster.
pub type ServiceRef = (String, ObjectKey);

/// What events touched since the last snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// Services whose views may differ (and imports, by [`crate::mcs::import_key`]).
    pub services: BTreeSet<ServiceRef>,
    /// Nodes whose config may differ.
    pub nodes: BTreeSet<String>,
    /// Nodes whose zone or home cluster changed.
    pub moved: BTreeSet<String>,
    /// Some node changed zones: every Service whose views vary by locality may differ.
    pub zones_moved: bool,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.nodes.is_empty() && self.moved.is_empty() && !self.zones_moved
    }
}

/// Every cluster's model and what views are computed from besides.
pub struct Tracker {
    /// Every source's cluster name.
    expected: BTreeSet<String>,
    /// The model of each cluster whose source has sent its first state.
    clusters: BTreeMap<String, Cluster>,
    placement: Placement,
    withdrawn: BTreeSet<String>,
    cluster_cidrs: Vec<IpNet>,
    /// Services whose views vary by node or zone (as last computed).
    varying: BTreeSet<ServiceRef>,
}

impl Tracker {
    /// A tracker of `clusters` (each source's name); `cluster_cidrs` go into node configs.
    pub fn new(clusters: impl IntoIterator<Item = String>, cluster_cidrs: Vec<IpNet>) -> Self {
        let expected: BTreeSet<String> = clusters.into_iter().collect();
        Tracker {
            placement: Placement::new(expected.len() > 1),
            expected,
            clusters: BTreeMap::new(),
            withdrawn: BTreeSet::new(),
            cluster_cidrs,
            varying: BTreeSet::new(),
        }
    }

    /// Whether every source has sent its first state.
    pub fn synced(&self) -> bool {
        self.clusters.len() == self.expected.len()
    }

    /// Applies one event of `cluster`'s source, recording in `into` what it touched.
    pub fn apply(&mut self, cluster: &str, event: SourceEvent, into: &mut ChangeSet) {
        if !self.expected.contains(cluster) {
            tracing::error!(cluster, "an event of an unknown cluster: ignored");
            return;
        }
        let touched = match event {
            SourceEvent::Replace(state) => {
                self.clusters.entry(cluster.to_owned()).or_default().replace(state)
            }
            SourceEvent::Apply(changes) => match self.clusters.get_mut(cluster) {
                Some(model) => model.apply(changes),
                None => {
                    tracing::error!(cluster, "changes before the source's first state: ignored");
                    return;
                }
            },
        };
        into.services.extend(touched.services.into_iter().map(|key| (cluster.to_owned(), key)));
        for key in touched.shared {
            for (peer, model) in &self.clusters {
                if peer != cluster && model.service(&key).is_some() {
                    into.services.insert((peer.clone(), key.clone()));
                }
            }
        }
        for key in touched.exported {
            let import = crate::mcs::import_key(&key);
            into.services.extend(self.clusters.keys().map(|peer| (peer.clone(), import.clone())));
        }
        for node in touched.nodes {
            let moved = self.placement.place(&node, &self.clusters);
            into.zones_moved |= moved.zone;
            if moved.zone || moved.home {
                into.moved.insert(node.clone());
            }
            into.nodes.insert(node);
        }
    }

    /// Withdraws the endpoints of `withdrawn` clusters from the others' global Services
    /// (and offers those of the others again); every global Service is touched.
    pub fn set_withdrawn(&mut self, withdrawn: BTreeSet<String>, into: &mut ChangeSet) {
        if withdrawn == self.withdrawn {
            return;
        }
        self.withdrawn = withdrawn;
        for (cluster, model) in &self.clusters {
            let global = model.state().services.iter().filter(|(_, s)| s.global);
            into.services.extend(global.map(|(key, _)| (cluster.clone(), key.clone())));
            let imports = model.state().imports.keys().map(crate::mcs::import_key);
            into.services.extend(imports.map(|key| (cluster.clone(), key)));
        }
    }

    /// Every cluster's model (once its source has sent its first state).
    pub fn clusters(&self) -> &BTreeMap<String, Cluster> {
        &self.clusters
    }

    pub fn withdrawn(&self) -> &BTreeSet<String> {
        &self.withdrawn
    }

    /// Everything: every Service and every node (the first snapshot).
    pub fn everything(&self) -> ChangeSet {
        let mut all = ChangeSet::default();
        for (cluster, model) in &self.clusters {
            all.services.extend(model.state().services.keys().map(|key| (cluster.clone(), key.clone())));
            let imports = model.state().imports.keys().map(crate::mcs::import_key);
            all.services.extend(imports.map(|key| (cluster.clone(), key)));
            all.nodes.extend(model.state().nodes.keys().cloned());
        }
        all
    }

    /// The views of what `changes` touched.
    pub fn views(&mut self, changes: &ChangeSet) -> ViewChanges {
        let mut all = ViewChanges::default();
        self.views_in_parts(changes, usize::MAX, |part| {
            all.services.extend(part.services);
            all.node_configs.extend(part.node_configs);
            all.moved.extend(part.moved);
            all.placement = part.placement;
        });
        all
    }

    /// The views of what `changes` touched, handed to `each` in parts of at most `size`
    /// Services (the first part also has the nodes), so that not all are held at once.
    pub fn views_in_parts(&mut self, changes: &ChangeSet, size: usize, mut each: impl FnMut(ViewChanges)) {
        let mut services: Vec<&ServiceRef> = changes.services.iter().collect();
        if changes.zones_moved {
            services.extend(self.varying.difference(&changes.services));
        }
        let inputs = Inputs {
            clusters: &self.clusters,
            placement: &self.placement,
            withdrawn: &self.withdrawn,
            cluster_cidrs: &self.cluster_cidrs,
        };
        let mut flipped: Vec<(ServiceRef, bool)> = Vec::new();
        // At least one part, for the nodes.
        let parts: Vec<&[&ServiceRef]> =
            if services.is_empty() { vec![&[]] } else { services.chunks(size.max(1)).collect() };
        for (i, part) in parts.into_iter().enumerate() {
            let nodes = changes.nodes.iter().filter(|_| i == 0).map(String::as_str);
            let mut out = inputs.changes(part.iter().map(|(c, key)| (c.as_str(), key)), nodes);
            if i == 0 {
                out.moved = changes.moved.iter().cloned().collect();
            }
            for (service, (_, views)) in part.iter().zip(&out.services) {
                let varies = views.as_ref().is_some_and(|v| v.varies);
                if self.varying.contains(*service) != varies {
                    flipped.push(((*service).clone(), varies));
                }
            }
            each(out);
        }
        for (service, varies) in flipped {
            if varies {
                self.varying.insert(service);
            } else {
                self.varying.remove(&service);
            }
        }
    }

    /// What each source has given so far.
    pub fn status(&self) -> BTreeMap<String, SourceStatus> {
        self.expected
            .iter()
            .map(|cluster| {
                let status = match self.clusters.get(cluster) {
                    Some(model) => SourceStatus {
                        synced: true,
                        services: model.state().services.len(),
                        endpoint_slices: model.state().slices.len(),
                        nodes: model.state().nodes.len(),
                    },
                    None => SourceStatus::default(),
                };
                (cluster.clone(), status)
            })
            .collect()
    }
}
