//! The node's desired state: every resource it accepted, with its version.
//!
//! A delta is validated as a whole before anything changes ([`Delta::validate`]);
//! it is then applied in place and can be undone exactly ([`Undo`]) when the
//! kernel or the store refuses it, so the last good state is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kpx_proto::types::{NodeConfig, ServiceView};
use kpx_proto::{InvalidResource, ResourceType};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub version: String,
    pub value: T,
}

/// Every accepted Service by resource name.
pub type Services = BTreeMap<String, Versioned<Arc<ServiceView>>>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    pub node: Option<Versioned<NodeConfig>>,
    /// Shared: a clone of the state (what a backend's bookkeeping is rebuilt from on a
    /// thread of its own) costs nothing until one side changes its Services
    /// ([`NodeState::services_mut`]), which then copies them (at 50,000 Services the copy
    /// is about 8 MB).
    pub services: Arc<Services>,
}

impl NodeState {
    /// The Services, to change; copied first if a clone of the state still shares them.
    pub fn services_mut(&mut self) -> &mut Services {
        Arc::make_mut(&mut self.services)
    }

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
    /// Each decoded straight into the allocation the state will share it by: a response
    /// of every Service (a node's first) never holds its views twice.
    pub services: Vec<Versioned<Arc<ServiceView>>>,
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
    #[error("resource {name:?}: a Service for the agents {}, and this one runs {} (does the control plane know --service-proxy-name?)", for_whom(.found), for_whom(.ours))]
    OtherProxy { name: String, ours: Option<String>, found: Option<String> },
}

fn for_whom(proxy: &Option<String>) -> String {
    match proxy {
        Some(name) => format!("with --service-proxy-name {name}"),
        None => "without --service-proxy-name".to_owned(),
    }
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
                    delta.services.push(Versioned { version: raw.version, value: Arc::new(value) });
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

    /// Refuses a Service meant for the agents of another `--service-proxy-name` than
    /// `ours` (a control plane that does not filter by it sends every node everything).
    pub fn check_proxy_name(&self, ours: Option<&str>) -> Result<(), InvalidDelta> {
        match self.services.iter().find(|s| s.value.service_proxy_name.as_deref() != ours) {
            None => Ok(()),
            Some(other) => Err(InvalidDelta::OtherProxy {
                name: other.value.resource_name(),
                ours: ours.map(str::to_owned),
                found: other.value.service_proxy_name.clone(),
            }),
        }
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
    services: Vec<(String, Option<Versioned<Arc<ServiceView>>>)>,
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
            let old = self
                .services_mut()
                .insert(name.clone(), Versioned { version: svc.version, value: svc.value });
            undo.services.push((name.clone(), old));
            changes.services.insert(name);
        }
        for name in delta.removed_services {
            if let Some(old) = self.services_mut().remove(&name) {
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
                Some(v) => self.services_mut().insert(name, v),
                None => self.services_mut().remove(&name),
            };
        }
        if let Some(node) = undo.node {
            self.node = node;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::{node_config, service};

    fn versioned<T>(version: &str, value: T) -> Versioned<T> {
        Versioned { version: version.into(), value }
    }

    fn state() -> NodeState {
        let mut s = NodeState { node: Some(versioned("n-1", node_config())), ..Default::default() };
        for name in ["a", "b"] {
            let view = service(name, "10.96.0.1", &["10.244.0.1"]);
            s.services_mut().insert(view.resource_name(), versioned("1", view.into()));
        }
        s
    }

    #[test]
    fn a_delta_applied_in_place_is_undone_exactly() {
        let before = state();
        let mut now = before.clone();
        let delta = Delta {
            services: vec![
                versioned("2", Arc::new(service("a", "10.96.0.1", &["10.244.0.2"]))),
                versioned("1", Arc::new(service("c", "10.96.0.3", &[]))),
                versioned("1", Arc::new(service("b", "10.96.0.1", &["10.244.0.1"]))),
            ],
            node: Some(versioned("n-2", NodeConfig { zone: "z".into(), ..node_config() })),
            removed_services: vec!["c/ns/b".into(), "c/ns/unknown".into()],
            node_removed: false,
        };
        let (changes, undo) = now.apply(delta);
        let names: Vec<&str> = changes.services.iter().map(String::as_str).collect();
        assert_eq!(names, ["c/ns/a", "c/ns/b", "c/ns/c"], "b's same version is no change, its removal is");
        assert!(changes.node);
        assert!(!now.services.contains_key("c/ns/b") && now.services["c/ns/a"].version == "2");
        now.undo(undo);
        assert_eq!(now, before);
        let (changes, undo) = now.apply(Delta { node_removed: true, ..Delta::default() });
        assert!(changes.node && now.node.is_none());
        now.undo(undo);
        assert_eq!(now, before);
    }

    #[test]
    fn a_clone_shares_the_services_until_either_side_changes_them() {
        let before = state();
        let mut now = before.clone();
        assert!(Arc::ptr_eq(&before.services, &now.services), "a clone copies no Service");
        let (changes, _) = now.apply(Delta { removed_services: vec!["c/ns/a".into()], ..Delta::default() });
        assert_eq!(changes.services.len(), 1);
        assert!(!Arc::ptr_eq(&before.services, &now.services), "the change copied them first");
        assert!(before.services.contains_key("c/ns/a"), "the clone still holds what it was taken with");
        assert!(!now.services.contains_key("c/ns/a"));
        let (unchanged, _) = now.apply(Delta::default());
        let shared = now.clone();
        assert!(unchanged.services.is_empty() && Arc::ptr_eq(&shared.services, &now.services));
    }

    #[test]
    fn validation_refuses_the_whole_response_and_names_the_resource() {
        let view = service("a", "10.96.0.1", &[]);
        let good = RawResource {
            name: view.resource_name(),
            version: "1".into(),
            type_url: ResourceType::ServiceView.type_url().into(),
            body: view.encode(),
        };
        let url = ResourceType::ServiceView.type_url();
        let misnamed = RawResource { name: "c/ns/other".into(), ..good.clone() };
        let err = Delta::validate("n1", url, vec![good.clone(), misnamed], vec![]).expect_err("name");
        assert!(matches!(err, InvalidDelta::NameMismatch { .. }), "{err}");
        let unversioned = RawResource { version: String::new(), ..good.clone() };
        assert!(matches!(
            Delta::validate("n1", url, vec![unversioned], vec![]),
            Err(InvalidDelta::NoVersion(_))
        ));
        let mixed = RawResource { type_url: ResourceType::NodeConfig.type_url().into(), ..good.clone() };
        assert!(matches!(
            Delta::validate("n1", url, vec![mixed], vec![]),
            Err(InvalidDelta::MixedTypes { .. })
        ));
        let delta = Delta::validate("n1", url, vec![good], vec!["c/ns/gone".into()]).expect("valid");
        delta.check_proxy_name(None).expect("for agents without a name");
        let err = delta.check_proxy_name(Some("kpx-b")).expect_err("not for kpx-b");
        assert!(
            err.to_string().contains("without --service-proxy-name") && err.to_string().contains("kpx-b"),
            "{err}"
        );
        assert_eq!((delta.resource_count(), delta.removed_services.len()), (1, 1));
    }
}
