//! The gRPC face of delta ADS: one task per stream, fed by the newest snapshot.
//!
//! The publisher never waits for a stream: it replaces the snapshot in a
//! `watch` channel and each stream task catches up at its own pace.

use kpx_proto::sync::Locked as _;
use std::sync::Arc;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use std::time::{Duration, Instant, SystemTime};

use super::nodes::{NodeRegistry, StreamEntry};
use super::snapshot::{ResourceType, SnapshotReceiver};
use super::stream::{ProtocolError, RequestKind, Response, StreamState};
use super::syncs::{Syncing, Syncs};
use crate::metrics::ControlPlaneMetrics;
use crate::trust::connection::ConnectionCloser;
use crate::trust::Caller;

/// What a stream task hands to the response body: boxed, so the channel's slots stay small.
pub type Outbound = Result<Box<Sending>, Box<Status>>;

/// A response on its way to the node and, for a walk chunk, its permit.
#[derive(Debug)]
pub struct Sending {
    pub response: Response,
    /// Held until the response body has handed the chunk's last piece to HTTP/2.
    pub permit: Option<WalkPermit>,
}

/// One side's hold on a walk chunk's permit. The permit is made with two holds, one for
/// the stream task and one for the response: it goes back to the other streams as soon as
/// either lets go (is dropped) — the body once the chunk is written, the stream task at
/// the chunk's answer or the end of its lease. So what bounds the initial syncs in
/// flight is chunks being written, and a node slow to ACK holds no permit meanwhile.
#[derive(Debug)]
pub struct WalkPermit(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl WalkPermit {
    /// The two holds on `permit`.
    fn pair(permit: OwnedSemaphorePermit) -> (WalkPermit, WalkPermit) {
        let shared = Arc::new(std::sync::Mutex::new(Some(permit)));
        (WalkPermit(Arc::clone(&shared)), WalkPermit(shared))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<OwnedSemaphorePermit>> {
        self.0.locked()
    }

    /// Whether the permit is still taken.
    fn held(&self) -> bool {
        self.slot().is_some()
    }
}

impl Drop for WalkPermit {
    fn drop(&mut self) {
        self.slot().take();
    }
}

pub struct AdsServer {
    snapshots: SnapshotReceiver,
    nodes: NodeRegistry,
    metrics: Arc<ControlPlaneMetrics>,
    /// Permits for walk chunks in flight (see `serve_stream`).
    walks: Arc<Semaphore>,
    /// How long a response may go unanswered before its stream is closed (`None`: ever).
    ack_timeout: Option<Duration>,
    syncs: Syncs,
}

/// The default of `--ack-timeout`.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a walk chunk holds its permit while HTTP/2 has not taken all of it: then the
/// permit goes back to the other streams (the chunk waits for its ACK or `--ack-timeout`),
/// so nodes that stopped reading cannot hold every permit and stall everyone's sync.
pub const WALK_LEASE: Duration = Duration::from_secs(5);

/// How many first-sync chunks may be being written at once, across all streams (each up
/// to `MAX_RESOURCES_PER_RESPONSE` resources).
pub const WALKS_IN_FLIGHT: usize = 128;

impl AdsServer {
    pub fn new(snapshots: SnapshotReceiver, nodes: NodeRegistry, metrics: Arc<ControlPlaneMetrics>) -> Self {
        Self::with_walks(snapshots, nodes, metrics, WALKS_IN_FLIGHT)
    }

    /// A server that lets at most `walks` walk chunks be in flight at once.
    pub fn with_walks(
        snapshots: SnapshotReceiver,
        nodes: NodeRegistry,
        metrics: Arc<ControlPlaneMetrics>,
        walks: usize,
    ) -> Self {
        AdsServer {
            snapshots,
            nodes,
            metrics,
            walks: Arc::new(Semaphore::new(walks)),
            ack_timeout: Some(ACK_TIMEOUT),
            syncs: Syncs::default(),
        }
    }

    /// Closes a stream whose response goes unanswered for `timeout` (`None`: never).
    pub fn with_ack_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.ack_timeout = timeout;
        self
    }
}

/// How long a stream's closing status may wait to be written before its node's
/// connection is closed instead.
const STATUS_GRACE: Duration = Duration::from_secs(5);

/// Ends a stream with `status`. The status goes out as the stream's trailers, and HTTP/2
/// lets the body go once they are written. A node that stopped reading never lets them
/// through (HTTP/2 no longer asks for more of a response that waits for its window), and
/// the stream's task would wait for it for good: past [`STATUS_GRACE`], its connection is
/// closed instead.
async fn end_with(
    status: Status,
    tx: &mpsc::Sender<Outbound>,
    closer: Option<&ConnectionCloser>,
    node: &str,
    peer: Option<SocketAddr>,
) {
    let delivered = async {
        if tx.send(Err(Box::new(status))).await.is_ok() {
            tx.closed().await;
        }
    };
    if tokio::time::timeout(STATUS_GRACE, delivered).await.is_err() {
        if let Some(closer) = closer {
            closer.close();
        }
        tracing::warn!(
            node,
            ?peer,
            grace_s = STATUS_GRACE.as_secs(),
            "the node did not take the stream's status: its connection closed"
        );
    }
}

/// What bounds a stream's hold on the server: the walk permits shared by all streams,
/// and how long its responses may go unanswered before the stream ends (and its node's
/// connection, if the node does not take the status).
struct Limits {
    walks: Arc<Semaphore>,
    ack_timeout: Option<Duration>,
    syncs: Syncs,
    /// Closes the node's connection (see `trust::connection`).
    closer: Option<ConnectionCloser>,
}

/// Where a stream reports what it does.
struct Reporter {
    entry: StreamEntry,
    metrics: Arc<ControlPlaneMetrics>,
    /// The node's `kpx_xds_stream_queue_depth` series, once the node is known.
    queue_depth: std::sync::OnceLock<prometheus_client::metrics::gauge::Gauge>,
}

impl Reporter {
    fn sent(&self, state: &StreamState, ty: ResourceType, response: &Response) {
        let m = &self.metrics;
        m.responses_sent.inc();
        m.resources_sent.inc_by(response.resources.len() as u64);
        m.removals_sent.inc_by(response.removed.len() as u64);
        self.progress(state, ty, |p| {
            p.responses_sent += 1;
            p.sent_at = Some(Instant::now());
            p.behind_since.get_or_insert_with(Instant::now);
        });
    }

    fn answered(&self, state: &StreamState, ty: ResourceType, nack: Option<&str>) {
        self.progress(state, ty, |p| {
            if let Some(sent) = p.sent_at.take() {
                self.metrics.ack_latency.observe(sent.elapsed().as_secs_f64());
            }
            match nack {
                Some(reason) => {
                    self.metrics.nacks.inc();
                    p.last_nack = Some((reason.to_owned(), SystemTime::now()));
                }
                None => p.behind_since = None,
            }
        });
    }

    /// Refreshes the node's entry for `ty` from the stream state, then applies `f`.
    fn progress(
        &self,
        state: &StreamState,
        ty: ResourceType,
        f: impl FnOnce(&mut super::nodes::TypeProgress),
    ) {
        let node = state.node().unwrap_or_default();
        let (acked, in_flight) = state.type_status(ty).unwrap_or_default();
        let mut depth = 0;
        self.entry.update(|entry| {
            if entry.node != node {
                entry.node = node.to_owned();
            }
            if entry.proxy_name != state.proxy_name() {
                entry.proxy_name = state.proxy_name().to_owned();
            }
            let p = entry.types.or_default(ty);
            p.acked = acked;
            p.in_flight = in_flight.is_some();
            p.pending = in_flight.unwrap_or(0);
            f(p);
            depth = entry.types.values().map(|t| t.pending as i64).sum();
        });
        if !node.is_empty() {
            // The node's series, looked up once per stream (the gauge is shared).
            let gauge = self.queue_depth.get_or_init(|| {
                self.metrics.queue_depth.get_or_create(&ControlPlaneMetrics::node(node)).clone()
            });
            gauge.set(depth);
        }
    }

    fn closed(self, node: &str) {
        let nodes = self.entry.close();
        self.metrics.streams.dec();
        if !node.is_empty() && !nodes.has_node(node) {
            self.metrics.queue_depth.remove(&ControlPlaneMetrics::node(node));
        }
    }
}

impl AdsServer {
    /// Serves one delta ADS stream: responses come out of the returned channel, in order,
    /// ending with an error status if the stream fails.
    /// (`inbound` is tonic's `Streaming` of the request body, or any stream of requests.)
    pub fn open<S>(
        &self,
        peer: Option<SocketAddr>,
        closer: Option<ConnectionCloser>,
        caller: Caller,
        inbound: S,
    ) -> mpsc::Receiver<Outbound>
    where
        S: Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Send + 'static,
    {
        // At most one response per type is in flight, so this never fills.
        let (tx, rx) = mpsc::channel(4);
        let snapshots = self.snapshots.clone();
        let limits = Limits {
            walks: Arc::clone(&self.walks),
            ack_timeout: self.ack_timeout,
            syncs: self.syncs.clone(),
            closer,
        };
        let reporter = Reporter {
            entry: self.nodes.open(peer),
            metrics: Arc::clone(&self.metrics),
            queue_depth: std::sync::OnceLock::new(),
        };
        let (query_tx, queries) = mpsc::channel(4);
        reporter.entry.update(|e| e.query = Some(query_tx));
        self.metrics.streams.inc();
        tokio::spawn(async move {
            let mut state = match caller.node() {
                Some((node, how)) => StreamState::for_node(node.to_owned(), how),
                None => StreamState::default(),
            };
            let result = serve_stream(&mut state, inbound, &tx, snapshots, &reporter, queries, &limits).await;
            reporter.closed(state.node().unwrap_or_default());
            let node = state.node().unwrap_or("?").to_owned();
            match result {
                Ok(()) => tracing::info!(node, ?peer, "stream closed"),
                Err(status) => {
                    tracing::warn!(node, ?peer, error = %status.message(), "stream ended");
                    end_with(status, &tx, limits.closer.as_ref(), &node, peer).await;
                }
            }
        });
        rx
    }
}

async fn serve_stream(
    state: &mut StreamState,
    inbound: impl Stream<Item = Result<DeltaDiscoveryRequest, Status>>,
    tx: &mpsc::Sender<Outbound>,
    mut snapshots: SnapshotReceiver,
    reporter: &Reporter,
    mut queries: mpsc::Receiver<tokio::sync::oneshot::Sender<super::nodes::Versions>>,
    limits: &Limits,
) -> Result<(), Status> {
    let Limits { walks, ack_timeout, syncs, .. } = limits;
    // Held while some type is in its first sync, unless a chunk of it outlived its lease
    // unanswered (a node that stopped reading does not hold the memory back).
    let mut syncing: Option<Syncing> = None;
    let mut stalled = false;
    let ack_timeout = *ack_timeout;
    let mut inbound = std::pin::pin!(inbound);
    // Per type, since when a response has gone unanswered.
    let mut unanswered: BTreeMap<ResourceType, tokio::time::Instant> = BTreeMap::new();
    let mut opened: Vec<_> = Vec::new();
    // A walk chunk takes a permit until it is written (see `WalkPermit`), so initial syncs
    // of many nodes at once take bounded memory; the stream's hold on it, by type.
    let mut leases: BTreeMap<ResourceType, WalkPermit> = BTreeMap::new();
    let mut spare: Option<OwnedSemaphorePermit> = None;
    // The newest snapshot, and a wait for the next that stays registered across the loop's
    // turns (re-registering with the channel on every turn is a lock shared by all streams).
    let mut latest = snapshots.borrow_and_update().clone();
    let mut changes = tokio_stream::wrappers::WatchStream::from_changes(snapshots);
    // The ACK deadline's timer, moved rather than made anew on each turn (a later deadline
    // only updates the armed timer); it may fire when nothing is unanswered any more.
    let ack_timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(ack_timer);
    loop {
        let mut waiting = false;
        if let Some(snapshot) = latest.clone() {
            for ty in state.subscribed() {
                if state.awaiting_answer(ty) {
                    continue;
                }
                let mut permit = None;
                if state.walking(ty) {
                    match spare.take().map_or_else(|| Arc::clone(walks).try_acquire_owned().ok(), Some) {
                        Some(p) => permit = Some(p),
                        None => {
                            waiting = true;
                            continue;
                        }
                    }
                }
                let response = state.next_response(ty, &snapshot);
                let node = state.node().unwrap_or_default();
                if !opened.contains(&ty) {
                    opened.push(ty);
                    tracing::info!(
                        node,
                        type_url = ty.type_url(),
                        sent = response.as_ref().map_or(0, |r| r.resources.len()),
                        removed = response.as_ref().map_or(0, |r| r.removed.len()),
                        "subscription synced"
                    );
                }
                if let Some(response) = response {
                    tracing::debug!(
                        node,
                        type_url = ty.type_url(),
                        nonce = response.nonce,
                        sent = response.resources.len(),
                        removed = response.removed.len(),
                        "sending delta"
                    );
                    reporter.sent(state, ty, &response);
                    unanswered.entry(ty).or_insert_with(tokio::time::Instant::now);
                    let permit = permit.map(|p| {
                        let (ours, theirs) = WalkPermit::pair(p);
                        leases.insert(ty, ours);
                        theirs
                    });
                    if tx.send(Ok(Box::new(Sending { response, permit }))).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        let walking = !stalled && state.in_first_sync();
        match (walking, &syncing) {
            (true, None) => syncing = Some(syncs.enter()),
            (false, Some(_)) => syncing = None,
            _ => {}
        }
        let deadline = ack_timeout.zip(unanswered.values().min()).map(|(timeout, since)| *since + timeout);
        if let Some(at) = deadline.filter(|at| *at != ack_timer.deadline()) {
            ack_timer.as_mut().reset(at);
        }
        let lease_ends = leases
            .iter()
            .filter(|(_, lease)| lease.held())
            .filter_map(|(ty, _)| unanswered.get(ty))
            .min()
            .map(|since| *since + WALK_LEASE);
        // A first sync whose chunk goes unanswered that long no longer counts as running.
        let stalls_at = syncing.as_ref().and(unanswered.values().min()).map(|since| *since + WALK_LEASE);
        let wake = lease_ends.into_iter().chain(stalls_at).min();
        tokio::select! {
            _ = tokio::time::sleep_until(wake.unwrap_or_else(tokio::time::Instant::now)), if wake.is_some() => {
                let now = tokio::time::Instant::now();
                let over: Vec<ResourceType> =
                    unanswered.iter().filter(|(_, since)| **since + WALK_LEASE <= now).map(|(ty, _)| *ty).collect();
                stalled |= !over.is_empty();
                for ty in over {
                    if leases.remove(&ty).is_some_and(|lease| lease.held()) {
                        tracing::debug!(node = state.node().unwrap_or_default(), type_url = ty.type_url(), "walk chunk not written within its lease: permit given back");
                    }
                }
            }
            _ = &mut ack_timer, if deadline.is_some() => {
                reporter.metrics.unresponsive_closed.inc();
                let waited = ack_timeout.unwrap_or_default();
                return Err(Status::deadline_exceeded(format!(
                    "no ACK or NACK within {} s",
                    waited.as_secs_f64()
                )));
            }
            request = inbound.next() => {
                let Some(request) = request.transpose()? else { return Ok(()) };
                let kind = state.on_request(request).map_err(|e| {
                    if matches!(e, ProtocolError::NotThisNode { .. }) {
                        reporter.metrics.refused_streams.get_or_create(&ControlPlaneMetrics::reason("node_id_mismatch")).inc();
                    }
                    status_of(&e)
                })?;
                let node = state.node().unwrap_or_default();
                match kind {
                    RequestKind::Subscribe { ty, initial_versions } => {
                        tracing::info!(node, type_url = ty.type_url(), initial_versions, "subscribed");
                        reporter.progress(state, ty, |_| {});
                    }
                    RequestKind::Ack { ty, nonce } => {
                        tracing::debug!(node, type_url = ty.type_url(), nonce, "ACK");
                        unanswered.remove(&ty);
                        stalled = false;
                        reporter.answered(state, ty, None);
                        leases.remove(&ty);
                    }
                    RequestKind::Nack { ty, nonce, reason } => {
                        tracing::warn!(node, type_url = ty.type_url(), nonce, reason, "NACK: node kept its last good state");
                        unanswered.remove(&ty);
                        stalled = false;
                        reporter.answered(state, ty, Some(&reason));
                        leases.remove(&ty);
                    }
                    RequestKind::UnknownType(url) => tracing::warn!(node, type_url = url, "ignoring unknown resource type"),
                    RequestKind::Stale { .. } | RequestKind::Update { .. } => {}
                }
            }
            Some(reply) = queries.recv() => {
                let _ = reply.send(state.versions());
            }
            permit = Arc::clone(walks).acquire_owned(), if waiting => {
                spare = permit.ok();
            }
            changed = changes.next() => match changed {
                Some(snapshot) => latest = snapshot,
                None => return Err(Status::unavailable("control plane shutting down")),
            },
        }
    }
}

/// The gRPC status that ends a stream for a protocol error: a node that claims another
/// node's name is denied, anything else is an invalid argument.
fn status_of(e: &ProtocolError) -> Status {
    match e {
        ProtocolError::NotThisNode { .. } => Status::permission_denied(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

#[cfg(test)]
mod tests;
