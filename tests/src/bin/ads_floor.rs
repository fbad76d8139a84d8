//! `ads_floor`: the fan-out benchmark's floor. A delta ADS server with the control plane's
//! transport (tonic over hyper and h2, the same HTTP/2 keepalive, jemalloc with the same
//! options, one task per stream feeding the response body through a channel, codec
//! buffers as small as the control plane's) and none of
//! its work: no sources, views, snapshots, per-node state or registry. To each stream it
//! sends one response of one resource named as the benchmark's Service 0 when the stream
//! opens and again whenever a file in `--watch DIR` changes (polled every 250 ms, as the
//! control plane's folder source is), and it reads and drops every request. What the
//! benchmark measures of it (CPU per change, RSS per stream, the change's spread over the
//! nodes) is what the transport alone costs on this machine.
//!
//! `ads_floor --listen ADDR --watch DIR [--resource-bytes N]`

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The control plane's jemalloc options.
#[export_name = "_rjem_malloc_conf"]
#[used]
static JEMALLOC_OPTIONS: &[u8; 60] = kpx_controlplane::memory::JEMALLOC_OPTIONS;

/// The resource name the benchmark's nodes look for (its Service 0).
const SERVICE0: &str = "default/bench/svc-0";

struct Args {
    listen: SocketAddr,
    watch: PathBuf,
    resource_bytes: usize,
}

fn parse_args() -> Result<Args, String> {
    let (mut listen, mut watch, mut resource_bytes) = (None, None, 512);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = Some(value()?.parse().map_err(|e| format!("--listen: {e}"))?),
            "--watch" => watch = Some(PathBuf::from(value()?)),
            "--resource-bytes" => {
                resource_bytes = value()?.parse().map_err(|e| format!("--resource-bytes: {e}"))?
            }
            other => {
                return Err(format!("unknown flag {other} (--listen ADDR --watch DIR --resource-bytes N)"))
            }
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen is required")?,
        watch: watch.ok_or("--watch is required")?,
        resource_bytes,
    })
}

/// The newest modification time of the files in `dir`.
fn newest_change(dir: &Path) -> Option<SystemTime> {
    std::fs::read_dir(dir).ok()?.filter_map(|entry| entry.ok()?.metadata().ok()?.modified().ok()).max()
}

#[derive(Clone)]
struct Floor {
    /// Bumped on every change of the watched folder.
    changes: watch::Receiver<u64>,
    resource_bytes: usize,
}

impl Floor {
    fn response(&self, type_url: &str, generation: u64) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            resources: vec![Resource {
                name: SERVICE0.to_owned(),
                version: generation.to_string(),
                resource: Some(envoy_types::pb::google::protobuf::Any {
                    type_url: type_url.to_owned(),
                    value: vec![0x5a; self.resource_bytes],
                }),
                ..Default::default()
            }],
            type_url: type_url.to_owned(),
            nonce: generation.to_string(),
            system_version_info: generation.to_string(),
            ..Default::default()
        }
    }
}

/// tonic's Prost codec with the control plane's small buffers (its responses here are one
/// resource): tonic's default of 8 KiB each way per stream would count in the floor's
/// memory and not in kpx's.
#[derive(Clone, Copy, Default)]
struct SmallBuffers;

impl tonic::codec::Codec for SmallBuffers {
    type Encode = DeltaDiscoveryResponse;
    type Decode = DeltaDiscoveryRequest;
    type Encoder = <tonic_prost::ProstCodec<DeltaDiscoveryResponse, DeltaDiscoveryRequest> as tonic::codec::Codec>::Encoder;
    type Decoder = <tonic_prost::ProstCodec<DeltaDiscoveryResponse, DeltaDiscoveryRequest> as tonic::codec::Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::raw_encoder(
            kpx_controlplane::xds::transport::buffers(),
        )
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::raw_decoder(
            kpx_controlplane::xds::transport::buffers(),
        )
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

impl tonic::server::StreamingService<DeltaDiscoveryRequest> for Floor {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = Responses;
    type Future = tonic::codegen::BoxFuture<Response<Responses>, Status>;

    fn call(&mut self, request: Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let floor = self.clone();
        let mut changes = self.changes.clone();
        tokio::spawn(async move {
            let Some(Ok(first)) = inbound.next().await else { return };
            let type_url = first.type_url;
            let mut generation = *changes.borrow_and_update();
            if tx.send(Ok(floor.response(&type_url, generation))).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    request = inbound.next() => match request {
                        Some(Ok(_ack)) => {}
                        _ => return,
                    },
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        generation = *changes.borrow_and_update();
                        if tx.send(Ok(floor.response(&type_url, generation))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let responses: Responses = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Box::pin(async move { Ok(Response::new(responses)) })
    }
}

/// The ADS service of the floor: delta ADS only, through [`SmallBuffers`].
#[derive(Clone)]
struct FloorService(Floor);

impl tonic::server::NamedService for FloorService {
    const NAME: &'static str = kpx_proto::grpc::ADS;
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for FloorService {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let floor = self.0.clone();
        Box::pin(async move {
            if request.uri().path() != DELTA_ADS_PATH {
                return Ok(Status::unimplemented("delta ADS only").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(SmallBuffers).max_decoding_message_size(4 << 20);
            Ok(grpc.streaming(floor, request).await)
        })
    }
}

const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

fn main() -> anyhow::Result<()> {
    let args = parse_args().map_err(|e| anyhow::anyhow!("ads_floor: {e}"))?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let (bump, changes) = watch::channel(0u64);
        let dir = args.watch.clone();
        tokio::spawn(async move {
            let mut seen = newest_change(&dir);
            let mut ticks = tokio::time::interval(Duration::from_millis(250));
            loop {
                ticks.tick().await;
                let now = newest_change(&dir);
                if now != seen {
                    seen = now;
                    bump.send_modify(|g| *g += 1);
                }
            }
        });
        let floor = Floor { changes, resource_bytes: args.resource_bytes };
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        println!("ads_floor serving on {}", args.listen);
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(kpx_controlplane::xds::transport::KEEPALIVE))
            .http2_keepalive_timeout(Some(kpx_controlplane::xds::transport::KEEPALIVE))
            .add_service(FloorService(floor))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await?;
        Ok(())
    })
}
