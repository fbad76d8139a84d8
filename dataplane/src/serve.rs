//! Starts the node agent's servers: admin gRPC (NodeAdmin, health,
//! reflection), kube-proxy's health endpoints, metrics, and the Services'
//! health-check node ports.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use kpx_proto::admin::node_admin_server::NodeAdminServer;

use crate::admin::NodeAdminService;
use crate::agent::SharedAgent;
use crate::{healthcheck, http};

/// Where the servers listen.
#[derive(Debug, Clone, Copy)]
pub struct Listen {
    pub admin: SocketAddr,
    pub healthz: SocketAddr,
    pub metrics: SocketAddr,
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// Binds every listener (so a taken port is an error at start) and serves in the background.
/// `/readyz` names `pod_uid`.
pub async fn start(agent: &SharedAgent, listen: Listen, pod_uid: Option<String>) -> anyhow::Result<()> {
    let admin = bind(listen.admin, "--admin-listen").await?;
    let healthz = bind(listen.healthz, "--healthz-listen").await?;
    let metrics = bind(listen.metrics, "--metrics-listen").await?;
    let (checks, proxy_health, metrics_of_agent) = {
        let agent = agent.lock();
        (agent.health_checks(), agent.proxy_health(), Arc::clone(agent.metrics()))
    };
    tokio::spawn(healthcheck::serve(checks, proxy_health.clone()));
    tokio::spawn(http::serve(healthz, http::health_router(proxy_health, metrics_of_agent, pod_uid)));
    tokio::spawn(http::serve(metrics, http::metrics_router(agent.clone())));
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<NodeAdminServer<NodeAdminService>>().await;
    let routes = kpx_proto::grpc::reflection_routes(kpx_proto::grpc::Server::NodeAgent)
        .context("reflection descriptors")?;
    let service = NodeAdminServer::new(NodeAdminService::new(agent.clone()));
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_routes(routes)
            .add_service(health_service)
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(admin))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin gRPC server failed");
        }
    });
    tracing::info!(admin = %listen.admin, healthz = %listen.healthz, metrics = %listen.metrics, "admin, health and metrics servers listening");
    Ok(())
}
