//! The gRPC face of delta ADS: each stream opened gets its entry in the node registry,
//! its limits and a task of its own (`xds::task`), fed by the newest snapshot; the
//! stream ends with the gRPC status made from how its task ended.
//!
//! The publisher never waits for a stream: it replaces the snapshot in a
//! `watch` channel and each stream task catches up at its own pace.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use futures::Stream;
use tokio::sync::{mpsc, Semaphore};
use tonic::Status;

use super::nodes::NodeRegistry;
use super::reporter::Reporter;
use super::snapshot::SnapshotReceiver;
use super::stream::{ProtocolError, StreamState};
use super::syncs::Syncs;
use super::task::{Inputs, Limits, StreamEnd, StreamTask};
use crate::metrics::ControlPlaneMetrics;
use crate::trust::connection::ConnectionCloser;
use crate::trust::Caller;

pub use super::outbound::{Outbound, Sending, WalkPermit, WALK_LEASE};

pub struct AdsServer {
    snapshots: SnapshotReceiver,
    nodes: NodeRegistry,
    metrics: Arc<ControlPlaneMetrics>,
    /// Permits for walk chunks in flight (see `outbound::WalkPermit`).
    walks: Arc<Semaphore>,
    /// How long a response may go unanswered before its stream is closed (`None`: ever).
    ack_timeout: Option<Duration>,
    syncs: Syncs,
}

/// The default of `--ack-timeout`.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(60);

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
            let state = match caller.node() {
                Some((node, how)) => StreamState::for_node(node.to_owned(), how),
                None => StreamState::default(),
            };
            let mut task = StreamTask::new(state, &tx, &reporter, &limits);
            let result = task.run(Inputs { requests: inbound, queries, snapshots }).await;
            let node = task.node().unwrap_or_default().to_owned();
            // Its walk permits go back now, not once the status is delivered.
            drop(task);
            reporter.closed(&node);
            let node = if node.is_empty() { "?".to_owned() } else { node };
            match result {
                Ok(()) => tracing::info!(node, ?peer, "stream closed"),
                Err(end) => {
                    let status = status_of(end);
                    tracing::warn!(node, ?peer, error = %status.message(), "stream ended");
                    end_with(status, &tx, limits.closer.as_ref(), &node, peer).await;
                }
            }
        });
        rx
    }
}

/// The gRPC status that ends a stream: a node that claims another node's name is
/// denied, another protocol error is an invalid argument.
fn status_of(end: StreamEnd) -> Status {
    match end {
        StreamEnd::Inbound(status) => status,
        StreamEnd::Protocol(e @ ProtocolError::NotThisNode { .. }) => {
            Status::permission_denied(e.to_string())
        }
        StreamEnd::Protocol(e) => Status::invalid_argument(e.to_string()),
        StreamEnd::Unanswered(waited) => {
            Status::deadline_exceeded(format!("no ACK or NACK within {} s", waited.as_secs_f64()))
        }
        StreamEnd::ShuttingDown => Status::unavailable("control plane shutting down"),
    }
}

#[cfg(test)]
mod tests;
