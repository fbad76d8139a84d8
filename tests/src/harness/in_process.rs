//! The rootless tier's harness: a control plane and node agents in the test's own
//! process, over loopback gRPC, with the agents programming the in-memory kernel
//! (`kpx_dataplane::exec::fake`). No root, no namespace, no child process: what it proves
//! is the protocol and the pipeline (manifests → model → views → delta xDS → validate →
//! backend → store → ACK), and what the fake kernel then holds. That the kernel does
//! what the rules say is the root tier's job (real traffic in namespaces).
//!
//! Each control plane and each agent runs on a runtime of its own, so stopping one ends
//! every task it started (sources, publisher, streams), as a process's end would.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use kpx_controlplane::config::{Config, Flags};
use kpx_controlplane::serve::{self, Listeners};
use kpx_controlplane::source;
use kpx_dataplane::agent::{Agent, SharedAgent};
use kpx_dataplane::backend::nftables::NftablesBackend;
use kpx_dataplane::connection::{ControlPlane, DEFAULT_KEEPALIVE};
use kpx_dataplane::exec::fake::{FakeConntrack, FakeNft};
use kpx_dataplane::home::ApiAccess;
use kpx_dataplane::store::Store;
use kpx_proto::node_context::ProxySettings;
use tokio::runtime::Runtime;

use super::traffic::http_get_path;
use crate::{wait_for, DEADLINE};

/// How long a runtime's tasks get to end when it is stopped.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The in-process control plane's and agents' logs in the test's output, at the level
/// `KPX_TEST_LOG` names (`info`, `debug`, a directive list; nothing when unset).
fn init_logs() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("KPX_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
}

fn runtime(name: &str) -> Runtime {
    init_logs();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// `text` written to `path` whole (a file source never reads half a manifest).
pub fn write_manifest(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).expect("write manifest");
    std::fs::rename(&partial, path).expect("rename manifest");
}

/// kpx-controlplane's own run (`kpx_controlplane::serve::run`) over a manifest folder.
pub struct InProcessControlPlane {
    runtime: Option<Runtime>,
    /// Where it serves delta ADS (the same on a restart).
    pub grpc: SocketAddr,
    /// Where it serves /metrics.
    pub metrics: SocketAddr,
}

impl InProcessControlPlane {
    /// Starts one reading `manifests`, serving on `grpc` (port 0: any).
    pub fn start(manifests: &Path, grpc: SocketAddr) -> InProcessControlPlane {
        let source = format!("--source=file:{}", manifests.display());
        let flags = Flags::try_parse_from([
            "kpx-controlplane",
            source.as_str(),
            "--listen=127.0.0.1:0",
            "--metrics-listen=127.0.0.1:0",
        ])
        .expect("flags");
        let config = Config::resolve(flags).expect("config");
        let runtime = runtime("control-plane");
        let prepared = config
            .sources
            .iter()
            .map(|spec| runtime.block_on(source::prepare(spec)).expect("source"))
            .collect();
        let (grpc_listener, metrics_listener) = runtime.block_on(async {
            let grpc = tokio::net::TcpListener::bind(grpc).await.expect("bind the gRPC address");
            let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind metrics");
            (grpc, metrics)
        });
        let grpc = grpc_listener.local_addr().expect("address");
        let metrics = metrics_listener.local_addr().expect("address");
        let listeners = Listeners { grpc: grpc_listener, metrics: metrics_listener };
        runtime.spawn(async move {
            if let Err(e) = serve::run(config, None, prepared, listeners, std::future::pending()).await {
                eprintln!("in-process control plane ended: {e:#}");
            }
        });
        InProcessControlPlane { runtime: Some(runtime), grpc, metrics }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// A counter or gauge of its /metrics (the sum of its series), 0 when absent.
    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = http_get_path(self.metrics, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{text}");
        (text.lines())
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Ends it and everything it started, as its process's end would.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(STOP_GRACE);
        }
    }
}

impl Drop for InProcessControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A node: its store on disk, its kernel in memory, and an agent when started.
pub struct InProcessNode {
    name: String,
    state: tempfile::TempDir,
    /// The node's kernel, as the agent programs it (shared with the agent).
    pub nft: FakeNft,
    conntrack: FakeConntrack,
    running: Option<(Runtime, SharedAgent)>,
}

impl InProcessNode {
    pub fn new(name: &str) -> InProcessNode {
        InProcessNode {
            name: name.to_owned(),
            state: tempfile::tempdir().expect("a state directory"),
            nft: FakeNft::new(),
            conntrack: FakeConntrack::new(),
            running: None,
        }
    }

    /// Starts the agent over the node's store and kernel (it programs what the store holds
    /// first) and its stream to `control_plane`.
    pub fn start(&mut self, control_plane: &str) {
        assert!(self.running.is_none(), "{} already runs", self.name);
        let backend = Box::new(NftablesBackend::new(Box::new(self.nft.clone())));
        let conntrack = std::sync::Arc::new(self.conntrack.clone());
        let agent = Agent::start(
            self.name.clone(),
            ProxySettings::default(),
            backend,
            self.store(),
            conntrack,
            control_plane.to_owned(),
        )
        .expect("the agent starts");
        let agent = SharedAgent::new(agent);
        let runtime = runtime("node-agent");
        let to = ControlPlane {
            url: control_plane.to_owned(),
            tls: None,
            token_file: None,
            keepalive: DEFAULT_KEEPALIVE,
        };
        runtime.spawn(kpx_dataplane::xds_client::run(
            vec![to],
            ApiAccess::default(),
            agent.clone(),
            Duration::ZERO,
        ));
        self.running = Some((runtime, agent));
    }

    /// Stops the agent (its runtime's end drops its stream), leaving store and kernel.
    pub fn stop(&mut self) {
        if let Some((runtime, agent)) = self.running.take() {
            runtime.shutdown_timeout(STOP_GRACE);
            drop(agent);
        }
    }

    /// A new, empty kernel, as after a reboot (the store stays).
    pub fn reboot_kernel(&mut self) {
        assert!(self.running.is_none(), "stop the agent first");
        self.nft = FakeNft::new();
    }

    /// The agent's store, once the agent that had it let go of it (sled's flusher thread
    /// holds its lock a moment after the last handle is dropped).
    fn store(&self) -> Store {
        wait_for("the store to be free", DEADLINE, || Store::open(self.state.path()).ok())
    }

    /// The endpoints the kernel holds for IPv4 Services (`entry . index : endpoint . port`).
    pub fn endpoints(&self) -> Vec<String> {
        self.nft.elements("endpoints-v4")
    }

    /// Waits until the kernel's IPv4 endpoints are `expected` (sorted).
    pub fn wait_endpoints(&self, what: &str, expected: &[String]) {
        wait_for(what, DEADLINE, || (self.endpoints() == expected).then_some(()));
    }
}

impl Drop for InProcessNode {
    fn drop(&mut self) {
        self.stop();
    }
}
