//! What every node should have, as one immutable [`Snapshot`].
//!
//! Each resource is encoded once and versioned by its content hash; a view
//! shared by many nodes is one `Arc<Resource>`. A new snapshot reuses the
//! `Arc`s of resources whose content did not change, so streams compare
//! pointers first.

use std::collections::BTreeMap;
use std::sync::Arc;

use kpx_proto::version::content_version;
use kpx_proto::{NODE_CONFIG_TYPE_URL, SERVICE_VIEW_TYPE_URL};

use crate::model::ClusterState;
use crate::view;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    ServiceView,
    NodeConfig,
}

impl ResourceType {
    pub const ALL: [ResourceType; 2] = [ResourceType::ServiceView, ResourceType::NodeConfig];

    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::ServiceView => SERVICE_VIEW_TYPE_URL,
            ResourceType::NodeConfig => NODE_CONFIG_TYPE_URL,
        }
    }

    pub fn from_type_url(url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.type_url() == url)
    }
}

/// One encoded resource.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub version: String,
    pub body: Vec<u8>,
}

impl Resource {
    fn new(name: String, body: Vec<u8>) -> Self {
        Resource { version: content_version(&body), name, body }
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    /// Views every node shares, by resource name.
    services: BTreeMap<String, Arc<Resource>>,
    /// Node configs by node name.
    node_configs: BTreeMap<String, Arc<Resource>>,
}

impl Snapshot {
    /// Builds the snapshot of all clusters, reusing the resources of `previous` that did not change.
    pub fn build(clusters: &BTreeMap<String, Arc<ClusterState>>, previous: &Snapshot) -> Snapshot {
        let reuse = |old: &BTreeMap<String, Arc<Resource>>, fresh: Resource| match old.get(&fresh.name) {
            Some(existing) if existing.version == fresh.version => Arc::clone(existing),
            _ => Arc::new(fresh),
        };
        let mut services = BTreeMap::new();
        let mut node_configs = BTreeMap::new();
        for (cluster, state) in clusters {
            let slices = state.slices_by_service();
            for svc in state.services.values().filter(|s| view::is_proxied(s)) {
                let v = view::shared_view(cluster, svc, slices.get(&svc.key).map_or(&[][..], Vec::as_slice));
                let resource = reuse(&previous.services, Resource::new(v.resource_name(), v.encode()));
                services.insert(resource.name.clone(), resource);
            }
            for node in state.nodes.values() {
                let config = view::node_config(node);
                let resource =
                    reuse(&previous.node_configs, Resource::new(config.name.clone(), config.encode()));
                node_configs.insert(resource.name.clone(), resource);
            }
        }
        Snapshot { services, node_configs }
    }

    /// The resources of one type that `node` should have.
    pub fn for_node<'a>(
        &'a self,
        ty: ResourceType,
        node: &'a str,
    ) -> Box<dyn Iterator<Item = &'a Arc<Resource>> + 'a> {
        match ty {
            ResourceType::ServiceView => Box::new(self.services.values()),
            ResourceType::NodeConfig => Box::new(self.node_configs.get(node).into_iter()),
        }
    }

    /// One resource that `node` should have, if it exists.
    pub fn get(&self, ty: ResourceType, node: &str, name: &str) -> Option<&Arc<Resource>> {
        match ty {
            ResourceType::ServiceView => self.services.get(name),
            ResourceType::NodeConfig => (name == node).then(|| self.node_configs.get(node)).flatten(),
        }
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}
