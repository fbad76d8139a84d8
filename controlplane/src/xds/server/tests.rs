use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio_stream::wrappers::ReceiverStream;

use super::*;
use crate::xds::fixtures::{next, services};
use crate::xds::snapshot::ResourceType;
use crate::xds::snapshot::Snapshot;
use crate::xds::stream::{Response, MAX_RESOURCES_PER_RESPONSE};
use tokio::sync::watch;

type Requests = mpsc::Sender<Result<DeltaDiscoveryRequest, Status>>;

struct Fixture {
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    nodes: NodeRegistry,
    metrics: Arc<ControlPlaneMetrics>,
    server: AdsServer,
}

fn fixture(walks: usize) -> Fixture {
    let (snapshots, rx) = watch::channel(None);
    let nodes = NodeRegistry::default();
    let metrics = Arc::new(ControlPlaneMetrics::default());
    let server = AdsServer::with_walks(rx, nodes.clone(), Arc::clone(&metrics), walks);
    Fixture { snapshots, nodes, metrics, server }
}

impl Fixture {
    /// A stream of node `node`, subscribed to Service views.
    async fn subscribe(&self, node: &str) -> (Requests, mpsc::Receiver<Outbound>) {
        let (tx, rx) = mpsc::channel(8);
        let out = self.server.open(None, None, Caller::Anonymous, ReceiverStream::new(rx));
        let request = DeltaDiscoveryRequest {
            node: Some(Node { id: node.into(), ..Default::default() }),
            type_url: ResourceType::ServiceView.type_url().into(),
            ..Default::default()
        };
        tx.send(Ok(request)).await.expect("stream open");
        (tx, out)
    }
}

/// The next response as the body gets it, permit and all (held until dropped, as the
/// body holds it until the response is written).
async fn sending(out: &mut mpsc::Receiver<Outbound>) -> Box<Sending> {
    let next = tokio::time::timeout(Duration::from_secs(5), out.recv()).await.expect("a response in time");
    next.expect("stream open").expect("a response, not an error")
}

/// The next response, written at once (its walk permit let go).
async fn response(out: &mut mpsc::Receiver<Outbound>) -> Response {
    sending(out).await.response
}

/// Nothing arrives for a moment.
async fn quiet(out: &mut mpsc::Receiver<Outbound>) -> bool {
    tokio::time::timeout(Duration::from_millis(200), out.recv()).await.is_err()
}

async fn ack(tx: &Requests, r: &Response) {
    let ack = DeltaDiscoveryRequest {
        type_url: r.type_url.into(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    };
    tx.send(Ok(ack)).await.expect("stream open");
}

fn names(r: &Response) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

#[tokio::test]
async fn nothing_before_the_first_snapshot_then_everything_then_only_changes() {
    let f = fixture(WALKS_IN_FLIGHT);
    let (tx, mut out) = f.subscribe("n1").await;
    assert!(quiet(&mut out).await, "no snapshot yet: nothing is served");
    let first = next(&services(2, None), &Snapshot::default());
    f.snapshots.send_replace(Some(Arc::clone(&first)));
    let all = response(&mut out).await;
    assert_eq!(names(&all), ["c/default/s0000", "c/default/s0001"]);
    ack(&tx, &all).await;
    let second = next(&services(2, Some(1)), &first);
    f.snapshots.send_replace(Some(second));
    let change = response(&mut out).await;
    assert_eq!(names(&change), ["c/default/s0001"]);
    ack(&tx, &change).await;
    assert!(quiet(&mut out).await, "in sync");
}

#[tokio::test]
async fn the_registry_and_metrics_follow_the_stream_until_it_closes() {
    let f = fixture(WALKS_IN_FLIGHT);
    f.snapshots.send_replace(Some(next(&services(3, None), &Snapshot::default())));
    let (tx, mut out) = f.subscribe("n1").await;
    let all = response(&mut out).await;
    ack(&tx, &all).await;
    let acked = || {
        let entry = f.nodes.snapshot().into_iter().find(|e| e.node == "n1")?;
        entry.types.get(ResourceType::ServiceView).map(|p| (p.acked, p.in_flight))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while acked() != Some((3, false)) {
        assert!(tokio::time::Instant::now() < deadline, "the ACK is reported: {:?}", acked());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let versions = tokio::time::timeout(Duration::from_secs(5), f.nodes.versions("n1"))
        .await
        .expect("in time")
        .expect("n1 answers");
    assert_eq!(versions.iter().filter(|(_, _, acked, _)| acked.is_some()).count(), 3);
    assert!(f.metrics.render().contains("kpx_xds_streams 1"));
    drop(tx);
    assert!(tokio::time::timeout(Duration::from_secs(5), out.recv()).await.expect("closes").is_none());
    assert!(!f.nodes.has_node("n1"), "forgotten once closed");
    assert!(f.metrics.render().contains("kpx_xds_streams 0"));
}

#[tokio::test]
async fn a_bad_request_or_an_inbound_error_ends_the_stream_with_a_status() {
    let f = fixture(WALKS_IN_FLIGHT);
    f.snapshots.send_replace(Some(next(&services(1, None), &Snapshot::default())));
    let (tx, rx) = mpsc::channel(8);
    let mut out = f.server.open(None, None, Caller::Anonymous, ReceiverStream::new(rx));
    tx.send(Ok(DeltaDiscoveryRequest::default())).await.expect("open");
    let ended = tokio::time::timeout(Duration::from_secs(5), out.recv()).await.expect("in time");
    let status = ended.expect("an item").expect_err("an error status");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("node.id"), "{}", status.message());

    let (tx, mut out) = f.subscribe("n1").await;
    response(&mut out).await;
    tx.send(Err(Status::data_loss("broken body"))).await.expect("open");
    let ended = tokio::time::timeout(Duration::from_secs(5), out.recv()).await.expect("in time");
    assert_eq!(ended.expect("an item").expect_err("the inbound error").code(), tonic::Code::DataLoss);
}

#[tokio::test]
async fn a_stream_that_leaves_a_response_unanswered_is_closed_and_its_walk_permit_freed() {
    let mut f = fixture(1);
    f.server = f.server.with_ack_timeout(Some(Duration::from_millis(300)));
    let many = MAX_RESOURCES_PER_RESPONSE + 100;
    f.snapshots.send_replace(Some(next(&services(many, None), &Snapshot::default())));
    // n1 takes the one walk permit with its first chunk, which is never written nor answered.
    let (_tx1, mut out1) = f.subscribe("n1").await;
    let _unwritten = sending(&mut out1).await;
    let since = std::time::Instant::now();
    let (tx2, mut out2) = f.subscribe("n2").await;
    let ended = tokio::time::timeout(Duration::from_secs(5), out1.recv()).await.expect("closed in time");
    let status = ended.expect("an item").expect_err("an error status");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert!(status.message().contains("no ACK or NACK within"), "{}", status.message());
    assert!(f.metrics.render().contains("kpx_xds_unresponsive_streams_closed_total 1"));
    // n2, which answers, gets the permit (freed by the closure, not by the lease) and its
    // whole walk, and is not closed.
    let chunk = response(&mut out2).await;
    assert!(since.elapsed() < WALK_LEASE, "n2 waited {:?}", since.elapsed());
    ack(&tx2, &chunk).await;
    let rest = response(&mut out2).await;
    assert_eq!(chunk.resources.len() + rest.resources.len(), many);
    ack(&tx2, &rest).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(quiet(&mut out2).await, "an answering stream stays open");
    assert!(f.metrics.render().contains("kpx_xds_unresponsive_streams_closed_total 1"));
}

#[tokio::test(start_paused = true)]
async fn a_walk_chunk_left_unwritten_gives_its_permit_back_after_its_lease() {
    let mut f = fixture(1);
    f.server = f.server.with_ack_timeout(None);
    let many = MAX_RESOURCES_PER_RESPONSE + 100;
    f.snapshots.send_replace(Some(next(&services(many, None), &Snapshot::default())));
    let (_tx1, mut out1) = f.subscribe("n1").await;
    let _unwritten = sending(&mut out1).await;
    let since = tokio::time::Instant::now();
    let (tx2, mut out2) = f.subscribe("n2").await;
    let next = tokio::time::timeout(WALK_LEASE * 2, out2.recv()).await.expect("n2 served after the lease");
    let chunk = next.expect("open").expect("a response").response;
    assert!(since.elapsed() >= WALK_LEASE, "n2 waited for n1's lease: {:?}", since.elapsed());
    ack(&tx2, &chunk).await;
    let rest = response(&mut out2).await;
    assert_eq!(chunk.resources.len() + rest.resources.len(), many);
    assert!(quiet(&mut out1).await, "n1 is not closed (no --ack-timeout) and gets nothing more");
}

#[tokio::test(start_paused = true)]
async fn walk_chunks_being_written_are_bounded_across_streams_and_unanswered_ones_hold_none() {
    let f = fixture(1);
    let many = MAX_RESOURCES_PER_RESPONSE + 100;
    f.snapshots.send_replace(Some(next(&services(many, None), &Snapshot::default())));
    let (tx1, mut out1) = f.subscribe("n1").await;
    let writing1 = *sending(&mut out1).await;
    assert_eq!(writing1.response.resources.len(), MAX_RESOURCES_PER_RESPONSE);
    let (tx2, mut out2) = f.subscribe("n2").await;
    assert!(quiet(&mut out2).await, "the one permit is n1's while its chunk is written");
    // Written (the body lets go of the permit), not yet answered: the permit is n2's at
    // once, not after n1's lease.
    let since = tokio::time::Instant::now();
    let Sending { response: chunk1, permit } = writing1;
    drop(permit);
    let writing2 = *sending(&mut out2).await;
    assert!(since.elapsed() < WALK_LEASE, "n2 waited {:?}", since.elapsed());
    assert_eq!(writing2.response.resources.len(), MAX_RESOURCES_PER_RESPONSE);
    ack(&tx1, &chunk1).await;
    assert!(quiet(&mut out1).await, "n1's next chunk waits while n2's is written");
    let since = tokio::time::Instant::now();
    let Sending { response: chunk2, permit } = writing2;
    drop(permit);
    let rest1 = response(&mut out1).await;
    assert!(since.elapsed() < WALK_LEASE, "n1 waited {:?}", since.elapsed());
    assert_eq!(rest1.resources.len(), 100);
    ack(&tx2, &chunk2).await;
    let rest2 = response(&mut out2).await;
    assert_eq!(rest2.resources.len(), 100);
}

#[tokio::test(start_paused = true)]
async fn a_stream_counts_as_in_its_first_sync_until_its_walk_ends_or_stalls() {
    let f = fixture(WALKS_IN_FLIGHT);
    let many = MAX_RESOURCES_PER_RESPONSE + 100;
    f.snapshots.send_replace(Some(next(&services(many, None), &Snapshot::default())));
    let running = || f.server.syncs.running();
    let settled = || tokio::time::sleep(Duration::from_millis(10));
    // n1 walks to the end.
    let (tx1, mut out1) = f.subscribe("n1").await;
    let chunk = response(&mut out1).await;
    settled().await;
    assert_eq!(running(), 1, "n1 walks");
    ack(&tx1, &chunk).await;
    let rest = response(&mut out1).await;
    ack(&tx1, &rest).await;
    settled().await;
    assert_eq!(running(), 0, "n1's walk ended");
    // n2 takes its first chunk and never answers: after the lease it no longer counts.
    let (tx2, mut out2) = f.subscribe("n2").await;
    let chunk = response(&mut out2).await;
    settled().await;
    assert_eq!(running(), 1, "n2 walks");
    tokio::time::sleep(WALK_LEASE).await;
    assert_eq!(running(), 0, "n2's walk stalled unanswered");
    // Its answer counts it again until its walk ends.
    ack(&tx2, &chunk).await;
    let rest = response(&mut out2).await;
    assert_eq!(running(), 1, "n2 walks again");
    ack(&tx2, &rest).await;
    settled().await;
    assert_eq!(running(), 0);
}
