//! The protocol state of one delta ADS stream, free of gRPC so it can be
//! tested as plain calls.
//!
//! Per resource type the stream remembers what the node has — not as a
//! name→version map of every resource, but as the snapshot it was last fully
//! in sync with (`base`, shared with every other stream in sync with it) plus
//! the few names where it differs (`overrides`). A new snapshot is compared
//! only for the names that changed since `base` (`Snapshot::changed_since`), so
//! one endpoint change costs each stream O(1), not O(Services). A node that
//! connects (or falls too far behind) is walked through the snapshot in name
//! order, at most 500 resources per response, then checked for what changed
//! during the walk, then based on the snapshot. At most one response is in flight. While a response is in flight, newer
//! snapshots simply replace older ones; when the ACK comes, the next response
//! carries the difference to the newest snapshot only. That is the per-stream
//! queue: bounded (one response per type), coalescing by name (newest wins).
//! A NACK leaves `acked` as it was and remembers the rejected versions, so the
//! same bad content is not sent again; a newer version of it will be.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;

use super::snapshot::{ResourceType, Snapshot};

/// At most this many resources per response, so a node's initial sync (10k Services ≈ 6 MB)
/// is sent in pieces and the memory a stream holds stays bounded whatever the cluster size.
pub const MAX_RESOURCES_PER_RESPONSE: usize = 500;

/// A request the stream cannot go on after.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("the first request must carry node.id (the node name)")]
    NoNodeId,
    #[error("node.id changed from {0:?} to {1:?} on one stream")]
    NodeChanged(String, String),
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
    /// name → version sent (None: sent as removed).
    sent: Vec<(String, Option<String>)>,
}

/// Where a wildcard subscription stands.
#[derive(Debug)]
enum Sync {
    /// Walking the snapshot in name order: names up to `cursor` are done; changes since
    /// generation `started` are checked once the walk ends.
    Walk { cursor: Option<String>, started: Option<u64> },
    /// The node has what `base` says for it, except `overrides`.
    Based(Arc<Snapshot>),
}

impl Default for Sync {
    fn default() -> Self {
        Sync::Walk { cursor: None, started: None }
    }
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: HashSet<String>,
    sync: Sync,
    /// Name → the version the node has (`None`: it has none), where that differs from `base`
    /// (or, without a base, everything it has).
    overrides: HashMap<String, Option<String>>,
    rejected: HashMap<String, String>,
    in_flight: Option<InFlight>,
}

impl TypeState {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    fn base(&self) -> Option<&Arc<Snapshot>> {
        match &self.sync {
            Sync::Based(base) if self.wildcard => Some(base),
            _ => None,
        }
    }

    /// The version of `name` the node has.
    fn has(&self, ty: ResourceType, node: &str, name: &str) -> Option<&str> {
        match self.overrides.get(name) {
            Some(version) => version.as_deref(),
            None => self.base().and_then(|b| b.get(ty, node, name)).map(|r| r.version.as_str()),
        }
    }

    /// How many resources the node has.
    fn count(&self, ty: ResourceType, node: &str) -> usize {
        let Some(base) = self.base() else {
            return self.overrides.values().filter(|v| v.is_some()).count();
        };
        let mut count = base.count_for_node(ty, node) as isize;
        for (name, version) in &self.overrides {
            match (base.get(ty, node, name).is_some(), version.is_some()) {
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
    fn held(&self, ty: ResourceType, node: &str) -> Vec<String> {
        let mut names: Vec<String> =
            self.base().map_or_else(Vec::new, |b| b.for_node(ty, node).map(|r| r.name.clone()).collect());
        names.extend(self.overrides.keys().cloned());
        names.sort();
        names.dedup();
        names.retain(|n| self.has(ty, node, n).is_some());
        names
    }
}

/// A response being assembled.
#[derive(Default)]
struct Pending {
    resources: Vec<Resource>,
    sent: Vec<(String, Option<String>)>,
    sent_names: HashSet<String>,
    removed: Vec<String>,
}

impl Pending {
    /// Adds what `name` needs, if anything; false once the response is full.
    fn consider(
        &mut self,
        state: &TypeState,
        ty: ResourceType,
        node: &str,
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
                return self.push(ty, r);
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
    fn push(&mut self, ty: ResourceType, r: &super::snapshot::Resource) -> bool {
        if self.resources.len() == MAX_RESOURCES_PER_RESPONSE {
            return false;
        }
        self.resources.push(Resource {
            name: r.name.clone(),
            version: r.version.clone(),
            resource: Some(Any { type_url: ty.type_url().to_owned(), value: r.body.clone() }),
            ..Default::default()
        });
        self.sent.push((r.name.clone(), Some(r.version.clone())));
        self.sent_names.insert(r.name.clone());
        true
    }
}

/// One stream: the node it serves and its subscriptions.
#[derive(Debug, Default)]
pub struct StreamState {
    node: Option<String>,
    types: BTreeMap<ResourceType, TypeState>,
    nonces: u64,
}

impl StreamState {
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Takes a request from the node.
    pub fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Result<RequestKind, ProtocolError> {
        let id = req.node.as_ref().map(|n| n.id.as_str()).unwrap_or_default();
        match (&self.node, id) {
            (None, "") => return Err(ProtocolError::NoNodeId),
            (None, id) => self.node = Some(id.to_owned()),
            (Some(known), id) if !id.is_empty() && id != known => {
                return Err(ProtocolError::NodeChanged(known.clone(), id.to_owned()))
            }
            _ => {}
        }
        let Some(ty) = ResourceType::from_type_url(&req.type_url) else {
            return Ok(RequestKind::UnknownType(req.type_url));
        };
        let first = !self.types.contains_key(&ty);
        let state = self.types.entry(ty).or_default();
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
        match req.error_detail {
            None => {
                for (name, version) in in_flight.sent {
                    state.rejected.remove(&name);
                    state.overrides.insert(name, version);
                }
                Ok(RequestKind::Ack { ty, nonce: in_flight.nonce })
            }
            Some(status) => {
                for (name, version) in in_flight.sent {
                    if let Some(v) = version {
                        state.rejected.insert(name, v);
                    }
                }
                Ok(RequestKind::Nack { ty, nonce: in_flight.nonce, reason: status.message })
            }
        }
    }

    /// What the node holds of `ty`: resources ACKed, resources in the response awaiting its ACK.
    pub fn type_status(&self, ty: ResourceType) -> Option<(usize, Option<usize>)> {
        let state = self.types.get(&ty)?;
        let node = self.node.as_deref().unwrap_or_default();
        Some((state.count(ty, node), state.in_flight.as_ref().map(|f| f.sent.len())))
    }

    /// Per type and name: the version the node ACKed (if any) and the one it NACKed (if any).
    pub fn versions(&self) -> Vec<(ResourceType, String, Option<String>, Option<String>)> {
        let mut out = Vec::new();
        let node = self.node.as_deref().unwrap_or_default();
        for (ty, state) in &self.types {
            let mut names = state.held(*ty, node);
            names.extend(state.rejected.keys().cloned());
            names.sort();
            names.dedup();
            for name in names {
                let has = state.has(*ty, node, &name).map(str::to_owned);
                let rejected = state.rejected.get(&name).cloned();
                out.push((*ty, name, has, rejected));
            }
        }
        out
    }

    /// Whether `ty` is being walked (a first sync, or after falling far behind).
    pub fn walking(&self, ty: ResourceType) -> bool {
        self.types.get(&ty).is_some_and(|t| t.wildcard && matches!(t.sync, Sync::Walk { .. }))
    }

    /// The types this stream has subscribed to.
    pub fn subscribed(&self) -> Vec<ResourceType> {
        self.types.keys().copied().collect()
    }

    /// The next response for `ty`, if the node lacks something and nothing is in flight.
    pub fn next_response(
        &mut self,
        ty: ResourceType,
        snapshot: &Arc<Snapshot>,
    ) -> Option<DeltaDiscoveryResponse> {
        let node = self.node.clone()?;
        let state = self.types.get_mut(&ty)?;
        if state.in_flight.is_some() {
            return None;
        }
        let mut pending = Pending::default();
        if !state.wildcard {
            let mut names: Vec<String> = state.names.iter().chain(state.overrides.keys()).cloned().collect();
            names.sort();
            names.dedup();
            for name in &names {
                pending.consider(state, ty, &node, name, snapshot);
            }
        } else {
            Self::wildcard_response(state, ty, &node, snapshot, &mut pending);
        }
        if pending.is_empty() {
            return None;
        }
        pending.removed.sort();
        pending.sent.extend(pending.removed.iter().map(|n| (n.clone(), None)));
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        state.in_flight = Some(InFlight { nonce: nonce.clone(), sent: pending.sent });
        Some(DeltaDiscoveryResponse {
            type_url: ty.type_url().to_owned(),
            resources: pending.resources,
            removed_resources: pending.removed,
            nonce,
            ..Default::default()
        })
    }

    /// Fills `pending` for a wildcard subscription, advancing its walk or its base.
    fn wildcard_response(
        state: &mut TypeState,
        ty: ResourceType,
        node: &str,
        snapshot: &Arc<Snapshot>,
        pending: &mut Pending,
    ) {
        // Based: look only at what changed since the base.
        if let Sync::Based(base) = &state.sync {
            let changed = if Arc::ptr_eq(base, snapshot) {
                Some(HashSet::new())
            } else if snapshot.generation() > base.generation() {
                snapshot.changed_since(base.generation(), ty)
            } else {
                None
            };
            match changed {
                Some(changed) => {
                    let mut names: Vec<&str> = changed
                        .into_iter()
                        .chain(state.overrides.keys().map(String::as_str))
                        .chain(state.rejected.keys().map(String::as_str))
                        .collect();
                    names.sort_unstable();
                    names.dedup();
                    for name in names {
                        if !pending.consider(state, ty, node, name, snapshot) {
                            break;
                        }
                    }
                    if pending.is_empty() && state.rejected.is_empty() {
                        state.sync = Sync::Based(Arc::clone(snapshot));
                        state.overrides = HashMap::new();
                    }
                    return;
                }
                None => {
                    // Too far behind to know what changed: walk again, keeping what it has.
                    let base = Arc::clone(base);
                    for r in base.for_node(ty, node) {
                        state.overrides.entry(r.name.clone()).or_insert_with(|| Some(r.version.clone()));
                    }
                    state.sync = Sync::default();
                }
            }
        }
        let Sync::Walk { cursor, started } = &mut state.sync else { return };
        let started_at = *started.get_or_insert(snapshot.generation());
        let from = cursor.clone();
        let mut walked_to = from.clone();
        let mut reached_end = true;
        for r in snapshot.for_node_after(ty, node, from.as_deref()) {
            if !pending.consider_walk(&state.overrides, &state.rejected, ty, node, &r.name, snapshot) {
                reached_end = false;
                break;
            }
            walked_to = Some(r.name.clone());
        }
        if !reached_end {
            if let Sync::Walk { cursor, .. } = &mut state.sync {
                *cursor = walked_to;
            }
            return;
        }
        // The walk is done: also remove what the node has and should not, and what changed
        // during the walk behind the cursor.
        let held: Vec<String> =
            state.overrides.iter().filter(|(_, v)| v.is_some()).map(|(n, _)| n.clone()).collect();
        for name in &held {
            if snapshot.get(ty, node, name).is_none() {
                pending.removed.push(name.clone());
            }
        }
        let mut checked_all = true;
        match snapshot.changed_since(started_at, ty) {
            Some(changed) => {
                let mut names: Vec<&str> = changed.into_iter().collect();
                names.sort_unstable();
                for name in names {
                    if !pending.consider_walk(&state.overrides, &state.rejected, ty, node, name, snapshot) {
                        checked_all = false;
                        break;
                    }
                }
            }
            None => {
                state.sync = Sync::default();
                return;
            }
        }
        if pending.is_empty() {
            if state.rejected.is_empty() {
                state.sync = Sync::Based(Arc::clone(snapshot));
                state.overrides = HashMap::new();
            }
        } else if checked_all {
            if let Sync::Walk { started, .. } = &mut state.sync {
                // Next time, only what changes from now on needs checking behind the cursor.
                *started = Some(snapshot.generation());
            }
        }
    }
}

impl Pending {
    /// [`Pending::consider`] for a walk (no base: the node has exactly `overrides`).
    fn consider_walk(
        &mut self,
        overrides: &HashMap<String, Option<String>>,
        rejected: &HashMap<String, String>,
        ty: ResourceType,
        node: &str,
        name: &str,
        snapshot: &Snapshot,
    ) -> bool {
        let Some(r) = snapshot.get(ty, node, name) else {
            if overrides.get(name).is_some_and(Option::is_some) && !self.removed.iter().any(|n| n == name) {
                self.removed.push(name.to_owned());
            }
            return true;
        };
        let has = overrides.get(name).and_then(Option::as_deref) == Some(r.version.as_str());
        if has || rejected.get(name) == Some(&r.version) || self.sent_names.contains(name) {
            return true;
        }
        self.push(ty, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::manifest::state_of;
    use crate::xds::snapshot::BuildOptions;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::google::rpc::Status;

    fn snapshot(yaml: &str) -> Arc<Snapshot> {
        let clusters = [("c".to_owned(), Arc::new(state_of(yaml)))].into_iter().collect();
        Arc::new(Snapshot::build(&clusters, &Snapshot::default(), &BuildOptions::default()))
    }

    /// A snapshot built on `previous` (so it knows what changed since).
    fn next(yaml: &str, previous: &Snapshot) -> Arc<Snapshot> {
        let clusters = [("c".to_owned(), Arc::new(state_of(yaml)))].into_iter().collect();
        Arc::new(Snapshot::build(&clusters, previous, &BuildOptions::default()))
    }

    const TWO: &str = "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\n\
                       kind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n";

    fn subscribe(initial: &[(&str, &str)]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: Some(Node { id: "n1".into(), ..Default::default() }),
            type_url: ResourceType::ServiceView.type_url().into(),
            initial_resource_versions: initial.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
            ..Default::default()
        }
    }

    fn reply(nonce: &str, error: Option<&str>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: ResourceType::ServiceView.type_url().into(),
            response_nonce: nonce.into(),
            error_detail: error.map(|m| Status { code: 3, message: m.into(), details: vec![] }),
            ..Default::default()
        }
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn wildcard_gets_everything_then_only_changes_after_ack() {
        let snap = snapshot(TWO);
        let mut s = StreamState::default();
        assert!(matches!(
            s.on_request(subscribe(&[])),
            Ok(RequestKind::Subscribe { initial_versions: 0, .. })
        ));
        let first = s.next_response(ResourceType::ServiceView, &snap).expect("a response");
        assert_eq!(names(&first), ["c/default/a", "c/default/b"]);
        // Nothing more while in flight, even for a new snapshot.
        assert!(s
            .next_response(ResourceType::ServiceView, &snapshot(&TWO[..TWO.find("---").unwrap_or(0)]))
            .is_none());
        assert_eq!(
            s.on_request(reply(&first.nonce, None)),
            Ok(RequestKind::Ack { ty: ResourceType::ServiceView, nonce: first.nonce.clone() })
        );
        assert!(s.next_response(ResourceType::ServiceView, &snap).is_none(), "nothing changed");
        let one = next(&TWO[..TWO.find("---").unwrap_or(0)], &snap);
        let removal = s.next_response(ResourceType::ServiceView, &one).expect("b removed");
        assert!(removal.resources.is_empty());
        assert_eq!(removal.removed_resources, ["c/default/b"]);
    }

    #[test]
    fn a_large_initial_sync_goes_in_bounded_pieces() {
        let yaml: String = (0..2500)
            .map(|i| {
                format!(
                    "kind: Service\nmetadata: {{name: s{i}}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}\n---\n",
                    i / 250,
                    i % 250 + 1
                )
            })
            .collect();
        let snap = snapshot(&yaml);
        let mut s = StreamState::default();
        s.on_request(subscribe(&[])).expect("ok");
        let mut sizes = Vec::new();
        while let Some(r) = s.next_response(ResourceType::ServiceView, &snap) {
            sizes.push(r.resources.len());
            s.on_request(reply(&r.nonce, None)).expect("ack");
        }
        assert_eq!(sizes, [500, 500, 500, 500, 500]);
        assert_eq!(s.type_status(ResourceType::ServiceView), Some((2500, None)));
    }

    fn many(n: usize, changed: Option<usize>) -> String {
        (0..n)
            .map(|i| {
                let port = if Some(i) == changed { 81 } else { 80 };
                format!(
                    "kind: Service\nmetadata: {{name: s{i:04}}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{port: {port}}}]}}\n---\n",
                    i / 250,
                    i % 250 + 1
                )
            })
            .collect()
    }

    fn sync_all(s: &mut StreamState, snap: &Arc<Snapshot>) -> Vec<DeltaDiscoveryResponse> {
        let mut all = Vec::new();
        while let Some(r) = s.next_response(ResourceType::ServiceView, snap) {
            s.on_request(reply(&r.nonce, None)).expect("ack");
            all.push(r);
        }
        all
    }

    #[test]
    fn after_a_full_sync_a_change_is_found_without_walking_and_nothing_per_name_is_kept() {
        let first = snapshot(&many(2500, None));
        let mut s = StreamState::default();
        s.on_request(subscribe(&[])).expect("ok");
        assert_eq!(sync_all(&mut s, &first).len(), 5);
        let state = &s.types[&ResourceType::ServiceView];
        assert!(state.is_based_without_overrides(), "in sync: only the shared snapshot is kept");
        let second = next(&many(2500, Some(7)), &first);
        let r = s.next_response(ResourceType::ServiceView, &second).expect("the change");
        assert_eq!(names(&r), ["c/default/s0007"]);
        s.on_request(reply(&r.nonce, None)).expect("ack");
        assert!(s.next_response(ResourceType::ServiceView, &second).is_none());
        assert!(s.types[&ResourceType::ServiceView].is_based_without_overrides());
        assert_eq!(s.type_status(ResourceType::ServiceView), Some((2500, None)));
    }

    #[test]
    fn what_changes_behind_the_walk_is_sent_before_the_walk_ends() {
        let first = snapshot(&many(2500, None));
        let mut s = StreamState::default();
        s.on_request(subscribe(&[])).expect("ok");
        let chunk = s.next_response(ResourceType::ServiceView, &first).expect("first chunk");
        assert!(names(&chunk).contains(&"c/default/s0003"));
        s.on_request(reply(&chunk.nonce, None)).expect("ack");
        // s0003, already sent, changes while the walk goes on.
        let second = next(&many(2500, Some(3)), &first);
        let rest = sync_all(&mut s, &second);
        let sent: Vec<&str> = rest.iter().flat_map(names).collect();
        assert_eq!(sent.len(), 2001, "the other 2000 and s0003 again");
        assert_eq!(sent.last(), Some(&"c/default/s0003"));
        assert!(s.types[&ResourceType::ServiceView].is_based_without_overrides());
    }

    #[test]
    fn resume_sends_only_differences_including_removals() {
        let snap = snapshot(TWO);
        let a = snap.get(ResourceType::ServiceView, "n1", "c/default/a").expect("a").version.clone();
        let mut s = StreamState::default();
        s.on_request(subscribe(&[("c/default/a", &a), ("c/default/gone", "v0")])).expect("ok");
        let r = s.next_response(ResourceType::ServiceView, &snap).expect("b and gone");
        assert_eq!(names(&r), ["c/default/b"]);
        assert_eq!(r.removed_resources, ["c/default/gone"]);

        let mut same = StreamState::default();
        let b = snap.get(ResourceType::ServiceView, "n1", "c/default/b").expect("b").version.clone();
        same.on_request(subscribe(&[("c/default/a", &a), ("c/default/b", &b)])).expect("ok");
        assert!(same.next_response(ResourceType::ServiceView, &snap).is_none(), "resumed with everything");
    }

    #[test]
    fn nack_keeps_acked_state_and_does_not_resend_the_same_version() {
        let snap = snapshot(TWO);
        let mut s = StreamState::default();
        s.on_request(subscribe(&[])).expect("ok");
        let r = s.next_response(ResourceType::ServiceView, &snap).expect("response");
        let kind = s.on_request(reply(&r.nonce, Some("ports[0].port: bad"))).expect("ok");
        assert!(matches!(kind, RequestKind::Nack { reason, .. } if reason == "ports[0].port: bad"));
        assert!(s.next_response(ResourceType::ServiceView, &snap).is_none(), "same content is not resent");
        assert!(matches!(s.on_request(reply("999", None)), Ok(RequestKind::Stale { .. })));
    }

    #[test]
    fn node_id_is_required_and_fixed() {
        let mut s = StreamState::default();
        assert_eq!(s.on_request(reply("", None)), Err(ProtocolError::NoNodeId));
        s.on_request(subscribe(&[])).expect("ok");
        let mut other = subscribe(&[]);
        other.node = Some(Node { id: "n2".into(), ..Default::default() });
        assert!(matches!(s.on_request(other), Err(ProtocolError::NodeChanged(..))));
    }

    #[test]
    fn each_node_is_sent_its_own_variant() {
        let snap = snapshot(
            "kind: Service\nmetadata: {name: a}\nspec: {type: NodePort, clusterIP: 10.96.0.1, \
             externalTrafficPolicy: Local, ports: [{port: 80, nodePort: 30080}]}\n---\n\
             kind: EndpointSlice\nmetadata: {name: a-1, labels: {kubernetes.io/service-name: a}}\n\
             addressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.0.0.1], nodeName: n1}]\n",
        );
        let sent_to = |node: &str| {
            let mut s = StreamState::default();
            let mut request = subscribe(&[]);
            request.node = Some(Node { id: node.into(), ..Default::default() });
            s.on_request(request).expect("ok");
            let r = s.next_response(ResourceType::ServiceView, &snap).expect("a response");
            assert_eq!(names(&r), ["c/default/a"]);
            r.resources[0].version.clone()
        };
        let default = snap.get(ResourceType::ServiceView, "nobody", "c/default/a").expect("a");
        assert_eq!(sent_to("n2"), default.version);
        assert_ne!(sent_to("n1"), default.version);
        assert_eq!(
            Some(sent_to("n1")),
            snap.get(ResourceType::ServiceView, "n1", "c/default/a").map(|r| r.version.clone())
        );
    }
}
