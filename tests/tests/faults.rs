//! Faults under continuous traffic over real processes (`kpx_e2e::scenarios::faults`),
//! on nftables and iptables-nft here; the IPVS suite runs them in its VM.

macro_rules! on_backends {
    ($($name:ident),*) => {
        mod nftables {
            $(#[test] fn $name() { kpx_e2e::scenarios::faults::$name(kpx_e2e::harness::topology::ProxyBackend::Nftables); })*
        }
        mod iptables {
            $(#[test] fn $name() { kpx_e2e::scenarios::faults::$name(kpx_e2e::harness::topology::ProxyBackend::Iptables); })*
        }
    };
}

on_backends!(
    control_plane_crash_and_a_change_while_it_is_down,
    a_second_replica_takes_over,
    a_cut_link_is_noticed_by_keepalive_and_the_stream_resumes,
    a_stalled_control_plane_is_noticed_and_another_replica_followed,
    the_agent_killed_during_a_10k_service_apply,
    a_full_state_filesystem_nacks_and_recovers
);

/// `kpx-controlplane` with `--ack-timeout` and 600 Services (a first response far beyond
/// a 1 KiB window), and a bare HTTP/2 client of its ADS: no kpx agent, so that the test
/// decides what the node reads and answers.
struct AckTimeoutBench {
    cp: kpx_e2e::harness::process::KpxProcess,
    port: u16,
    ack_timeout: std::time::Duration,
    _dir: tempfile::TempDir,
}

impl AckTimeoutBench {
    fn start(ack_timeout: std::time::Duration) -> AckTimeoutBench {
        let dir = tempfile::tempdir().expect("temp dir");
        let services: String = (0..600)
            .map(|i| {
                format!(
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: test}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}\n---\n",
                    i / 200,
                    i % 200 + 1
                )
            })
            .collect();
        std::fs::write(dir.path().join("services.yaml"), services).expect("manifest");
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        };
        let (port, metrics_port) = (free_port(), free_port());
        let mut command = std::process::Command::new(kpx_e2e::harness::process::binary("kpx-controlplane"));
        command
            .arg(format!("--listen=127.0.0.1:{port}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .arg(format!("--ack-timeout={}s", ack_timeout.as_secs()))
            .arg(format!("--source=file:{}", dir.path().display()))
            .args(["--log-format", "json"]);
        let cp = kpx_e2e::harness::process::KpxProcess::start_command(
            command,
            "kpx-controlplane",
            dir.path().join("cp.log"),
        );
        cp.wait_event("its first snapshot", kpx_e2e::DEADLINE, |e| e["message"] == "snapshot published");
        AckTimeoutBench { cp, port, ack_timeout, _dir: dir }
    }

    /// Opens a connection with this receive window and subscribes `node` to Service views
    /// (the response's headers checked).
    async fn subscribe(&self, node: &str, window: u32) -> BareStream {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.expect("connect");
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(window)
            .handshake::<_, bytes::Bytes>(tcp)
            .await
            .expect("HTTP/2 handshake");
        let connection = tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        let (response, mut requests) =
            client.send_request(Self::ads_request(self.port), false).expect("stream opened");
        BareStream::send(&mut requests, node);
        let response = response.await.expect("response headers");
        assert_eq!(response.status(), 200);
        BareStream { client, connection, requests, responses: response.into_body() }
    }

    fn ads_request(port: u16) -> http::Request<()> {
        http::Request::post(format!(
            "http://127.0.0.1:{port}/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
    }
}

/// One ADS stream of a bare HTTP/2 client: its connection's client and task, the request
/// body (kept open, as a node's is) and the response body.
struct BareStream {
    client: h2::client::SendRequest<bytes::Bytes>,
    connection: tokio::task::JoinHandle<Result<(), h2::Error>>,
    requests: h2::SendStream<bytes::Bytes>,
    responses: h2::RecvStream,
}

impl BareStream {
    /// Sends a request of `node` for Service views, as one gRPC message.
    fn send(requests: &mut h2::SendStream<bytes::Bytes>, node: &str) {
        use envoy_types::pb::envoy::config::core::v3::Node;
        use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
        use prost::Message;

        let request = DeltaDiscoveryRequest {
            node: Some(Node { id: node.into(), ..Default::default() }),
            type_url: kpx_proto::SERVICE_VIEW_TYPE_URL.into(),
            ..Default::default()
        };
        let message = request.encode_to_vec();
        let mut frame = vec![0u8];
        frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        frame.extend_from_slice(&message);
        requests.send_data(frame.into(), false).expect("request sent");
    }
}

/// A node that stops reading its stream (its HTTP/2 window full, the control plane's
/// response waiting in HTTP/2) is disconnected once `--ack-timeout` passes without an
/// ACK and the status cannot reach it: the connection is closed, so what it held is freed
/// and the node, if alive, connects again. A bare HTTP/2 client, which answers PINGs
/// (keepalive alone would never close it) but never reads the response.
#[test]
fn a_node_that_stops_reading_its_stream_is_disconnected_after_the_ack_timeout() {
    use std::time::{Duration, Instant};

    let bench = AckTimeoutBench::start(Duration::from_secs(3));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (waited, ended) = runtime.block_on(async {
        let subscribed = Instant::now();
        // The response body is held, never read: the window stays full.
        let stream = bench.subscribe("stuck-node", 1024).await;
        let ended =
            tokio::time::timeout(bench.ack_timeout + Duration::from_secs(30), stream.connection).await;
        (subscribed.elapsed(), ended)
    });
    let log = bench.cp.log_text();
    assert!(ended.is_ok(), "the connection is still open {waited:?} after the subscription:\n{log}");
    assert!(waited >= bench.ack_timeout, "closed after {waited:?}, before the ACK timeout");
    assert!(log.contains("its connection closed"), "{log}");
}

/// A node that reads its stream but never ACKs gets the gRPC status DEADLINE_EXCEEDED
/// once `--ack-timeout` passes, and keeps its connection: a new stream opens on it after
/// the control plane's grace for the status has passed.
#[test]
fn a_node_that_reads_but_never_acks_gets_deadline_exceeded_and_keeps_its_connection() {
    use std::time::{Duration, Instant};

    let bench = AckTimeoutBench::start(Duration::from_secs(3));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (waited, status, read, mut stream) = runtime.block_on(async {
        let subscribed = Instant::now();
        let mut stream = bench.subscribe("reading-node", 1024).await;
        let body = &mut stream.responses;
        // Read (and give the window back) every byte; answer nothing.
        let mut read = 0;
        let limit = bench.ack_timeout + Duration::from_secs(30);
        while let Some(data) = tokio::time::timeout(limit, body.data()).await.expect("the body ends in time")
        {
            let data = data.expect("data");
            read += data.len();
            body.flow_control().release_capacity(data.len()).expect("window given back");
        }
        let trailers = tokio::time::timeout(limit, body.trailers()).await.expect("trailers in time");
        let status = trailers.expect("trailers").and_then(|t| {
            Some((
                t.get("grpc-status")?.to_str().ok()?.to_owned(),
                t.get("grpc-message")?.to_str().ok()?.to_owned(),
            ))
        });
        (subscribed.elapsed(), status, read, stream)
    });
    let log = bench.cp.log_text();
    assert!(read > 1024, "the node read only {read} bytes");
    let (code, message) = status.unwrap_or_else(|| panic!("no grpc-status in the trailers:\n{log}"));
    assert_eq!(code, "4", "DEADLINE_EXCEEDED ({message}):\n{log}");
    // grpc-message is percent-encoded.
    assert!(message.replace("%20", " ").contains("no ACK or NACK within 3 s"), "{message}");
    assert!(waited >= bench.ack_timeout, "ended after {waited:?}, before the ACK timeout");
    // Past the grace the control plane gives a status to be written, the connection is
    // still there and takes a new stream.
    runtime.block_on(async {
        let still_open = tokio::time::timeout(Duration::from_secs(8), &mut stream.connection).await;
        assert!(still_open.is_err(), "the connection ended: {still_open:?}\n{}", bench.cp.log_text());
        let mut client = stream.client.clone().ready().await.expect("the connection takes a new stream");
        let (response, _body) =
            client.send_request(AckTimeoutBench::ads_request(bench.port), false).expect("stream opened");
        let response = tokio::time::timeout(Duration::from_secs(30), response).await.expect("in time");
        assert_eq!(response.expect("response headers").status(), 200);
    });
    assert!(!bench.cp.log_text().contains("its connection closed"), "{}", bench.cp.log_text());
}

/// A stream that ends with a status its node does not take closes the node's connection
/// after the control plane's grace, whatever the status: here a protocol error (node.id
/// changed on one stream) sent by a node that has stopped reading, long before its
/// `--ack-timeout`. (A connection left open would hold the stream's task and memory for
/// good: the node still answers keepalive PINGs.)
#[test]
fn a_status_its_node_does_not_take_closes_the_connection_whatever_ended_the_stream() {
    use std::time::{Duration, Instant};

    let bench = AckTimeoutBench::start(Duration::from_secs(600));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (waited, ended) = runtime.block_on(async {
        // The response body is held, never read: the window stays full.
        let mut stream = bench.subscribe("first-name", 1024).await;
        let changed = Instant::now();
        BareStream::send(&mut stream.requests, "second-name");
        let ended = tokio::time::timeout(Duration::from_secs(60), stream.connection).await;
        (changed.elapsed(), ended)
    });
    let log = bench.cp.log_text();
    assert!(ended.is_ok(), "the connection is still open {waited:?} after the protocol error:\n{log}");
    assert!(log.contains("node.id changed"), "{log}");
    assert!(log.contains("the node did not take the stream's status: its connection closed"), "{log}");
}
