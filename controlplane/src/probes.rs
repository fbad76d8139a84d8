//! The HTTP probes a Deployment points its kubelet at, served beside `/metrics`:
//! `/readyz` answers 200 once every source has given its first state (until then a
//! replica would serve nodes a partial cluster, so it takes no traffic), 503 naming the
//! sources still syncing; `/livez` answers 200 while the process serves. The gRPC health
//! service's overall status (`""`) follows readiness too, for clients that ask over gRPC.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use tonic_health::server::HealthReporter;

use crate::publisher::{SourceStatus, StatusReceiver};

/// The sources of `status` that have not given their first state, by cluster name.
pub fn unsynced(status: &BTreeMap<String, SourceStatus>) -> Vec<&str> {
    status.iter().filter(|(_, s)| !s.synced).map(|(cluster, _)| cluster.as_str()).collect()
}

/// `/readyz`'s answer for `status`.
pub fn readiness(status: &BTreeMap<String, SourceStatus>) -> (StatusCode, String) {
    let waiting = unsynced(status);
    if waiting.is_empty() {
        (StatusCode::OK, format!("ok: {} source(s) synced\n", status.len()))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: waiting for the first state of {}\n", waiting.join(", ")),
        )
    }
}

/// `/readyz` and `/livez`, to merge into the metrics router.
pub fn router(status: StatusReceiver) -> axum::Router {
    axum::Router::new()
        .route(
            "/readyz",
            axum::routing::get(move || {
                let status = status.clone();
                async move { readiness(&status.borrow()) }
            }),
        )
        .route("/livez", axum::routing::get(|| async { "ok\n" }))
}

/// Keeps the gRPC health service's overall status (`""`) at SERVING while every source
/// has synced and NOT_SERVING before; runs until the publisher is gone.
pub async fn follow_in_grpc_health(mut status: StatusReceiver, reporter: HealthReporter) {
    loop {
        let ready = unsynced(&status.borrow_and_update()).is_empty();
        let serving = if ready {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        reporter.set_service_status("", serving).await;
        if status.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_once_every_source_synced() {
        let synced = SourceStatus { synced: true, ..Default::default() };
        let mut status = BTreeMap::from([
            ("east".to_owned(), synced.clone()),
            ("west".to_owned(), SourceStatus::default()),
        ]);
        let (code, body) = readiness(&status);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("west") && !body.contains("east"), "{body}");
        status.insert("west".to_owned(), synced);
        assert_eq!(readiness(&status).0, StatusCode::OK);
    }
}
