//! The control plane's run: everything `main` starts once its configuration is parsed
//! and its sources prepared, on listeners it bound. The binary and the rootless tests run
//! this same code.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use kpx_proto::admin::control_plane_admin_server::ControlPlaneAdminServer;
use kpx_proto::tls::ReloadingServerConfig;
use tokio::net::TcpListener;

use crate::admin::ControlPlaneAdminService;
use crate::config::Config;
use crate::metrics::ControlPlaneMetrics;
use crate::probes;
use crate::publisher::{McsPlanning, Publisher};
use crate::source::{self, kubernetes::TokenReviews, Prepared};
use crate::trust::{self, TokenReviewer, Trust};
use crate::xds;
use crate::xds::nodes::NodeRegistry;
use crate::xds::snapshot::BuildOptions;

/// The sockets a control plane serves on, bound by the caller (`--listen`,
/// `--metrics-listen`; a test binds port 0).
pub struct Listeners {
    pub grpc: TcpListener,
    pub metrics: TcpListener,
}

/// How many source events may wait for the publisher before a source waits too.
const EVENTS_QUEUED: usize = 64;

/// Runs the control plane until `shutdown` completes: its sources (already prepared), the
/// publisher, the metrics and probes on `listeners.metrics`, and delta ADS, the admin API,
/// health and reflection on `listeners.grpc` (TLS when `tls` is given).
pub async fn run(
    args: Config,
    tls: Option<Arc<ReloadingServerConfig>>,
    prepared: Vec<Prepared>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Listeners { grpc: listener, metrics: metrics_listener } = listeners;
    let metrics_addr = metrics_listener.local_addr().context("the metrics listener")?;
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
    let reviewer = (!apis.is_empty()).then(|| {
        let reviews = Arc::new(TokenReviews::new(apis.clone())) as Arc<dyn TokenReviewer>;
        Arc::new(crate::trust::review_cache::CachedReviews::new(reviews)) as Arc<dyn TokenReviewer>
    });
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
    let imports_rx = publisher.imports();
    let publisher = match (&args.mcs, apis.first()) {
        (Some(mcs), Some((home, lease_client))) => {
            let (plans, plans_rx) = tokio::sync::watch::channel(Arc::default());
            let (leader, leader_rx) = tokio::sync::watch::channel(false);
            let identity = crate::mcs::election::identity();
            tracing::info!(cluster = home, lease = %mcs.lease, identity, clusterset_cidrs = ?mcs.clusterset_cidrs, "the clusterset's MCS controller: electing the writer");
            tokio::spawn(crate::mcs::election::run(
                lease_client.clone(),
                mcs.lease.clone(),
                identity,
                leader,
            ));
            let clients: BTreeMap<String, _> = apis.iter().cloned().collect();
            let writable = clients.keys().cloned().collect();
            let (missing, missing_rx) = tokio::sync::watch::channel(Default::default());
            let writer = crate::mcs::writer::run(clients, plans_rx, leader_rx, missing, Arc::clone(&metrics));
            tokio::spawn(writer);
            publisher.with_mcs(McsPlanning {
                clusterset_cidrs: mcs.clusterset_cidrs.clone(),
                writable,
                plans,
                missing: missing_rx,
            })
        }
        _ => publisher,
    };
    tokio::spawn(publisher.run(events, reachability));
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
        ControlPlaneAdminService::new(
            snapshot_rx.clone(),
            nodes.clone(),
            args.sources.clone(),
            status_rx,
            imports_rx,
        ),
        move |request: tonic::Request<()>| admin_trust.admit_admin(&request).map(|()| request),
    );
    let ads = xds::transport::AdsService::new(
        xds::server::AdsServer::new(snapshot_rx, nodes, metrics).with_ack_timeout(args.ack_timeout),
        trust,
    );
    let reflection = kpx_proto::grpc::reflection_routes(kpx_proto::grpc::Server::ControlPlane)
        .context("reflection descriptors")?;
    tracing::info!(
        listen = %listener.local_addr().context("the gRPC listener")?,
        metrics = %metrics_addr,
        tls = tls.is_some(),
        allocator_background_thread = crate::memory::background_thread(),
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
            router.serve_with_incoming_shutdown(trust::listener::incoming(listener, config), shutdown).await
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::StreamExt::map(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        |c| c.map(trust::connection::Closable::new),
                    ),
                    shutdown,
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
