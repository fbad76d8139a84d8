//! Turns the states of all sources into snapshots. Nothing is published until
//! every source has read its initial state, so a starting control plane never
//! serves an empty or partial state that would wipe rules on nodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::metrics::ControlPlaneMetrics;
use crate::model::ClusterState;
use crate::source::{ReachabilityReceiver, StateReceiver};
use crate::xds::snapshot::BuildOptions;
use crate::xds::Snapshot;

/// Runs until every source is gone.
pub async fn run(
    mut sources: BTreeMap<String, (StateReceiver, ReachabilityReceiver)>,
    options: BuildOptions,
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    metrics: Arc<ControlPlaneMetrics>,
) {
    let mut previous = Arc::new(Snapshot::default());
    loop {
        let states: Option<BTreeMap<String, Arc<ClusterState>>> = sources
            .iter_mut()
            .map(|(name, (rx, _))| rx.borrow_and_update().clone().map(|s| (name.clone(), s)))
            .collect();
        if let Some(states) = states {
            let started = std::time::Instant::now();
            let snapshot = Arc::new(Snapshot::build(&states, &previous, &options));
            metrics.snapshot_build.observe(started.elapsed().as_secs_f64());
            metrics.services.set(snapshot.service_count() as i64);
            metrics.node_variants.set(snapshot.variant_count() as i64);
            tracing::info!(
                services = snapshot.service_count(),
                node_variants = snapshot.variant_count(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "snapshot published"
            );
            previous = Arc::clone(&snapshot);
            tx.send_replace(Some(snapshot));
        }
        let changes = sources.values_mut().map(|(rx, _)| Box::pin(rx.changed()));
        if futures::future::select_all(changes).await.0.is_err() {
            return;
        }
    }
}
