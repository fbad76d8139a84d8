//! Fan-out: simulated nodes, each a real delta ADS stream, against a control plane or
//! the transport floor.

use kpx_proto::sync::Locked as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::measure::*;
use super::workload::*;
use super::*;
use crate::harness::percentile;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use serde_json::json;

/// What one simulated node saw.
#[derive(Default)]
pub struct NodeLog {
    pub synced_at: Option<Instant>,
    /// Bytes of the resources received (what the wire carried, less a few bytes of
    /// framing per response).
    pub bytes: u64,
    /// Responses received until the initial sync was complete.
    pub responses_to_sync: usize,
    /// Arrivals of responses carrying Service 0.
    service0: Vec<Instant>,
}

/// How simulated nodes reach the control plane: plaintext, or mutual TLS with a
/// certificate of their own (`system:node:sim-N`).
#[derive(Clone)]
pub enum Transport {
    Plain,
    Tls { ca: tonic::transport::Certificate, identities: Arc<Vec<tonic::transport::Identity>> },
}

/// How a simulated node treats its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// ACKs each response at once.
    Fast,
    /// Waits 2 s before each ACK.
    Slow,
    /// Opens its stream and never reads it (nor ACKs).
    Stuck,
}

/// Which kind node `i` is: every `100 / stuck_percent`-th is stuck, every
/// `100 / slow_percent`-th of the others slow.
pub fn node_kind(i: usize, slow_percent: usize, stuck_percent: usize) -> NodeKind {
    let every = |percent: usize| 100usize.checked_div(percent).map(|n| n.max(1));
    if every(stuck_percent).is_some_and(|n| i % n == n / 2) {
        NodeKind::Stuck
    } else if every(slow_percent).is_some_and(|n| i % n == n - 1) {
        NodeKind::Slow
    } else {
        NodeKind::Fast
    }
}

pub async fn simulated_node(
    addr: String,
    transport: Transport,
    id: usize,
    services: usize,
    kind: NodeKind,
    log: Arc<Mutex<NodeLog>>,
    started: Arc<AtomicUsize>,
) {
    // A node that cannot connect or open its stream (an overloaded accept queue) tries again.
    for attempt in 0..10u64 {
        match open_stream(&addr, &transport, id).await {
            Ok((tx, inbound)) if kind == NodeKind::Stuck => {
                started.fetch_add(1, Ordering::Relaxed);
                // Holds both ends and reads nothing, until the benchmark ends.
                let _held = (tx, inbound);
                return std::future::pending().await;
            }
            Ok((tx, inbound)) => {
                return run_node(tx, inbound, services, kind == NodeKind::Slow, log, started).await
            }
            Err(_) if attempt < 9 => tokio::time::sleep(Duration::from_millis(200 * (attempt + 1))).await,
            Err(e) => eprintln!("node {id}: giving up: {e}"),
        }
    }
}

pub type Outbound = tokio::sync::mpsc::Sender<DeltaDiscoveryRequest>;

pub type Inbound = tonic::Streaming<ResponseFrame>;

/// What a simulated node decodes of a `DeltaDiscoveryResponse`: its nonce and type, and of
/// each resource its size and whether it is Service 0, each let go as soon as it is read
/// (so the receive buffer is reused). A real node decodes every view on a machine of its
/// own; 5,000 simulated nodes decoding every view (or keeping slices of every buffer)
/// would measure the simulator on the control plane's two cores. Every byte still
/// crosses HTTP/2 and is walked.
#[derive(Debug, Default)]
pub struct ResponseFrame {
    pub resources: usize,
    /// Bytes of the resources.
    pub bytes: u64,
    has_service0: bool,
    pub type_url: String,
    pub nonce: String,
}

/// The resource name of Service 0, the one changed.
pub const SERVICE0: &str = "default/bench/svc-0";

impl prost::Message for ResponseFrame {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        prost::encoding::string::encode(4, &self.type_url, buf);
        prost::encoding::string::encode(5, &self.nonce, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            2 => {
                let mut resource = bytes::Bytes::new();
                prost::encoding::bytes::merge(wire_type, &mut resource, buf, ctx)?;
                self.resources += 1;
                self.bytes += resource.len() as u64;
                self.has_service0 |= resource_name(resource) == SERVICE0.as_bytes();
                Ok(())
            }
            4 => prost::encoding::string::merge(wire_type, &mut self.type_url, buf, ctx),
            5 => prost::encoding::string::merge(wire_type, &mut self.nonce, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::encoding::string::encoded_len(4, &self.type_url)
            + prost::encoding::string::encoded_len(5, &self.nonce)
    }

    fn clear(&mut self) {
        *self = ResponseFrame::default();
    }
}

/// The name of an `envoy.service.discovery.v3.Resource`, read in place.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceName {
    #[prost(bytes = "bytes", tag = "3")]
    pub name: bytes::Bytes,
}

pub fn resource_name(resource: bytes::Bytes) -> bytes::Bytes {
    <ResourceName as prost::Message>::decode(resource).map(|r| r.name).unwrap_or_default()
}

pub const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

pub async fn open_stream(
    addr: &str,
    transport: &Transport,
    id: usize,
) -> Result<(Outbound, Inbound), String> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(addr.to_owned())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(60));
    if let Transport::Tls { ca, identities } = transport {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(ca.clone())
            .identity(identities[id].clone());
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    let channel = endpoint.connect().await.map_err(|e| format!("connect: {e}"))?;
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(256 << 20);
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let subscribe = DeltaDiscoveryRequest {
        node: Some(Node { id: format!("sim-{id}"), ..Default::default() }),
        type_url: kpx_proto::SERVICE_VIEW_TYPE_URL.to_owned(),
        ..Default::default()
    };
    tx.send(subscribe).await.map_err(|_| "request channel closed".to_owned())?;
    client.ready().await.map_err(|e| format!("channel: {e}"))?;
    let codec = tonic_prost::ProstCodec::<DeltaDiscoveryRequest, ResponseFrame>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(DELTA_ADS_PATH);
    let request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let inbound = client
        .streaming(request, path, codec)
        .await
        .map_err(|e| format!("stream: {}", e.message()))?
        .into_inner();
    Ok((tx, inbound))
}

pub async fn run_node(
    tx: Outbound,
    mut inbound: Inbound,
    services: usize,
    slow: bool,
    log: Arc<Mutex<NodeLog>>,
    started: Arc<AtomicUsize>,
) {
    started.fetch_add(1, Ordering::Relaxed);
    let mut have = 0usize;
    let mut responses = 0usize;
    while let Ok(Some(response)) = inbound.message().await {
        let now = Instant::now();
        have += response.resources;
        responses += 1;
        {
            let mut log = log.locked();
            log.bytes += response.bytes;
            if have >= services && log.synced_at.is_none() {
                log.synced_at = Some(now);
                log.responses_to_sync = responses;
            }
            if response.has_service0 {
                log.service0.push(now);
            }
        }
        if slow {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let ack = DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return;
        }
    }
}

/// What serves the fan-out's simulated nodes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FanoutServer {
    /// `kpx-controlplane`, plaintext or over mutual TLS.
    Kpx { tls: bool },
    /// `ads_floor`: the same transport and none of the control plane's work (its one
    /// resource is Service 0; every node reads at once).
    Floor,
}

pub fn fanout(a: &Args, server: FanoutServer, out: &mut serde_json::Map<String, serde_json::Value>) {
    let tls = server == FanoutServer::Kpx { tls: true };
    let floor = server == FanoutServer::Floor;
    // The floor has no --ack-timeout to close nodes that never read: none are simulated.
    let (slow_percent, stuck_percent) = if floor { (0, 0) } else { (a.slow_percent, a.stuck_percent) };
    // How many resources make a node's initial sync.
    let synced_with = if floor { 1 } else { a.services };
    if floor {
        println!(
            "\n== fan-out's floor: the same transport alone (ads_floor: one resource per change, no views, snapshots or node state), {} simulated nodes",
            a.nodes
        );
    } else {
        println!(
            "\n== fan-out: {} Services × {} endpoints, {} simulated nodes ({}% slow, {}% never reading){}",
            a.services,
            a.endpoints,
            a.nodes,
            slow_percent,
            stuck_percent,
            if tls { ", mutual TLS" } else { "" }
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (transport, url, tls_args) = if tls {
        let pki = crate::harness::pki::Pki::new(dir.path(), "bench");
        let server = pki.server("server");
        let started = Instant::now();
        let identities: Vec<tonic::transport::Identity> = (0..a.nodes)
            .map(|i| {
                let issued = pki.issue(
                    &format!("sim-{i}"),
                    &format!("system:node:sim-{i}"),
                    &[],
                    &[],
                    crate::harness::pki::Validity::Current,
                );
                let read = |p: &Path| std::fs::read(p).expect("read certificate");
                tonic::transport::Identity::from_pem(read(&issued.cert), read(&issued.key))
            })
            .collect();
        println!("{} node certificates made in {:.1} s", a.nodes, started.elapsed().as_secs_f64());
        let ca = tonic::transport::Certificate::from_pem(std::fs::read(pki.ca()).expect("CA"));
        let args = vec![
            format!("--tls-cert={}", server.cert.display()),
            format!("--tls-key={}", server.key.display()),
            format!("--tls-client-ca={}", pki.ca().display()),
        ];
        (Transport::Tls { ca, identities: Arc::new(identities) }, "https://127.0.0.1:28000", args)
    } else {
        (Transport::Plain, "http://127.0.0.1:28000", Vec::new())
    };
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).expect("dir");
    write_manifests(&manifests, a.services, a.endpoints, 0);
    let program = if floor { "ads_floor" } else { "kpx-controlplane" };
    let cp_bin = crate::harness::process::binary(program);
    let log_path = dir.path().join("cp.log");
    let log = std::fs::File::create(&log_path).expect("log");
    // KPX_BENCH_CP_WRAPPER="heaptrack -o /tmp/cp" runs the control plane under a profiler.
    let wrapper: Vec<String> = std::env::var("KPX_BENCH_CP_WRAPPER")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(&cp_bin);
            c
        }
        None => std::process::Command::new(&cp_bin),
    };
    if floor {
        command.args(["--listen", "127.0.0.1:28000", "--watch"]).arg(&manifests);
    } else {
        command
            .args([
                "--listen",
                "127.0.0.1:28000",
                "--metrics-listen",
                "127.0.0.1:28002",
                "--log-format",
                "json",
            ])
            .arg(format!("--ack-timeout={}s", a.ack_timeout_s))
            .arg(format!("--source=file:{}", manifests.display()))
            .args(&tls_args)
            .env("RUST_LOG", "warn,kpx_controlplane::publisher=info,kpx_controlplane::source::file=info");
    }
    let mut cp = command
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let loaded = Instant::now();
    let ready = if floor { "ads_floor serving" } else { "snapshot published" };
    crate::wait_for("the control plane's first snapshot", Duration::from_secs(600), || {
        if let Ok(Some(status)) = cp.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("{program} exited ({status}) before serving:\n{log}");
        }
        std::fs::read_to_string(&log_path).ok()?.contains(ready).then_some(())
    });
    // The control plane itself, also under a wrapper (whose figures would be its own).
    let pid = crate::harness::process::program_pid(cp.id(), program).unwrap_or(cp.id());
    if floor {
        println!("ads_floor: serving; RSS {} MiB", rss_kib(pid) / 1024);
    } else {
        println!(
            "control plane: read and built {} Services in {:.2} s; RSS {} MiB",
            a.services,
            loaded.elapsed().as_secs_f64(),
            rss_kib(pid) / 1024
        );
    }
    // The baseline once the allocator has given back what loading freed (jemalloc's decay,
    // about a second): pages freed but still resident would otherwise be reused by the
    // first streams and counted as shared state, lowering the figure per stream by a
    // fixed amount divided by the node count.
    let baseline = settled_rss_kib(pid);
    // (The floor serves no metrics: it has no account to read.)
    let heap_baseline = (!floor).then(control_plane_heap_kib);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let logs: Vec<Arc<Mutex<NodeLog>>> = (0..a.nodes).map(|_| Arc::default()).collect();
    let kind = |i: usize| node_kind(i, slow_percent, stuck_percent);
    let is_slow = |i: usize| kind(i) == NodeKind::Slow;
    let reading: Vec<usize> = (0..a.nodes).filter(|&i| kind(i) != NodeKind::Stuck).collect();
    let stuck = a.nodes - reading.len();
    let started = Arc::new(AtomicUsize::new(0));
    let sync_start = Instant::now();
    for (i, log) in logs.iter().enumerate() {
        let fut = simulated_node(
            url.into(),
            transport.clone(),
            i,
            synced_with,
            kind(i),
            Arc::clone(log),
            Arc::clone(&started),
        );
        runtime.spawn(fut);
    }
    let all_synced = crate::wait_for("every reading node's initial sync", Duration::from_secs(1800), || {
        let done = logs.iter().filter(|l| l.lock().map(|l| l.synced_at.is_some()).unwrap_or(false)).count();
        (done == reading.len()).then(|| sync_start.elapsed())
    });
    let synced_after = |i: &usize| logs[*i].lock().ok().and_then(|l| l.synced_at).map(|t| t - sync_start);
    let mut syncs: Vec<Duration> = reading.iter().filter_map(synced_after).collect();
    syncs.sort();
    let fast_synced =
        reading.iter().filter(|&&i| !is_slow(i)).filter_map(synced_after).max().unwrap_or_default();
    let slow_synced = reading.iter().filter(|&&i| is_slow(i)).filter_map(synced_after).max();
    let wire_bytes: u64 = logs.iter().filter_map(|l| l.lock().ok().map(|l| l.bytes)).sum();
    let responses_per_node =
        logs.iter().filter_map(|l| l.lock().ok().map(|l| l.responses_to_sync)).max().unwrap_or(0);
    // Steady state: let the streams finish their walks and the allocator return what it freed.
    std::thread::sleep(Duration::from_secs(12));
    let after = rss_kib(pid);
    let per_stream_kib = (after.saturating_sub(baseline)) as f64 / a.nodes.max(1) as f64;
    let heap_per_stream = heap_baseline.map(|before| {
        let after = control_plane_heap_kib();
        [0, 1, 2].map(|k| (after[k] - before[k]) / a.nodes.max(1) as f64)
    });
    println!(
        "initial sync: every fast node {:.2} s, every node {:.2} s (per node p50 {:.2} s, p99 {:.2} s; a slow node waits 2 s before each ACK of its up to {responses_per_node} responses: {} s by itself); control plane RSS {} MiB, {:.1} KiB per stream beyond the shared state",
        fast_synced.as_secs_f64(),
        all_synced.as_secs_f64(),
        percentile(&syncs, 0.5).as_secs_f64(),
        percentile(&syncs, 0.99).as_secs_f64(),
        2 * responses_per_node,
        after / 1024,
        per_stream_kib
    );
    if let Some([allocated, active, resident]) = heap_per_stream {
        println!(
            "control plane heap per stream, by the allocator: {allocated:.1} KiB allocated, {active:.1} KiB in active pages, {resident:.1} KiB resident"
        );
    }
    println!(
        "bytes on the wire in the initial sync: {:.2} GB to {} nodes, {:.2} MB per node",
        wire_bytes as f64 / 1e9,
        reading.len(),
        wire_bytes as f64 / 1e6 / reading.len().max(1) as f64,
    );
    // Let slow nodes finish their last ACK wait.
    std::thread::sleep(Duration::from_secs(3));
    let mut fast_lat = Vec::new();
    let mut slow_lat = Vec::new();
    let mut detect = Vec::new();
    let mut cpu = Vec::new();
    // Each change's window (manifest written → every node has it) and the idle CPU rate.
    let mut windows = Vec::new();
    let mut idle_rate = Vec::new();
    for change in 1..=a.changes {
        let before: Vec<usize> =
            reading.iter().map(|&i| logs[i].lock().map(|l| l.service0.len()).unwrap_or(0)).collect();
        let cpu_before = cpu_seconds(pid);
        let written = Instant::now();
        write_manifests_one(&manifests, a.endpoints, change);
        let arrivals = crate::wait_for("every node to receive the change", Duration::from_secs(600), || {
            let got: Vec<Option<Instant>> = reading
                .iter()
                .zip(&before)
                .map(|(&i, b)| logs[i].lock().ok().and_then(|l| l.service0.get(*b).copied()))
                .collect();
            got.iter().all(Option::is_some).then(|| got.into_iter().flatten().collect::<Vec<_>>())
        });
        cpu.push(cpu_seconds(pid) - cpu_before);
        windows.push(written.elapsed().as_secs_f64());
        let first = arrivals.iter().min().copied().unwrap_or(written);
        detect.push(first - written);
        for (&i, at) in reading.iter().zip(&arrivals) {
            let spread = *at - first;
            if is_slow(i) {
                slow_lat.push(spread);
            } else {
                fast_lat.push(spread);
            }
        }
        // Between changes: what the control plane spends with nothing to send (keepalive
        // PINGs, the file source's polling), which also runs inside each change's window.
        let (idle_before, idle_from) = (cpu_seconds(pid), Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        idle_rate.push((cpu_seconds(pid) - idle_before) / idle_from.elapsed().as_secs_f64());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let idle_per_s = mean(&idle_rate);
    let cpu_per_change = mean(&cpu);
    let beyond_idle = (cpu_per_change - idle_per_s * mean(&windows)).max(0.0);
    fast_lat.sort();
    slow_lat.sort();
    detect.sort();
    println!(
        "one endpoint change → every fast node has it: p50 {} ms, p99 {} ms, max {} ms after the first node (manifest write → first node: p50 {} ms: file poll + parse + snapshot)",
        ms(percentile(&fast_lat, 0.5)),
        ms(percentile(&fast_lat, 0.99)),
        ms(percentile(&fast_lat, 1.0)),
        ms(percentile(&detect, 0.5)),
    );
    println!(
        "slow nodes (2 s per ACK): p50 {} ms; control plane CPU per change: {cpu_per_change:.3} s in its window of {:.0} ms (manifest written → every node has it), {beyond_idle:.3} s beyond the idle rate ({:.1} ms of CPU per second between changes: keepalive PINGs, the folder's polling)",
        ms(percentile(&slow_lat, 0.5)),
        mean(&windows) * 1000.0,
        idle_per_s * 1000.0,
    );
    // The nodes that never read: closed by the control plane after --ack-timeout, counted.
    let rss_with_stuck = rss_kib(pid);
    let closed = || control_plane_metric("kpx_xds_unresponsive_streams_closed_total") as usize;
    let stuck_closed_after = (stuck > 0).then(|| {
        let limit = Duration::from_secs(a.ack_timeout_s + 600);
        crate::wait_for("the control plane to close the streams that are not read", limit, || {
            (closed() >= stuck).then(|| sync_start.elapsed())
        })
    });
    std::thread::sleep(Duration::from_secs(5));
    let rss_after_stuck = rss_kib(pid);
    if !floor {
        println!(
        "nodes that never read: {stuck} streams, {} closed by the control plane ({}, --ack-timeout {} s); control plane RSS {} MiB with them open, {} MiB after, peak {} MiB",
        closed(),
        stuck_closed_after.map_or_else(|| "none to close".to_owned(), |d| format!("the last {:.1} s after the nodes connected", d.as_secs_f64())),
        a.ack_timeout_s,
        rss_with_stuck / 1024,
        rss_after_stuck / 1024,
        peak_rss_kib(pid) / 1024,
    );
    }
    // Where the control plane's time per change goes, from its own logs: the file source
    // reading the changed file (`manifests read`), the views of what changed and the
    // snapshot (`snapshot published`); the rest of the CPU is the streams and polling.
    let logged = events(&log_path);
    let after_first = |message: &str, field: &str| -> Vec<f64> {
        logged.iter().filter(|e| e["message"] == message).skip(1).filter_map(|e| e[field].as_f64()).collect()
    };
    let mean_ms =
        |us: &[f64]| if us.is_empty() { f64::NAN } else { us.iter().sum::<f64>() / us.len() as f64 / 1000.0 };
    let (read_ms, views_ms, snapshot_ms) = (
        mean_ms(&after_first("manifests read", "elapsed_us")),
        mean_ms(&after_first("snapshot published", "views_us")),
        mean_ms(&after_first("snapshot published", "snapshot_us")),
    );
    if !floor {
        println!(
            "per change inside the control plane: file source {read_ms:.2} ms (the changed file read again), views {views_ms:.2} ms, snapshot {snapshot_ms:.2} ms; the rest of its CPU is the streams (gRPC, HTTP/2) and polling"
        );
    }
    out.insert(
        match server {
            FanoutServer::Kpx { tls: true } => "fanout_tls",
            FanoutServer::Kpx { tls: false } => "fanout",
            FanoutServer::Floor => "fanout_floor",
        }
        .into(),
        json!({
            "services": a.services, "endpoints": a.endpoints, "nodes": a.nodes, "slow_percent": slow_percent,
            "initial_sync_all_s": all_synced.as_secs_f64(),
            "initial_sync_fast_s": fast_synced.as_secs_f64(),
            "initial_sync_slow_s": slow_synced.map(|d| d.as_secs_f64()),
            "initial_sync_responses_per_node": responses_per_node,
            "initial_sync_wire_bytes": wire_bytes,
            "initial_sync_p50_s": percentile(&syncs, 0.5).as_secs_f64(), "initial_sync_p99_s": percentile(&syncs, 0.99).as_secs_f64(),
            "change_p50_ms": ms(percentile(&fast_lat, 0.5)), "change_p99_ms": ms(percentile(&fast_lat, 0.99)), "change_max_ms": ms(percentile(&fast_lat, 1.0)),
            "write_to_first_node_p50_ms": ms(percentile(&detect, 0.5)),
            "slow_nodes_change_p50_ms": ms(percentile(&slow_lat, 0.5)),
            "controlplane_rss_mib": after / 1024, "controlplane_kib_per_stream": per_stream_kib,
            "controlplane_heap_kib_per_stream": heap_per_stream.map(|[allocated, active, resident]| json!({
                "allocated": allocated, "active": active, "resident": resident,
            })),
            "controlplane_cpu_s_per_change": cpu_per_change,
            "controlplane_cpu_s_per_change_beyond_idle": beyond_idle,
            "controlplane_idle_cpu_s_per_s": idle_per_s,
            "change_window_ms": mean(&windows) * 1000.0,
            "controlplane_file_read_ms_per_change": read_ms, "controlplane_views_ms_per_change": views_ms,
            "controlplane_snapshot_ms_per_change": snapshot_ms,
            "stuck_percent": stuck_percent, "stuck_streams": stuck, "stuck_streams_closed": closed(),
            "stuck_closed_after_s": stuck_closed_after.map(|d| d.as_secs_f64()),
            "ack_timeout_s": a.ack_timeout_s,
            "controlplane_rss_with_stuck_mib": rss_with_stuck / 1024,
            "controlplane_rss_after_stuck_mib": rss_after_stuck / 1024,
            "controlplane_peak_rss_mib": peak_rss_kib(pid) / 1024,
        }),
    );
    runtime.shutdown_background();
    // SIGTERM to the control plane itself, so that under a profiler (KPX_BENCH_CP_WRAPPER)
    // it ends and the profiler writes its data.
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on the process this function started (or its wrapper's child).
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let _ = cp.wait();
}

/// Plaintext and TLS fan-out side by side.
pub fn compare_tls(out: &serde_json::Map<String, serde_json::Value>) {
    let (Some(plain), Some(tls)) = (out.get("fanout"), out.get("fanout_tls")) else { return };
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!("\n== plaintext vs mutual TLS");
    for (what, key, unit) in [
        ("one endpoint change → every fast node, p99", "change_p99_ms", "ms"),
        ("one endpoint change → every fast node, p50", "change_p50_ms", "ms"),
        ("initial sync of every node", "initial_sync_all_s", "s"),
        ("control plane memory per node", "controlplane_kib_per_stream", "KiB"),
        ("control plane CPU per change", "controlplane_cpu_s_per_change", "s"),
    ] {
        let (p, t) = (f(plain, key), f(tls, key));
        println!(
            "{what:<48} {p:>9.1} {unit:<3} vs {t:>9.1} {unit:<3}  (TLS ×{:.2}, {:+.1} {unit})",
            t / p,
            t - p
        );
    }
}
