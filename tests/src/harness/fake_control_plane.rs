//! A control plane under the test's control: it sends exactly the responses
//! the test gives it (valid or not) over real delta ADS, and hands the test
//! every request the node agent sends back (ACKs, NACKs).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::harness::netns::Netns;

type Scripted = mpsc::UnboundedReceiver<Result<DeltaDiscoveryResponse, Status>>;

struct Service {
    responses: Mutex<Option<Scripted>>,
    requests: Mutex<std_mpsc::Sender<DeltaDiscoveryRequest>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("delta only"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let Some(responses) = self.responses.lock().map_err(|_| Status::internal("poisoned"))?.take() else {
            return Err(Status::unavailable("the fake serves one stream"));
        };
        let mut inbound = request.into_inner();
        let requests = self.requests.lock().map_err(|_| Status::internal("poisoned"))?.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = inbound.next().await {
                if requests.send(req).is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(responses))))
    }
}

pub struct FakeControlPlane {
    _runtime: tokio::runtime::Runtime,
    responses: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, Status>>,
    requests: std_mpsc::Receiver<DeltaDiscoveryRequest>,
}

impl FakeControlPlane {
    /// Serves on `addr` inside `ns`.
    pub fn start(ns: &Netns, addr: SocketAddr) -> FakeControlPlane {
        let listener = ns.run_in(move || {
            let l = std::net::TcpListener::bind(addr).expect("bind fake control plane");
            l.set_nonblocking(true).expect("nonblocking");
            l
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (responses, scripted) = mpsc::unbounded_channel();
        let (req_tx, requests) = std_mpsc::channel();
        let service = AggregatedDiscoveryServiceServer::from_arc(Arc::new(Service {
            responses: Mutex::new(Some(scripted)),
            requests: Mutex::new(req_tx),
        }));
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        FakeControlPlane { _runtime: runtime, responses, requests }
    }

    pub fn send(&self, response: DeltaDiscoveryResponse) {
        self.responses.send(Ok(response)).expect("stream open");
    }

    /// The next request of `type_url` from the node (others are skipped).
    pub fn next_request(&self, type_url: &str) -> DeltaDiscoveryRequest {
        loop {
            let req =
                self.requests.recv_timeout(Duration::from_secs(30)).expect("a request from the node agent");
            if req.type_url == type_url {
                return req;
            }
        }
    }
}

/// A response carrying `views` as ServiceView resources.
pub fn service_views(nonce: &str, views: &[kpx_proto::pb::ServiceView]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: kpx_proto::SERVICE_VIEW_TYPE_URL.into(),
        nonce: nonce.into(),
        resources: views
            .iter()
            .map(|v| {
                let body = v.encode_to_vec();
                Resource {
                    name: format!("{}/{}/{}", v.cluster, v.namespace, v.name),
                    version: kpx_proto::version::content_version(&body),
                    resource: Some(Any { type_url: kpx_proto::SERVICE_VIEW_TYPE_URL.into(), value: body }),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}
