//! Where kpx stands at scale: `sudo tests/bench-scale.sh [flags]` prints a table and
//! writes JSON (`--json PATH`). Nothing is asserted; figures are for reading.
//!
//! 1. fan-out: one kpx-controlplane (release build, loopback), `--nodes` simulated
//!    nodes, each a real delta ADS stream on its own connection that ACKs what it
//!    gets (`--slow-percent` of them wait 2 s before each ACK; `--stuck-percent` of them
//!    open their stream and never read it). Initial sync of every node that reads; then
//!    `--changes` times one endpoint of one Service is changed in the manifests and the
//!    time until each fast node has it is measured; control plane RSS per stream and CPU
//!    seconds per change; then how long until the control plane closed the stuck streams
//!    (`--ack-timeout`), and its RSS with them and after.
//! 2. node programming, at each of `--node-scales` (Services × distinct endpoints per
//!    Service; default 10k × 10, 5k × 50, 50k × 10): kpx-dataplane with nftables in a
//!    network namespace with its control plane (iptables-legacy at the first scale too):
//!    the initial sync (agent start → last Service programmed, and the agent's own apply
//!    time), `--node-changes` one-endpoint changes (delta received → kernel committed +
//!    stored, from its log), a full sync (restarted over its store), peak and steady RSS.
//! 3. data path: TCP connect latency to the first and the last Service (in every
//!    backend's order), two Services of their own backed by a real pod, per run of 2.
//! 4. one endpoint change through the Kubernetes API (the tests' list/watch server).
//! 5. IPVS beside nftables at `--services` Services, `--node-changes` changes, in the
//!    test VM (`tests/vm/run-in-vm.sh`: this kernel has no IPVS).

use kpx_proto::sync::Locked as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use kpx_e2e::backends_in_vm;
use kpx_e2e::percentile;
use kpx_e2e::process::{binary, KpxProcess};
use kpx_e2e::topology::{sock, ProxyBackend, Topology};
use kpx_e2e::traffic::Prober;
use serde_json::json;

#[derive(Debug, Clone)]
struct Args {
    services: usize,
    endpoints: usize,
    nodes: usize,
    slow_percent: usize,
    stuck_percent: usize,
    /// The control plane's `--ack-timeout`, in seconds.
    ack_timeout_s: u64,
    changes: usize,
    node_scales: Vec<Scale>,
    /// One endpoint changes measured per node-programming scale.
    node_changes: usize,
    /// How long the agent idles before its steady RSS is read, in seconds.
    node_idle_s: u64,
    json: Option<PathBuf>,
    skip: Vec<String>,
    /// Also run the fan-out over mutual TLS and print both side by side.
    tls: bool,
    /// Another build's agent (its commit, its binary): nftables' full rewrite is also
    /// timed with it, in the same run, and the two printed side by side.
    baseline: Option<(String, PathBuf)>,
}

/// Node programming's scales: Kubernetes' per-cluster envelope of 250k endpoints (5k ×
/// 50) between a common shape and five times the envelope.
const DEFAULT_NODE_SCALES: &str = "10000x10,5000x50,50000x10";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        services: 10_000,
        endpoints: 10,
        nodes: 5_000,
        slow_percent: 5,
        stuck_percent: 5,
        ack_timeout_s: 120,
        changes: 5,
        node_scales: parse_scales("--node-scales", DEFAULT_NODE_SCALES)?,
        node_changes: 100,
        node_idle_s: 25,
        json: None,
        skip: vec![],
        tls: false,
        baseline: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|_| format!("{flag}: {v:?} is not a number"));
        match flag.as_str() {
            "--services" => a.services = number(value()?)?,
            "--endpoints" => a.endpoints = number(value()?)?,
            "--nodes" => a.nodes = number(value()?)?,
            "--slow-percent" => a.slow_percent = number(value()?)?,
            "--stuck-percent" => a.stuck_percent = number(value()?)?,
            "--ack-timeout" => a.ack_timeout_s = number(value()?)? as u64,
            "--changes" => a.changes = number(value()?)?.max(1),
            "--node-scales" => a.node_scales = parse_scales(&flag, &value()?)?,
            "--node-changes" => a.node_changes = number(value()?)?.max(1),
            "--node-idle" => a.node_idle_s = number(value()?)? as u64,
            "--json" => a.json = Some(PathBuf::from(value()?)),
            "--skip" => a.skip.push(value()?),
            "--tls" => a.tls = true,
            "--baseline" => {
                let v = value()?;
                let (commit, path) =
                    v.split_once('=').ok_or_else(|| format!("{flag}: {v:?} is not COMMIT=PATH"))?;
                if !std::path::Path::new(path).is_file() {
                    return Err(format!("{flag}: {path:?} is no file"));
                }
                a.baseline = Some((commit.to_owned(), PathBuf::from(path)));
            }
            other => return Err(format!("unknown flag {other} (--services --endpoints --nodes --slow-percent --stuck-percent --ack-timeout SECONDS --changes --node-scales SxE,… --node-changes --node-idle SECONDS --json --skip fanout|floor|node|iptables|api|ipvs --tls --baseline COMMIT=AGENT_BINARY)")),
        }
    }
    Ok(a)
}

fn vip(i: usize) -> String {
    format!("10.{}.{}.{}", 96 + i / 62_500, (i % 62_500) / 250, i % 250 + 1)
}

/// The `n`-th endpoint address of a benchmark (10.128.0.0/9: 8M distinct ones).
fn endpoint_address(n: usize) -> String {
    format!("10.{}.{}.{}", 128 + (n >> 16) % 128, (n >> 8) & 255, n & 255)
}

/// One Service of a benchmark manifest: name, ClusterIP, endpoint addresses.
struct BenchService {
    name: String,
    vip: String,
    endpoints: Vec<String>,
}

impl BenchService {
    /// Service `i` of a benchmark of `endpoints` distinct endpoints per Service. At
    /// `generation` g > 0, Service 0's last endpoint is another address (10.127.x.y): one
    /// endpoint changed.
    fn numbered(i: usize, endpoints: usize, generation: usize) -> BenchService {
        let mut eps: Vec<String> = (0..endpoints).map(|e| endpoint_address(i * endpoints + e)).collect();
        if i == 0 && generation > 0 {
            if let Some(last) = eps.last_mut() {
                *last = format!("10.127.{}.{}", (generation / 250) % 250, generation % 250 + 1);
            }
        }
        BenchService { name: format!("svc-{i}"), vip: vip(i), endpoints: eps }
    }

    fn yaml(&self) -> String {
        let name = &self.name;
        let mut text = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bench}}\nspec: {{clusterIP: {}, ports: [{{name: http, protocol: TCP, port: 80}}]}}\n---\n",
            self.vip
        );
        text.push_str(&self.slice_yaml());
        text
    }

    /// Its EndpointSlice alone.
    fn slice_yaml(&self) -> String {
        let name = &self.name;
        let mut text = String::new();
        text.push_str(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: bench, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, protocol: TCP, port: 8080}}]\nendpoints:\n"
        ));
        for e in &self.endpoints {
            text.push_str(&format!(
                "- {{addresses: [{e}], conditions: {{ready: true}}, nodeName: node-a}}\n"
            ));
        }
        text.push_str("---\n");
        text
    }
}

/// Writes `services` Services of one port with `endpoints` distinct endpoints each, 500 to
/// a file; Service 0 alone in `svc-0.yaml` (the one changed, at `generation`).
fn write_manifests(dir: &Path, services: usize, endpoints: usize, generation: usize) {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..services {
        let file = if i == 0 { "svc-0.yaml".to_owned() } else { format!("svc-{:03}.yaml", 1 + i / 500) };
        files.entry(file).or_default().push_str(&BenchService::numbered(i, endpoints, generation).yaml());
    }
    for (file, text) in files {
        kpx_e2e::topology::write_atomically(&dir.join(file), &text);
    }
}

/// Rewrites Service 0's file at generation `g` (its last endpoint changed).
fn write_manifests_one(dir: &Path, endpoints: usize, g: usize) {
    let text = BenchService::numbered(0, endpoints, g).yaml();
    kpx_e2e::topology::write_atomically(&dir.join("svc-0.yaml"), &text);
}

/// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The RSS once it has stopped falling: no drop of more than 256 KiB over two seconds
/// (at most 30 s).
fn settled_rss_kib(pid: u32) -> u64 {
    let mut readings = std::collections::VecDeque::from([rss_kib(pid)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        readings.push_back(rss_kib(pid));
        if readings.len() > 5 {
            readings.pop_front();
            if readings.front().copied().unwrap_or(0) <= readings.back().copied().unwrap_or(0) + 256 {
                break;
            }
        }
    }
    readings.back().copied().unwrap_or(0)
}

fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// One sample of a metric of the fan-out's control plane (its /metrics on 127.0.0.1:28002).
fn control_plane_metric(name: &str) -> f64 {
    let Ok((200, body)) = kpx_e2e::traffic::http_get_path(sock("127.0.0.1", 28002), "/metrics") else {
        return f64::NAN;
    };
    kpx_e2e::traffic::metric_value(&body, name).unwrap_or(f64::NAN)
}

/// The control plane's heap by the allocator's account (allocated, active, resident), in KiB.
fn control_plane_heap_kib() -> [f64; 3] {
    ["allocated", "active", "resident"]
        .map(|kind| control_plane_metric(&format!("kpx_controlplane_heap_bytes{{kind=\"{kind}\"}}")) / 1024.0)
}

/// The numbers of `/proc/PID/stat` from its state's field on (the state is field 3 of
/// stat(5), at index 0 here).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit(')').next()?.split_whitespace().map(str::to_owned).collect())
}

/// A process's minor and major page faults so far (fields 10 and 12 of stat(5)).
fn page_faults(pid: u32) -> Option<(u64, u64)> {
    let fields = stat_fields(pid)?;
    Some((fields.get(7)?.parse().ok()?, fields.get(9)?.parse().ok()?))
}

/// A process's CPU time so far, user and system (fields 14 and 15 of stat(5)).
fn cpu_seconds(pid: u32) -> f64 {
    let fields = stat_fields(pid).unwrap_or_default();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf is always safe to call.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

fn raise_fd_limit() {
    let limit = libc::rlimit { rlim_cur: 1 << 20, rlim_max: 1 << 20 };
    // SAFETY: setrlimit with a valid struct; failure only means fewer streams fit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
}

/// What one simulated node saw.
#[derive(Default)]
struct NodeLog {
    synced_at: Option<Instant>,
    /// Bytes of the resources received (what the wire carried, less a few bytes of
    /// framing per response).
    bytes: u64,
    /// Responses received until the initial sync was complete.
    responses_to_sync: usize,
    /// Arrivals of responses carrying Service 0.
    service0: Vec<Instant>,
}

/// How simulated nodes reach the control plane: plaintext, or mutual TLS with a
/// certificate of their own (`system:node:sim-N`).
#[derive(Clone)]
enum Transport {
    Plain,
    Tls { ca: tonic::transport::Certificate, identities: Arc<Vec<tonic::transport::Identity>> },
}

/// How a simulated node treats its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeKind {
    /// ACKs each response at once.
    Fast,
    /// Waits 2 s before each ACK.
    Slow,
    /// Opens its stream and never reads it (nor ACKs).
    Stuck,
}

/// Which kind node `i` is: every `100 / stuck_percent`-th is stuck, every
/// `100 / slow_percent`-th of the others slow.
fn node_kind(i: usize, slow_percent: usize, stuck_percent: usize) -> NodeKind {
    let every = |percent: usize| 100usize.checked_div(percent).map(|n| n.max(1));
    if every(stuck_percent).is_some_and(|n| i % n == n / 2) {
        NodeKind::Stuck
    } else if every(slow_percent).is_some_and(|n| i % n == n - 1) {
        NodeKind::Slow
    } else {
        NodeKind::Fast
    }
}

async fn simulated_node(
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

type Outbound = tokio::sync::mpsc::Sender<DeltaDiscoveryRequest>;
type Inbound = tonic::Streaming<ResponseFrame>;

/// What a simulated node decodes of a `DeltaDiscoveryResponse`: its nonce and type, and of
/// each resource its size and whether it is Service 0, each let go as soon as it is read
/// (so the receive buffer is reused). A real node decodes every view on a machine of its
/// own; 5,000 simulated nodes decoding every view (or keeping slices of every buffer)
/// would measure the simulator on the control plane's two cores. Every byte still
/// crosses HTTP/2 and is walked.
#[derive(Debug, Default)]
struct ResponseFrame {
    resources: usize,
    /// Bytes of the resources.
    bytes: u64,
    has_service0: bool,
    type_url: String,
    nonce: String,
}

/// The resource name of Service 0, the one changed.
const SERVICE0: &str = "default/bench/svc-0";

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
struct ResourceName {
    #[prost(bytes = "bytes", tag = "3")]
    name: bytes::Bytes,
}

fn resource_name(resource: bytes::Bytes) -> bytes::Bytes {
    <ResourceName as prost::Message>::decode(resource).map(|r| r.name).unwrap_or_default()
}

const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

async fn open_stream(addr: &str, transport: &Transport, id: usize) -> Result<(Outbound, Inbound), String> {
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

async fn run_node(
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
enum FanoutServer {
    /// `kpx-controlplane`, plaintext or over mutual TLS.
    Kpx { tls: bool },
    /// `ads_floor`: the same transport and none of the control plane's work (its one
    /// resource is Service 0; every node reads at once).
    Floor,
}

fn fanout(a: &Args, server: FanoutServer, out: &mut serde_json::Map<String, serde_json::Value>) {
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
        let pki = kpx_e2e::pki::Pki::new(dir.path(), "bench");
        let server = pki.server("server");
        let started = Instant::now();
        let identities: Vec<tonic::transport::Identity> = (0..a.nodes)
            .map(|i| {
                let issued = pki.issue(
                    &format!("sim-{i}"),
                    &format!("system:node:sim-{i}"),
                    &[],
                    &[],
                    kpx_e2e::pki::Validity::Current,
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
    let cp_bin = kpx_e2e::process::binary(program);
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
    kpx_e2e::wait_for("the control plane's first snapshot", Duration::from_secs(600), || {
        if let Ok(Some(status)) = cp.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("{program} exited ({status}) before serving:\n{log}");
        }
        std::fs::read_to_string(&log_path).ok()?.contains(ready).then_some(())
    });
    // The control plane itself, also under a wrapper (whose figures would be its own).
    let pid = kpx_e2e::process::program_pid(cp.id(), program).unwrap_or(cp.id());
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
    let all_synced =
        kpx_e2e::wait_for("every reading node's initial sync", Duration::from_secs(1800), || {
            let done =
                logs.iter().filter(|l| l.lock().map(|l| l.synced_at.is_some()).unwrap_or(false)).count();
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
        let arrivals =
            kpx_e2e::wait_for("every node to receive the change", Duration::from_secs(600), || {
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
        kpx_e2e::wait_for("the control plane to close the streams that are not read", limit, || {
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
fn compare_tls(out: &serde_json::Map<String, serde_json::Value>) {
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

/// What the figures were measured on: cores, memory, kernel, nft.
fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    let nft = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_gib": (mem_kib as f64 / 1048576.0).round(),
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "nft": nft,
    })
}

/// Events of a JSON log file.
fn events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// One node-programming scale: Services × distinct endpoints per Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scale {
    services: usize,
    endpoints: usize,
}

impl std::fmt::Display for Scale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}", self.services, self.endpoints)
    }
}

fn parse_scales(flag: &str, text: &str) -> Result<Vec<Scale>, String> {
    text.split(',')
        .map(|one| {
            let (s, e) =
                one.split_once('x').ok_or_else(|| format!("{flag}: {one:?} is not SERVICESxENDPOINTS"))?;
            let number = |v: &str| v.trim().parse::<usize>().ok().filter(|n| *n > 0);
            match (number(s), number(e)) {
                (Some(services), Some(endpoints)) => Ok(Scale { services, endpoints }),
                _ => Err(format!("{flag}: {one:?}: both numbers must be positive")),
            }
        })
        .collect()
}

/// The two Services of the data-path measurement, backed by a real pod: the first and
/// the last in every backend's order (keys sort by name).
const DATA_PATH_SERVICES: [(&str, &str); 2] = [("aaa-first", "10.95.0.1"), ("zzz-last", "10.95.0.2")];

fn write_data_path_services(dir: &Path) {
    let text: String = DATA_PATH_SERVICES
        .iter()
        .map(|(name, vip)| {
            BenchService {
                name: (*name).to_owned(),
                vip: (*vip).to_owned(),
                endpoints: vec![Topology::pod_ip(0)],
            }
            .yaml()
        })
        .collect();
    kpx_e2e::topology::write_atomically(&dir.join("data-path.yaml"), &text);
}

/// Seconds since the Unix epoch of a log timestamp (`2026-12-04T14:21:01.302810Z`).
fn unix_seconds(timestamp: &str) -> Option<f64> {
    let (date, time) = timestamp.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|v| v.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, min, sec) =
        (t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?);
    // Days from 1970-01-01 of a proleptic Gregorian date.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// One endpoint change as a user makes it, through the Kubernetes API: Service 0's
/// EndpointSlice replaced in an API server (the tests' fake, serving kube-rs the real
/// list/watch protocol over HTTP) → the watch event → the control plane → the node agent
/// → the kernel committed. Each change waits for the last to be applied and for a quiet
/// moment, as a lone change.
fn api_latency(a: &Args, scale: Scale) -> serde_json::Value {
    use kpx_e2e::fake_apiserver::FakeApiServer;
    println!(
        "\n== one endpoint change through the Kubernetes API (an in-process API server's list/watch): {} Services × {} endpoints",
        scale.services, scale.endpoints
    );
    let t = Topology::new(1);
    let api = FakeApiServer::start(&t.node, sock("127.0.0.1", 16443));
    api.apply_yaml(&kpx_e2e::topology::node_yaml(kpx_e2e::topology::NODE_NAME, "zone-a"));
    let all: String =
        (0..scale.services).map(|i| BenchService::numbered(i, scale.endpoints, 0).yaml()).collect();
    api.apply_yaml(&all);
    drop(all);
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let _cp = t.start_control_plane_from(&[format!("kubeconfig:{}", kubeconfig.display())], &[]);
    let dp = t.start_dataplane_with(ProxyBackend::Nftables, &[]);
    kpx_e2e::wait_for("the node's initial sync", Duration::from_secs(1800), || {
        exited_before(&dp, "its initial sync");
        let applied: u64 = service_deltas(&dp.log).iter().map(|e| e["resources"].as_u64().unwrap_or(0)).sum();
        (applied >= scale.services as u64).then_some(())
    });
    let mut latencies = Vec::new();
    for change in 1..=a.node_changes {
        let before = service_deltas(&dp.log).len();
        std::thread::sleep(Duration::from_millis(100));
        let written = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        api.apply_yaml(&BenchService::numbered(0, scale.endpoints, change).slice_yaml());
        let event = kpx_e2e::wait_for("the change applied", Duration::from_secs(120), || {
            exited_before(&dp, "the change applied");
            service_deltas(&dp.log).into_iter().nth(before)
        });
        // The event is logged once stored too: the kernel had it `elapsed - kernel` before.
        let logged = event["timestamp"]
            .as_str()
            .and_then(unix_seconds)
            .unwrap_or_else(|| panic!("the agent's event has no UTC timestamp: {event}"));
        let after_kernel_us =
            event["elapsed_us"].as_f64().unwrap_or(0.0) - event["kernel_us"].as_f64().unwrap_or(0.0);
        // (Rounded to the log's microseconds: never below zero.)
        latencies.push(Duration::from_secs_f64((logged - written - after_kernel_us / 1e6).max(0.0)));
    }
    latencies.sort();
    println!(
        "EndpointSlice replaced in the API → kernel committed, over {} changes: p50 {} ms, p99 {} ms",
        latencies.len(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    json!({
        "services": scale.services, "endpoints_per_service": scale.endpoints, "changes": latencies.len(),
        "api_to_kernel_p50_ms": ms(percentile(&latencies, 0.5)),
        "api_to_kernel_p99_ms": ms(percentile(&latencies, 0.99)),
    })
}

/// Ends the benchmark if the agent has exited (instead of waiting out a deadline for it).
fn exited_before(agent: &KpxProcess, what: &str) {
    if agent.exited() {
        panic!("{} exited before {what}; log:\n{}", agent.name, agent.log_text());
    }
}

/// The agent's "delta applied" events of Services (the log holds every run of it).
fn service_deltas(log: &Path) -> Vec<serde_json::Value> {
    events(log)
        .into_iter()
        .filter(|e| e["message"] == "delta applied" && e["type_url"] == kpx_proto::SERVICE_VIEW_TYPE_URL)
        .collect()
}

/// Node programming at one scale: a real control plane and node agent in a namespace.
/// Initial sync (the whole pipeline, and the agent's own apply time), `changes` single
/// endpoint changes (delta received → kernel committed and stored, from the agent's
/// log), a full sync (the agent restarted over its store reprograms everything), the
/// agent's peak (VmHWM) and steady RSS, and TCP connects to the data-path Services.
fn node_programming(a: &Args, scale: Scale, backend: ProxyBackend, label: &str) -> serde_json::Value {
    let total = scale.services + DATA_PATH_SERVICES.len();
    println!(
        "\n== node programming and data path: {label}, {} Services × {} distinct endpoints ({} endpoints; + {} Services backed by a pod for the data path)",
        scale.services,
        scale.endpoints,
        scale.services * scale.endpoints,
        DATA_PATH_SERVICES.len()
    );
    let t = Topology::new(1);
    let _backend = t.start_backends(8080);
    let manifests = t.manifests();
    write_manifests(&manifests, scale.services, scale.endpoints, 0);
    write_data_path_services(&manifests);
    let _cp = t.start_control_plane();
    let start = Instant::now();
    // KPX_BENCH_DP_WRAPPER="heaptrack" runs each agent under a profiler (RSS figures are
    // then the wrapper's).
    let wrapper: Vec<String> = std::env::var("KPX_BENCH_DP_WRAPPER")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let mut dp: KpxProcess = t.start_dataplane_under(backend, &wrapper);
    let log = dp.log.clone();
    let initial = kpx_e2e::wait_for("the node's initial sync", Duration::from_secs(1800), || {
        exited_before(&dp, "its initial sync");
        let deltas = service_deltas(&log);
        let applied: u64 = deltas.iter().map(|e| e["resources"].as_u64().unwrap_or(0)).sum();
        (applied >= total as u64).then_some(deltas)
    });
    let pipeline = start.elapsed();
    let initial_apply: Duration =
        initial.iter().map(|e| Duration::from_micros(e["elapsed_us"].as_u64().unwrap_or(0))).sum();
    let pid = kpx_e2e::wait_for("the agent's pid", Duration::from_secs(5), || dp.pid());
    let peak_after_sync = peak_rss_kib(pid);
    // One endpoint change at a time: Service 0's last endpoint moves to another address.
    let (mut latencies, mut to_kernel) = (Vec::new(), Vec::new());
    // Page faults taken by the agent over the changes: a major one is a page read back
    // from disk (this machine's kernel pages cold file pages out), in a change's time.
    let faults_before = page_faults(pid);
    for change in 1..=a.node_changes {
        let before = service_deltas(&log).len();
        write_manifests_one(&manifests, scale.endpoints, change);
        let event = kpx_e2e::wait_for("the change applied", Duration::from_secs(120), || {
            exited_before(&dp, "the change applied");
            service_deltas(&log).into_iter().nth(before)
        });
        let us = |field: &str| Duration::from_micros(event[field].as_u64().unwrap_or(0));
        latencies.push(us("elapsed_us"));
        to_kernel.push(us("kernel_us"));
    }
    let faults =
        page_faults(pid).zip(faults_before).map(|((min, maj), (min0, maj0))| (min - min0, maj - maj0));
    latencies.sort();
    to_kernel.sort();
    // Steady: idle (by default through two canary checks and housekeeping).
    std::thread::sleep(Duration::from_secs(a.node_idle_s));
    let steady = rss_kib(pid);
    let peak = peak_rss_kib(pid);
    // Data path: connect latency to the first and the last Service.
    let connect = |addr: &str| -> Duration {
        let to = sock(addr, 80);
        let mut times: Vec<Duration> = t.client.run_in(move || {
            (0..200)
                .filter_map(|_| {
                    let s = Instant::now();
                    std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2))
                        .ok()
                        .map(|_| s.elapsed())
                })
                .collect()
        });
        times.sort();
        percentile(&times, 0.5)
    };
    let (first, last) = (connect(DATA_PATH_SERVICES[0].1), connect(DATA_PATH_SERVICES[1].1));
    // Restart over an intact table: the agent restarted over its store programs all it
    // holds again over the table it left (nftables: compared, only what differs written).
    // Under continuous traffic to the data-path Services: every 10 ms, each must be
    // answered by the pod throughout.
    let targets: Vec<_> = DATA_PATH_SERVICES.iter().map(|(_, vip)| sock(vip, 80)).collect();
    let prober =
        Prober::start(&t.client, &targets, "pod0", Duration::from_millis(10), Duration::from_secs(1800));
    dp.stop();
    let this_build = kpx_e2e::process::binary("kpx-dataplane");
    let restart = restart_and_measure(&t, backend, &this_build, &wrapper, total);
    let probed = prober.finish();
    // Full rewrite: the same over a node whose table is gone (nftables; the other
    // backends rewrite at every restart).
    let rewrite = (backend == ProxyBackend::Nftables).then(|| {
        t.node.exec("nft", &["delete", "table", "inet", "kpx"]);
        restart_and_measure(&t, backend, &this_build, &wrapper, total)
    });
    // The same full rewrite by another build's agent, alternating with this one's.
    let compared = match (&rewrite, &a.baseline) {
        (Some(rewrite), Some((commit, binary))) => {
            Some(compare_rewrites(&t, backend, (&this_build, binary), &wrapper, total, rewrite, commit))
        }
        _ => None,
    };
    println!(
        "initial sync: {:.2} s from the agent's start to the last Service programmed (the agent applying: {:.2} s); agent peak RSS {} MiB after it",
        pipeline.as_secs_f64(),
        initial_apply.as_secs_f64(),
        peak_after_sync / 1024
    );
    println!(
        "one endpoint change inside the agent, over {} changes: delta received → kernel committed p50 {} ms, p99 {} ms; → kernel and store committed (the ACK) p50 {} ms, p99 {} ms",
        latencies.len(),
        ms(percentile(&to_kernel, 0.5)),
        ms(percentile(&to_kernel, 0.99)),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    if let Some((minor, major)) = faults {
        println!(
            "page faults in the agent over those changes: {minor} minor, {major} major (read back from disk)"
        );
    }
    let told =
        |r: &Restart| if r.phases.is_empty() { String::new() } else { format!(" ({})", r.phases.join(", ")) };
    println!(
        "restart over an intact table: {:.3} s, {} of {} elements written{}, peak RSS {} MiB{}",
        restart.seconds,
        restart.written.map_or("?".into(), |w| w.to_string()),
        restart.elements.map_or("all".into(), |w| w.to_string()),
        restart.accounted_after.map_or(String::new(), |s| format!(
            " (its bookkeeping rebuilt in {s:.2} s more, off the restart's path)"
        )),
        restart.peak_kib / 1024,
        told(&restart)
    );
    if let Some(rewrite) = &rewrite {
        println!(
            "full rewrite (the table gone): {:.2} s, {} elements written, peak RSS {} MiB{}; restart / rewrite time {:.1} %",
            rewrite.seconds,
            rewrite.written.map_or("?".into(), |w| w.to_string()),
            rewrite.peak_kib / 1024,
            told(rewrite),
            100.0 * restart.seconds / rewrite.seconds.max(f64::EPSILON)
        );
    }
    println!(
        "requests to the data-path Services across the restart (old agent stopped → new one programmed and stopped): {} sent, {} failed{}",
        probed.sent,
        probed.failed,
        if probed.failures.is_empty() { String::new() } else { format!(" {:?}", probed.failures) }
    );
    println!(
        "agent RSS: peak {} MiB, steady {} MiB ({} s idle after the changes)",
        peak / 1024,
        steady / 1024,
        a.node_idle_s
    );
    println!(
        "TCP connect, median of 200: first Service {} µs, last Service {} µs",
        first.as_micros(),
        last.as_micros()
    );
    json!({
        "backend": label, "services": scale.services, "endpoints_per_service": scale.endpoints,
        "data_path_services": DATA_PATH_SERVICES.len(),
        "initial_sync_pipeline_s": pipeline.as_secs_f64(), "initial_sync_agent_apply_s": initial_apply.as_secs_f64(),
        "full_sync_s": restart.seconds,
        "restart_s": restart.seconds, "restart_elements": restart.elements, "restart_elements_written": restart.written,
        "restart_peak_rss_mib": restart.peak_kib as f64 / 1024.0, "restart_accounted_after_s": restart.accounted_after,
        "restart_requests_sent": probed.sent, "restart_requests_failed": probed.failed,
        "rewrite_s": rewrite.as_ref().map(|r| r.seconds), "rewrite_elements_written": rewrite.as_ref().and_then(|r| r.written),
        "rewrite_peak_rss_mib": rewrite.as_ref().map(|r| r.peak_kib as f64 / 1024.0),
        "changes": latencies.len(),
        "change_p50_ms": ms(percentile(&latencies, 0.5)), "change_p99_ms": ms(percentile(&latencies, 0.99)),
        "change_to_kernel_p50_ms": ms(percentile(&to_kernel, 0.5)), "change_to_kernel_p99_ms": ms(percentile(&to_kernel, 0.99)),
        "agent_peak_rss_mib": peak as f64 / 1024.0,
        "agent_minor_faults_during_changes": faults.map(|f| f.0), "agent_major_faults_during_changes": faults.map(|f| f.1), "agent_steady_rss_mib": steady as f64 / 1024.0,
        "agent_steady_after_idle_s": a.node_idle_s,
        "agent_peak_rss_after_initial_sync_mib": peak_after_sync as f64 / 1024.0,
        "agent_full_sync_peak_rss_mib": restart.peak_kib as f64 / 1024.0,
        "rewrite_render_ms": rewrite.as_ref().and_then(|r| r.render_ms),
        "rewrite_compared": compared,
        "connect_first_us": first.as_micros() as u64, "connect_last_us": last.as_micros() as u64,
    })
}

/// An agent restarted over its store: how long until its stored state was programmed,
/// its peak RSS, and what the backend logged of it.
struct Restart {
    seconds: f64,
    /// nftables over an untouched table: how long its bookkeeping took to rebuild, off
    /// the restart's path.
    accounted_after: Option<f64>,
    peak_kib: u64,
    /// The elements the full sync wanted and wrote (nftables' log).
    elements: Option<u64>,
    written: Option<u64>,
    /// Each `*_ms` and `elements*` field the backend logged.
    phases: Vec<String>,
    /// nftables' full sync: how long the Services took to render and encode into the
    /// transaction (the backend's `render_ms`).
    render_ms: Option<u64>,
}

/// How many full rewrites each build makes in [`compare_rewrites`].
const COMPARED_REWRITES: usize = 3;

/// nftables' full rewrite by this build's agent and by another's (`builds`: this one's
/// binary, then the other's), alternating, [`COMPARED_REWRITES`] times each (`first` is
/// this build's first): the median of each one's time, and of its render, side by side.
fn compare_rewrites(
    t: &Topology,
    backend: ProxyBackend,
    builds: (&std::path::Path, &std::path::Path),
    wrapper: &[String],
    services: usize,
    first: &Restart,
    commit: &str,
) -> serde_json::Value {
    let (mut this, mut other) = (vec![(first.seconds, first.render_ms)], Vec::new());
    for round in 0..COMPARED_REWRITES * 2 - 1 {
        let (binary, runs) = if round % 2 == 0 { (builds.1, &mut other) } else { (builds.0, &mut this) };
        t.node.exec("nft", &["delete", "table", "inet", "kpx"]);
        let r = restart_and_measure(t, backend, binary, wrapper, services);
        runs.push((r.seconds, r.render_ms));
    }
    let median = |runs: &[(f64, Option<u64>)]| {
        let mut seconds: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let mut render: Vec<u64> = runs.iter().filter_map(|r| r.1).collect();
        seconds.sort_by(f64::total_cmp);
        render.sort();
        (seconds.get(seconds.len() / 2).copied(), render.get(render.len() / 2).copied())
    };
    let ((this_s, this_render), (other_s, other_render)) = (median(&this), median(&other));
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b.max(f64::EPSILON));
    let render_ratio = ratio(this_render.map(|r| r as f64), other_render.map(|r| r as f64));
    println!(
        "full rewrite, this build against {commit}, median of {COMPARED_REWRITES} each (alternating): {} s against {} s; the Services rendered and encoded (render_ms) {} ms against {} ms: this build / {commit} = {}",
        this_s.map_or("?".into(), |s| format!("{s:.2}")),
        other_s.map_or("?".into(), |s| format!("{s:.2}")),
        this_render.map_or("?".into(), |r| r.to_string()),
        other_render.map_or("?".into(), |r| r.to_string()),
        render_ratio.map_or("?".into(), |r| format!("{r:.2}")),
    );
    json!({
        "baseline_commit": commit, "rewrites_each": COMPARED_REWRITES,
        "rewrite_s": this_s, "baseline_rewrite_s": other_s,
        "render_ms": this_render, "baseline_render_ms": other_render, "render_ratio": render_ratio,
        "rewrite_ratio": ratio(this_s, other_s),
    })
}

/// Starts the agent over its store, measures it programming what it stored, stops it.
fn restart_and_measure(
    t: &Topology,
    backend: ProxyBackend,
    binary: &std::path::Path,
    wrapper: &[String],
    services: usize,
) -> Restart {
    // nftables logs how it wrote a full sync, or that its table needed no write.
    let unchanged = "full sync: kpx's table is as its last write left it, nothing written";
    let mut dp = t.start_dataplane_from(binary, backend, wrapper);
    let programmed = kpx_e2e::wait_for("its stored state programmed", Duration::from_secs(1800), || {
        exited_before(&dp, "programming its stored state");
        dp.events().into_iter().find(|e| {
            e["message"] == "programmed stored state" && e["services"].as_u64() == Some(services as u64)
        })
    });
    let seconds = programmed["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0;
    // An untouched nftables table is accounted for after it is programmed, on a thread of
    // its own: the peak counts that too.
    let accounted = "kpx's table accounted for: ready for changes";
    let unchanged_table = dp.events().iter().any(|e| e["message"] == unchanged);
    let accounted_after = unchanged_table.then(|| {
        let event =
            dp.wait_event("its table accounted for", Duration::from_secs(600), |e| e["message"] == accounted);
        event["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
    });
    let pid = kpx_e2e::wait_for("the agent's pid", Duration::from_secs(5), || dp.pid());
    let peak_kib = peak_rss_kib(pid);
    let written =
        dp.events().into_iter().rfind(|e| e["message"] == "full sync written" || e["message"] == unchanged);
    dp.stop();
    let field = |name: &str| match written.as_ref() {
        Some(e) if e["message"] == unchanged && name == "elements_written" => Some(0),
        Some(e) => e[name].as_u64(),
        None => None,
    };
    let phases = written
        .as_ref()
        .and_then(|e| e.as_object().cloned())
        .map(|e| {
            e.iter()
                .filter(|(k, _)| {
                    k.ends_with("_ms")
                        || k.starts_with("elements")
                        || ["compared", "message", "unchanged_chains", "restore_bytes"].contains(&k.as_str())
                })
                .map(|(k, v)| format!("{k} {v}"))
                .collect()
        })
        .unwrap_or_default();
    Restart {
        seconds,
        accounted_after,
        peak_kib,
        elements: field("elements"),
        written: field("elements_written"),
        render_ms: written.as_ref().and_then(|e| e["render_ms"].as_u64()),
        phases,
    }
}

/// IPVS beside nftables, one endpoint change at `--services` Services, in the test VM.
fn ipvs_in_vm(a: &Args) -> Option<serde_json::Value> {
    println!(
        "\n== IPVS vs nftables in the VM (this kernel has no IPVS; emulated: compare within the run): {} Services × 10 endpoints, {} changes",
        a.services, a.node_changes
    );
    match backends_in_vm::measure(&binary("bench_backends"), a.services, a.node_changes) {
        Ok(figures) => {
            for b in figures["backends"].as_array().into_iter().flatten() {
                println!(
                    "{}: one endpoint change p50 {} ms, p99 {} ms; full sync {:.1} s",
                    b["backend"].as_str().unwrap_or("?"),
                    b["change_p50_ms"],
                    b["change_p99_ms"],
                    b["full_sync_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0
                );
            }
            Some(figures)
        }
        Err(e) => {
            println!("not measured: {e}");
            None
        }
    }
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_scale: {e}");
            std::process::exit(2);
        }
    };
    raise_fd_limit();
    let mut out = serde_json::Map::new();
    if !a.skip.iter().any(|s| s == "fanout") {
        fanout(&a, FanoutServer::Kpx { tls: false }, &mut out);
        if a.tls {
            fanout(&a, FanoutServer::Kpx { tls: true }, &mut out);
            compare_tls(&out);
        }
    }
    if !a.skip.iter().any(|s| s == "floor") {
        fanout(&a, FanoutServer::Floor, &mut out);
    }
    if !a.skip.iter().any(|s| s == "node") {
        // nftables at every scale; iptables-legacy at the first, for the data path's
        // first-vs-last comparison (its rules are a list walked per packet).
        let mut runs: Vec<serde_json::Value> = a
            .node_scales
            .iter()
            .map(|&scale| node_programming(&a, scale, ProxyBackend::Nftables, "nftables"))
            .collect();
        if let Some(&first) = a.node_scales.first().filter(|_| !a.skip.iter().any(|s| s == "iptables")) {
            runs.push(node_programming(&a, first, ProxyBackend::IptablesLegacy, "iptables-legacy"));
        }
        out.insert("node_programming".into(), serde_json::Value::Array(runs));
    }
    if let Some(&first) = a.node_scales.first().filter(|_| !a.skip.iter().any(|s| s == "api")) {
        out.insert("api".into(), api_latency(&a, first));
    }
    if !a.skip.iter().any(|s| s == "ipvs") {
        if let Some(figures) = ipvs_in_vm(&a) {
            out.insert("ipvs_vm".into(), figures);
        }
    }
    out.insert(
        "command".into(),
        json!(format!(
            "sudo tests/bench-scale.sh {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        )
        .trim_end()),
    );
    out.insert("machine".into(), machine());
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(out)).unwrap_or_default();
    if let Some(path) = &a.json {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("bench_scale: --json {}: {e}", path.display());
        } else {
            println!("\nJSON written to {}", path.display());
        }
    }
}
