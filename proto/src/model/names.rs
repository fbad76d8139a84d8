//! Names that many endpoints repeat — the node an endpoint is on, the cluster it comes
//! from — kept once per pair: at 250k endpoints on 5,000 nodes, one copy per node, not
//! per endpoint, and one pointer in each endpoint for both.

use crate::sync::Locked as _;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

/// Below this many origins the table is never pruned.
const PRUNE_FROM: usize = 1024;

/// Where an endpoint runs: its node's name and its cluster ("" when it is the Service's
/// own). Shared: every endpoint of one node and cluster holds the same copy.
#[derive(Clone)]
pub struct Origin(Arc<Names>);

struct Names {
    node_name: Box<str>,
    cluster: Box<str>,
}

#[derive(Default)]
struct Origins {
    /// cluster → node name → origin.
    known: HashMap<Box<str>, HashMap<Box<str>, Origin>>,
    count: usize,
    /// How many origins were left by the last pruning.
    after_pruning: usize,
}

fn origins() -> &'static Mutex<Origins> {
    static ORIGINS: OnceLock<Mutex<Origins>> = OnceLock::new();
    ORIGINS.get_or_init(Mutex::default)
}

impl Origin {
    /// The shared copy of (`node_name`, `cluster`). Origins nothing holds any more are
    /// forgotten whenever the table has doubled since it was last pruned.
    pub fn of(node_name: &str, cluster: &str) -> Origin {
        static NOWHERE: OnceLock<Origin> = OnceLock::new();
        let fresh = || Origin(Arc::new(Names { node_name: node_name.into(), cluster: cluster.into() }));
        if node_name.is_empty() && cluster.is_empty() {
            return NOWHERE.get_or_init(fresh).clone();
        }
        let mut table = origins().locked();
        if let Some(known) = table.known.get(cluster).and_then(|nodes| nodes.get(node_name)) {
            return known.clone();
        }
        if table.count >= (2 * table.after_pruning).max(PRUNE_FROM) {
            table.known.retain(|_, nodes| {
                nodes.retain(|_, o| Arc::strong_count(&o.0) > 1);
                !nodes.is_empty()
            });
            table.count = table.known.values().map(HashMap::len).sum();
            table.after_pruning = table.count;
        }
        let origin = fresh();
        table.known.entry(cluster.into()).or_default().insert(node_name.into(), origin.clone());
        table.count += 1;
        origin
    }

    pub fn node_name(&self) -> &str {
        &self.0.node_name
    }

    pub fn cluster(&self) -> &str {
        &self.0.cluster
    }

    fn key(&self) -> (&str, &str) {
        (self.node_name(), self.cluster())
    }
}

impl PartialEq for Origin {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.key() == other.key()
    }
}

impl Eq for Origin {}

impl PartialOrd for Origin {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Origin {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl Hash for Origin {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("node_name", &self.node_name())
            .field("cluster", &self.cluster())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(node_name: &str) -> bool {
        let table = origins().locked();
        table.known.get("c").is_some_and(|nodes| nodes.contains_key(node_name))
    }

    #[test]
    fn one_copy_per_origin_and_the_unused_forgotten() {
        let a = Origin::of("node-interned-a", "c");
        let b = Origin::of(&String::from("node-interned-a"), "c");
        assert!(Arc::ptr_eq(&a.0, &b.0), "the same copy");
        assert_eq!((b.node_name(), b.cluster()), ("node-interned-a", "c"));
        assert_ne!(a, Origin::of("node-interned-a", ""), "another cluster, another origin");
        assert_eq!(Origin::of("", "").key(), ("", ""));
        drop((a, b));
        // Enough new origins to prune: the one nothing holds is gone.
        let kept: Vec<Origin> =
            (0..2 * PRUNE_FROM).map(|i| Origin::of(&format!("node-interned-{i}"), "c")).collect();
        assert!(!held("node-interned-a"), "pruned once the table doubled");
        assert!(Arc::ptr_eq(&kept[7].0, &Origin::of("node-interned-7", "c").0), "held origins stay shared");
    }

    #[test]
    fn an_endpoint_is_32_bytes() {
        assert_eq!(std::mem::size_of::<crate::types::Endpoint>(), 32);
    }
}
