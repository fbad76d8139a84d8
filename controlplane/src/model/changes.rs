//! What a source says changed since its last word: per object, its new value or its
//! deletion. Later changes of the same object replace earlier ones, so a burst of
//! events becomes one change per object.

use std::collections::BTreeMap;

use super::{
    ClusterState, EndpointSlice, McsSlice, Node, ObjectKey, Service, ServiceCidr, ServiceExport,
    ServiceImport,
};

/// Upserts (`Some`) and deletions (`None`) of each kind's objects, by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectChanges {
    pub services: BTreeMap<ObjectKey, Option<Service>>,
    /// By the slice's own key.
    pub slices: BTreeMap<ObjectKey, Option<EndpointSlice>>,
    pub nodes: BTreeMap<String, Option<Node>>,
    pub service_cidrs: BTreeMap<String, Option<ServiceCidr>>,
    pub exports: BTreeMap<ObjectKey, Option<ServiceExport>>,
    pub imports: BTreeMap<ObjectKey, Option<ServiceImport>>,
    pub mcs_slices: BTreeMap<ObjectKey, Option<McsSlice>>,
}

impl ObjectChanges {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.slices.is_empty()
            && self.nodes.is_empty()
            && self.service_cidrs.is_empty()
            && self.exports.is_empty()
            && self.imports.is_empty()
            && self.mcs_slices.is_empty()
    }

    /// How many objects changed.
    pub fn len(&self) -> usize {
        self.services.len()
            + self.slices.len()
            + self.nodes.len()
            + self.service_cidrs.len()
            + self.exports.len()
            + self.imports.len()
            + self.mcs_slices.len()
    }

    /// Takes `later` in: where both name an object, `later` wins.
    pub fn merge(&mut self, later: ObjectChanges) {
        self.services.extend(later.services);
        self.slices.extend(later.slices);
        self.nodes.extend(later.nodes);
        self.service_cidrs.extend(later.service_cidrs);
        self.exports.extend(later.exports);
        self.imports.extend(later.imports);
        self.mcs_slices.extend(later.mcs_slices);
    }

    /// The objects upserted, as a state (deletions have nothing to add).
    pub fn into_state(self) -> ClusterState {
        fn upserts<K: Ord, V>(changes: BTreeMap<K, Option<V>>) -> BTreeMap<K, V> {
            changes.into_iter().filter_map(|(k, v)| Some((k, v?))).collect()
        }
        ClusterState {
            services: upserts(self.services),
            slices: upserts(self.slices),
            nodes: upserts(self.nodes),
            service_cidrs: upserts(self.service_cidrs),
            exports: upserts(self.exports),
            imports: upserts(self.imports),
            mcs_slices: upserts(self.mcs_slices),
        }
    }

    /// What turns `old` into `new`: O(size of both), for a whole state read again.
    pub fn between(old: &ClusterState, new: &ClusterState) -> ObjectChanges {
        ObjectChanges {
            services: diff_by_key(&old.services, &new.services),
            slices: diff_by_key(&old.slices, &new.slices),
            nodes: diff_by_key(&old.nodes, &new.nodes),
            service_cidrs: diff_by_key(&old.service_cidrs, &new.service_cidrs),
            exports: diff_by_key(&old.exports, &new.exports),
            imports: diff_by_key(&old.imports, &new.imports),
            mcs_slices: diff_by_key(&old.mcs_slices, &new.mcs_slices),
        }
    }
}

/// The entries of `new` that are not in `old` as they are, and deletions for the keys
/// `new` lacks.
pub fn diff_by_key<K: Ord + Clone, V: PartialEq + Clone>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
) -> BTreeMap<K, Option<V>> {
    let mut out: BTreeMap<K, Option<V>> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    out.extend(old.keys().filter(|k| !new.contains_key(*k)).map(|k| (k.clone(), None)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: Option<&str>) -> Node {
        Node {
            name: name.into(),
            addresses: vec![],
            pod_cidrs: vec![],
            zone: zone.map(str::to_owned),
            being_deleted: false,
        }
    }

    #[test]
    fn between_two_states_are_the_upserts_and_deletions_only() {
        let mut old = ClusterState::default();
        for n in ["a", "b", "c"] {
            old.nodes.insert(n.into(), node(n, None));
        }
        let mut new = old.clone();
        new.nodes.remove("a");
        new.nodes.insert("b".into(), node("b", Some("z1")));
        new.nodes.insert("d".into(), node("d", None));
        let changes = ObjectChanges::between(&old, &new);
        let got: Vec<(&str, Option<Option<&str>>)> =
            changes.nodes.iter().map(|(k, v)| (k.as_str(), v.as_ref().map(|n| n.zone.as_deref()))).collect();
        assert_eq!(got, [("a", None), ("b", Some(Some("z1"))), ("d", Some(None))]);
        assert!(ObjectChanges::between(&new, &new).is_empty(), "identical: nothing");
        let rebuilt = ObjectChanges::between(&ClusterState::default(), &new).into_state();
        assert_eq!(rebuilt, new, "from nothing, the upserts are the state");
    }

    #[test]
    fn a_later_change_of_the_same_object_wins() {
        let mut first = ObjectChanges::default();
        first.nodes.insert("a".into(), Some(node("a", None)));
        first.nodes.insert("b".into(), Some(node("b", None)));
        let mut later = ObjectChanges::default();
        later.nodes.insert("a".into(), None);
        first.merge(later);
        assert_eq!(first.nodes.get("a"), Some(&None));
        assert_eq!(first.len(), 2);
    }
}
