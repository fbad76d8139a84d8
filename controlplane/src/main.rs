//! `kpx-controlplane`: wiring only. Configuration is parsed here; the work
//! happens in the library.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ipnet::IpNet;
use kpx_controlplane::admin::ControlPlaneAdminService;
use kpx_controlplane::metrics::ControlPlaneMetrics;
use kpx_controlplane::source::{self, SourceSpec};
use kpx_controlplane::xds::nodes::NodeRegistry;
use kpx_controlplane::xds::snapshot::BuildOptions;
use kpx_controlplane::{publisher, xds};
use kpx_proto::admin::control_plane_admin_server::ControlPlaneAdminServer;
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(
    name = "kpx-controlplane",
    version,
    about = "kpx control plane: serves per-node Service views over delta xDS"
)]
struct Args {
    /// Where cluster state comes from: `[NAME=]file:DIR` (a folder of manifests),
    /// `[NAME=]kubeconfig:PATH[#CONTEXT]` or `[NAME=]in-cluster` (a Kubernetes API server).
    /// Repeatable: each NAME is a cluster, the home of its own nodes.
    #[arg(long = "source", required = true, value_name = "SOURCE")]
    sources: Vec<SourceSpec>,
    /// The cluster's pod CIDR(s): traffic from inside them is pod traffic, not
    /// masqueraded on its way to a ClusterIP. Repeatable (one per IP family).
    /// Without it, each node uses its own podCIDRs.
    #[arg(long = "cluster-cidr", value_name = "CIDR", value_parser = cidr)]
    cluster_cidrs: Vec<IpNet>,
    /// How long a cluster may be unreachable (API server or folder) before its endpoints
    /// are withdrawn from the other clusters' global Services (e.g. 90s, 5m).
    #[arg(long, default_value = "5m", value_parser = duration)]
    cluster_grace_period: std::time::Duration,
    /// gRPC address: delta ADS, the admin API, health and reflection.
    #[arg(long, default_value = "0.0.0.0:18000")]
    listen: SocketAddr,
    /// Prometheus /metrics.
    #[arg(long, default_value = "127.0.0.1:18002")]
    metrics_listen: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value = "human")]
    log_format: LogFormat,
}

/// A `--cluster-cidr` value; host bits are cleared, as kube-proxy does.
fn cidr(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .map(|net| net.trunc())
        .map_err(|_| format!("{text:?} is not a CIDR (e.g. 10.244.0.0/16)"))
}

/// A duration as `90s`, `5m`, `1h30m`, `500ms`.
fn duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 90s, 5m, 1h30m)");
    let mut total = std::time::Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ms" => std::time::Duration::from_millis(1),
            "s" => std::time::Duration::from_secs(1),
            "m" => std::time::Duration::from_secs(60),
            "h" => std::time::Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        rest = &rest[unit..];
        total += scale * u32::try_from(number).map_err(|_| bad())?;
    }
    Ok(total)
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
    let mut names = std::collections::BTreeSet::new();
    if let Some(dup) = args.sources.iter().find(|s| !names.insert(s.cluster.as_str())) {
        eprintln!("kpx-controlplane: --source: cluster name {:?} given twice", dup.cluster);
        return ExitCode::from(2);
    }
    init_logs(args.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kpx-controlplane: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut prepared = Vec::new();
    for spec in &args.sources {
        match runtime.block_on(source::prepare(spec)) {
            Ok(p) => prepared.push(p),
            Err(e) => {
                eprintln!("kpx-controlplane: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match runtime.block_on(run(args, prepared)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
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

async fn run(args: Args, prepared: Vec<source::Prepared>) -> anyhow::Result<()> {
    let mut sources = BTreeMap::new();
    let mut source_list = Vec::new();
    for (spec, prepared) in args.sources.iter().zip(prepared) {
        let (rx, reachability) = source::spawn(&spec.cluster, prepared);
        source_list.push((spec.clone(), rx.clone()));
        sources.insert(spec.cluster.clone(), (rx, reachability));
    }
    let metrics = Arc::new(ControlPlaneMetrics::default());
    let nodes = NodeRegistry::default();
    let (snapshot_tx, snapshot_rx) = watch::channel(None);
    let mut cluster_cidrs = args.cluster_cidrs.clone();
    cluster_cidrs.sort();
    cluster_cidrs.dedup();
    let options = BuildOptions { cluster_cidrs, ..Default::default() };
    tokio::spawn(publisher::run(
        sources,
        options,
        args.cluster_grace_period,
        snapshot_tx,
        Arc::clone(&metrics),
    ));
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--metrics-listen)", args.metrics_listen))?;
    let router = metrics_router(Arc::clone(&metrics));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(metrics_listener, router).await {
            tracing::error!(error = %e, "metrics server failed");
        }
    });

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<xds::transport::AdsService>().await;
    health_reporter.set_serving::<ControlPlaneAdminServer<ControlPlaneAdminService>>().await;
    let admin = ControlPlaneAdminServer::new(ControlPlaneAdminService::new(
        snapshot_rx.clone(),
        nodes.clone(),
        source_list,
    ));
    let ads = xds::transport::AdsService::new(xds::server::AdsServer::new(snapshot_rx, nodes, metrics));
    let reflection = kpx_proto::grpc::reflection_routes(true).context("reflection descriptors")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, metrics = %args.metrics_listen, "serving delta xDS and the admin API");
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .add_routes(reflection)
        .add_service(health_service)
        .add_service(admin)
        .add_service(ads)
        .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), shutdown())
        .await
        .context("gRPC server failed")
}

fn metrics_router(metrics: Arc<ControlPlaneMetrics>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move {
            (
                [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                metrics.render(),
            )
        }),
    )
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
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(duration("1h30m"), Ok(std::time::Duration::from_secs(5400)));
        assert_eq!(duration("250ms"), Ok(std::time::Duration::from_millis(250)));
        assert!(duration("").is_err());
        assert!(duration("5").is_err());
        assert!(duration("5d").is_err());
    }

    #[test]
    fn cluster_cidrs_are_repeatable_and_a_bad_one_names_the_flag() {
        let args = Args::try_parse_from([
            "kpx-controlplane",
            "--source=file:/tmp",
            "--cluster-cidr=10.244.0.1/16",
            "--cluster-cidr",
            "fd00:10::/56",
        ])
        .expect("valid");
        let shown: Vec<String> = args.cluster_cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.244.0.0/16", "fd00:10::/56"]);
        let err =
            Args::try_parse_from(["kpx-controlplane", "--source=file:/tmp", "--cluster-cidr=10.0.0.0/33"])
                .expect_err("bad CIDR");
        assert!(err.use_stderr());
        assert!(err.to_string().contains("--cluster-cidr"), "{err}");
        assert!(err.to_string().contains("is not a CIDR"), "{err}");
    }
}
