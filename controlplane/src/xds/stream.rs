//! The protocol state of one delta ADS stream, free of gRPC so it can be
//! tested as plain calls.
//!
//! Per resource type the stream remembers what the node has (`acked`: the
//! `initial_resource_versions` it resumed with, then every ACKed response),
//! and at most one response in flight. While a response is in flight, newer
//! snapshots simply replace older ones; when the ACK comes, the next response
//! carries the difference to the newest snapshot only. That is the per-stream
//! queue: bounded (one response per type), coalescing by name (newest wins).
//! A NACK leaves `acked` as it was and remembers the rejected versions, so the
//! same bad content is not sent again; a newer version of it will be.

use std::collections::{BTreeMap, HashMap, HashSet};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;

use super::snapshot::{ResourceType, Snapshot};

/// At most this many resources per response, so a node's initial sync (10k Services ≈ 5 MB)
/// is sent in pieces and the memory a stream holds stays bounded whatever the cluster size.
pub const MAX_RESOURCES_PER_RESPONSE: usize = 1000;

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

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: HashSet<String>,
    acked: HashMap<String, String>,
    rejected: HashMap<String, String>,
    in_flight: Option<InFlight>,
}

impl TypeState {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
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
            state.acked = req.initial_resource_versions;
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
            } else {
                state.names.remove(&name);
                // Unsubscribed resources are forgotten on both sides.
                state.acked.remove(&name);
            }
        }
        if first {
            return Ok(RequestKind::Subscribe { ty, initial_versions: state.acked.len() });
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
                    match version {
                        Some(v) => state.acked.insert(name, v),
                        None => state.acked.remove(&name),
                    };
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
        Some((state.acked.len(), state.in_flight.as_ref().map(|f| f.sent.len())))
    }

    /// Per type and name: the version the node ACKed (if any) and the one it NACKed (if any).
    pub fn versions(&self) -> Vec<(ResourceType, String, Option<String>, Option<String>)> {
        let mut out = Vec::new();
        for (ty, state) in &self.types {
            let mut names: Vec<&String> = state.acked.keys().chain(state.rejected.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                out.push((
                    *ty,
                    name.clone(),
                    state.acked.get(name).cloned(),
                    state.rejected.get(name).cloned(),
                ));
            }
        }
        out
    }

    /// The types this stream has subscribed to.
    pub fn subscribed(&self) -> Vec<ResourceType> {
        self.types.keys().copied().collect()
    }

    /// The next response for `ty`, if the node lacks something and nothing is in flight.
    pub fn next_response(&mut self, ty: ResourceType, snapshot: &Snapshot) -> Option<DeltaDiscoveryResponse> {
        let node = self.node.as_deref()?;
        let state = self.types.get_mut(&ty)?;
        if state.in_flight.is_some() {
            return None;
        }
        let mut resources = Vec::new();
        let mut sent = Vec::new();
        let desired: Box<dyn Iterator<Item = _>> = if state.wildcard {
            snapshot.for_node(ty, node)
        } else {
            Box::new(state.names.iter().filter_map(|n| snapshot.get(ty, node, n)))
        };
        for res in desired {
            let has = state.acked.get(&res.name) == Some(&res.version);
            let refused = state.rejected.get(&res.name) == Some(&res.version);
            if has || refused {
                continue;
            }
            if resources.len() == MAX_RESOURCES_PER_RESPONSE {
                // The rest goes in the next response, after this one's ACK.
                break;
            }
            resources.push(Resource {
                name: res.name.clone(),
                version: res.version.clone(),
                resource: Some(Any { type_url: ty.type_url().to_owned(), value: res.body.clone() }),
                ..Default::default()
            });
            sent.push((res.name.clone(), Some(res.version.clone())));
        }
        let mut removed: Vec<String> = state
            .acked
            .keys()
            .filter(|name| !state.wants(name) || snapshot.get(ty, node, name).is_none())
            .cloned()
            .collect();
        removed.sort();
        if resources.is_empty() && removed.is_empty() {
            return None;
        }
        sent.extend(removed.iter().map(|n| (n.clone(), None)));
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        state.in_flight = Some(InFlight { nonce: nonce.clone(), sent });
        Some(DeltaDiscoveryResponse {
            type_url: ty.type_url().to_owned(),
            resources,
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::manifest::state_of;
    use crate::xds::snapshot::BuildOptions;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::google::rpc::Status;
    use std::sync::Arc;

    fn snapshot(yaml: &str) -> Snapshot {
        let clusters = [("c".to_owned(), Arc::new(state_of(yaml)))].into_iter().collect();
        Snapshot::build(&clusters, &Snapshot::default(), &BuildOptions::default())
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
        let one = snapshot(&TWO[..TWO.find("---").unwrap_or(0)]);
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
        assert_eq!(sizes, [1000, 1000, 500]);
        assert_eq!(s.type_status(ResourceType::ServiceView), Some((2500, None)));
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
