//! What every node should have, as one immutable [`Snapshot`].
//!
//! Each resource is encoded once and versioned by its content hash. Most
//! Services mean the same on every node: one default view, one `Arc<Resource>`
//! for all. A Service whose meaning depends on locality (see [`crate::view`])
//! may also have variants: per zone, for the nodes of a zone its topology
//! hints name, and per node, for the nodes its endpoints or hints name. A
//! variant is stored only when it differs from what the node would get
//! without it (its zone's variant, else the default), so memory grows with the
//! variants that differ, not with Services × nodes.
//!
//! Resources are interned by version: identical variants share one `Arc`, and
//! a new snapshot reuses the `Arc`s of the previous one for unchanged content,
//! so streams compare pointers first.
//!
//! Node names are taken to be unique across clusters (as for node configs).
//! A node's zone comes from its Node object; a node whose Node object is
//! unknown has no zone, but still gets its own variant where the Service's
//! endpoints or `forNodes` hints name it (kube-proxy's locality is the node
//! name, not the Node object).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use ipnet::IpNet;
use kpx_proto::version::content_version;
pub use kpx_proto::ResourceType;

use crate::model::{ClusterState, EndpointSlice, ObjectKey};
use crate::view::{self, Locality, ViewBuilder};
use crate::xds::wire::{HasEntry, ResourceEntry};

/// One encoded resource, with its encoding as it goes on the wire (shared by every stream).
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub version: String,
    entry: ResourceEntry,
}

impl Resource {
    fn new(ty: ResourceType, name: String, body: Vec<u8>) -> Self {
        let version = content_version(&body);
        let entry = ResourceEntry::new(&name, &version, ty.type_url(), &body);
        Resource { version, name, entry }
    }

    /// The resource's protobuf encoding.
    pub fn body(&self) -> &[u8] {
        self.entry.body()
    }
}

impl HasEntry for Resource {
    fn name(&self) -> &str {
        &self.name
    }

    fn entry(&self) -> &ResourceEntry {
        &self.entry
    }
}

/// What the control plane adds to the cluster state when building snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildOptions {
    /// `--cluster-cidr`: goes into every node config.
    pub cluster_cidrs: Vec<IpNet>,
    /// Clusters unreachable for longer than the grace period: their endpoints are no longer
    /// offered to the other clusters' nodes (global Services).
    pub withdrawn: BTreeSet<String>,
}

/// Resource name → resource.
type Resources = BTreeMap<String, Arc<Resource>>;

#[derive(Debug, Default)]
pub struct Snapshot {
    /// The default view of every Service, by resource name.
    services: Resources,
    /// Zone → the views that differ from the default for that zone's nodes.
    zone_variants: HashMap<String, Resources>,
    /// Node → the views that differ for it from its zone's variant or the default.
    node_variants: HashMap<String, Resources>,
    /// The zone of every node whose zone has variants.
    node_zones: HashMap<String, String>,
    /// With several clusters: each known node's cluster (its home: it gets that
    /// cluster's Services only). With one cluster every node gets everything.
    node_homes: HashMap<String, String>,
    /// With several clusters: how many Services each has.
    cluster_sizes: HashMap<String, usize>,
    several_clusters: bool,
    /// Node configs by node name.
    node_configs: Resources,
    /// 1 for the first snapshot, +1 for each next one.
    generation: u64,
    /// Per Service name: a hash over its default view's and all its variants' versions.
    signatures: HashMap<String, u64>,
    /// What changed in this snapshot and the ones before it (newest last), so a stream
    /// that had an older snapshot examines only the names that changed since.
    history: VecDeque<(u64, Arc<Changes>)>,
}

/// The names whose resources differ from the previous snapshot, for any node.
#[derive(Debug, Default)]
pub struct Changes {
    services: HashSet<String>,
    node_configs: HashSet<String>,
    /// Something changed that may alter any node's resources (nodes moved zones).
    everything: bool,
}

/// How many snapshots' changes are kept.
const HISTORY: usize = 32;

/// Hands out one `Arc` per content version.
struct Interner {
    by_version: HashMap<String, Arc<Resource>>,
}

impl Interner {
    fn new<'a>(known: impl Iterator<Item = &'a Arc<Resource>>) -> Self {
        Interner { by_version: known.map(|r| (r.version.clone(), Arc::clone(r))).collect() }
    }

    fn intern(&mut self, fresh: Resource) -> Arc<Resource> {
        match self.by_version.get(&fresh.version) {
            Some(known) if known.name == fresh.name => Arc::clone(known),
            _ => {
                let fresh = Arc::new(fresh);
                self.by_version.insert(fresh.version.clone(), Arc::clone(&fresh));
                fresh
            }
        }
    }
}

/// Where nodes are: each known node's zone (from Node objects; a later cluster wins).
struct Zones<'a> {
    of_node: HashMap<&'a str, &'a str>,
    known: HashSet<&'a str>,
}

impl<'a> Zones<'a> {
    fn new(clusters: &'a BTreeMap<String, Arc<ClusterState>>) -> Self {
        let mut of_node = HashMap::new();
        for node in clusters.values().flat_map(|state| state.nodes.values()) {
            match node.zone.as_deref() {
                Some(zone) => of_node.insert(node.name.as_str(), zone),
                None => of_node.remove(node.name.as_str()),
            };
        }
        let known = of_node.values().copied().collect();
        Zones { of_node, known }
    }
}

impl Snapshot {
    /// Builds the snapshot of all clusters, reusing the resources of `previous` that did not change.
    pub fn build(
        clusters: &BTreeMap<String, Arc<ClusterState>>,
        previous: &Snapshot,
        options: &BuildOptions,
    ) -> Snapshot {
        let mut views = Interner::new(previous.all_services());
        let mut configs = Interner::new(previous.node_configs.values());
        let zones = Zones::new(clusters);
        let mut snapshot = Snapshot::default();
        let slices: BTreeMap<&str, HashMap<ObjectKey, Vec<&EndpointSlice>>> =
            clusters.iter().map(|(c, state)| (c.as_str(), state.slices_by_service())).collect();
        // Global Services: namespace/name → the clusters that mark it global.
        let mut globals: HashMap<&ObjectKey, Vec<&str>> = HashMap::new();
        for (cluster, state) in clusters {
            for svc in state.services.values().filter(|s| s.global && view::is_proxied(s)) {
                globals.entry(&svc.key).or_default().push(cluster);
            }
        }
        snapshot.several_clusters = clusters.len() > 1;
        for (cluster, state) in clusters {
            let own_slices = &slices[cluster.as_str()];
            for svc in state.services.values().filter(|s| view::is_proxied(s)) {
                let own = own_slices.get(&svc.key).map_or(&[][..], Vec::as_slice);
                let remote: Vec<(&str, &EndpointSlice)> = match globals.get(&svc.key).filter(|_| svc.global) {
                    Some(peers) => peers
                        .iter()
                        .filter(|peer| **peer != cluster.as_str() && !options.withdrawn.contains(**peer))
                        .flat_map(|peer| {
                            slices[peer].get(&svc.key).into_iter().flatten().map(move |s| (*peer, *s))
                        })
                        .collect(),
                    None => Vec::new(),
                };
                let builder = ViewBuilder::global(cluster, svc, own, &remote);
                let default = views.intern(encode(&builder, Locality::UNKNOWN));
                snapshot.add_variants(&builder, &default, &zones, &mut views);
                snapshot.services.insert(default.name.clone(), default);
                *snapshot.cluster_sizes.entry(cluster.clone()).or_default() += 1;
            }
            for node in state.nodes.values() {
                if snapshot.several_clusters {
                    if let Some(first) = snapshot.node_homes.get(&node.name) {
                        tracing::warn!(
                            node = node.name,
                            first,
                            also = cluster,
                            "a node of two clusters: the first one is its home"
                        );
                        continue;
                    }
                    snapshot.node_homes.insert(node.name.clone(), cluster.clone());
                }
                let config = view::node_config(node, &options.cluster_cidrs);
                let resource = configs.intern(Resource::new(
                    ResourceType::NodeConfig,
                    config.name.clone(),
                    config.encode(),
                ));
                snapshot.node_configs.insert(resource.name.clone(), resource);
            }
        }
        snapshot.node_zones = zones
            .of_node
            .iter()
            .filter(|(_, zone)| snapshot.zone_variants.contains_key(**zone))
            .map(|(node, zone)| ((*node).to_owned(), (*zone).to_owned()))
            .collect();
        snapshot.record_changes(previous);
        snapshot
    }

    /// Signs every Service and records what differs from `previous`.
    fn record_changes(&mut self, previous: &Snapshot) {
        let mut variants: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
        for (who, resources) in self.zone_variants.iter().chain(&self.node_variants) {
            for (name, r) in resources {
                variants.entry(name.as_str()).or_default().push((who.as_str(), r.version.as_str()));
            }
        }
        let mut signatures = HashMap::with_capacity(self.services.len());
        for (name, default) in &self.services {
            let mut text = default.version.clone();
            if let Some(list) = variants.get_mut(name.as_str()) {
                list.sort_unstable();
                for (who, version) in list.iter() {
                    text.push_str(&format!("|{who}={version}"));
                }
            }
            signatures.insert(name.clone(), xxhash_rust::xxh3::xxh3_64(text.as_bytes()));
        }
        let mut changes = Changes {
            everything: self.node_zones != previous.node_zones || self.node_homes != previous.node_homes,
            ..Default::default()
        };
        for (name, sig) in &signatures {
            if previous.signatures.get(name) != Some(sig) {
                changes.services.insert(name.clone());
            }
        }
        changes.services.extend(previous.signatures.keys().filter(|n| !signatures.contains_key(*n)).cloned());
        for (name, r) in &self.node_configs {
            if previous.node_configs.get(name).map(|p| &p.version) != Some(&r.version) {
                changes.node_configs.insert(name.clone());
            }
        }
        changes
            .node_configs
            .extend(previous.node_configs.keys().filter(|n| !self.node_configs.contains_key(*n)).cloned());
        self.signatures = signatures;
        self.generation = previous.generation + 1;
        self.history = previous.history.clone();
        self.history.push_back((self.generation, Arc::new(changes)));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
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
    pub fn differences(old: &Snapshot, new: &Snapshot, ty: ResourceType, node: &str) -> Vec<String> {
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
    pub fn count_for_node(&self, ty: ResourceType, node: &str) -> usize {
        match ty {
            ResourceType::ServiceView => match self.home(node) {
                Some(None) => self.services.len(),
                Some(Some(cluster)) => self.cluster_sizes.get(cluster).copied().unwrap_or(0),
                None => 0,
            },
            ResourceType::NodeConfig => usize::from(self.node_configs.contains_key(node)),
        }
    }

    /// Stores the zone and node views of one Service that differ from what those nodes would get otherwise.
    fn add_variants(
        &mut self,
        builder: &ViewBuilder<'_>,
        default: &Arc<Resource>,
        zones: &Zones<'_>,
        views: &mut Interner,
    ) {
        let localities = builder.localities();
        let name = &default.name;
        for &zone in localities.zones.iter().filter(|z| zones.known.contains(*z)) {
            let fresh = encode(builder, Locality { node: None, zone: Some(zone) });
            if fresh.version != default.version {
                self.zone_variants
                    .entry(zone.to_owned())
                    .or_default()
                    .insert(name.clone(), views.intern(fresh));
            }
        }
        for &node in &localities.nodes {
            let zone = zones.of_node.get(node).copied();
            let fallback =
                zone.and_then(|z| self.zone_variants.get(z)).and_then(|v| v.get(name)).unwrap_or(default);
            let fresh = encode(builder, Locality { node: Some(node), zone });
            if fresh.version != fallback.version {
                self.node_variants
                    .entry(node.to_owned())
                    .or_default()
                    .insert(name.clone(), views.intern(fresh));
            }
        }
    }

    fn all_services(&self) -> impl Iterator<Item = &Arc<Resource>> {
        let variants = self.zone_variants.values().chain(self.node_variants.values());
        self.services.values().chain(variants.flat_map(BTreeMap::values))
    }

    /// `node`'s variant of the Service view `name`, if it has one.
    fn variant(&self, node: &str, name: &str) -> Option<&Arc<Resource>> {
        let own = self.node_variants.get(node).and_then(|v| v.get(name));
        own.or_else(|| {
            let zone = self.node_zones.get(node)?;
            self.zone_variants.get(zone)?.get(name)
        })
    }

    /// The resources of one type that `node` should have.
    pub fn for_node<'a>(
        &'a self,
        ty: ResourceType,
        node: &'a str,
    ) -> Box<dyn Iterator<Item = &'a Arc<Resource>> + 'a> {
        self.for_node_after(ty, node, None)
    }

    /// The cluster whose Services `node` gets: `Some(None)` for all (one cluster),
    /// `None` for none (several clusters, and no Node object names it).
    fn home(&self, node: &str) -> Option<Option<&str>> {
        if !self.several_clusters {
            return Some(None);
        }
        self.node_homes.get(node).map(|c| Some(c.as_str()))
    }

    /// The names of the Services `node` gets, after `after`, as a key range.
    fn service_range(&self, node: &str, after: Option<&str>) -> Option<(Bound<String>, Bound<String>)> {
        let after = after.map(|a| Bound::Excluded(a.to_owned()));
        match self.home(node)? {
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
        node: &'a str,
        after: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Resource>> + 'a> {
        match ty {
            ResourceType::ServiceView => {
                let Some(range) = self.service_range(node, after) else {
                    return Box::new(std::iter::empty());
                };
                let services = self.services.range::<String, _>(range);
                let has_variants =
                    self.node_variants.contains_key(node) || self.node_zones.contains_key(node);
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
    pub fn get(&self, ty: ResourceType, node: &str, name: &str) -> Option<&Arc<Resource>> {
        match ty {
            ResourceType::ServiceView => {
                let at_home = match self.home(node) {
                    Some(None) => true,
                    Some(Some(cluster)) => {
                        name.strip_prefix(cluster).is_some_and(|rest| rest.starts_with('/'))
                    }
                    None => false,
                };
                let default = self.services.get(name).filter(|_| at_home)?;
                Some(self.variant(node, name).unwrap_or(default))
            }
            ResourceType::NodeConfig => (name == node).then(|| self.node_configs.get(node)).flatten(),
        }
    }

    /// The default view of every Service.
    pub fn defaults(&self) -> impl Iterator<Item = &Arc<Resource>> {
        self.services.values()
    }

    /// The variants of Service `name`: for each, who gets it (`zone=<zone>` and the
    /// nodes of that zone, or a node name) and the resource.
    pub fn variants_of(&self, name: &str) -> Vec<(Vec<String>, &Arc<Resource>)> {
        let mut out = Vec::new();
        let mut zones: Vec<_> =
            self.zone_variants.iter().filter_map(|(z, v)| v.get(name).map(|r| (z, r))).collect();
        zones.sort_by(|a, b| a.0.cmp(b.0));
        for (zone, resource) in zones {
            let mut who = vec![format!("zone={zone}")];
            let mut nodes: Vec<String> =
                self.node_zones.iter().filter(|(_, z)| *z == zone).map(|(n, _)| n.clone()).collect();
            nodes.sort();
            who.extend(nodes);
            out.push((who, resource));
        }
        let mut nodes: Vec<_> =
            self.node_variants.iter().filter_map(|(n, v)| v.get(name).map(|r| (n, r))).collect();
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        out.extend(nodes.into_iter().map(|(node, resource)| (vec![node.clone()], resource)));
        out
    }

    /// The node config of `node`, if the control plane knows the node.
    pub fn node_config(&self, node: &str) -> Option<&Arc<Resource>> {
        self.node_configs.get(node)
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// How many zone and node variants are stored besides the default views.
    pub fn variant_count(&self) -> usize {
        self.zone_variants.values().chain(self.node_variants.values()).map(BTreeMap::len).sum()
    }
}

fn encode(builder: &ViewBuilder<'_>, at: Locality<'_>) -> Resource {
    let view = builder.view(at);
    Resource::new(ResourceType::ServiceView, view.resource_name(), view.encode())
}
