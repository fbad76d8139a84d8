//! The views of a ServiceImport of type ClusterSetIP, for the nodes of the cluster that
//! holds it: a Service at the import's ClusterSetIPs, with its ports and session
//! affinity, over the endpoints of every cluster whose export of the name is valid (its
//! Service exists and is not ExternalName), the importing cluster's own as local and the
//! others' with their cluster's name. A cluster withdrawn (unreachable for longer than
//! the grace period) offers its endpoints to no other cluster's import.
//!
//! The import object is the record of the address and ports (written by the clusterset's
//! MCS controller); the endpoints follow the exports as they are now.

use crate::mcs::resolve::resolve;
use crate::model::{ImportType, ObjectKey, Service, ServicePort};

use super::{Inputs, ServiceViews, ViewBuilder};

impl Inputs<'_> {
    /// The views of the import `key` of `cluster`; `None` when it has none of type
    /// ClusterSetIP with an address, or no cluster exports the name validly.
    pub fn import_views(&self, cluster: &str, key: &ObjectKey) -> Option<ServiceViews> {
        let model = self.clusters.get(cluster)?;
        let import = &model.state().imports.get(key)?.spec;
        if import.import_type != ImportType::ClusterSetIp || import.ips.is_empty() {
            return None;
        }
        let offered = (self.clusters.iter())
            .filter(|(peer, _)| peer.as_str() == cluster || !self.withdrawn.contains(peer.as_str()))
            .filter_map(|(peer, m)| Some((peer.as_str(), m.state().exports.get(key)?, m.service(key))));
        let exporters = resolve(offered).import?.clusters;
        let own_export = model.state().exports.get(key);
        let service = Service {
            key: crate::mcs::import_key(key),
            cluster_ips: import.ips.clone(),
            ports: (import.ports.iter())
                .map(|p| ServicePort {
                    name: p.name.clone(),
                    protocol: p.protocol,
                    port: p.port,
                    node_port: None,
                })
                .collect(),
            session_affinity_timeout: import.session_affinity_timeout,
            cluster_affinity: own_export.map(|e| e.cluster_affinity).unwrap_or_default(),
            ..Service::default()
        };
        let mut own = Vec::new();
        let mut remote = Vec::new();
        for peer in &exporters {
            let Some(m) = self.clusters.get(peer) else { continue };
            if peer == cluster {
                own = m.slices_of(key);
            } else {
                remote.extend(m.slices_of(key).into_iter().map(|s| (peer.as_str(), s)));
            }
        }
        let builder = ViewBuilder::global(cluster, &service, &own, &remote);
        Some(ServiceViews::new(&builder, self.placement))
    }
}
