//! Faults under continuous traffic over real processes (`kpx_e2e::fault_scenarios`),
//! on nftables and iptables-nft here; the IPVS suite runs them in its VM.

macro_rules! on_backends {
    ($($name:ident),*) => {
        mod nftables {
            $(#[test] fn $name() { kpx_e2e::fault_scenarios::$name(kpx_e2e::topology::ProxyBackend::Nftables); })*
        }
        mod iptables {
            $(#[test] fn $name() { kpx_e2e::fault_scenarios::$name(kpx_e2e::topology::ProxyBackend::Iptables); })*
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

/// A node that stops reading its stream (its HTTP/2 window full, the control plane's
/// response waiting in HTTP/2) is disconnected once `--ack-timeout` passes without an
/// ACK: the connection is closed, so what it held is freed and the node, if alive,
/// connects again. A bare HTTP/2 client, which answers PINGs (keepalive alone would never
/// close it) but never reads the response.
#[test]
fn a_node_that_stops_reading_its_stream_is_disconnected_after_the_ack_timeout() {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use prost::Message;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().expect("temp dir");
    // Enough Services that the first response is far beyond the client's 1 KiB window.
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
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
    };
    let (port, metrics_port) = (free_port(), free_port());
    let ack_timeout = Duration::from_secs(3);
    let mut command = std::process::Command::new(kpx_e2e::process::binary("kpx-controlplane"));
    command
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
        .arg(format!("--ack-timeout={}s", ack_timeout.as_secs()))
        .arg(format!("--source=file:{}", dir.path().display()))
        .args(["--log-format", "json"]);
    let cp =
        kpx_e2e::process::KpxProcess::start_command(command, "kpx-controlplane", dir.path().join("cp.log"));
    cp.wait_event("its first snapshot", kpx_e2e::DEADLINE, |e| e["message"] == "snapshot published");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (waited, ended) = runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        let (client, connection) =
            h2::client::Builder::new().initial_window_size(1024).handshake::<_, bytes::Bytes>(tcp).await.expect("HTTP/2 handshake");
        let connection = tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        let request = http::Request::post(format!(
            "http://127.0.0.1:{port}/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
        let (response, mut body) = client.send_request(request, false).expect("stream opened");
        let subscribe = DeltaDiscoveryRequest {
            node: Some(Node { id: "stuck-node".into(), ..Default::default() }),
            type_url: kpx_proto::SERVICE_VIEW_TYPE_URL.into(),
            ..Default::default()
        };
        let message = subscribe.encode_to_vec();
        let mut frame = vec![0u8];
        frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        frame.extend_from_slice(&message);
        let subscribed = Instant::now();
        body.send_data(frame.into(), false).expect("subscribe sent");
        let response = response.await.expect("response headers");
        assert_eq!(response.status(), 200);
        // The response body is held, never read: the window stays full.
        let _unread = response.into_body();
        let ended = tokio::time::timeout(ack_timeout + Duration::from_secs(30), connection).await;
        (subscribed.elapsed(), ended)
    });
    assert!(
        ended.is_ok(),
        "the connection is still open {waited:?} after the subscription:\n{}",
        cp.log_text()
    );
    assert!(waited >= ack_timeout, "closed after {waited:?}, before the ACK timeout");
    assert!(cp.log_text().contains("its connection closed"), "{}", cp.log_text());
}
