//! The views of a ServiceImport of type ClusterSetIP, for the nodes of the cluster that
//! holds it: a Service at the import's ClusterSetIPs, with its ports and session
//! affinity, over the endpoints of every cluster whose export of the name is valid (its
//! Service exists and is not ExternalName), the importing cluster's own as local and the
//! others' with their cluster's name. A cluster withdrawn (unreachable for longer than
//! the grace period) offers its endpoints to no other cluster's import. A port of the
//! import is served only by the clusters whose export has exactly that port (name,
//! protocol and number; sig-multicluster's `StrictPortConflict`): where two clusters
//! give one port name different numbers, traffic to the import's port reaches only the
//! cluster that won it.
//!
//! The import object is the record of the address and ports (written by the clusterset's
//! MCS controller); the endpoints follow the exports as they are now.

use crate::mcs::resolve::resolve;
use crate::model::{EndpointSlice, ImportType, ObjectKey, Service, ServicePort};

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
        let resolved = resolve(offered).import?;
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
                    app_protocol: None,
                })
                .collect(),
            session_affinity_timeout: import.session_affinity_timeout,
            internal_traffic_policy: import.internal_traffic_policy.unwrap_or_default(),
            cluster_affinity: own_export.map(|e| e.cluster_affinity).unwrap_or_default(),
            ..Service::default()
        };
        // Each cluster's slices with only the ports its export serves as the import has
        // them (same name, protocol and number): traffic to a port goes only to the
        // clusters that expose it.
        let mut sliced: Vec<(&str, EndpointSlice)> = Vec::new();
        for peer in &resolved.clusters {
            let Some(m) = self.clusters.get(peer) else { continue };
            let serves = |name: &str| {
                (resolved.ports.iter().zip(&resolved.port_clusters))
                    .any(|(p, serving)| p.name == name && serving.contains(peer))
            };
            for slice in m.slices_of(key) {
                let ports = slice.ports.iter().filter(|p| serves(&p.name)).cloned().collect();
                sliced.push((peer.as_str(), EndpointSlice { ports, ..slice.clone() }));
            }
        }
        let own: Vec<&EndpointSlice> =
            (sliced.iter()).filter(|(p, _)| *p == cluster).map(|(_, s)| s).collect();
        let remote: Vec<(&str, &EndpointSlice)> =
            (sliced.iter()).filter(|(p, _)| *p != cluster).map(|(p, s)| (*p, s)).collect();
        let builder = ViewBuilder::global(cluster, &service, &own, &remote);
        Some(ServiceViews::new(&builder, self.placement))
    }
}
