//! `kpx-dataplane`: wiring only.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kpx_dataplane::agent::{Agent, SharedAgent};
use kpx_dataplane::backend::iptables::IptablesMode;
use kpx_dataplane::backend::BackendKind;
use kpx_dataplane::config::{self, AgentConfig, Flags};
use kpx_dataplane::store::Store;
use kpx_dataplane::{serve, xds_client};

#[derive(Parser, Debug)]
#[command(name = "kpx-dataplane", version, about = "kpx node agent: programs the kernel from delta xDS")]
struct Args {
    /// A KubeProxyConfiguration-style YAML file; flags given on the command line win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's name (the xDS node id).
    #[arg(long)]
    node_name: Option<String>,
    /// The control plane's gRPC URL, e.g. http://127.0.0.1:18000.
    #[arg(long)]
    control_plane: Option<String>,
    /// Which kernel facility to program [default: nftables].
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Where the accepted state is kept (sled).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Masquerade all Service traffic (kube-proxy's masqueradeAll).
    #[arg(long)]
    masquerade_all: bool,
    /// Open NodePorts only on the node's addresses inside these prefixes (comma-separated);
    /// default: on all of the node's addresses (never on loopback).
    #[arg(long, value_delimiter = ',', value_parser = parse_cidr)]
    nodeport_addresses: Option<Vec<ipnet::IpNet>>,
    /// Pod CIDRs for local-traffic detection (comma-separated); default: the control plane's.
    #[arg(long, value_delimiter = ',', value_parser = parse_cidr)]
    cluster_cidr: Option<Vec<ipnet::IpNet>>,
    /// Which iptables flavour `--backend iptables` drives [default: auto: the one holding more rules].
    #[arg(long, value_enum)]
    iptables_mode: Option<IptablesMode>,
    /// Reprogram everything this often (0s: never), repairing rules changed behind kpx's back [default: 1h].
    #[arg(long, value_parser = config::parse_duration)]
    full_sync_period: Option<Duration>,
    /// Apply deltas at most this often; the control plane coalesces changes meanwhile [default: 0s].
    #[arg(long, value_parser = config::parse_duration)]
    min_sync_period: Option<Duration>,
    /// The IPVS scheduler (rr, wrr, lc, wlc, sh, dh, mh) of Services without the
    /// `service.kpx.io/ipvs-scheduler` annotation [default: rr].
    #[arg(long, value_parser = config::parse_scheduler)]
    ipvs_scheduler: Option<String>,
    /// How long an IPVS destination that went away may keep its connections before it is
    /// removed (it takes no new ones meanwhile) [default: 15m].
    #[arg(long, value_parser = config::parse_duration)]
    ipvs_drain_grace: Option<Duration>,
    /// The admin gRPC API (kpx.admin.v1.NodeAdmin, health, reflection) [default: 127.0.0.1:18001].
    #[arg(long)]
    admin_listen: Option<std::net::SocketAddr>,
    /// kube-proxy's /healthz and /livez [default: 0.0.0.0:10256].
    #[arg(long)]
    healthz_listen: Option<std::net::SocketAddr>,
    /// Prometheus /metrics [default: 127.0.0.1:10249].
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Remove everything kpx programmed, then exit.
    #[arg(long)]
    cleanup: bool,
    /// Log format.
    #[arg(long, value_enum, default_value = "human")]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Human,
    Json,
}

fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("kpx-dataplane: {message}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    init_logs(args.log_format);
    let cleanup = args.cleanup;
    let flags = Flags {
        config: args.config,
        node_name: args.node_name,
        control_plane: args.control_plane,
        backend: args.backend,
        state_dir: args.state_dir,
        masquerade_all: args.masquerade_all,
        nodeport_addresses: args.nodeport_addresses,
        cluster_cidrs: args.cluster_cidr,
        iptables_mode: args.iptables_mode,
        full_sync_period: args.full_sync_period,
        min_sync_period: args.min_sync_period,
        ipvs_scheduler: args.ipvs_scheduler,
        ipvs_drain_grace: args.ipvs_drain_grace,
        admin_listen: args.admin_listen,
        healthz_listen: args.healthz_listen,
        metrics_listen: args.metrics_listen,
    };
    let config = match AgentConfig::resolve(flags) {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let mut backend = match config.backend.create(&config) {
        Ok(b) => b,
        Err(message) => return usage_error(message),
    };
    if cleanup {
        return match backend.cleanup() {
            Ok(()) => {
                tracing::info!(backend = backend.name(), "removed everything kpx programmed");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!("cleanup failed: {e}");
                ExitCode::from(1)
            }
        };
    }
    let (Some(node_name), Some(control_plane), Some(state_dir)) =
        (config.node_name.clone(), config.control_plane.clone(), config.state_dir.clone())
    else {
        return usage_error(
            "--node-name, --control-plane and --state-dir are required (or hostnameOverride, kpx.controlPlane, kpx.stateDir in --config)",
        );
    };
    if let Err(e) = tonic::transport::Endpoint::from_shared(control_plane.clone()) {
        return usage_error(format!("--control-plane {control_plane:?}: not a URL: {e}"));
    }
    if let Err(e) = std::fs::create_dir_all(&state_dir) {
        return usage_error(format!("--state-dir {}: {e}", state_dir.display()));
    }
    let listen = serve::Listen {
        admin: config.admin_listen,
        healthz: config.healthz_listen,
        metrics: config.metrics_listen,
    };
    let sync = xds_client::SyncPeriods { full: config.full_sync_period, min: config.min_sync_period };
    let result = (|| -> anyhow::Result<()> {
        let store = Store::open(&state_dir)?;
        let agent = SharedAgent::new(Agent::start(node_name, backend, store, control_plane.clone())?);
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(async {
            serve::start(&agent, config.options.clone(), listen).await?;
            tokio::select! {
                _ = xds_client::run(control_plane, agent, sync) => {},
                _ = shutdown() => {},
            }
            anyhow::Ok(())
        })
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

fn parse_cidr(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse().map_err(|_| format!("{text:?} is not a CIDR (like 10.0.0.0/8)"))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down; rules stay in place (use --cleanup to remove them)");
}
