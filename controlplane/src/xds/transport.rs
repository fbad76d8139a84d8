//! The ADS service as tonic routes it: requests are decoded by tonic, responses are
//! written as [`wire`](super::wire) frames straight into the HTTP/2 body, so each
//! resource's shared encoding goes out as it is (no per-stream encode buffer).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use http_body::Frame;
use tokio::sync::mpsc;
use tonic::codec::Streaming;
use tonic::server::NamedService;
use tonic::{Code, Status};

use super::server::{AdsServer, Outbound, WalkPermit};
use super::snapshot::Resource;
use super::wire::Pieces;
use crate::trust::{self, Trust};

const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const STATE_OF_THE_WORLD_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// An HTTP/2 PING every this often, the connection dropped when one goes unanswered for
/// as long: the stream of a node behind a dead link is closed and its memory freed
/// within twice this. (The fan-out benchmark's transport floor serves with the same.)
pub const KEEPALIVE: Duration = Duration::from_secs(10);

/// A stream's codec buffers: its requests are small ACKs after the first, so they start
/// small (tonic's default of 8 KiB each way would be per stream).
pub fn buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(1024, 32 << 10)
}

/// Largest request accepted (a reconnecting node's `initial_resource_versions` of 10k
/// Services is about 0.5 MB).
const MAX_REQUEST_BYTES: usize = 64 << 20;

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`, delta variant only.
#[derive(Clone)]
pub struct AdsService {
    server: Arc<AdsServer>,
    trust: Arc<Trust>,
}

impl AdsService {
    /// The ADS route over `server`, serving each stream the node its caller proved to be.
    pub fn new(server: AdsServer, trust: Arc<Trust>) -> Self {
        AdsService { server: Arc::new(server), trust }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = kpx_proto::grpc::ADS;
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = Result<T, Infallible>> + Send>>;

impl tower_service::Service<http::Request<tonic::body::Body>> for AdsService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let response = match request.uri().path() {
            DELTA_PATH => {
                let this = self.clone();
                return Box::pin(async move { Ok(this.delta(request).await) });
            }
            STATE_OF_THE_WORLD_PATH => Status::unimplemented(
                "kpx serves the incremental protocol only: use DeltaAggregatedResources",
            )
            .into_http(),
            _ => Status::unimplemented("no such method").into_http(),
        };
        Box::pin(async move { Ok(response) })
    }
}

impl AdsService {
    async fn delta(&self, request: http::Request<tonic::body::Body>) -> http::Response<tonic::body::Body> {
        if request.headers().get("grpc-encoding").is_some_and(|e| e != "identity") {
            return Status::unimplemented("compressed requests are not accepted").into_http();
        }
        let trust::Peer { addr: peer, certs, closer } = trust::peer(request.extensions());
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let caller =
            match self.trust.identify(certs.as_deref().map(Vec::as_slice), authorization.as_deref()).await {
                Ok(caller) => caller,
                Err(status) => {
                    tracing::warn!(?peer, reason = status.message(), "stream refused");
                    return status.into_http();
                }
            };
        let decoder =
            tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::raw_decoder(buffers());
        let inbound = Streaming::new_request(decoder, request.into_body(), None, Some(MAX_REQUEST_BYTES));
        let responses = self.server.open(peer, closer, caller, inbound);
        let body = ResponseBody { responses, writing: None, done: false };
        let mut response = http::Response::new(tonic::body::Body::new(body));
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
        response
    }
}

/// The response body of one stream: each response's pieces as HTTP/2 data, then the
/// gRPC status as trailers.
struct ResponseBody {
    responses: mpsc::Receiver<Outbound>,
    /// What is left of the response being written, and its walk permit (let go with the
    /// last piece).
    writing: Option<(Pieces<Resource>, Option<WalkPermit>)>,
    done: bool,
}

impl ResponseBody {
    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            trailers.insert("grpc-status", http::HeaderValue::from(Code::Internal as i32));
        }
        Frame::trailers(trailers)
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        loop {
            if let Some((pieces, _)) = &mut self.writing {
                let piece = pieces.next();
                if pieces.is_done() {
                    self.writing = None;
                }
                if let Some(piece) = piece {
                    return Poll::Ready(Some(Ok(Frame::data(piece))));
                }
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.responses.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(sending))) => {
                    let sending = *sending;
                    self.writing = Some((sending.response.into_pieces(), sending.permit));
                }
                Poll::Ready(Some(Err(status))) => {
                    self.done = true;
                    return Poll::Ready(Some(Ok(Self::trailers(&status))));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(Some(Ok(Self::trailers(&Status::new(Code::Ok, "")))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.writing.is_none()
    }
}
