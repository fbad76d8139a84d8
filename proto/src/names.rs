//! Names that many values repeat — the node an endpoint is on, the cluster it comes
//! from — kept once: at 250k endpoints on 5,000 nodes, one copy per node, not per endpoint.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Below this many names the set is never pruned.
const PRUNE_FROM: usize = 1024;

#[derive(Default)]
struct Names {
    names: HashSet<Arc<str>>,
    /// How many names were left by the last pruning.
    after_pruning: usize,
}

fn names() -> &'static Mutex<Names> {
    static NAMES: OnceLock<Mutex<Names>> = OnceLock::new();
    NAMES.get_or_init(Mutex::default)
}

/// The shared copy of `name`. Names nothing holds any more are forgotten whenever the set
/// has doubled since it was last pruned.
pub fn intern(name: &str) -> Arc<str> {
    static EMPTY: OnceLock<Arc<str>> = OnceLock::new();
    if name.is_empty() {
        return Arc::clone(EMPTY.get_or_init(|| Arc::from("")));
    }
    let mut set = names().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = set.names.get(name) {
        return Arc::clone(known);
    }
    if set.names.len() >= (2 * set.after_pruning).max(PRUNE_FROM) {
        set.names.retain(|n| Arc::strong_count(n) > 1);
        set.after_pruning = set.names.len();
    }
    let name: Arc<str> = Arc::from(name);
    set.names.insert(Arc::clone(&name));
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_per_name_and_the_unused_forgotten() {
        let a = intern("node-interned-a");
        let b = intern(&String::from("node-interned-a"));
        assert!(Arc::ptr_eq(&a, &b), "the same copy");
        assert_eq!(&*intern(""), "");
        drop((a, b));
        // Enough new names to prune: the one nothing holds is gone.
        let kept: Vec<Arc<str>> =
            (0..2 * PRUNE_FROM).map(|i| intern(&format!("node-interned-{i}"))).collect();
        let held = names().lock().unwrap_or_else(PoisonError::into_inner).names.contains("node-interned-a");
        assert!(!held, "pruned once the set doubled");
        assert!(Arc::ptr_eq(&kept[7], &intern("node-interned-7")), "held names stay shared");
    }
}
