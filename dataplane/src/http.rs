//! The node agent's HTTP endpoints, where kube-proxy has them: `/healthz` and `/livez` (on
//! `--healthz-listen`, default `0.0.0.0:10256`), and on `--metrics-listen` (default
//! `127.0.0.1:10249`) Prometheus `/metrics`, `/proxyMode` (the backend's name, as
//! kube-proxy's mode) and that server's own `/healthz` (`ok` while it answers).

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use tokio::sync::watch;

use crate::agent::SharedAgent;
use crate::metrics::{labels, AgentMetrics};
use crate::status::{Probe, ProxyHealth};

fn health(health: &watch::Receiver<ProxyHealth>, probe: Probe, metrics: &AgentMetrics) -> Response {
    // Read from what every sync publishes, never waiting for an apply in progress.
    let (code, body) = health.borrow().answer(probe, SystemTime::now());
    let answers = match probe {
        Probe::Healthz => &metrics.healthz_answers,
        Probe::Livez => &metrics.livez_answers,
        Probe::Readyz => return json(code, body),
    };
    answers.get_or_create(&labels(&[("code", &code.to_string())])).inc();
    json(code, body)
}

fn json(code: u16, body: String) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (code, [(header::CONTENT_TYPE, "application/json"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], body)
        .into_response()
}

/// `/healthz` and `/livez`, each answer counted in `kubeproxy_proxy_{healthz,livez}_total{code}`,
/// and kpx's `/readyz`, whose body also names the agent's pod (`pod`: `instance`), so that
/// a probe can tell this agent's answer from another process's on the same port.
pub fn health_router(
    proxy_health: watch::Receiver<ProxyHealth>,
    metrics: Arc<AgentMetrics>,
    instance: Option<String>,
) -> Router {
    let (livez, livez_metrics) = (proxy_health.clone(), Arc::clone(&metrics));
    let readyz = proxy_health.clone();
    let pod = format!(",\"pod\":\"{}\"}}", instance.unwrap_or_default().escape_default());
    Router::new()
        .route("/healthz", get(move || async move { health(&proxy_health, Probe::Healthz, &metrics) }))
        .route("/livez", get(move || async move { health(&livez, Probe::Livez, &livez_metrics) }))
        .route(
            "/readyz",
            get(move || async move {
                let (code, body) = readyz.borrow().answer(Probe::Readyz, SystemTime::now());
                json(code, format!("{}{pod}", body.trim_end_matches('}')))
            }),
        )
}

/// kube-proxy's metrics server answers these two in plain text, and tools read them
/// (`curl 127.0.0.1:10249/proxyMode` is how a node says which mode its proxy runs in).
fn plain(text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], text)
        .into_response()
}

pub fn metrics_router(agent: SharedAgent) -> Router {
    let mode = agent.lock().backend_name();
    Router::new()
        .route("/proxyMode", get(move || async move { plain(mode) }))
        .route("/healthz", get(|| async { plain("ok") }))
        .route(
            "/metrics",
            get(move || async move {
                let text = {
                    let agent = agent.lock();
                    let since = agent.status.since_contact(SystemTime::now());
                    agent.metrics().xds_since_contact.set(since.as_secs_f64());
                    agent.metrics().render()
                };
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
