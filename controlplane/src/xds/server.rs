//! The gRPC face of delta ADS: one task per stream, fed by the newest snapshot.
//!
//! The publisher never waits for a stream: it replaces the snapshot in a
//! `watch` channel and each stream task catches up at its own pace.

use std::sync::Arc;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use std::time::{Instant, SystemTime};

use super::nodes::NodeRegistry;
use super::snapshot::{ResourceType, Snapshot};
use super::stream::{RequestKind, Response, StreamState};
use crate::metrics::ControlPlaneMetrics;

/// What a stream task hands to the response body: boxed, so the channel's slots stay small.
pub type Outbound = Result<Box<Response>, Box<Status>>;

/// The newest snapshot; `None` until every source has read its initial state.
pub type SnapshotReceiver = watch::Receiver<Option<Arc<Snapshot>>>;

pub struct AdsServer {
    snapshots: SnapshotReceiver,
    nodes: NodeRegistry,
    metrics: Arc<ControlPlaneMetrics>,
    /// Permits for walk chunks in flight (see `serve_stream`).
    walks: Arc<Semaphore>,
}

/// How many first-sync chunks may be in flight at once, across all streams (each up to
/// `MAX_RESOURCES_PER_RESPONSE` resources).
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
        AdsServer { snapshots, nodes, metrics, walks: Arc::new(Semaphore::new(walks)) }
    }
}

/// Where a stream reports what it does.
struct Reporter {
    id: u64,
    nodes: NodeRegistry,
    metrics: Arc<ControlPlaneMetrics>,
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
        let node = state.node().unwrap_or_default().to_owned();
        let (acked, in_flight) = state.type_status(ty).unwrap_or_default();
        let mut depth = 0;
        self.nodes.update(self.id, |entry| {
            entry.node.clone_from(&node);
            let p = entry.types.entry(ty).or_default();
            p.acked = acked;
            p.in_flight = in_flight.is_some();
            p.pending = in_flight.unwrap_or(0);
            f(p);
            depth = entry.types.values().map(|t| t.pending as i64).sum();
        });
        if !node.is_empty() {
            self.metrics.queue_depth.get_or_create(&ControlPlaneMetrics::node(&node)).set(depth);
        }
    }

    fn closed(&self, node: &str) {
        self.nodes.close(self.id);
        self.metrics.streams.dec();
        if !node.is_empty() && !self.nodes.has_node(node) {
            self.metrics.queue_depth.remove(&ControlPlaneMetrics::node(node));
        }
    }
}

impl AdsServer {
    /// Serves one delta ADS stream: responses come out of the returned channel, in order,
    /// ending with an error status if the stream fails.
    /// (`inbound` is tonic's `Streaming` of the request body, or any stream of requests.)
    pub fn open<S>(&self, peer: Option<SocketAddr>, inbound: S) -> mpsc::Receiver<Outbound>
    where
        S: Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Send + 'static,
    {
        // At most one response per type is in flight, so this never fills.
        let (tx, rx) = mpsc::channel(4);
        let snapshots = self.snapshots.clone();
        let walks = Arc::clone(&self.walks);
        let reporter = Reporter {
            id: self.nodes.open(peer),
            nodes: self.nodes.clone(),
            metrics: Arc::clone(&self.metrics),
        };
        let (query_tx, queries) = mpsc::channel(4);
        self.nodes.update(reporter.id, |e| e.query = Some(query_tx));
        self.metrics.streams.inc();
        tokio::spawn(async move {
            let mut state = StreamState::default();
            let result = serve_stream(&mut state, inbound, &tx, snapshots, &reporter, queries, &walks).await;
            reporter.closed(state.node().unwrap_or_default());
            let node = state.node().unwrap_or("?").to_owned();
            match result {
                Ok(()) => tracing::info!(node, ?peer, "stream closed"),
                Err(status) => {
                    tracing::warn!(node, ?peer, error = %status.message(), "stream ended");
                    let _ = tx.send(Err(Box::new(status))).await;
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
    walks: &Arc<Semaphore>,
) -> Result<(), Status> {
    let mut inbound = std::pin::pin!(inbound);
    let mut opened: Vec<_> = Vec::new();
    // Walk chunks in flight hold a permit each, so initial syncs of many nodes at once take
    // bounded memory; a permit is given back at the chunk's ACK.
    let mut permits: BTreeMap<ResourceType, OwnedSemaphorePermit> = BTreeMap::new();
    let mut spare: Option<OwnedSemaphorePermit> = None;
    loop {
        let mut waiting = false;
        let snapshot = snapshots.borrow_and_update().clone();
        if let Some(snapshot) = snapshot {
            for ty in state.subscribed() {
                if state.walking(ty) && !permits.contains_key(&ty) {
                    match spare.take().map_or_else(|| Arc::clone(walks).try_acquire_owned().ok(), Some) {
                        Some(permit) => {
                            permits.insert(ty, permit);
                        }
                        None => {
                            waiting = true;
                            continue;
                        }
                    }
                }
                let response = state.next_response(ty, &snapshot);
                if response.is_none() {
                    permits.remove(&ty);
                }
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
                    if tx.send(Ok(Box::new(response))).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        tokio::select! {
            request = inbound.next() => {
                let Some(request) = request.transpose()? else { return Ok(()) };
                let kind = state.on_request(request).map_err(|e| Status::invalid_argument(e.to_string()))?;
                let node = state.node().unwrap_or_default();
                match kind {
                    RequestKind::Subscribe { ty, initial_versions } => {
                        tracing::info!(node, type_url = ty.type_url(), initial_versions, "subscribed");
                        reporter.progress(state, ty, |_| {});
                    }
                    RequestKind::Ack { ty, nonce } => {
                        tracing::debug!(node, type_url = ty.type_url(), nonce, "ACK");
                        reporter.answered(state, ty, None);
                        permits.remove(&ty);
                    }
                    RequestKind::Nack { ty, nonce, reason } => {
                        tracing::warn!(node, type_url = ty.type_url(), nonce, reason, "NACK: node kept its last good state");
                        reporter.answered(state, ty, Some(&reason));
                        permits.remove(&ty);
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
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return Err(Status::unavailable("control plane shutting down"));
                }
            }
        }
    }
}
