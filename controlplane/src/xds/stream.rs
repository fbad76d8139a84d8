//! The protocol state of one delta ADS stream, free of gRPC so it can be
//! tested as plain calls.
//!
//! Per resource type the stream remembers what the node has — not as a
//! name→version map of every resource, but as a snapshot shared with every
//! other stream (`base`) plus the few names where the node differs from it
//! (`overrides`):
//! - `Based(base)`: the node has what `base` says for it, except `overrides`.
//! - `Walk { base, acked }`: a node that connected is walked through `base` in name
//!   order, at most 500 resources per response; it has `base`'s version of every name
//!   up to `acked` and, beyond it, only what `overrides` say (its
//!   `initial_resource_versions`). When the walk ends it is `Based(base)`.
//!
//! Before each response the base moves to the newest snapshot ("rebase"): only the
//! names changed since (`Snapshot::changed_since`, or a merge of both snapshots when
//! that history is gone) are looked at, and where the node's version differs from the
//! new base it is kept as an override. So one endpoint change costs each stream O(1),
//! not O(Services), a stream holds on to the newest snapshot only, and what it keeps
//! per name is bounded by what is in flight or changed, even during a first sync.
//!
//! At most one response per type is in flight. While it is, newer snapshots simply
//! replace older ones; when the ACK comes, the next response carries the difference to
//! the newest snapshot only. That is the per-stream queue: bounded (one response per
//! type), coalescing by name (newest wins). A NACK leaves the node's versions as they
//! were and remembers the rejected ones, so the same bad content is not sent again; a
//! newer version of it will be.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::google::protobuf::value::Kind;

use super::per_type::PerType;
use super::snapshot::{Audience, Resource, ResourceType, Snapshot};
use super::wire::Outgoing;

/// One response, as the shared resources it carries.
pub type Response = Outgoing<Resource>;

/// At most this many resources per response, so a node's initial sync (10k Services ≈ 6 MB)
/// is sent in pieces and the memory a stream holds stays bounded whatever the cluster size.
pub const MAX_RESOURCES_PER_RESPONSE: usize = 500;

/// At most this many bytes of resource bodies per response (one resource larger than that
/// goes alone). What a node agent holds while it applies a response is over ten times its
/// bytes (decoded views, rendered elements, the kernel batch, the store's records): with
/// 500 Services of 50 endpoints a piece (~740 KB), its initial sync peaked 6.7 MiB above
/// its steady memory; in pieces of this size (~90 such Services) 1.3–1.6 MiB above.
pub const MAX_RESPONSE_BYTES: usize = 128 << 10;

/// A request the stream cannot go on after.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("the first request must carry node.id (the node name)")]
    NoNodeId,
    #[error("node.id is {claimed:?} but the {how} is node {identity:?}")]
    NotThisNode { claimed: String, identity: String, how: &'static str },
    #[error("node.id changed from {0:?} to {1:?} on one stream")]
    NodeChanged(String, String),
    #[error("node.metadata.{key}: {reason}")]
    BadMetadata { key: &'static str, reason: String },
}

/// The `--service-proxy-name` a node announces in `node.metadata` (`""`: none).
fn proxy_name(node: Option<&Node>) -> Result<String, ProtocolError> {
    let key = kpx_proto::SERVICE_PROXY_NAME_KEY;
    let Some(value) = node.and_then(|n| n.metadata.as_ref()).and_then(|m| m.fields.get(key)) else {
        return Ok(String::new());
    };
    let bad = |reason: String| ProtocolError::BadMetadata { key, reason };
    match &value.kind {
        Some(Kind::StringValue(name)) => {
            kpx_proto::check_service_proxy_name(name).map_err(bad)?;
            Ok(name.clone())
        }
        _ => Err(bad("must be a string".to_owned())),
    }
}

/// What one request meant, for logs and metrics.
#[derive(Debug, PartialEq, Eq)]
pub enum RequestKind {
    Subscribe {
        ty: ResourceType,
        initial_versions: usize,
    },
    Ack {
        ty: ResourceType,
        nonce: String,
    },
    Nack {
        ty: ResourceType,
        nonce: String,
        reason: String,
    },
    /// A response nonce that is not the one in flight (superseded or unknown): ignored.
    Stale {
        ty: ResourceType,
    },
    UnknownType(String),
    /// Subscription changes without a nonce.
    Update {
        ty: ResourceType,
    },
}

#[derive(Debug)]
struct InFlight {
    nonce: String,
    /// The resources it carried: the response's own list, shared (nothing copied per name).
    resources: Arc<[Arc<Resource>]>,
    removed: Vec<String>,
    /// The base the stream was on when it sent the response (a wildcard subscription's).
    base: Option<Arc<Snapshot>>,
    /// For a response that walks: how far it takes the walk once answered.
    walk: Option<WalkStep>,
}

impl InFlight {
    /// Each name it carried and the version sent (`None`: sent as removed).
    fn sent(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        let resources = self.resources.iter().map(|r| (r.name.as_str(), Some(r.version.as_str())));
        resources.chain(self.removed.iter().map(|name| (name.as_str(), None)))
    }

    fn len(&self) -> usize {
        self.resources.len() + self.removed.len()
    }
}

/// How far one response takes a walk.
#[derive(Debug)]
struct WalkStep {
    /// The last name of the base the response covers (None: it covers nothing new).
    to: Option<String>,
    /// How many of the base's resources it covers.
    walked: usize,
    /// Whether the walk is done with it.
    end: bool,
}

/// Where a wildcard subscription stands, apart from the names in `overrides`.
#[derive(Debug, Default)]
enum Sync {
    /// Nothing walked (or not a wildcard subscription): the node has exactly `overrides`.
    #[default]
    Start,
    /// Walking `base` in name order: the node has `base`'s version of each name up to
    /// `acked` (`acked_count` resources) and nothing beyond it.
    Walk { base: Arc<Snapshot>, acked: Option<String>, acked_count: usize },
    /// The node has what `base` says for it.
    Based(Arc<Snapshot>),
}

impl Sync {
    fn base(&self) -> Option<&Arc<Snapshot>> {
        match self {
            Sync::Start => None,
            Sync::Walk { base, .. } | Sync::Based(base) => Some(base),
        }
    }

    /// Whether the node's version of `name` is given by the base.
    fn covers(&self, name: &str) -> bool {
        match self {
            Sync::Start => false,
            Sync::Walk { acked, .. } => acked.as_deref().is_some_and(|a| name <= a),
            Sync::Based(_) => true,
        }
    }

    /// The version of `name` the node has by the base alone (overrides aside).
    fn implied(&self, ty: ResourceType, node: Audience<'_>, name: &str) -> Option<&str> {
        if !self.covers(name) {
            return None;
        }
        self.base().and_then(|b| b.get(ty, node, name)).map(|r| r.version.as_str())
    }

    /// How many resources the node has by the base alone.
    fn count(&self, ty: ResourceType, node: Audience<'_>) -> usize {
        match self {
            Sync::Start => 0,
            Sync::Walk { acked_count, .. } => *acked_count,
            Sync::Based(base) => base.count_for_node(ty, node),
        }
    }

    /// The node answered a response that walked `step`.
    fn advance(&mut self, step: WalkStep) {
        if let Sync::Walk { base, acked, acked_count } = self {
            if step.end {
                *self = Sync::Based(Arc::clone(base));
                return;
            }
            if step.to.is_some() {
                *acked = step.to;
            }
            *acked_count += step.walked;
        }
    }
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: HashSet<String>,
    sync: Sync,
    /// Name → the version the node has (`None`: it has none), where that differs from
    /// what `sync` implies.
    overrides: HashMap<String, Option<String>>,
    rejected: HashMap<String, String>,
    in_flight: Option<InFlight>,
}

impl TypeState {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// The version of `name` the node has.
    fn has(&self, ty: ResourceType, node: Audience<'_>, name: &str) -> Option<&str> {
        match self.overrides.get(name) {
            Some(version) => version.as_deref(),
            None => self.sync.implied(ty, node, name),
        }
    }

    /// How many resources the node has.
    fn count(&self, ty: ResourceType, node: Audience<'_>) -> usize {
        let mut count = self.sync.count(ty, node) as isize;
        for (name, version) in &self.overrides {
            match (self.sync.implied(ty, node, name).is_some(), version.is_some()) {
                (false, true) => count += 1,
                (true, false) => count -= 1,
                _ => {}
            }
        }
        count.max(0) as usize
    }

    #[cfg(test)]
    fn is_based_without_overrides(&self) -> bool {
        matches!(self.sync, Sync::Based(_)) && self.overrides.is_empty()
    }

    /// Every name the node has (walks the base: for the admin API only).
    fn held(&self, ty: ResourceType, node: Audience<'_>) -> Vec<String> {
        let mut names: Vec<String> = self.sync.base().map_or_else(Vec::new, |b| {
            b.for_node(ty, node).filter(|r| self.sync.covers(&r.name)).map(|r| r.name.clone()).collect()
        });
        names.extend(self.overrides.keys().cloned());
        names.sort();
        names.dedup();
        names.retain(|n| self.has(ty, node, n).is_some());
        names
    }

    /// Records the answer to the response in flight: the node now has what was sent
    /// (`accepted`) or what it had before.
    fn settle(&mut self, ty: ResourceType, node: Audience<'_>, mut in_flight: InFlight, accepted: bool) {
        // Refused: the node keeps what it had of each name, read before the walk moves on.
        let had: Vec<Option<String>> = if accepted {
            Vec::new()
        } else {
            in_flight.sent().map(|(name, _)| self.has(ty, node, name).map(str::to_owned)).collect()
        };
        if let Some(step) = in_flight.walk.take() {
            self.sync.advance(step);
        }
        // Sent from the base the node is still on: what it took is what the base says for
        // every name the base covers, so nothing differs from it (no lookup per name).
        let from_base = accepted
            && matches!((&in_flight.base, self.sync.base()), (Some(sent), Some(now)) if Arc::ptr_eq(sent, now));
        for (i, (name, sent)) in in_flight.sent().enumerate() {
            if from_base && self.sync.covers(name) {
                if !self.overrides.is_empty() {
                    self.overrides.remove(name);
                }
                continue;
            }
            let version = if accepted { sent } else { had.get(i).and_then(Option::as_deref) };
            if self.sync.implied(ty, node, name) == version {
                self.overrides.remove(name);
            } else {
                self.overrides.insert(name.to_owned(), version.map(str::to_owned));
            }
        }
    }

    /// Moves the base to `snapshot`, keeping as overrides the names whose version on the
    /// node then differs from the new base.
    fn rebase(&mut self, ty: ResourceType, node: Audience<'_>, snapshot: &Arc<Snapshot>) {
        let old = match &self.sync {
            Sync::Start => {
                self.sync = Sync::Walk { base: Arc::clone(snapshot), acked: None, acked_count: 0 };
                return;
            }
            Sync::Walk { base, .. } | Sync::Based(base) if Arc::ptr_eq(base, snapshot) => return,
            Sync::Walk { base, .. } | Sync::Based(base) => Arc::clone(base),
        };
        let changed: Vec<String> = match snapshot.changed_since(old.generation(), ty) {
            Some(names) => names.into_iter().filter(|n| self.sync.covers(n)).map(str::to_owned).collect(),
            None => Snapshot::differences(&old, snapshot, ty, node)
                .into_iter()
                .filter(|n| self.sync.covers(n))
                .collect(),
        };
        let had: Vec<(String, Option<String>)> = changed
            .into_iter()
            .filter(|name| !self.overrides.contains_key(name))
            .map(|name| {
                let version = self.sync.implied(ty, node, &name).map(str::to_owned);
                (name, version)
            })
            .collect();
        match &mut self.sync {
            Sync::Start => {}
            Sync::Based(base) => *base = Arc::clone(snapshot),
            Sync::Walk { base, acked_count, .. } => {
                *base = Arc::clone(snapshot);
                for (name, version) in &had {
                    match (version.is_some(), snapshot.get(ty, node, name).is_some()) {
                        (true, false) => *acked_count = acked_count.saturating_sub(1),
                        (false, true) => *acked_count += 1,
                        _ => {}
                    }
                }
            }
        }
        for (name, version) in had {
            if self.sync.implied(ty, node, &name) != version.as_deref() {
                self.overrides.insert(name, version);
            }
        }
    }

    /// Forgets overrides that say what the base says anyway.
    fn prune(&mut self, ty: ResourceType, node: Audience<'_>) {
        let sync = &self.sync;
        self.overrides.retain(|name, version| sync.implied(ty, node, name) != version.as_deref());
    }
}

/// A response being assembled.
#[derive(Default)]
struct Pending {
    resources: Vec<Arc<Resource>>,
    /// The bytes of their bodies.
    bytes: usize,
    removed: Vec<String>,
    walk: Option<WalkStep>,
}

impl Pending {
    /// Adds what `name` needs, if anything; false once the response is full.
    fn consider(
        &mut self,
        state: &TypeState,
        ty: ResourceType,
        node: Audience<'_>,
        name: &str,
        snapshot: &Snapshot,
    ) -> bool {
        let want = if state.wants(name) { snapshot.get(ty, node, name) } else { None };
        let have = state.has(ty, node, name);
        match want {
            Some(r) => {
                let has = have == Some(r.version.as_str());
                let refused = state.rejected.get(name) == Some(&r.version);
                if has || refused {
                    return true;
                }
                return self.push(r);
            }
            None if have.is_some() => self.removed.push(name.to_owned()),
            None => {}
        }
        true
    }

    fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.removed.is_empty()
    }

    /// Adds `r` to the response; false (and nothing added) when it is full.
    fn push(&mut self, r: &Arc<Resource>) -> bool {
        let size = r.body().len();
        let too_many = self.resources.len() == MAX_RESOURCES_PER_RESPONSE;
        let too_large = !self.resources.is_empty() && self.bytes + size > MAX_RESPONSE_BYTES;
        if too_many || too_large {
            return false;
        }
        self.bytes += size;
        self.resources.push(Arc::clone(r));
        true
    }
}

/// One stream: the node it serves and its subscriptions.
#[derive(Debug, Default)]
pub struct StreamState {
    node: Option<String>,
    /// The node's `--service-proxy-name` (its first request's `node.metadata`), `""` for none.
    proxy: String,
    /// Who the caller proved to be (its certificate or token), and how: `node.id` must be it.
    identity: Option<(String, &'static str)>,
    types: PerType<TypeState>,
    nonces: u64,
}

impl StreamState {
    /// A stream whose caller proved to be node `identity` (by `how`: "client certificate",
    /// "ServiceAccount token"): any other `node.id` ends it.
    pub fn for_node(identity: String, how: &'static str) -> Self {
        StreamState { identity: Some((identity, how)), ..Default::default() }
    }

    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The `--service-proxy-name` the node's agent runs with (`""`: none).
    pub fn proxy_name(&self) -> &str {
        &self.proxy
    }

    /// Who the snapshot is read for.
    fn audience(&self) -> Audience<'_> {
        Audience { node: self.node.as_deref().unwrap_or_default(), proxy: &self.proxy }
    }

    /// Takes a request from the node.
    pub fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Result<RequestKind, ProtocolError> {
        let id = req.node.as_ref().map(|n| n.id.as_str()).unwrap_or_default();
        if let Some((identity, how)) = &self.identity {
            if !id.is_empty() && id != identity {
                return Err(ProtocolError::NotThisNode {
                    claimed: id.to_owned(),
                    identity: identity.clone(),
                    how,
                });
            }
        }
        match (&self.node, id) {
            (None, "") => return Err(ProtocolError::NoNodeId),
            (None, id) => {
                self.node = Some(id.to_owned());
                self.proxy = proxy_name(req.node.as_ref())?;
            }
            (Some(known), id) if !id.is_empty() && id != known => {
                return Err(ProtocolError::NodeChanged(known.clone(), id.to_owned()))
            }
            _ => {}
        }
        let Some(ty) = ResourceType::from_type_url(&req.type_url) else {
            return Ok(RequestKind::UnknownType(req.type_url));
        };
        let (node, proxy) = (self.node.clone().unwrap_or_default(), self.proxy.clone());
        let who = Audience { node: &node, proxy: &proxy };
        let first = !self.types.contains(ty);
        let state = self.types.or_default(ty);
        if first {
            state.wildcard = req.resource_names_subscribe.is_empty();
            state.overrides = req.initial_resource_versions.into_iter().map(|(n, v)| (n, Some(v))).collect();
        }
        for name in req.resource_names_subscribe {
            if name == "*" {
                state.wildcard = true;
            } else {
                state.names.insert(name);
            }
        }
        for name in req.resource_names_unsubscribe {
            if name == "*" {
                // What the base gave the node it keeps, until told otherwise.
                for name in state.held(ty, who) {
                    let version = state.has(ty, who, &name).map(str::to_owned);
                    state.overrides.insert(name, version);
                }
                state.wildcard = false;
                state.sync = Sync::default();
            } else {
                state.names.remove(&name);
                // Unsubscribed resources are forgotten on both sides.
                state.overrides.insert(name, None);
            }
        }
        if first {
            let initial_versions = state.overrides.len();
            return Ok(RequestKind::Subscribe { ty, initial_versions });
        }
        if req.response_nonce.is_empty() {
            return Ok(RequestKind::Update { ty });
        }
        let Some(in_flight) = state.in_flight.take_if(|f| f.nonce == req.response_nonce) else {
            return Ok(RequestKind::Stale { ty });
        };
        let nonce = in_flight.nonce.clone();
        match req.error_detail {
            None => {
                for (name, _) in in_flight.sent() {
                    state.rejected.remove(name);
                }
                state.settle(ty, who, in_flight, true);
                Ok(RequestKind::Ack { ty, nonce })
            }
            Some(status) => {
                for (name, version) in in_flight.sent() {
                    if let Some(v) = version {
                        state.rejected.insert(name.to_owned(), v.to_owned());
                    }
                }
                state.settle(ty, who, in_flight, false);
                Ok(RequestKind::Nack { ty, nonce, reason: status.message })
            }
        }
    }

    /// What the node holds of `ty`: resources ACKed, resources in the response awaiting its ACK.
    pub fn type_status(&self, ty: ResourceType) -> Option<(usize, Option<usize>)> {
        let state = self.types.get(ty)?;
        Some((state.count(ty, self.audience()), state.in_flight.as_ref().map(InFlight::len)))
    }

    /// Per type and name: the version the node ACKed (if any) and the one it NACKed (if any).
    pub fn versions(&self) -> Vec<(ResourceType, String, Option<String>, Option<String>)> {
        let mut out = Vec::new();
        let node = self.audience();
        for (ty, state) in self.types.iter() {
            let mut names = state.held(ty, node);
            names.extend(state.rejected.keys().cloned());
            names.sort();
            names.dedup();
            for name in names {
                let has = state.has(ty, node, &name).map(str::to_owned);
                let rejected = state.rejected.get(&name).cloned();
                out.push((ty, name, has, rejected));
            }
        }
        out
    }

    /// Whether a response of `ty` awaits the node's answer (nothing more of `ty` is sent
    /// until it comes).
    pub fn awaiting_answer(&self, ty: ResourceType) -> bool {
        self.types.get(ty).is_some_and(|t| t.in_flight.is_some())
    }

    /// Whether `ty` is being walked (a first sync).
    pub fn walking(&self, ty: ResourceType) -> bool {
        self.types.get(ty).is_some_and(|t| t.wildcard && matches!(t.sync, Sync::Start | Sync::Walk { .. }))
    }

    /// Whether some type is being walked (the stream is in a first sync).
    pub fn in_first_sync(&self) -> bool {
        self.types.types().any(|ty| self.walking(ty))
    }

    /// The types this stream has subscribed to.
    pub fn subscribed(&self) -> Vec<ResourceType> {
        self.types.types().collect()
    }

    /// The next response for `ty`, if the node lacks something and nothing is in flight.
    pub fn next_response(&mut self, ty: ResourceType, snapshot: &Arc<Snapshot>) -> Option<Response> {
        let (node, proxy) = (self.node.clone()?, self.proxy.clone());
        let who = Audience { node: &node, proxy: &proxy };
        let state = self.types.get_mut(ty)?;
        if state.in_flight.is_some() {
            return None;
        }
        let mut pending = Pending::default();
        if !state.wildcard {
            let mut names: Vec<String> = state.names.iter().chain(state.overrides.keys()).cloned().collect();
            names.sort();
            names.dedup();
            for name in &names {
                pending.consider(state, ty, who, name, snapshot);
            }
        } else {
            Self::wildcard_response(state, ty, who, snapshot, &mut pending);
        }
        if pending.is_empty() {
            return None;
        }
        pending.removed.sort();
        pending.removed.dedup();
        let resources: Arc<[Arc<Resource>]> = pending.resources.into();
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        state.in_flight = Some(InFlight {
            nonce: nonce.clone(),
            resources: Arc::clone(&resources),
            removed: pending.removed.clone(),
            base: state.sync.base().cloned(),
            walk: pending.walk,
        });
        Some(Response { type_url: ty.type_url(), resources, removed: pending.removed, nonce })
    }

    /// Fills `pending` for a wildcard subscription: first what differs behind the walk
    /// (or, once based, everything that differs), then the next piece of the walk.
    fn wildcard_response(
        state: &mut TypeState,
        ty: ResourceType,
        node: Audience<'_>,
        snapshot: &Arc<Snapshot>,
        pending: &mut Pending,
    ) {
        state.rebase(ty, node, snapshot);
        state.prune(ty, node);
        let mut behind: Vec<&str> = state
            .overrides
            .keys()
            .chain(state.rejected.keys())
            .map(String::as_str)
            .filter(|n| state.sync.covers(n))
            .collect();
        behind.sort_unstable();
        behind.dedup();
        for name in behind {
            if !pending.consider(state, ty, node, name, snapshot) {
                return;
            }
        }
        let Sync::Walk { acked, .. } = &state.sync else { return };
        let mut step = WalkStep { to: None, walked: 0, end: true };
        let mut last = None;
        for r in snapshot.for_node_after(ty, node, acked.as_deref()) {
            let has = state.overrides.get(&r.name).and_then(Option::as_deref) == Some(r.version.as_str());
            let refused = state.rejected.get(&r.name) == Some(&r.version);
            if !has && !refused && !pending.push(r) {
                step.end = false;
                break;
            }
            last = Some(r);
            step.walked += 1;
        }
        step.to = last.map(|r| r.name.clone());
        if step.end {
            // What the node has beyond the walk and should not.
            for (name, version) in &state.overrides {
                if version.is_some() && !state.sync.covers(name) && snapshot.get(ty, node, name).is_none() {
                    pending.removed.push(name.clone());
                }
            }
        }
        if pending.is_empty() {
            // Nothing to send: the walk is done and the node is in sync with the snapshot.
            state.sync.advance(step);
            return;
        }
        pending.walk = Some(step);
    }
}

#[cfg(test)]
mod tests;
