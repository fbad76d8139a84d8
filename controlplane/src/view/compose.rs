//! Composition across clusters: which EndpointSlices a Service's views are built from
//! (its own cluster's and, for a global Service, those of the other clusters that mark
//! the same namespace/name global and are not withdrawn; for an import, see
//! [`super::import`]), which Node object gives a node its config (its home cluster's),
//! and the views of the Services, imports and nodes a change touched.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use ipnet::IpNet;
use kpx_proto::types::{service_resource_name, NodeConfig};

use super::{is_proxied, node_config, Placement, ServiceViews, ViewBuilder};
use crate::model::{Cluster, EndpointSlice, ObjectKey, Service};

/// Everything views are computed from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Every cluster's model, by cluster name.
    pub clusters: &'a BTreeMap<String, Cluster>,
    pub placement: &'a Placement,
    /// Clusters unreachable for longer than the grace period: their endpoints are no longer
    /// offered to the other clusters' global Services.
    pub withdrawn: &'a BTreeSet<String>,
    /// `--cluster-cidr`: goes into every node config.
    pub cluster_cidrs: &'a [IpNet],
}

/// What the views of the touched Services and nodes are now; the snapshot interns them.
#[derive(Debug, Clone, Default)]
pub struct ViewChanges {
    /// By resource name (`<cluster>/<namespace>/<name>`): the Service's views, `None` when
    /// it is no longer served (gone, headless, another proxy's, …).
    pub services: Vec<(String, Option<ServiceViews>)>,
    /// By node name: its config, `None` when no cluster names it any more.
    pub node_configs: Vec<(String, Option<NodeConfig>)>,
    /// Where every node is now.
    pub placement: Placement,
    /// Nodes whose zone or home changed.
    pub moved: Vec<String>,
}

/// Whether another cluster's Service draws on this one: marked global and served.
fn shares(svc: &Service) -> bool {
    svc.global && is_proxied(svc)
}

impl<'a> Inputs<'a> {
    /// The other clusters' slices a Service of `cluster` gets, with their cluster's name.
    pub fn remote_slices(&self, cluster: &str, svc: &Service) -> Vec<(&'a str, &'a EndpointSlice)> {
        if !svc.global {
            return Vec::new();
        }
        self.clusters
            .iter()
            .filter(|(peer, _)| peer.as_str() != cluster && !self.withdrawn.contains(peer.as_str()))
            .filter(|(_, model)| model.service(&svc.key).is_some_and(shares))
            .flat_map(|(peer, model)| model.slices_of(&svc.key).into_iter().map(move |s| (peer.as_str(), s)))
            .collect()
    }

    /// The views of Service `key` of `cluster` (or of its import, for a key of
    /// [`crate::mcs::import_key`]); `None` when kpx does not serve it.
    pub fn service_views(&self, cluster: &str, key: &ObjectKey) -> Option<ServiceViews> {
        if let Some(import) = crate::mcs::imported(key) {
            return self.import_views(cluster, &import);
        }
        let model = self.clusters.get(cluster)?;
        let svc = model.service(key).filter(|s| is_proxied(s))?;
        let own = model.slices_of(key);
        let remote = self.remote_slices(cluster, svc);
        let builder = ViewBuilder::global(cluster, svc, &own, &remote);
        Some(ServiceViews::new(&builder, self.placement))
    }

    /// The config of `node`, from its home cluster's Node object (the first cluster's that
    /// names it).
    pub fn node_config(&self, node: &str) -> Option<NodeConfig> {
        let (model, object) = self.clusters.values().find_map(|model| Some((model, model.node(node)?)))?;
        Some(node_config(object, self.cluster_cidrs, model.state().service_ranges()))
    }

    /// The views of `services` and the configs of `nodes`.
    pub fn changes<'k>(
        &self,
        services: impl IntoIterator<Item = (&'k str, &'k ObjectKey)>,
        nodes: impl IntoIterator<Item = &'k str>,
    ) -> ViewChanges {
        ViewChanges {
            services: services
                .into_iter()
                .map(|(cluster, key)| {
                    let name = service_resource_name(cluster, &key.namespace, &key.name);
                    (name, self.service_views(cluster, key))
                })
                .collect(),
            node_configs: nodes.into_iter().map(|n| (n.to_owned(), self.node_config(n))).collect(),
            placement: self.placement.clone(),
            moved: Vec::new(),
        }
    }

    /// The views of every Service and import, and the config of every node (a whole rebuild).
    pub fn all(&self) -> ViewChanges {
        let imports: Vec<(&str, ObjectKey)> = (self.clusters.iter())
            .flat_map(|(c, model)| {
                model.state().imports.keys().map(move |k| (c.as_str(), crate::mcs::import_key(k)))
            })
            .collect();
        let services = self
            .clusters
            .iter()
            .flat_map(|(c, model)| model.state().services.keys().map(move |key| (c.as_str(), key)))
            .chain(imports.iter().map(|(c, k)| (*c, k)));
        let nodes: BTreeSet<&str> =
            self.clusters.values().flat_map(|m| m.state().nodes.keys().map(String::as_str)).collect();
        self.changes(services, nodes)
    }
}
