//! A whole rebuild: the snapshot of given cluster states, made as the next one after
//! `previous` (so unchanged content keeps its `Arc`s and the history says what differs).
//! The control plane itself moves from snapshot to snapshot with [`Snapshot::next`];
//! this is for tests and tools that have whole states.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;

use super::Snapshot;
use crate::model::{Cluster, ClusterState};
use crate::view::{Inputs, Placement};

/// What the control plane adds to the cluster states when building snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildOptions {
    /// `--cluster-cidr`: goes into every node config.
    pub cluster_cidrs: Vec<IpNet>,
    /// Clusters unreachable for longer than the grace period: their endpoints are no longer
    /// offered to the other clusters' nodes (global Services).
    pub withdrawn: BTreeSet<String>,
}

impl Snapshot {
    /// The snapshot of all clusters, as the one after `previous`.
    pub fn build(
        clusters: &BTreeMap<String, Arc<ClusterState>>,
        previous: &Snapshot,
        options: &BuildOptions,
    ) -> Snapshot {
        let models: BTreeMap<String, Cluster> =
            clusters.iter().map(|(name, state)| (name.clone(), Cluster::new((**state).clone()))).collect();
        let placement = Placement::of(&models, models.len() > 1);
        let inputs = Inputs {
            clusters: &models,
            placement: &placement,
            withdrawn: &options.withdrawn,
            cluster_cidrs: &options.cluster_cidrs,
        };
        let mut changes = inputs.all();
        let served: BTreeSet<&str> = changes.services.iter().map(|(name, _)| name.as_str()).collect();
        let gone: Vec<String> = previous
            .defaults()
            .filter(|r| !served.contains(r.name.as_str()))
            .map(|r| r.name.clone())
            .collect();
        changes.services.extend(gone.into_iter().map(|name| (name, None)));
        let configured: BTreeSet<&str> = changes.node_configs.iter().map(|(node, _)| node.as_str()).collect();
        let unknown: Vec<String> = previous
            .node_configs
            .keys()
            .filter(|node| !configured.contains(node.as_str()))
            .cloned()
            .collect();
        changes.node_configs.extend(unknown.into_iter().map(|node| (node, None)));
        // Every node either placement knows may have moved.
        let mut nodes: BTreeSet<String> = placement.nodes().map(str::to_owned).collect();
        nodes.extend(previous.placement.nodes().map(str::to_owned));
        changes.moved = nodes.into_iter().collect();
        let mut builder = Snapshot::builder(previous);
        builder.apply(changes);
        let (snapshot, changed) = builder.done();
        snapshot.recorded(previous, changed)
    }
}
