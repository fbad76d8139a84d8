//! One cluster's model, kept up to date by changes: its state plus the slices of every
//! Service, indexed as they come and go (no scan of all slices per Service or per change).
//! Applying a change says what it touched, so views are recomputed for those only.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A set kept as a sorted `Vec`: most Services have one or two slices, and a `Vec` of one
/// costs far less than a tree.
type SortedSet<T> = Vec<T>;

fn insert_sorted<T: Ord>(set: &mut SortedSet<T>, item: T) {
    if let Err(at) = set.binary_search(&item) {
        set.insert(at, item);
    }
}

fn remove_sorted<T: Ord>(set: &mut SortedSet<T>, item: &T) {
    if let Ok(at) = set.binary_search(item) {
        set.remove(at);
    }
}

use super::{ClusterState, EndpointSlice, McsSlice, Node, ObjectChanges, ObjectKey, Service};

/// A cluster's objects and its index of slices by Service.
#[derive(Debug, Default)]
pub struct Cluster {
    state: ClusterState,
    /// Service key → the keys of its EndpointSlices.
    slices_of: HashMap<ObjectKey, SortedSet<ObjectKey>>,
}

/// What a change touched.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// Services whose object or EndpointSlices changed; a slice that moved from one
    /// Service to another touches both.
    pub services: BTreeSet<ObjectKey>,
    /// Of those, the ones marked global (before or after the change): the same
    /// namespace/name in other clusters may draw on them.
    pub shared: BTreeSet<ObjectKey>,
    /// Names whose ServiceExport, ServiceImport or MCS EndpointSlices changed, or whose
    /// Service or slices changed while this cluster exports the name: every cluster's
    /// import of the name may differ.
    pub exported: BTreeSet<ObjectKey>,
    /// Nodes whose object changed, came or went.
    pub nodes: BTreeSet<String>,
}

impl Touched {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.nodes.is_empty() && self.exported.is_empty()
    }
}

/// Upserts (`Some`) or removes (`None`) `key` in `map`; whether that changed it.
fn set<K: Ord + Clone, V: PartialEq>(map: &mut BTreeMap<K, V>, key: &K, new: Option<V>) -> bool {
    if map.get(key) == new.as_ref() {
        return false;
    }
    match new {
        Some(value) => map.insert(key.clone(), value),
        None => map.remove(key),
    };
    true
}

/// The Service an EndpointSlice belongs to.
fn owner(slice: &EndpointSlice) -> ObjectKey {
    ObjectKey { namespace: slice.namespace.clone(), name: slice.service_name.clone() }
}

fn index(state: &ClusterState) -> HashMap<ObjectKey, SortedSet<ObjectKey>> {
    let mut index: HashMap<ObjectKey, SortedSet<ObjectKey>> = HashMap::new();
    for (key, slice) in &state.slices {
        // In key order: each list stays sorted.
        index.entry(owner(slice)).or_default().push(key.clone());
    }
    index
}

/// The keys whose value differs between `old` and `new` (present in one only, or unequal).
fn changed_keys<'a, K: Ord, V: PartialEq>(old: &'a BTreeMap<K, V>, new: &'a BTreeMap<K, V>) -> Vec<&'a K> {
    let mut keys: Vec<&K> = new.iter().filter(|(k, v)| old.get(*k) != Some(*v)).map(|(k, _)| k).collect();
    keys.extend(old.keys().filter(|k| !new.contains_key(*k)));
    keys
}

impl Cluster {
    pub fn new(state: ClusterState) -> Self {
        let slices_of = index(&state);
        Cluster { state, slices_of }
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn service(&self, key: &ObjectKey) -> Option<&Service> {
        self.state.services.get(key)
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.state.nodes.get(name)
    }

    /// The EndpointSlices a proxy uses for Service `key`, in slice-key order: those not
    /// labelled headless.
    pub fn slices_of(&self, key: &ObjectKey) -> Vec<&EndpointSlice> {
        self.exported_slices_of(key).into_iter().filter(|s| !s.headless).collect()
    }

    /// Every EndpointSlice of Service `key`, headless ones included: what an MCS export
    /// carries to the clusterset (a headless import's endpoints are its whole point).
    pub fn exported_slices_of(&self, key: &ObjectKey) -> Vec<&EndpointSlice> {
        self.slices_of
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|slice| self.state.slices.get(slice))
            .collect()
    }

    fn is_global(&self, key: &ObjectKey) -> bool {
        self.service(key).is_some_and(|s| s.global)
    }

    fn is_exported(&self, key: &ObjectKey) -> bool {
        self.state.exports.contains_key(key)
    }

    /// Applies per-object changes; an upsert equal to what is known touches nothing.
    pub fn apply(&mut self, changes: ObjectChanges) -> Touched {
        let mut touched = Touched::default();
        for (key, new) in changes.services {
            let old = self.state.services.get(&key);
            if old == new.as_ref() {
                continue;
            }
            if old.is_some_and(|s| s.global) || new.as_ref().is_some_and(|s| s.global) {
                touched.shared.insert(key.clone());
            }
            if self.is_exported(&key) {
                touched.exported.insert(key.clone());
            }
            touched.services.insert(key.clone());
            match new {
                Some(svc) => self.state.services.insert(key, svc),
                None => self.state.services.remove(&key),
            };
        }
        for (key, new) in changes.slices {
            let old = self.state.slices.get(&key);
            if old == new.as_ref() {
                continue;
            }
            let owners: BTreeSet<ObjectKey> = old.into_iter().chain(new.as_ref()).map(owner).collect();
            if let Some(old) = old.map(owner) {
                if let Some(set) = self.slices_of.get_mut(&old) {
                    remove_sorted(set, &key);
                    if set.is_empty() {
                        self.slices_of.remove(&old);
                    }
                }
            }
            match new {
                Some(slice) => {
                    insert_sorted(self.slices_of.entry(owner(&slice)).or_default(), key.clone());
                    self.state.slices.insert(key, slice);
                }
                None => {
                    self.state.slices.remove(&key);
                }
            }
            for svc in owners {
                if self.is_global(&svc) {
                    touched.shared.insert(svc.clone());
                }
                if self.is_exported(&svc) {
                    touched.exported.insert(svc.clone());
                }
                touched.services.insert(svc);
            }
        }
        for (key, new) in changes.exports {
            if set(&mut self.state.exports, &key, new) {
                touched.exported.insert(key);
            }
        }
        for (key, new) in changes.imports {
            if set(&mut self.state.imports, &key, new) {
                touched.exported.insert(key);
            }
        }
        for (key, new) in changes.mcs_slices {
            let imports =
                |s: &McsSlice| ObjectKey { namespace: s.key.namespace.clone(), name: s.spec.service.clone() };
            let before = self.state.mcs_slices.get(&key).map(imports);
            let after = new.as_ref().map(imports);
            if set(&mut self.state.mcs_slices, &key, new) {
                touched.exported.extend(before.into_iter().chain(after));
            }
        }
        for (name, new) in changes.nodes {
            if set(&mut self.state.nodes, &name, new) {
                touched.nodes.insert(name);
            }
        }
        if !changes.service_cidrs.is_empty() {
            let ranges = self.state.service_ranges();
            for (name, new) in changes.service_cidrs {
                set(&mut self.state.service_cidrs, &name, new);
            }
            if self.state.service_ranges() != ranges {
                // Every node's config carries the Service CIDRs.
                touched.nodes.extend(self.state.nodes.keys().cloned());
            }
        }
        touched
    }

    /// Swaps in a whole state (a relist); touches only what differs from the known one.
    pub fn replace(&mut self, new: ClusterState) -> Touched {
        let mut touched = Touched::default();
        let old = &self.state;
        let global = |key: &ObjectKey| {
            old.services.get(key).is_some_and(|s| s.global) || new.services.get(key).is_some_and(|s| s.global)
        };
        for key in changed_keys(&old.services, &new.services) {
            touched.services.insert(key.clone());
        }
        for key in changed_keys(&old.slices, &new.slices) {
            for slice in old.slices.get(key).into_iter().chain(new.slices.get(key)) {
                touched.services.insert(owner(slice));
            }
        }
        touched.shared = touched.services.iter().filter(|k| global(k)).cloned().collect();
        let exported = |key: &ObjectKey| old.exports.contains_key(key) || new.exports.contains_key(key);
        touched.exported = touched.services.iter().filter(|k| exported(k)).cloned().collect();
        touched.exported.extend(changed_keys(&old.exports, &new.exports).into_iter().cloned());
        touched.exported.extend(changed_keys(&old.imports, &new.imports).into_iter().cloned());
        for key in changed_keys(&old.mcs_slices, &new.mcs_slices) {
            for slice in old.mcs_slices.get(key).into_iter().chain(new.mcs_slices.get(key)) {
                touched.exported.insert(ObjectKey {
                    namespace: slice.key.namespace.clone(),
                    name: slice.spec.service.clone(),
                });
            }
        }
        touched.nodes = changed_keys(&old.nodes, &new.nodes).into_iter().cloned().collect();
        if old.service_ranges() != new.service_ranges() {
            touched.nodes.extend(new.nodes.keys().cloned());
        }
        *self = Cluster::new(new);
        touched
    }
}

#[cfg(test)]
mod tests;
