//! The node's desired state: every resource it accepted, with its version.
//!
//! A delta is validated as a whole before anything changes ([`Delta::validate`]);
//! it is then applied in place and can be undone exactly ([`Undo`]) when the
//! kernel or the store refuses it, so the last good state is kept.

use std::collections::{BTreeMap, BTreeSet};

use kpx_proto::types::{NodeConfig, ServiceView};
use kpx_proto::{InvalidResource, ResourceType};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub version: String,
    pub value: T,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    pub node: Option<Versioned<NodeConfig>>,
    pub services: BTreeMap<String, Versioned<ServiceView>>,
}

impl NodeState {
    /// name → version of every resource of a type, for `initial_resource_versions`.
    pub fn versions(&self, ty: ResourceType) -> BTreeMap<String, String> {
        match ty {
            ResourceType::ServiceView => {
                self.services.iter().map(|(n, s)| (n.clone(), s.version.clone())).collect()
            }
            ResourceType::NodeConfig => {
                self.node.iter().map(|n| (n.value.name.clone(), n.version.clone())).collect()
            }
        }
    }
}

/// A resource as it arrives: name, version, encoded body.
#[derive(Debug, Clone)]
pub struct RawResource {
    pub name: String,
    pub version: String,
    pub type_url: String,
    pub body: Vec<u8>,
}

/// One validated response.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    pub services: Vec<Versioned<ServiceView>>,
    pub node: Option<Versioned<NodeConfig>>,
    pub removed_services: Vec<String>,
    pub node_removed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InvalidDelta {
    #[error("unknown resource type {0:?}")]
    UnknownType(String),
    #[error("resource {name:?}: type {found:?} in a response of type {expected:?}")]
    MixedTypes { name: String, expected: String, found: String },
    #[error("resource {name:?}: {source}")]
    Invalid { name: String, source: InvalidResource },
    #[error("resource {name:?}: its content names it {actual:?}")]
    NameMismatch { name: String, actual: String },
    #[error("resource {name:?}: node config for another node (this is {node:?})")]
    OtherNode { name: String, node: String },
    #[error("resource {0:?}: no version")]
    NoVersion(String),
}

impl Delta {
    /// Validates a whole response; one bad resource refuses all of it.
    pub fn validate(
        node_name: &str,
        type_url: &str,
        resources: Vec<RawResource>,
        removed: Vec<String>,
    ) -> Result<Delta, InvalidDelta> {
        let ty = ResourceType::from_type_url(type_url)
            .ok_or_else(|| InvalidDelta::UnknownType(type_url.to_owned()))?;
        let mut delta = Delta::default();
        for raw in resources {
            if raw.type_url != type_url {
                return Err(InvalidDelta::MixedTypes {
                    name: raw.name,
                    expected: type_url.into(),
                    found: raw.type_url,
                });
            }
            if raw.version.is_empty() {
                return Err(InvalidDelta::NoVersion(raw.name));
            }
            match ty {
                ResourceType::ServiceView => {
                    let value = ServiceView::decode(&raw.body)
                        .map_err(|source| InvalidDelta::Invalid { name: raw.name.clone(), source })?;
                    let actual = value.resource_name();
                    if actual != raw.name {
                        return Err(InvalidDelta::NameMismatch { name: raw.name, actual });
                    }
                    delta.services.push(Versioned { version: raw.version, value });
                }
                ResourceType::NodeConfig => {
                    let value = NodeConfig::decode(&raw.body)
                        .map_err(|source| InvalidDelta::Invalid { name: raw.name.clone(), source })?;
                    if raw.name != node_name || value.name != node_name {
                        return Err(InvalidDelta::OtherNode { name: raw.name, node: node_name.into() });
                    }
                    delta.node = Some(Versioned { version: raw.version, value });
                }
            }
        }
        match ty {
            ResourceType::ServiceView => delta.removed_services = removed,
            ResourceType::NodeConfig => delta.node_removed = removed.iter().any(|n| n == node_name),
        }
        Ok(delta)
    }

    pub fn resource_count(&self) -> usize {
        self.services.len() + usize::from(self.node.is_some())
    }
}

/// What a delta changed, for a backend's partial sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// Services added, changed or removed (look them up in the new state).
    pub services: BTreeSet<String>,
    pub node: bool,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.node
    }
}

/// How to put the state back as it was before a delta.
#[derive(Debug, Default)]
pub struct Undo {
    services: Vec<(String, Option<Versioned<ServiceView>>)>,
    node: Option<Option<Versioned<NodeConfig>>>,
}

impl NodeState {
    /// Applies a validated delta in place; returns what changed and how to undo it.
    /// Resources whose version the node already has are no change.
    pub fn apply(&mut self, delta: Delta) -> (ChangeSet, Undo) {
        let mut changes = ChangeSet::default();
        let mut undo = Undo::default();
        for svc in delta.services {
            let name = svc.value.resource_name();
            if self.services.get(&name).is_some_and(|old| old.version == svc.version) {
                continue;
            }
            let old = self.services.insert(name.clone(), svc);
            undo.services.push((name.clone(), old));
            changes.services.insert(name);
        }
        for name in delta.removed_services {
            if let Some(old) = self.services.remove(&name) {
                undo.services.push((name.clone(), Some(old)));
                changes.services.insert(name);
            }
        }
        if let Some(node) = delta.node {
            if self.node.as_ref().map(|n| &n.version) != Some(&node.version) {
                undo.node = Some(self.node.replace(node));
                changes.node = true;
            }
        } else if delta.node_removed && self.node.is_some() {
            undo.node = Some(self.node.take());
            changes.node = true;
        }
        (changes, undo)
    }

    pub fn undo(&mut self, undo: Undo) {
        for (name, old) in undo.services.into_iter().rev() {
            match old {
                Some(v) => self.services.insert(name, v),
                None => self.services.remove(&name),
            };
        }
        if let Some(node) = undo.node {
            self.node = node;
        }
    }
}
