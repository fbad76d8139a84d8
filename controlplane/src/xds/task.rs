//! One stream's task: the protocol state, the newest snapshot, the ACK clock and the walk
//! gate in one struct, and a loop that only waits ([`StreamTask::run`]). What each
//! wake-up means is a method: [`StreamTask::send_ready`] after every turn,
//! [`StreamTask::on_request`], [`StreamTask::on_wake`] and the ACK deadline.
//!
//! It ends with a [`StreamEnd`], which the server turns into the stream's gRPC status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::Status;

use super::nodes::Versions;
use super::outbound::{Outbound, Sending, WalkPermit, WALK_LEASE};
use super::reporter::Reporter;
use super::snapshot::{ResourceType, Snapshot, SnapshotReceiver};
use super::stream::{ProtocolError, RequestKind, StreamState};
use super::syncs::{Syncing, Syncs};
use crate::metrics::ControlPlaneMetrics;
use crate::trust::connection::ConnectionCloser;

/// What bounds a stream's hold on the server: the walk permits shared by all streams,
/// and how long its responses may go unanswered before the stream ends (and its node's
/// connection, if the node does not take the status).
pub(super) struct Limits {
    pub(super) walks: Arc<Semaphore>,
    pub(super) ack_timeout: Option<Duration>,
    pub(super) syncs: Syncs,
    /// Closes the node's connection (see `trust::connection`).
    pub(super) closer: Option<ConnectionCloser>,
}

/// Why a stream ended other than by the node closing it.
#[derive(Debug)]
pub(super) enum StreamEnd {
    /// The request stream failed, as the transport reported it.
    Inbound(Status),
    /// A request the stream cannot go on after.
    Protocol(ProtocolError),
    /// A response went unanswered this long.
    Unanswered(Duration),
    /// The snapshots stopped: the control plane is shutting down.
    ShuttingDown,
}

/// Where the task's requests, node queries and snapshots come from.
pub(super) struct Inputs<S> {
    pub(super) requests: S,
    pub(super) queries: mpsc::Receiver<oneshot::Sender<Versions>>,
    pub(super) snapshots: SnapshotReceiver,
}

pub(super) struct StreamTask<'a> {
    state: StreamState,
    out: &'a mpsc::Sender<Outbound>,
    reporter: &'a Reporter,
    limits: &'a Limits,
    /// The newest snapshot.
    latest: Option<Arc<Snapshot>>,
    /// Per type, since when a response has gone unanswered.
    unanswered: BTreeMap<ResourceType, Instant>,
    /// The types whose first response was logged.
    opened: Vec<ResourceType>,
    /// A walk chunk takes a permit until it is written (see `WalkPermit`), so initial
    /// syncs of many nodes at once take bounded memory; the stream's hold on it, by type.
    leases: BTreeMap<ResourceType, WalkPermit>,
    /// A permit taken while waiting for one, for the next walk chunk.
    spare: Option<OwnedSemaphorePermit>,
    /// Whether a walk chunk waits for a permit.
    waiting: bool,
    /// Held while some type is in its first sync, unless a chunk of it outlived its lease
    /// unanswered (a node that stopped reading does not hold the memory back).
    syncing: Option<Syncing>,
    stalled: bool,
}

impl<'a> StreamTask<'a> {
    pub(super) fn new(
        state: StreamState,
        out: &'a mpsc::Sender<Outbound>,
        reporter: &'a Reporter,
        limits: &'a Limits,
    ) -> Self {
        StreamTask {
            state,
            out,
            reporter,
            limits,
            latest: None,
            unanswered: BTreeMap::new(),
            opened: Vec::new(),
            leases: BTreeMap::new(),
            spare: None,
            waiting: false,
            syncing: None,
            stalled: false,
        }
    }

    /// The node's name, once known.
    pub(super) fn node(&self) -> Option<&str> {
        self.state.node()
    }

    /// Serves the stream until the node closes it (`Ok`) or it must end.
    pub(super) async fn run<S>(&mut self, inputs: Inputs<S>) -> Result<(), StreamEnd>
    where
        S: Stream<Item = Result<DeltaDiscoveryRequest, Status>>,
    {
        let Inputs { requests, mut queries, mut snapshots } = inputs;
        let mut requests = std::pin::pin!(requests);
        // A wait for the next snapshot that stays registered across the loop's turns
        // (re-registering with the channel on every turn is a lock shared by all streams).
        self.latest = snapshots.borrow_and_update().clone();
        let mut changes = tokio_stream::wrappers::WatchStream::from_changes(snapshots);
        // The ACK deadline's timer, moved rather than made anew on each turn (a later
        // deadline only updates the armed timer); it may fire when nothing is unanswered.
        let ack_timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(ack_timer);
        let walks = Arc::clone(&self.limits.walks);
        loop {
            if !self.send_ready().await {
                return Ok(());
            }
            self.track_first_sync();
            let deadline = self.ack_deadline();
            if let Some(at) = deadline.filter(|at| *at != ack_timer.deadline()) {
                ack_timer.as_mut().reset(at);
            }
            let wake = self.wake_at();
            tokio::select! {
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => self.on_wake(),
                _ = &mut ack_timer, if deadline.is_some() => return Err(self.unanswered_too_long()),
                request = requests.next() => match request {
                    None => return Ok(()),
                    Some(request) => self.on_request(request.map_err(StreamEnd::Inbound)?)?,
                },
                Some(reply) = queries.recv() => {
                    let _ = reply.send(self.state.versions());
                }
                permit = Arc::clone(&walks).acquire_owned(), if self.waiting => self.spare = permit.ok(),
                changed = changes.next() => self.latest = changed.ok_or(StreamEnd::ShuttingDown)?,
            }
        }
    }

    /// Sends every subscribed type that has nothing in flight its next response, if it has
    /// one; a walk chunk only with a permit (else `waiting`). False when the response
    /// body is gone.
    async fn send_ready(&mut self) -> bool {
        self.waiting = false;
        let Some(snapshot) = self.latest.clone() else { return true };
        for ty in self.state.subscribed() {
            if self.state.awaiting_answer(ty) {
                continue;
            }
            let mut permit = None;
            if self.state.walking(ty) {
                let walks = &self.limits.walks;
                match self.spare.take().map_or_else(|| Arc::clone(walks).try_acquire_owned().ok(), Some) {
                    Some(p) => permit = Some(p),
                    None => {
                        self.waiting = true;
                        continue;
                    }
                }
            }
            let response = self.state.next_response(ty, &snapshot);
            let node = self.state.node().unwrap_or_default();
            if !self.opened.contains(&ty) {
                self.opened.push(ty);
                tracing::info!(
                    node,
                    type_url = ty.type_url(),
                    sent = response.as_ref().map_or(0, |r| r.resources.len()),
                    removed = response.as_ref().map_or(0, |r| r.removed.len()),
                    "subscription synced"
                );
            }
            let Some(response) = response else { continue };
            tracing::debug!(
                node,
                type_url = ty.type_url(),
                nonce = response.nonce,
                sent = response.resources.len(),
                removed = response.removed.len(),
                "sending delta"
            );
            self.reporter.sent(&self.state, ty, &response);
            self.unanswered.entry(ty).or_insert_with(Instant::now);
            let permit = permit.map(|p| {
                let (ours, theirs) = WalkPermit::pair(p);
                self.leases.insert(ty, ours);
                theirs
            });
            if self.out.send(Ok(Box::new(Sending { response, permit }))).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Enters or leaves the server's count of first syncs running.
    fn track_first_sync(&mut self) {
        let walking = !self.stalled && self.state.in_first_sync();
        match (walking, &self.syncing) {
            (true, None) => self.syncing = Some(self.limits.syncs.enter()),
            (false, Some(_)) => self.syncing = None,
            _ => {}
        }
    }

    /// When the oldest unanswered response's time runs out.
    fn ack_deadline(&self) -> Option<Instant> {
        let since = self.unanswered.values().min()?;
        Some(*since + self.limits.ack_timeout?)
    }

    /// When a held lease ends, or the first sync stalls: an unanswered chunk that old no
    /// longer counts as running.
    fn wake_at(&self) -> Option<Instant> {
        let lease_ends = (self.leases.iter())
            .filter(|(_, lease)| lease.held())
            .filter_map(|(ty, _)| self.unanswered.get(ty))
            .min()
            .map(|since| *since + WALK_LEASE);
        let stalls_at =
            self.syncing.as_ref().and(self.unanswered.values().min()).map(|since| *since + WALK_LEASE);
        lease_ends.into_iter().chain(stalls_at).min()
    }

    /// Gives back the permits of chunks unanswered past their lease.
    fn on_wake(&mut self) {
        let now = Instant::now();
        let over: Vec<ResourceType> = self
            .unanswered
            .iter()
            .filter(|(_, since)| **since + WALK_LEASE <= now)
            .map(|(ty, _)| *ty)
            .collect();
        self.stalled |= !over.is_empty();
        for ty in over {
            if self.leases.remove(&ty).is_some_and(|lease| lease.held()) {
                tracing::debug!(
                    node = self.state.node().unwrap_or_default(),
                    type_url = ty.type_url(),
                    "walk chunk not written within its lease: permit given back"
                );
            }
        }
    }

    fn unanswered_too_long(&self) -> StreamEnd {
        self.reporter.metrics.unresponsive_closed.inc();
        StreamEnd::Unanswered(self.limits.ack_timeout.unwrap_or_default())
    }

    fn on_request(&mut self, request: DeltaDiscoveryRequest) -> Result<(), StreamEnd> {
        let kind = self.state.on_request(request).map_err(|e| {
            if matches!(e, ProtocolError::NotThisNode { .. }) {
                let reason = ControlPlaneMetrics::reason("node_id_mismatch");
                self.reporter.metrics.refused_streams.get_or_create(&reason).inc();
            }
            StreamEnd::Protocol(e)
        })?;
        let node = self.state.node().unwrap_or_default();
        match kind {
            RequestKind::Subscribe { ty, initial_versions } => {
                tracing::info!(node, type_url = ty.type_url(), initial_versions, "subscribed");
                self.reporter.progress(&self.state, ty, |_| {});
            }
            RequestKind::Ack { ty, nonce } => {
                tracing::debug!(node, type_url = ty.type_url(), nonce, "ACK");
                self.answered(ty, None);
            }
            RequestKind::Nack { ty, nonce, reason } => {
                tracing::warn!(
                    node,
                    type_url = ty.type_url(),
                    nonce,
                    reason,
                    "NACK: node kept its last good state"
                );
                self.answered(ty, Some(&reason));
            }
            RequestKind::UnknownType(url) => {
                tracing::warn!(node, type_url = url, "ignoring unknown resource type")
            }
            RequestKind::Stale { .. } | RequestKind::Update { .. } => {}
        }
        Ok(())
    }

    /// The response of `ty` was ACKed (`nack: None`) or NACKed.
    fn answered(&mut self, ty: ResourceType, nack: Option<&str>) {
        self.unanswered.remove(&ty);
        self.stalled = false;
        self.reporter.answered(&self.state, ty, nack);
        self.leases.remove(&ty);
    }
}
