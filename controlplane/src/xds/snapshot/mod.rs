//! What every node should have, as one immutable [`Snapshot`].
//!
//! Each resource is encoded once and versioned by its content hash. Most Services mean
//! the same on every node: one default view, one `Arc<Resource>` for all. A Service
//! whose meaning depends on locality also has the zone and node variants that differ
//! ([`crate::view::ServiceViews`]). Resources are interned by version among the
//! resources of their name: identical variants share one `Arc`, and content that did
//! not change keeps the `Arc` of the previous snapshot, so streams compare pointers first.
//!
//! A snapshot is made from the previous one and the views of what changed
//! ([`Snapshot::next`]): the maps are persistent (`imbl`), so the new snapshot shares all
//! the rest with the previous one and building it costs O(changed · log n), not
//! O(Services). What changed is recorded as it is applied, for [`Snapshot::changed_since`].

mod build;
mod resource;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

pub use build::BuildOptions;
use kpx_proto::types::{NodeConfig, ServiceView};
pub use kpx_proto::ResourceType;
use resource::Interner;
pub use resource::Resource;

use crate::view::{Placement, ServiceViews, ViewChanges};

/// The newest snapshot, as the publisher publishes it; `None` until every source has
/// read its initial state.
pub type SnapshotReceiver = tokio::sync::watch::Receiver<Option<Arc<Snapshot>>>;

/// Resource name → resource, shared between snapshots.
type Resources = imbl::HashMap<String, Arc<Resource>>;

/// Resource name → resource in name order (what nodes walk), shared between snapshots.
type OrderedResources = imbl::OrdMap<String, Arc<Resource>>;

/// One Service's variants as stored: who gets each (a zone, a node) and the resource.
#[derive(Debug, Default)]
struct Variants {
    zones: Vec<(String, Arc<Resource>)>,
    nodes: Vec<(String, Arc<Resource>)>,
}

impl Variants {
    fn len(&self) -> usize {
        self.zones.len() + self.nodes.len()
    }

    fn resources(&self) -> impl Iterator<Item = &Arc<Resource>> {
        self.zones.iter().chain(&self.nodes).map(|(_, r)| r)
    }

    /// Whether both give every zone and node the same versions.
    fn same_as(&self, other: &Variants) -> bool {
        let same = |a: &[(String, Arc<Resource>)], b: &[(String, Arc<Resource>)]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1.version == y.1.version)
        };
        same(&self.zones, &other.zones) && same(&self.nodes, &other.nodes)
    }
}

/// Who a snapshot is read for: a node, and the `--service-proxy-name` its agent runs with
/// (`""`: none). An agent with a name gets the Services labelled with that name only; one
/// without gets the Services without the label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audience<'a> {
    pub node: &'a str,
    pub proxy: &'a str,
}

impl<'a> From<&'a String> for Audience<'a> {
    fn from(node: &'a String) -> Self {
        Audience { node, proxy: "" }
    }
}

impl<'a> From<&'a str> for Audience<'a> {
    /// A node whose agent runs without a `--service-proxy-name`.
    fn from(node: &'a str) -> Self {
        Audience { node, proxy: "" }
    }
}

#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// The default view of every Service without a `service-proxy-name` label, by resource name.
    services: OrderedResources,
    /// Proxy name → the default views of the Services labelled with it.
    named: imbl::HashMap<String, OrderedResources>,
    /// The proxy name of each labelled Service, by resource name.
    proxy_of: imbl::HashMap<String, String>,
    /// The variants of each Service that has some, by resource name.
    variants: imbl::HashMap<String, Arc<Variants>>,
    /// Zone → the views that differ from the default for that zone's nodes.
    zone_variants: imbl::HashMap<String, Resources>,
    /// Node → the views that differ for it from its zone's variant or the default.
    node_variants: imbl::HashMap<String, Resources>,
    variant_count: usize,
    /// Each node's zone and (several clusters) home cluster: with several clusters a node
    /// gets its home cluster's Services only; with one every node gets everything.
    placement: Placement,
    /// How many Services without a proxy name each cluster has.
    cluster_sizes: BTreeMap<String, usize>,
    /// Node configs by node name.
    node_configs: OrderedResources,
    /// 1 for the first snapshot, +1 for each next one.
    generation: u64,
    /// What changed in this snapshot and the ones before it (newest last), so a stream
    /// that had an older snapshot examines only the names that changed since.
    history: VecDeque<(u64, Arc<Changes>)>,
}

/// The names whose resources differ from the previous snapshot, for any node.
#[derive(Debug, Default)]
pub struct Changes {
    services: HashSet<String>,
    node_configs: HashSet<String>,
    /// Something changed that may alter any node's resources (nodes moved zones or homes).
    everything: bool,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.services.is_empty() && self.node_configs.is_empty() && !self.everything
    }
}

/// How many snapshots' changes are kept.
const HISTORY: usize = 32;

/// The cluster of a Service resource name (`<cluster>/<namespace>/<name>`).
fn cluster_of(name: &str) -> &str {
    name.split_once('/').map_or(name, |(cluster, _)| cluster)
}

fn encode(name: &str, view: &ServiceView) -> Resource {
    Resource::new(ResourceType::ServiceView, name.to_owned(), view.encode())
}

/// The next snapshot being made from the previous one, one part of the changes at a time
/// (so a large change, like the first snapshot, need not hold every view at once).
pub struct SnapshotBuilder<'p> {
    previous: &'p Snapshot,
    next: Snapshot,
    changed: Changes,
    moved: Vec<String>,
}

impl SnapshotBuilder<'_> {
    /// Takes one part of the changes in; the placement of the last part is kept.
    pub fn apply(&mut self, changes: ViewChanges) {
        for (name, views) in changes.services {
            self.next.set_service(name, views, &mut self.changed);
        }
        for (node, config) in changes.node_configs {
            self.next.set_node_config(node, config, &mut self.changed);
        }
        self.next.placement = changes.placement;
        self.moved.extend(changes.moved);
    }

    /// The next snapshot; `None` when no resource differs from the previous one for any
    /// node (and that is not the empty start).
    pub fn finish(self) -> Option<Snapshot> {
        let previous = self.previous;
        let (next, changed) = self.done();
        if changed.is_empty() && previous.generation > 0 {
            return None;
        }
        Some(next.recorded(previous, changed))
    }

    fn done(mut self) -> (Snapshot, Changes) {
        let (previous, next) = (self.previous, &self.next);
        // Which variants a node gets follows its zone (where that zone has variants) and its
        // home; when that changes, or a zone gains or loses its variants, any name may differ
        // for some node.
        let zones = |s: &Snapshot| s.zone_variants.keys().cloned().collect::<HashSet<String>>();
        self.changed.everything = zones(previous) != zones(next)
            || self.moved.iter().any(|node| {
                previous.placement.home(node) != next.placement.home(node)
                    || previous.variant_zone(node) != next.variant_zone(node)
            });
        (self.next, self.changed)
    }
}

impl Snapshot {
    /// The snapshot after `changes`; `None` when no resource differs from `previous` for
    /// any node (and `previous` is not the empty start).
    pub fn next(previous: &Snapshot, changes: ViewChanges) -> Option<Snapshot> {
        let mut builder = Snapshot::builder(previous);
        builder.apply(changes);
        builder.finish()
    }

    /// Starts the snapshot after `previous`.
    pub fn builder(previous: &Snapshot) -> SnapshotBuilder<'_> {
        SnapshotBuilder { previous, next: previous.clone(), changed: Changes::default(), moved: Vec::new() }
    }

    /// Takes `changed` into the history, as the snapshot after `previous`.
    fn recorded(mut self, previous: &Snapshot, changed: Changes) -> Snapshot {
        self.generation = previous.generation + 1;
        self.history.push_back((self.generation, Arc::new(changed)));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        self
    }

    /// The zone whose variants `node` gets, if that zone has any.
    fn variant_zone(&self, node: &str) -> Option<&str> {
        self.placement.zone(node).filter(|z| self.zone_variants.contains_key(*z))
    }

    /// Stores the views of Service `name` (`None`: removes it), keeping the `Arc`s of
    /// content that did not change.
    fn set_service(&mut self, name: String, views: Option<ServiceViews>, changed: &mut Changes) {
        let old_proxy = self.proxy_of.get(&name).cloned();
        let old_default =
            self.defaults_for(old_proxy.as_deref().unwrap_or("")).and_then(|m| m.get(&name)).cloned();
        let old_variants = self.variants.get(&name).cloned();
        let Some(views) = views else {
            if old_default.is_some() {
                self.remove_variants(&name, old_variants.as_deref());
                self.remove_default(&name, old_proxy.as_deref());
                changed.services.insert(name);
            }
            return;
        };
        let fresh = encode(&name, &views.default);
        let default = match &old_default {
            Some(old) if old.version == fresh.version => Arc::clone(old),
            _ => Arc::new(fresh),
        };
        let variants = if views.zones.is_empty() && views.nodes.is_empty() {
            Variants::default()
        } else {
            let known = old_default.iter().chain(old_variants.iter().flat_map(|v| v.resources()));
            let mut interner = Interner::new(known.chain([&default]));
            let mut intern_all = |list: &[(String, ServiceView)]| -> Vec<(String, Arc<Resource>)> {
                list.iter().map(|(who, view)| (who.clone(), interner.intern(encode(&name, view)))).collect()
            };
            Variants { zones: intern_all(&views.zones), nodes: intern_all(&views.nodes) }
        };
        // The proxy name is part of the view, so a relabelled Service has a new version.
        let same_default = old_default.as_ref().is_some_and(|d| d.version == default.version);
        let same_variants = match &old_variants {
            Some(old) => old.same_as(&variants),
            None => variants.len() == 0,
        };
        if same_default && same_variants {
            return;
        }
        if old_default.is_some() {
            self.remove_default(&name, old_proxy.as_deref());
        }
        self.insert_default(&name, views.default.service_proxy_name.as_deref(), default);
        if !same_variants {
            self.remove_variants(&name, old_variants.as_deref());
            self.add_variants(&name, variants);
        }
        changed.services.insert(name);
    }

    /// The default views of the Services for agents named `proxy` (`""`: without a name).
    fn defaults_for(&self, proxy: &str) -> Option<&OrderedResources> {
        if proxy.is_empty() {
            Some(&self.services)
        } else {
            self.named.get(proxy)
        }
    }

    fn insert_default(&mut self, name: &str, proxy: Option<&str>, default: Arc<Resource>) {
        match proxy {
            None => {
                self.services.insert(name.to_owned(), default);
                self.resize(name, 1);
            }
            Some(proxy) => {
                self.named.entry(proxy.to_owned()).or_default().insert(name.to_owned(), default);
                self.proxy_of.insert(name.to_owned(), proxy.to_owned());
            }
        }
    }

    fn remove_default(&mut self, name: &str, proxy: Option<&str>) {
        match proxy {
            None => {
                self.services.remove(name);
                self.resize(name, -1);
            }
            Some(proxy) => {
                if let Some(map) = self.named.get_mut(proxy) {
                    map.remove(name);
                    if map.is_empty() {
                        self.named.remove(proxy);
                    }
                }
                self.proxy_of.remove(name);
            }
        }
    }

    fn resize(&mut self, name: &str, by: isize) {
        let cluster = cluster_of(name);
        let size = self.cluster_sizes.get(cluster).copied().unwrap_or(0).saturating_add_signed(by);
        if size == 0 {
            self.cluster_sizes.remove(cluster);
        } else if let Some(known) = self.cluster_sizes.get_mut(cluster) {
            *known = size;
        } else {
            self.cluster_sizes.insert(cluster.to_owned(), size);
        }
    }

    fn remove_variants(&mut self, name: &str, old: Option<&Variants>) {
        let Some(old) = old else { return };
        for (maps, list) in [(&mut self.zone_variants, &old.zones), (&mut self.node_variants, &old.nodes)] {
            for (who, _) in list {
                if let Some(map) = maps.get_mut(who) {
                    map.remove(name);
                    if map.is_empty() {
                        maps.remove(who);
                    }
                }
            }
        }
        self.variant_count -= old.len();
        self.variants.remove(name);
    }

    fn add_variants(&mut self, name: &str, variants: Variants) {
        if variants.len() == 0 {
            return;
        }
        for (maps, list) in
            [(&mut self.zone_variants, &variants.zones), (&mut self.node_variants, &variants.nodes)]
        {
            for (who, resource) in list {
                maps.entry(who.clone()).or_default().insert(name.to_owned(), Arc::clone(resource));
            }
        }
        self.variant_count += variants.len();
        self.variants.insert(name.to_owned(), Arc::new(variants));
    }

    fn set_node_config(&mut self, node: String, config: Option<NodeConfig>, changed: &mut Changes) {
        match config {
            Some(config) => {
                let fresh = Resource::new(ResourceType::NodeConfig, config.name.clone(), config.encode());
                if self.node_configs.get(&node).is_some_and(|known| known.version == fresh.version) {
                    return;
                }
                self.node_configs.insert(node.clone(), Arc::new(fresh));
            }
            None => {
                if self.node_configs.remove(&node).is_none() {
                    return;
                }
            }
        }
        changed.node_configs.insert(node);
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The names of type `ty` whose resource may differ, for some node, between the snapshot
    /// of `generation` and this one; `None` when that is too long ago to know (compare all).
    pub fn changed_since(&self, generation: u64, ty: ResourceType) -> Option<HashSet<&str>> {
        if generation == self.generation {
            return Some(HashSet::new());
        }
        let oldest = self.history.front().map_or(u64::MAX, |(g, _)| *g);
        if generation + 1 < oldest || generation > self.generation {
            return None;
        }
        let mut names = HashSet::new();
        for (g, changes) in &self.history {
            if *g <= generation {
                continue;
            }
            if changes.everything {
                return None;
            }
            let set = match ty {
                ResourceType::ServiceView => &changes.services,
                ResourceType::NodeConfig => &changes.node_configs,
            };
            names.extend(set.iter().map(String::as_str));
        }
        Some(names)
    }

    /// The names of `ty` whose resource differs for `node` between `old` and `new`, found
    /// by merging both in name order (for when `changed_since` no longer knows).
    pub fn differences(old: &Snapshot, new: &Snapshot, ty: ResourceType, node: Audience<'_>) -> Vec<String> {
        use std::cmp::Ordering;
        let mut before = old.for_node(ty, node).peekable();
        let mut after = new.for_node(ty, node).peekable();
        let mut names = Vec::new();
        loop {
            let order = match (before.peek(), after.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(a), Some(b)) => a.name.cmp(&b.name),
            };
            match order {
                Ordering::Less => names.extend(before.next().map(|r| r.name.clone())),
                Ordering::Greater => names.extend(after.next().map(|r| r.name.clone())),
                Ordering::Equal => {
                    if let (Some(a), Some(b)) = (before.next(), after.next()) {
                        if !Arc::ptr_eq(a, b) && a.version != b.version {
                            names.push(a.name.clone());
                        }
                    }
                }
            }
        }
        names
    }

    /// How many resources of `ty` a node gets (without walking them).
    pub fn count_for_node<'w>(&self, ty: ResourceType, who: impl Into<Audience<'w>>) -> usize {
        let who = who.into();
        match ty {
            ResourceType::ServiceView if !who.proxy.is_empty() => match self.service_range(who.node, None) {
                Some(range) => self.named.get(who.proxy).map_or(0, |m| m.range(range).count()),
                None => 0,
            },
            ResourceType::ServiceView => match self.placement.home(who.node) {
                Some(None) => self.services.len(),
                Some(Some(cluster)) => self.cluster_sizes.get(cluster).copied().unwrap_or(0),
                None => 0,
            },
            ResourceType::NodeConfig => usize::from(self.node_configs.contains_key(who.node)),
        }
    }

    /// `node`'s variant of the Service view `name`, if it has one.
    fn variant(&self, node: &str, name: &str) -> Option<&Arc<Resource>> {
        let own = self.node_variants.get(node).and_then(|v| v.get(name));
        own.or_else(|| self.zone_variants.get(self.placement.zone(node)?)?.get(name))
    }

    /// The resources of one type that `node` should have.
    pub fn for_node<'a>(
        &'a self,
        ty: ResourceType,
        who: impl Into<Audience<'a>>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Resource>> + 'a> {
        self.for_node_after(ty, who, None)
    }

    /// The names of the Services `node` gets, after `after`, as a key range.
    fn service_range(&self, node: &str, after: Option<&str>) -> Option<(Bound<String>, Bound<String>)> {
        let after = after.map(|a| Bound::Excluded(a.to_owned()));
        match self.placement.home(node)? {
            None => Some((after.unwrap_or(Bound::Unbounded), Bound::Unbounded)),
            Some(cluster) => {
                let first = format!("{cluster}/");
                let start = match after {
                    Some(Bound::Excluded(a)) if a >= first => Bound::Excluded(a),
                    _ => Bound::Included(first),
                };
                // '0' follows '/': the range holds exactly the names "cluster/…".
                Some((start, Bound::Excluded(format!("{cluster}0"))))
            }
        }
    }

    /// The resources of `ty` that `node` should have, in name order, after the name `after`.
    pub fn for_node_after<'a>(
        &'a self,
        ty: ResourceType,
        who: impl Into<Audience<'a>>,
        after: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Resource>> + 'a> {
        let Audience { node, proxy } = who.into();
        match ty {
            ResourceType::ServiceView => {
                let (Some(range), Some(defaults)) =
                    (self.service_range(node, after), self.defaults_for(proxy))
                else {
                    return Box::new(std::iter::empty());
                };
                let services = defaults.range(range);
                let has_variants = self.node_variants.contains_key(node) || self.variant_zone(node).is_some();
                if !has_variants {
                    return Box::new(services.map(|(_, default)| default));
                }
                Box::new(services.map(move |(name, default)| self.variant(node, name).unwrap_or(default)))
            }
            ResourceType::NodeConfig => {
                let after = after.map(str::to_owned);
                Box::new(
                    self.node_configs
                        .get(node)
                        .into_iter()
                        .filter(move |r| after.as_deref().is_none_or(|a| r.name.as_str() > a)),
                )
            }
        }
    }

    /// One resource that `node` should have, if it exists.
    pub fn get<'w>(
        &self,
        ty: ResourceType,
        who: impl Into<Audience<'w>>,
        name: &str,
    ) -> Option<&Arc<Resource>> {
        let Audience { node, proxy } = who.into();
        match ty {
            ResourceType::ServiceView => {
                let at_home = match self.placement.home(node) {
                    Some(None) => true,
                    Some(Some(cluster)) => {
                        name.strip_prefix(cluster).is_some_and(|rest| rest.starts_with('/'))
                    }
                    None => false,
                };
                let default = self.defaults_for(proxy)?.get(name).filter(|_| at_home)?;
                Some(self.variant(node, name).unwrap_or(default))
            }
            ResourceType::NodeConfig => (name == node).then(|| self.node_configs.get(node)).flatten(),
        }
    }

    /// The default view of every Service: those without a proxy name in name order, then
    /// each proxy name's.
    pub fn defaults(&self) -> impl Iterator<Item = &Arc<Resource>> {
        self.services.values().chain(self.named.values().flat_map(|m| m.values()))
    }

    /// The default view of Service `name`, whichever agents it is for.
    pub fn default_view(&self, name: &str) -> Option<&Arc<Resource>> {
        self.defaults_for(self.proxy_name(name))?.get(name)
    }

    /// The `service-proxy-name` of Service `name` (`""`: none, or no such Service).
    pub fn proxy_name(&self, name: &str) -> &str {
        self.proxy_of.get(name).map_or("", String::as_str)
    }

    /// The variants of Service `name`: for each, who gets it (`zone=<zone>` and the
    /// nodes of that zone, or a node name) and the resource.
    pub fn variants_of(&self, name: &str) -> Vec<(Vec<String>, &Arc<Resource>)> {
        let Some(variants) = self.variants.get(name) else { return Vec::new() };
        let mut out = Vec::new();
        for (zone, resource) in &variants.zones {
            let mut who = vec![format!("zone={zone}")];
            who.extend(self.placement.nodes_in(zone).into_iter().map(str::to_owned));
            out.push((who, resource));
        }
        out.extend(variants.nodes.iter().map(|(node, resource)| (vec![node.clone()], resource)));
        out
    }

    /// The node config of `node`, if the control plane knows the node.
    pub fn node_config(&self, node: &str) -> Option<&Arc<Resource>> {
        self.node_configs.get(node)
    }

    pub fn service_count(&self) -> usize {
        self.services.len() + self.proxy_of.len()
    }

    /// How many zone and node variants are stored besides the default views.
    pub fn variant_count(&self) -> usize {
        self.variant_count
    }
}
