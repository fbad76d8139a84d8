//! Where each node is, as views and snapshots need it: its zone and, with several
//! clusters, its home, the cluster whose Services it gets. Node names are taken to be
//! unique across clusters; a node that two clusters name has the first (in cluster-name
//! order) as its home and the zone the last one gives it.
//!
//! Kept in persistent maps, so each snapshot holds the placement it was built with at
//! O(1) cost, and placing one node again costs O(clusters).

use std::collections::BTreeMap;

use crate::model::{Cluster, Node};

#[derive(Debug, Clone, Default)]
pub struct Placement {
    several_clusters: bool,
    /// Each node's zone (`topology.kubernetes.io/zone` of its Node object).
    zones: imbl::HashMap<String, String>,
    /// How many nodes each zone has; a zone is known while it has one.
    zone_sizes: imbl::HashMap<String, usize>,
    /// With several clusters: each node's home cluster.
    homes: imbl::HashMap<String, String>,
}

/// What placing a node again changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub zone: bool,
    pub home: bool,
}

impl Placement {
    pub fn new(several_clusters: bool) -> Self {
        Placement { several_clusters, ..Placement::default() }
    }

    /// Every node of `clusters` placed (a whole rebuild).
    pub fn of(clusters: &BTreeMap<String, Cluster>, several_clusters: bool) -> Self {
        let mut placement = Placement::new(several_clusters);
        let names: std::collections::BTreeSet<&str> =
            clusters.values().flat_map(|c| c.state().nodes.keys().map(String::as_str)).collect();
        for name in names {
            placement.place(name, clusters);
        }
        placement
    }

    /// Places `node` again from the Node objects of every cluster.
    pub fn place(&mut self, node: &str, clusters: &BTreeMap<String, Cluster>) -> Moved {
        let objects: Vec<(&str, &Node)> =
            clusters.iter().filter_map(|(c, model)| model.node(node).map(|n| (c.as_str(), n))).collect();
        if self.several_clusters && objects.len() > 1 {
            tracing::warn!(
                node,
                first = objects[0].0,
                also = objects[1].0,
                "a node of two clusters: the first one is its home"
            );
        }
        let zone = objects.last().and_then(|(_, n)| n.zone.clone());
        let home = objects.first().filter(|_| self.several_clusters).map(|(c, _)| (*c).to_owned());
        let moved = Moved {
            zone: self.zones.get(node) != zone.as_ref(),
            home: self.homes.get(node) != home.as_ref(),
        };
        if moved.zone {
            if let Some(old) = self.zones.remove(node) {
                self.count(&old, -1);
            }
            if let Some(zone) = zone {
                self.count(&zone, 1);
                self.zones.insert(node.to_owned(), zone);
            }
        }
        if moved.home {
            match home {
                Some(home) => self.homes.insert(node.to_owned(), home),
                None => self.homes.remove(node),
            };
        }
        moved
    }

    fn count(&mut self, zone: &str, by: isize) {
        let size = self.zone_sizes.get(zone).copied().unwrap_or(0).saturating_add_signed(by);
        if size == 0 {
            self.zone_sizes.remove(zone);
        } else {
            self.zone_sizes.insert(zone.to_owned(), size);
        }
    }

    /// The node's zone, when its Node object gives one.
    pub fn zone(&self, node: &str) -> Option<&str> {
        self.zones.get(node).map(String::as_str)
    }

    /// Whether some node is in `zone`.
    pub fn knows_zone(&self, zone: &str) -> bool {
        self.zone_sizes.contains_key(zone)
    }

    /// The nodes in `zone`, in name order (walks every node: for the admin API).
    pub fn nodes_in(&self, zone: &str) -> Vec<&str> {
        let mut nodes: Vec<&str> =
            self.zones.iter().filter(|(_, z)| z.as_str() == zone).map(|(n, _)| n.as_str()).collect();
        nodes.sort_unstable();
        nodes
    }

    /// The cluster whose Services `node` gets: `Some(None)` for all of them (one cluster),
    /// `None` for none (several clusters, and no Node object names it).
    pub fn home(&self, node: &str) -> Option<Option<&str>> {
        if !self.several_clusters {
            return Some(None);
        }
        self.homes.get(node).map(|c| Some(c.as_str()))
    }

    /// Every node that has a zone or a home (some twice).
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.zones.keys().chain(self.homes.keys()).map(String::as_str)
    }

    pub fn several_clusters(&self) -> bool {
        self.several_clusters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ClusterState;

    /// Node name and zone.
    type Nodes<'a> = &'a [(&'a str, Option<&'a str>)];

    fn clusters(list: &[(&str, Nodes<'_>)]) -> BTreeMap<String, Cluster> {
        list.iter()
            .map(|(cluster, nodes)| {
                let mut state = ClusterState::default();
                for (name, zone) in *nodes {
                    let node = Node {
                        name: (*name).into(),
                        addresses: vec![],
                        pod_cidrs: vec![],
                        zone: zone.map(str::to_owned),
                        being_deleted: false,
                    };
                    state.nodes.insert((*name).into(), node);
                }
                ((*cluster).to_owned(), Cluster::new(state))
            })
            .collect()
    }

    #[test]
    fn the_first_cluster_is_home_and_the_last_gives_the_zone() {
        let all = clusters(&[("east", &[("n1", Some("a")), ("n2", None)]), ("west", &[("n1", Some("b"))])]);
        let placement = Placement::of(&all, true);
        assert_eq!(placement.home("n1"), Some(Some("east")));
        assert_eq!(placement.zone("n1"), Some("b"));
        assert_eq!(placement.home("n2"), Some(Some("east")));
        assert_eq!(placement.home("stranger"), None, "several clusters: nobody's node gets nothing");
        assert!(placement.knows_zone("b") && !placement.knows_zone("a"));
        let one = Placement::of(&clusters(&[("c", &[("n1", Some("a"))])]), false);
        assert_eq!((one.home("n1"), one.home("stranger")), (Some(None), Some(None)));
    }

    #[test]
    fn placing_a_node_again_says_what_moved_and_zones_are_counted() {
        let mut placement = Placement::new(true);
        let before = clusters(&[("east", &[("n1", Some("a")), ("n2", Some("a"))])]);
        assert_eq!(placement.place("n1", &before), Moved { zone: true, home: true });
        assert_eq!(placement.place("n2", &before), Moved { zone: true, home: true });
        assert_eq!(placement.place("n1", &before), Moved::default(), "nothing changed");
        assert_eq!(placement.nodes_in("a"), ["n1", "n2"]);
        let after = clusters(&[("east", &[("n2", Some("b"))])]);
        assert_eq!(placement.place("n1", &after), Moved { zone: true, home: true });
        assert!(placement.knows_zone("a"), "n2 is still there");
        assert_eq!(placement.place("n2", &after), Moved { zone: true, home: false });
        assert!(!placement.knows_zone("a") && placement.knows_zone("b"));
        assert_eq!(placement.home("n1"), None);
    }
}
