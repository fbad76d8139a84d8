//! `kpx-dataplane`: wiring only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kpx_dataplane::agent::{Agent, SharedAgent};
use kpx_dataplane::backend::iptables::IptablesMode;
use kpx_dataplane::backend::{BackendKind, ProxyOptions};
use kpx_dataplane::store::Store;
use kpx_dataplane::{serve, xds_client};

#[derive(Parser, Debug)]
#[command(name = "kpx-dataplane", version, about = "kpx node agent: programs the kernel from delta xDS")]
struct Args {
    /// This node's name (the xDS node id).
    #[arg(long, required_unless_present = "cleanup")]
    node_name: Option<String>,
    /// The control plane's gRPC URL, e.g. http://127.0.0.1:18000.
    #[arg(long, required_unless_present = "cleanup")]
    control_plane: Option<String>,
    /// Which kernel facility to program.
    #[arg(long, value_enum, default_value = "nftables")]
    backend: BackendKind,
    /// Where the accepted state is kept (sled).
    #[arg(long, required_unless_present = "cleanup")]
    state_dir: Option<PathBuf>,
    /// Masquerade all Service traffic (kube-proxy's masqueradeAll).
    #[arg(long)]
    masquerade_all: bool,
    /// Open NodePorts only on the node's addresses inside these prefixes (comma-separated);
    /// default: on all of the node's addresses (never on loopback).
    #[arg(long, value_delimiter = ',', value_parser = parse_cidr)]
    nodeport_addresses: Vec<ipnet::IpNet>,
    /// Which iptables flavour `--backend iptables` drives (auto: the one holding more rules).
    #[arg(long, value_enum, default_value = "auto")]
    iptables_mode: IptablesMode,
    /// Reprogram everything every this many seconds (0: never), repairing rules changed behind kpx's back.
    #[arg(long, default_value_t = 3600)]
    full_sync_period: u64,
    /// The admin gRPC API (kpx.admin.v1.NodeAdmin, health, reflection).
    #[arg(long, default_value = "127.0.0.1:18001")]
    admin_listen: std::net::SocketAddr,
    /// kube-proxy's /healthz and /livez.
    #[arg(long, default_value = "0.0.0.0:10256")]
    healthz_listen: std::net::SocketAddr,
    /// Prometheus /metrics.
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_listen: std::net::SocketAddr,
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

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    init_logs(args.log_format);
    let options =
        ProxyOptions { masquerade_all: args.masquerade_all, nodeport_cidrs: args.nodeport_addresses };
    let mut backend = match args.backend.create(options.clone(), args.iptables_mode) {
        Ok(b) => b,
        Err(message) => {
            eprintln!("kpx-dataplane: {message}");
            return ExitCode::from(2);
        }
    };
    if args.cleanup {
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
    // clap guarantees these when --cleanup is absent.
    let (Some(node_name), Some(control_plane), Some(state_dir)) =
        (args.node_name, args.control_plane, args.state_dir)
    else {
        eprintln!("kpx-dataplane: --node-name, --control-plane and --state-dir are required");
        return ExitCode::from(2);
    };
    if let Err(e) = tonic::transport::Endpoint::from_shared(control_plane.clone()) {
        eprintln!("kpx-dataplane: --control-plane {control_plane:?}: not a URL: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = std::fs::create_dir_all(&state_dir) {
        eprintln!("kpx-dataplane: --state-dir {}: {e}", state_dir.display());
        return ExitCode::from(2);
    }
    let full_sync_period =
        (args.full_sync_period > 0).then(|| std::time::Duration::from_secs(args.full_sync_period));
    let listen = serve::Listen {
        admin: args.admin_listen,
        healthz: args.healthz_listen,
        metrics: args.metrics_listen,
    };
    let result = (|| -> anyhow::Result<()> {
        let store = Store::open(&state_dir)?;
        let agent = SharedAgent::new(Agent::start(node_name, backend, store, control_plane.clone())?);
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(async {
            serve::start(&agent, options, listen).await?;
            tokio::select! {
                _ = xds_client::run(control_plane, agent, full_sync_period) => {},
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
