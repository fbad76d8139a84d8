//! `kpx-controlplane`: wiring only. Configuration is parsed here; the work
//! happens in the library.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use kpx_controlplane::admin::ControlPlaneAdminService;
use kpx_controlplane::config::{Config, Flags, Security};
use kpx_controlplane::metrics::ControlPlaneMetrics;
use kpx_controlplane::probes;
use kpx_controlplane::publisher::Publisher;
use kpx_controlplane::source::{self, kubernetes::TokenReviews, Prepared};
use kpx_controlplane::trust::{self, TokenReviewer, Trust};
use kpx_controlplane::xds;
use kpx_controlplane::xds::nodes::NodeRegistry;
use kpx_controlplane::xds::snapshot::BuildOptions;
use kpx_proto::admin::control_plane_admin_server::ControlPlaneAdminServer;
use kpx_proto::tls::ReloadingServerConfig;

/// jemalloc (see `kpx_controlplane::memory`), with its options.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its options from this symbol when it starts.
#[export_name = "_rjem_malloc_conf"]
#[used]
static JEMALLOC_OPTIONS: &[u8; 60] = kpx_controlplane::memory::JEMALLOC_OPTIONS;

fn main() -> ExitCode {
    let flags = match Flags::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    kpx_proto::cli::init_logs(flags.log_format);
    let config = match Config::resolve(flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kpx-controlplane: {e}");
            return ExitCode::from(2);
        }
    };
    let tls = match &config.security {
        Security::Tls(files) => match ReloadingServerConfig::load(files.clone()) {
            Ok(tls) => Some(Arc::new(tls)),
            Err(e) => {
                eprintln!("kpx-controlplane: --tls-cert/--tls-key/--tls-client-ca: {e}");
                return ExitCode::from(2);
            }
        },
        Security::Plaintext => None,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kpx-controlplane: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut prepared = Vec::new();
    for spec in &config.sources {
        match runtime.block_on(source::prepare(spec)) {
            Ok(p) => prepared.push(p),
            Err(e) => {
                eprintln!("kpx-controlplane: {}", kpx_proto::cli::causes(&e));
                return ExitCode::from(2);
            }
        }
    }
    match runtime.block_on(run(config, tls, prepared)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// How many source events may wait for the publisher before a source waits too.
const EVENTS_QUEUED: usize = 64;

async fn run(
    args: Config,
    tls: Option<Arc<ReloadingServerConfig>>,
    prepared: Vec<Prepared>,
) -> anyhow::Result<()> {
    let (events_tx, events) = tokio::sync::mpsc::channel(EVENTS_QUEUED);
    let mut reachability = BTreeMap::new();
    let apis: Vec<_> = args
        .sources
        .iter()
        .zip(&prepared)
        .filter_map(|(spec, p)| match p {
            Prepared::Kube(client) => Some((spec.cluster.clone(), client.clone())),
            Prepared::File(_) => None,
        })
        .collect();
    let reviewer = (!apis.is_empty()).then(|| Arc::new(TokenReviews::new(apis)) as Arc<dyn TokenReviewer>);
    for (spec, prepared) in args.sources.iter().zip(prepared) {
        reachability.insert(spec.cluster.clone(), source::spawn(&spec.cluster, prepared, events_tx.clone()));
    }
    drop(events_tx);
    let metrics = Arc::new(ControlPlaneMetrics::default());
    let nodes = NodeRegistry::default();
    let options = BuildOptions { cluster_cidrs: args.cluster_cidrs.clone(), ..Default::default() };
    let clusters = args.sources.iter().map(|s| s.cluster.clone());
    let (publisher, snapshot_rx, status_rx) =
        Publisher::new(clusters, options, args.cluster_grace_period, Arc::clone(&metrics));
    tokio::spawn(publisher.run(events, reachability));
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--metrics-listen)", args.metrics_listen))?;
    let router = metrics_router(Arc::clone(&metrics)).merge(probes::router(status_rx.clone()));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(metrics_listener, router).await {
            tracing::error!(error = %e, "metrics server failed");
        }
    });

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<xds::transport::AdsService>().await;
    health_reporter.set_serving::<ControlPlaneAdminServer<ControlPlaneAdminService>>().await;
    tokio::spawn(probes::follow_in_grpc_health(status_rx.clone(), health_reporter));
    let trust = Arc::new(Trust::new(
        tls.is_some(),
        reviewer,
        args.token_audience.clone(),
        args.admin_identities.clone(),
        Arc::clone(&metrics),
    ));
    let admin_trust = Arc::clone(&trust);
    let admin = ControlPlaneAdminServer::with_interceptor(
        ControlPlaneAdminService::new(snapshot_rx.clone(), nodes.clone(), args.sources.clone(), status_rx),
        move |request: tonic::Request<()>| admin_trust.admit_admin(&request).map(|()| request),
    );
    let ads = xds::transport::AdsService::new(
        xds::server::AdsServer::new(snapshot_rx, nodes, metrics).with_ack_timeout(args.ack_timeout),
        trust,
    );
    let reflection = kpx_proto::grpc::reflection_routes(kpx_proto::grpc::Server::ControlPlane)
        .context("reflection descriptors")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(
        listen = %args.listen,
        metrics = %args.metrics_listen,
        tls = tls.is_some(),
        allocator_background_thread = kpx_controlplane::memory::background_thread(),
        "serving delta xDS and the admin API"
    );
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(xds::transport::KEEPALIVE))
        .http2_keepalive_timeout(Some(xds::transport::KEEPALIVE))
        .add_routes(reflection)
        .add_service(health_service)
        .add_service(admin)
        .add_service(ads);
    match tls {
        Some(config) => {
            router.serve_with_incoming_shutdown(trust::listener::incoming(listener, config), shutdown()).await
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::StreamExt::map(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        |c| c.map(trust::connection::Closable::new),
                    ),
                    shutdown(),
                )
                .await
        }
    }
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
