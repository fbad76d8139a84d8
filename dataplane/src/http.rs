//! The node agent's HTTP endpoints: kube-proxy's `/healthz` and `/livez` (on
//! `--healthz-listen`, default `0.0.0.0:10256`) and Prometheus `/metrics` (on
//! `--metrics-listen`, default `127.0.0.1:10249`).

use std::time::SystemTime;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use tokio::sync::watch;

use crate::agent::SharedAgent;
use crate::status::{Probe, ProxyHealth};

fn health(health: &watch::Receiver<ProxyHealth>, probe: Probe) -> Response {
    // Read from what every sync publishes, never waiting for an apply in progress.
    let (code, body) = health.borrow().answer(probe, SystemTime::now());
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (code, [(header::CONTENT_TYPE, "application/json"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], body)
        .into_response()
}

pub fn health_router(proxy_health: watch::Receiver<ProxyHealth>) -> Router {
    let livez = proxy_health.clone();
    Router::new()
        .route("/healthz", get(move || async move { health(&proxy_health, Probe::Healthz) }))
        .route("/livez", get(move || async move { health(&livez, Probe::Livez) }))
}

pub fn metrics_router(agent: SharedAgent) -> Router {
    Router::new().route(
        "/metrics",
        get(move || async move {
            let text = agent.lock().metrics().render();
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
        }),
    )
}

/// Serves `router` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) {
    if let Err(e) = axum::serve(listener, router).await {
        tracing::error!(error = %e, "HTTP server failed");
    }
}
