//! The delta ADS client: subscribes to kpx's resource types with the versions
//! the node already has, applies each response through the [`Agent`], and
//! ACKs or NACKs it. Reconnects with exponential backoff and jitter.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::agent::{Agent, SharedAgent};
use crate::connection::ControlPlane;
use crate::home::{ApiAccess, Home};
use crate::state::RawResource;
use kpx_proto::ResourceType;

const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// gRPC status code INVALID_ARGUMENT, carried in NACKs.
const INVALID_ARGUMENT: i32 = 3;

/// Runs forever: connect, stream, and on any failure back off and resume, with the next
/// of `control_planes` (replicas serve the same versions, so a node resumes on any of
/// them without anything resent).
/// At least `min_sync_period` passes between two applies: a delta that comes sooner
/// waits, and the control plane (which sends nothing new before the ACK) coalesces
/// changes meanwhile.
/// Each is reached as [`Home::dial`] finds it: never only through the Services kpx programs.
pub async fn run(
    control_planes: Vec<ControlPlane>,
    api: ApiAccess,
    agent: SharedAgent,
    min_sync_period: Duration,
) {
    let mut backoff = INITIAL_BACKOFF;
    let mut homes: Vec<Home> = control_planes.into_iter().map(Home::new).collect();
    for i in (0..homes.len()).cycle() {
        let home = &mut homes[i];
        let url = home.control_plane().url.clone();
        let url = url.as_str();
        let streamed = match home.dial(&agent, &api).await {
            Ok((channel, via)) => {
                stream_once(home.control_plane(), channel, via, &agent, min_sync_period).await
            }
            Err(error) => {
                Err(StreamEnd { error: error.context("connect"), established: false, local_failure: false })
            }
        };
        match streamed {
            Ok(()) => {
                tracing::warn!(control_plane = url, "control plane closed the stream");
                agent.lock().set_connected(false, Some("control plane closed the stream".into()));
                backoff = INITIAL_BACKOFF;
            }
            Err(StreamEnd { error, established, local_failure }) => {
                if established {
                    backoff = INITIAL_BACKOFF;
                }
                agent.lock().set_connected(false, Some(format!("{error:#}")));
                if local_failure {
                    tracing::warn!(control_plane = url, error = %error, retry_in_ms = backoff.as_millis() as u64, "resuming the stream to be sent the change again; rules stay as they are");
                } else {
                    tracing::warn!(control_plane = url, error = %error, retry_in_ms = backoff.as_millis() as u64, "control plane unreachable; rules stay as they are");
                }
            }
        }
        let jitter = rand::rng().random_range(0.5..1.5);
        tokio::time::sleep(backoff.mul_f64(jitter)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

struct StreamEnd {
    error: anyhow::Error,
    established: bool,
    /// Ended by this node, to be sent again a change it could not take.
    local_failure: bool,
}

/// What the node tells the control plane besides its name: its `--service-proxy-name`.
fn metadata(agent: &Agent) -> Option<Struct> {
    let name = agent.service_proxy_name()?;
    let value = Value { kind: Some(Kind::StringValue(name.to_owned())) };
    Some(Struct { fields: [(kpx_proto::SERVICE_PROXY_NAME_KEY.to_owned(), value)].into_iter().collect() })
}

fn subscription(agent: &Agent, ty: ResourceType) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(Node {
            id: agent.node_name().to_owned(),
            metadata: metadata(agent),
            ..Default::default()
        }),
        type_url: ty.type_url().to_owned(),
        initial_resource_versions: agent.state().versions(ty).into_iter().collect(),
        ..Default::default()
    }
}

/// A node recovering from a damaged store takes the control plane's state as whole once
/// the stream has been quiet this long after its last response (a control plane answers
/// each ACK with the next part of an initial sync at once).
const RECOVERY_QUIET: Duration = Duration::from_secs(2);

async fn stream_once(
    control_plane: &ControlPlane,
    channel: tonic::transport::Channel,
    via: Option<std::net::SocketAddr>,
    agent: &SharedAgent,
    min_sync_period: Duration,
) -> Result<(), StreamEnd> {
    let fail =
        |established: bool| move |e: anyhow::Error| StreamEnd { error: e, established, local_failure: false };
    let mut client = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(256 << 20);
    let (tx, rx) = mpsc::channel(16);
    for ty in ResourceType::ALL {
        let request = subscription(&agent.lock(), ty);
        tx.send(request).await.map_err(|_| fail(false)(anyhow::anyhow!("request channel closed")))?;
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(bearer) = control_plane.bearer().map_err(|e| fail(false)(e.into()))? {
        let value = bearer
            .parse()
            .map_err(|_| fail(false)(anyhow::anyhow!("the token is not a valid header value")))?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut inbound = client
        .delta_aggregated_resources(request)
        .await
        .map_err(|e| {
            fail(false)(anyhow::anyhow!("open stream: {}", status_text(&e, control_plane.tls.is_some())))
        })?
        .into_inner();
    let services = {
        let mut agent = agent.lock();
        agent.set_connected(true, None);
        agent.state().services.len()
    };
    tracing::info!(
        control_plane = control_plane.url,
        address = via.map(|a| a.to_string()),
        services,
        "stream open; resuming with the versions this node has"
    );
    let mut last_apply = tokio::time::Instant::now() - min_sync_period;
    let mut last_response = tokio::time::Instant::now();
    loop {
        let recovering = agent.lock().recovering();
        let message = tokio::select! {
            message = inbound.message() => message,
            _ = tokio::time::sleep_until(last_response + RECOVERY_QUIET), if recovering => {
                tokio::task::block_in_place(|| agent.lock().finish_recovery());
                continue;
            }
        };
        let response = match message {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(status) => {
                // A refusal of who this node is will not change by retrying at once.
                let refused =
                    matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::Unauthenticated);
                let error = anyhow::anyhow!("stream: {}", status_text(&status, control_plane.tls.is_some()));
                return Err(fail(!refused)(error));
            }
        };
        if let Some(wait) = min_sync_period.checked_sub(last_apply.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let (reply, local_failure) = tokio::task::block_in_place(|| handle(&mut agent.lock(), response));
        last_apply = tokio::time::Instant::now();
        last_response = last_apply;
        tx.send(reply).await.map_err(|_| fail(true)(anyhow::anyhow!("request channel closed")))?;
        if let Some(failure) = local_failure {
            // Half-close so the NACK reaches the control plane, let it end the stream,
            // and resume (with backoff) from the versions the node holds.
            drop(tx);
            let drain = async { while let Ok(Some(_)) = inbound.message().await {} };
            let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
            return Err(StreamEnd {
                error: anyhow::anyhow!("this node could not take a change: {failure}"),
                established: false,
                local_failure: true,
            });
        }
    }
}

/// A gRPC status code as operators read it in logs.
fn code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

/// A status as the agent logs it: its code, message and causes, and what they likely mean.
fn status_text(status: &tonic::Status, tls: bool) -> String {
    let mut text = format!("{}: {}", code_name(status.code()), status.message());
    if let Some(source) = std::error::Error::source(status) {
        let below = kpx_proto::cli::causes(source);
        if below.starts_with(status.message()) {
            text = format!("{}: {below}", code_name(status.code()));
        } else if !text.contains(&below) {
            text.push_str(": ");
            text.push_str(&below);
        }
    }
    if let Some(hint) = hint(&text, tls) {
        text.push_str(" (");
        text.push_str(hint);
        text.push(')');
    }
    text
}

/// What a transport failure most likely means, for the operator reading the log.
fn hint(text: &str, tls: bool) -> Option<&'static str> {
    if text.contains("UnknownCA") || text.contains("BadCertificate") {
        return Some(
            "the control plane does not trust this node's certificate: is it signed by its --tls-client-ca?",
        );
    }
    if text.contains("UnknownIssuer") || text.contains("NotValidForName") {
        return Some(
            "this node does not trust the control plane's certificate: check --tls-ca and the URL's host",
        );
    }
    // How a connection that the other end closed reads, at whichever layer noticed: a
    // close before HTTP/2's handshake finished reads "connection was not ready".
    let closed = ["connection closed", "connection was not ready", "broken pipe", "reset by peer"]
        .iter()
        .any(|t| text.contains(t));
    if !tls && (closed || ["FRAME_SIZE_ERROR", "frame with invalid size"].iter().any(|t| text.contains(t))) {
        return Some("does the control plane speak TLS? then use https:// with --tls-ca");
    }
    if tls
        && (closed
            || ["CertificateExpired", "InvalidContentType", "CorruptMessage"]
                .iter()
                .any(|t| text.contains(t)))
    {
        return Some("the TLS connection was closed: the control plane's log says why (a certificate out of date, or of another CA?); or it does not speak TLS");
    }
    None
}

/// Applies one response and builds its ACK or NACK.
/// Applies one response; the ACK or NACK to send, and, for a NACK of a local failure
/// (the kernel or the disk refused), the failure: the stream is then resumed, so the
/// control plane (which never resends what a node refused) sends the change again.
fn handle(agent: &mut Agent, response: DeltaDiscoveryResponse) -> (DeltaDiscoveryRequest, Option<String>) {
    let type_url = response.type_url.clone();
    let resources = response
        .resources
        .into_iter()
        .map(|r| {
            let (type_url, body) = r.resource.map(|a| (a.type_url, a.value)).unwrap_or_default();
            RawResource { name: r.name, version: r.version, type_url, body }
        })
        .collect();
    let mut reply = DeltaDiscoveryRequest {
        type_url: type_url.clone(),
        response_nonce: response.nonce.clone(),
        ..Default::default()
    };
    let mut local_failure = None;
    match agent.apply(&type_url, resources, response.removed_resources) {
        Ok(applied) => {
            tracing::info!(
                type_url,
                nonce = response.nonce,
                resources = applied.resources,
                removed = applied.removed,
                kernel_us = applied.to_kernel.as_micros() as u64,
                elapsed_us = applied.elapsed.as_micros() as u64,
                "delta applied"
            );
        }
        Err(e) => {
            tracing::error!(type_url, nonce = response.nonce, error = %e, "delta refused (NACK); keeping the last good state");
            reply.error_detail =
                Some(RpcStatus { code: INVALID_ARGUMENT, message: e.to_string(), details: vec![] });
            if e.is_local() {
                local_failure = Some(e.to_string());
            }
        }
    }
    (reply, local_failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::service;
    use crate::backend::nftables::NftablesBackend;
    use crate::exec::fake::{FakeConntrack, FakeNft};
    use crate::store::Store;
    use envoy_types::pb::envoy::service::discovery::v3::Resource;
    use envoy_types::pb::google::protobuf::Any;

    fn agent(dir: &std::path::Path) -> Agent {
        let backend = Box::new(NftablesBackend::new(Box::new(FakeNft::new())));
        let store = Store::open(dir).expect("store");
        Agent::start(
            "n1".into(),
            Default::default(),
            backend,
            store,
            std::sync::Arc::new(FakeConntrack::new()),
            "cp".into(),
        )
        .expect("start")
    }

    fn response(nonce: &str, body: Vec<u8>, name: &str) -> DeltaDiscoveryResponse {
        let type_url = ResourceType::ServiceView.type_url().to_owned();
        DeltaDiscoveryResponse {
            type_url: type_url.clone(),
            nonce: nonce.into(),
            resources: vec![Resource {
                name: name.into(),
                version: "v1".into(),
                resource: Some(Any { type_url, value: body }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_response_is_acked_with_its_nonce_or_nacked_with_the_reason() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut agent = agent(dir.path());
        let view = service("web", "10.96.0.10", &["10.244.0.1"]);
        let (ack, _) = handle(&mut agent, response("n-1", view.encode(), &view.resource_name()));
        assert_eq!(
            (ack.response_nonce.as_str(), ack.type_url.as_str()),
            ("n-1", ResourceType::ServiceView.type_url())
        );
        assert!(ack.error_detail.is_none(), "{ack:?}");
        let (nack, local) = handle(&mut agent, response("n-2", vec![0xff, 0xff], "c/ns/broken"));
        assert_eq!(local, None, "an invalid resource is not retried");
        assert_eq!(nack.response_nonce, "n-2");
        let status = nack.error_detail.expect("NACK");
        assert_eq!(status.code, INVALID_ARGUMENT);
        assert!(status.message.contains("c/ns/broken"), "{}", status.message);
        assert_eq!(agent.state().services.len(), 1, "the last good state stays");

        let subscribe = subscription(&agent, ResourceType::ServiceView);
        assert_eq!(subscribe.node.map(|n| n.id).as_deref(), Some("n1"));
        assert_eq!(subscribe.initial_resource_versions.get("c/ns/web").map(String::as_str), Some("v1"));
        assert!(subscription(&agent, ResourceType::NodeConfig).initial_resource_versions.is_empty());
    }

    /// The texts a plaintext agent read when it dialled a TLS control plane, each seen
    /// in a run of the trust scenario: which one comes depends on when the server's
    /// close lands in HTTP/2's handshake.
    #[test]
    fn a_plaintext_agent_refused_by_a_tls_control_plane_is_told_about_tls() {
        for seen in [
            "Cancelled: operation was canceled: transport error: operation was canceled: connection was not ready",
            "Internal: h2 protocol error: http2 error: transport error: http2 error: connection error detected: frame with invalid size",
            "Unknown: transport error: connection closed",
        ] {
            assert!(hint(seen, false).is_some_and(|h| h.contains("TLS")), "{seen}");
        }
        assert_eq!(hint("Unavailable: tcp connect error: Connection refused (os error 111)", false), None);
    }
}
