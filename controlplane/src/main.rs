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
use kpx_controlplane::publisher::Publisher;
use kpx_controlplane::source::{self, SourceSpec};
use kpx_controlplane::xds;
use kpx_controlplane::xds::nodes::NodeRegistry;
use kpx_controlplane::xds::snapshot::BuildOptions;
use kpx_proto::admin::control_plane_admin_server::ControlPlaneAdminServer;
use kpx_proto::cli::LogFormat;
use std::sync::Arc;

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
    #[arg(long, default_value = "5m", value_parser = kpx_proto::cli::parse_duration)]
    cluster_grace_period: std::time::Duration,
    /// gRPC address: delta ADS, the admin API, health and reflection.
    #[arg(long, default_value = "0.0.0.0:18000")]
    listen: SocketAddr,
    /// Prometheus /metrics.
    #[arg(long, default_value = "127.0.0.1:18002")]
    metrics_listen: SocketAddr,
    /// Log format: human or json.
    #[arg(long, default_value = "human", value_parser = str::parse::<LogFormat>)]
    log_format: LogFormat,
}

/// A `--cluster-cidr` value; host bits are cleared, as kube-proxy does.
fn cidr(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .map(|net| net.trunc())
        .map_err(|_| format!("{text:?} is not a CIDR (e.g. 10.244.0.0/16)"))
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
    kpx_proto::cli::init_logs(args.log_format);
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
                eprintln!("kpx-controlplane: {}", causes(&e));
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

/// An error and its causes, each once: `a: b: c` (kube's errors repeat their cause in
/// their own message, so a cause already said is not said again).
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    text
}

/// How many source events may wait for the publisher before a source waits too.
const EVENTS_QUEUED: usize = 64;

async fn run(args: Args, prepared: Vec<source::Prepared>) -> anyhow::Result<()> {
    let (events_tx, events) = tokio::sync::mpsc::channel(EVENTS_QUEUED);
    let mut reachability = BTreeMap::new();
    for (spec, prepared) in args.sources.iter().zip(prepared) {
        reachability.insert(spec.cluster.clone(), source::spawn(&spec.cluster, prepared, events_tx.clone()));
    }
    drop(events_tx);
    let metrics = Arc::new(ControlPlaneMetrics::default());
    let nodes = NodeRegistry::default();
    let mut cluster_cidrs = args.cluster_cidrs.clone();
    cluster_cidrs.sort();
    cluster_cidrs.dedup();
    let options = BuildOptions { cluster_cidrs, ..Default::default() };
    let clusters = args.sources.iter().map(|s| s.cluster.clone());
    let (publisher, snapshot_rx, status_rx) =
        Publisher::new(clusters, options, args.cluster_grace_period, Arc::clone(&metrics));
    tokio::spawn(publisher.run(events, reachability));
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
        args.sources.clone(),
        status_rx,
    ));
    let ads = xds::transport::AdsService::new(xds::server::AdsServer::new(snapshot_rx, nodes, metrics));
    let reflection = kpx_proto::grpc::reflection_routes(kpx_proto::grpc::Server::ControlPlane)
        .context("reflection descriptors")?;
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
    kpx_proto::cli::shutdown_signal().await;
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

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
