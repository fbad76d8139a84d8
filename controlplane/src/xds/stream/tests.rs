use super::*;
use crate::xds::fixtures::{next, services};
use envoy_types::pb::google::rpc::Status;

fn snapshot(yaml: &str) -> Arc<Snapshot> {
    next(yaml, &Snapshot::default())
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

fn names(r: &Response) -> Vec<&str> {
    r.names().collect()
}

#[test]
fn wildcard_gets_everything_then_only_changes_after_ack() {
    let snap = snapshot(TWO);
    let mut s = StreamState::default();
    assert!(matches!(s.on_request(subscribe(&[])), Ok(RequestKind::Subscribe { initial_versions: 0, .. })));
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
    assert_eq!(removal.removed, ["c/default/b"]);
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

#[test]
fn responses_stop_at_a_bounded_size_of_bodies_and_a_larger_body_goes_alone() {
    // 600 Services of 40 endpoints (~700 bytes of body each), then one of 10,000 (more
    // than the bound by itself).
    let service = |i: usize, endpoints: usize| {
        let addresses: Vec<String> = (0..endpoints)
            .map(|e| format!("{{addresses: [10.{}.{}.{}]}}", 1 + i / 250, e / 250, e % 250 + 1))
            .collect();
        format!(
                "kind: Service\nmetadata: {{name: s{i:04}}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}\n---\n\
                 kind: EndpointSlice\nmetadata: {{name: s{i:04}-x, labels: {{kubernetes.io/service-name: s{i:04}}}}}\n\
                 addressType: IPv4\nports: [{{port: 80}}]\nendpoints: [{}]\n---\n",
                i / 250,
                i % 250 + 1,
                addresses.join(", ")
            )
    };
    let yaml: String = (0..600).map(|i| service(i, 40)).chain([service(600, 10_000)]).collect();
    let snap = snapshot(&yaml);
    let mut s = StreamState::default();
    s.on_request(subscribe(&[])).expect("ok");
    let responses = sync_all(&mut s, &snap);
    let bytes = |r: &Response| r.resources.iter().map(|r| r.body().len()).sum::<usize>();
    let largest = snap
        .for_node_after(ResourceType::ServiceView, Audience { node: "n1", proxy: "" }, None)
        .map(|r| r.body().len())
        .max()
        .unwrap_or(0);
    assert!(largest > MAX_RESPONSE_BYTES, "one body is larger than the bound: {largest}");
    let sizes: Vec<(usize, usize)> = responses.iter().map(|r| (r.resources.len(), bytes(r))).collect();
    assert!(sizes.len() >= 4, "in pieces: {sizes:?}");
    for (count, size) in &sizes {
        assert!(*size <= MAX_RESPONSE_BYTES || *count == 1, "over the bound with others: {sizes:?}");
        assert!(*count < MAX_RESOURCES_PER_RESPONSE, "bounded by bytes, not count: {sizes:?}");
    }
    assert_eq!(sizes.iter().map(|(count, _)| count).sum::<usize>(), 601, "every Service sent once");
    assert_eq!(s.type_status(ResourceType::ServiceView), Some((601, None)));
}

fn sync_all(s: &mut StreamState, snap: &Arc<Snapshot>) -> Vec<Response> {
    let mut all = Vec::new();
    while let Some(r) = s.next_response(ResourceType::ServiceView, snap) {
        s.on_request(reply(&r.nonce, None)).expect("ack");
        all.push(r);
    }
    all
}

#[test]
fn after_a_full_sync_a_change_is_found_without_walking_and_nothing_per_name_is_kept() {
    let first = snapshot(&services(2500, None));
    let mut s = StreamState::default();
    s.on_request(subscribe(&[])).expect("ok");
    assert_eq!(sync_all(&mut s, &first).len(), 5);
    let state = &s.types[ResourceType::ServiceView];
    assert!(state.is_based_without_overrides(), "in sync: only the shared snapshot is kept");
    let second = next(&services(2500, Some(7)), &first);
    let r = s.next_response(ResourceType::ServiceView, &second).expect("the change");
    assert_eq!(names(&r), ["c/default/s0007"]);
    s.on_request(reply(&r.nonce, None)).expect("ack");
    assert!(s.next_response(ResourceType::ServiceView, &second).is_none());
    assert!(s.types[ResourceType::ServiceView].is_based_without_overrides());
    assert_eq!(s.type_status(ResourceType::ServiceView), Some((2500, None)));
}

#[test]
fn what_changes_behind_the_walk_is_sent_before_the_walk_ends() {
    let first = snapshot(&services(2500, None));
    let mut s = StreamState::default();
    s.on_request(subscribe(&[])).expect("ok");
    let chunk = s.next_response(ResourceType::ServiceView, &first).expect("first chunk");
    assert!(names(&chunk).contains(&"c/default/s0003"));
    s.on_request(reply(&chunk.nonce, None)).expect("ack");
    // s0003, already sent, changes while the walk goes on.
    let second = next(&services(2500, Some(3)), &first);
    let rest = sync_all(&mut s, &second);
    let sent: Vec<&str> = rest.iter().flat_map(names).collect();
    assert_eq!(sent.len(), 2001, "the other 2000 and s0003 again");
    assert_eq!(sent.first(), Some(&"c/default/s0003"), "the change goes ahead of the rest of the walk");
    assert!(s.types[ResourceType::ServiceView].is_based_without_overrides());
}

#[test]
fn a_walk_keeps_nothing_per_name_for_what_it_has_walked() {
    let snap = snapshot(&services(2500, None));
    let mut s = StreamState::default();
    s.on_request(subscribe(&[])).expect("ok");
    for walked in [500, 1000, 1500] {
        let r = s.next_response(ResourceType::ServiceView, &snap).expect("a chunk");
        s.on_request(reply(&r.nonce, None)).expect("ack");
        let state = &s.types[ResourceType::ServiceView];
        assert!(state.overrides.is_empty(), "walked names are implied by the cursor, not stored");
        assert_eq!(s.type_status(ResourceType::ServiceView), Some((walked, None)));
    }
}

#[test]
fn a_stream_far_behind_is_sent_only_what_differs() {
    let first = snapshot(&services(300, None));
    let mut s = StreamState::default();
    s.on_request(subscribe(&[])).expect("ok");
    sync_all(&mut s, &first);
    // More snapshots than the history keeps, ending with one Service changed.
    let mut latest = Arc::clone(&first);
    for round in 0..40 {
        let changed = if round == 39 { Some(5) } else { None };
        latest = next(&services(300, changed), &latest);
    }
    assert!(latest.changed_since(first.generation(), ResourceType::ServiceView).is_none());
    let r = s.next_response(ResourceType::ServiceView, &latest).expect("the change");
    assert_eq!(names(&r), ["c/default/s0005"]);
    s.on_request(reply(&r.nonce, None)).expect("ack");
    assert!(s.types[ResourceType::ServiceView].is_based_without_overrides());
}

#[test]
fn a_nacked_walk_chunk_is_not_taken_for_held_and_the_walk_goes_on() {
    let snap = snapshot(&services(1200, None));
    let mut s = StreamState::default();
    s.on_request(subscribe(&[])).expect("ok");
    let first = s.next_response(ResourceType::ServiceView, &snap).expect("first chunk");
    s.on_request(reply(&first.nonce, Some("bad"))).expect("nack");
    assert_eq!(s.type_status(ResourceType::ServiceView), Some((0, None)), "the node has none of it");
    let rest = sync_all(&mut s, &snap);
    let sent: Vec<&str> = rest.iter().flat_map(names).collect();
    assert_eq!(sent.len(), 700, "the rejected 500 are not sent again");
    assert_eq!(s.type_status(ResourceType::ServiceView), Some((700, None)));
    let versions = s.versions();
    let held = versions.iter().filter(|(_, _, has, _)| has.is_some()).count();
    let rejected = versions.iter().filter(|(_, _, _, rejected)| rejected.is_some()).count();
    assert_eq!((held, rejected), (700, 500));
}

#[test]
fn a_resumed_node_keeps_no_overrides_once_walked() {
    let snap = snapshot(&services(1200, None));
    let held: Vec<(String, String)> = snap
        .for_node(ResourceType::ServiceView, "n1")
        .filter(|r| r.name != "c/default/s0700")
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    let initial: Vec<(&str, &str)> = held.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let mut s = StreamState::default();
    s.on_request(subscribe(&initial)).expect("ok");
    let sent = sync_all(&mut s, &snap);
    assert_eq!(sent.iter().flat_map(names).collect::<Vec<_>>(), ["c/default/s0700"]);
    assert!(s.types[ResourceType::ServiceView].is_based_without_overrides());
    assert_eq!(s.type_status(ResourceType::ServiceView), Some((1200, None)));
}

#[test]
fn resume_sends_only_differences_including_removals() {
    let snap = snapshot(TWO);
    let a = snap.get(ResourceType::ServiceView, "n1", "c/default/a").expect("a").version.clone();
    let mut s = StreamState::default();
    s.on_request(subscribe(&[("c/default/a", &a), ("c/default/gone", "v0")])).expect("ok");
    let r = s.next_response(ResourceType::ServiceView, &snap).expect("b and gone");
    assert_eq!(names(&r), ["c/default/b"]);
    assert_eq!(r.removed, ["c/default/gone"]);

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
fn a_node_announcing_a_service_proxy_name_is_sent_that_names_services_only() {
    use envoy_types::pb::google::protobuf::{Struct, Value};
    let snap = snapshot(
        "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\n\
             kind: Service\nmetadata: {name: b, labels: {service.kubernetes.io/service-proxy-name: kpx-b}}\n\
             spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n",
    );
    let with = |value: Kind| {
        let fields = [(kpx_proto::SERVICE_PROXY_NAME_KEY.to_owned(), Value { kind: Some(value) })];
        let mut request = subscribe(&[]);
        request.node = Some(Node {
            id: "n1".into(),
            metadata: Some(Struct { fields: fields.into_iter().collect() }),
            ..Default::default()
        });
        request
    };
    let sent = |request: DeltaDiscoveryRequest| {
        let mut s = StreamState::default();
        s.on_request(request).expect("ok");
        let response = s.next_response(ResourceType::ServiceView, &snap).expect("a response");
        names(&response).into_iter().map(str::to_owned).collect::<Vec<String>>()
    };
    assert_eq!(sent(subscribe(&[])), ["c/default/a"]);
    assert_eq!(sent(with(Kind::StringValue("kpx-b".into()))), ["c/default/b"]);
    let refused =
        |kind: Kind| StreamState::default().on_request(with(kind)).expect_err("refused").to_string();
    assert!(refused(Kind::BoolValue(true)).contains("node.metadata.service_proxy_name"));
    assert!(refused(Kind::StringValue("no spaces".into())).contains("label value"));
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
