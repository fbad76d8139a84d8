//! The gRPC face of delta ADS: one task per stream, fed by the newest snapshot.
//!
//! The publisher never waits for a stream: it replaces the snapshot in a
//! `watch` channel and each stream task catches up at its own pace.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::snapshot::Snapshot;
use super::stream::{RequestKind, StreamState};

/// The newest snapshot; `None` until every source has read its initial state.
pub type SnapshotReceiver = watch::Receiver<Option<Arc<Snapshot>>>;

pub struct AdsServer {
    snapshots: SnapshotReceiver,
}

impl AdsServer {
    pub fn new(snapshots: SnapshotReceiver) -> Self {
        AdsServer { snapshots }
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("kpx serves the incremental protocol only: use DeltaAggregatedResources"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = request.remote_addr();
        let inbound = request.into_inner();
        // At most one response per type is in flight, so this never fills.
        let (tx, rx) = mpsc::channel(4);
        let snapshots = self.snapshots.clone();
        tokio::spawn(async move {
            let mut state = StreamState::default();
            let result = serve_stream(&mut state, inbound, &tx, snapshots).await;
            let node = state.node().unwrap_or("?").to_owned();
            match result {
                Ok(()) => tracing::info!(node, ?peer, "stream closed"),
                Err(status) => {
                    tracing::warn!(node, ?peer, error = %status.message(), "stream ended");
                    let _ = tx.send(Err(status)).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

async fn serve_stream(
    state: &mut StreamState,
    mut inbound: Streaming<DeltaDiscoveryRequest>,
    tx: &mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    mut snapshots: SnapshotReceiver,
) -> Result<(), Status> {
    let mut opened: Vec<_> = Vec::new();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        if let Some(snapshot) = snapshot {
            for ty in state.subscribed() {
                let response = state.next_response(ty, &snapshot);
                let node = state.node().unwrap_or_default();
                if !opened.contains(&ty) {
                    opened.push(ty);
                    tracing::info!(
                        node,
                        type_url = ty.type_url(),
                        sent = response.as_ref().map_or(0, |r| r.resources.len()),
                        removed = response.as_ref().map_or(0, |r| r.removed_resources.len()),
                        "subscription synced"
                    );
                }
                if let Some(response) = response {
                    tracing::debug!(
                        node,
                        type_url = ty.type_url(),
                        nonce = response.nonce,
                        sent = response.resources.len(),
                        removed = response.removed_resources.len(),
                        "sending delta"
                    );
                    if tx.send(Ok(response)).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        tokio::select! {
            request = inbound.message() => {
                let Some(request) = request? else { return Ok(()) };
                let kind = state.on_request(request).map_err(|e| Status::invalid_argument(e.to_string()))?;
                let node = state.node().unwrap_or_default();
                match kind {
                    RequestKind::Subscribe { ty, initial_versions } => {
                        tracing::info!(node, type_url = ty.type_url(), initial_versions, "subscribed");
                    }
                    RequestKind::Ack { ty, nonce } => tracing::debug!(node, type_url = ty.type_url(), nonce, "ACK"),
                    RequestKind::Nack { ty, nonce, reason } => {
                        tracing::warn!(node, type_url = ty.type_url(), nonce, reason, "NACK: node kept its last good state");
                    }
                    RequestKind::UnknownType(url) => tracing::warn!(node, type_url = url, "ignoring unknown resource type"),
                    RequestKind::Stale { .. } | RequestKind::Update { .. } => {}
                }
            }
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return Err(Status::unavailable("control plane shutting down"));
                }
            }
        }
    }
}
