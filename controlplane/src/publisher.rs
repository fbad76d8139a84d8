//! Turns the states of all sources into snapshots. Nothing is published until
//! every source has read its initial state, so a starting control plane never
//! serves an empty or partial state that would wipe rules on nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::metrics::ControlPlaneMetrics;
use crate::model::ClusterState;
use crate::source::{ReachabilityReceiver, StateReceiver};
use crate::xds::snapshot::BuildOptions;
use crate::xds::Snapshot;

/// Every cluster's state, by cluster name.
type States = BTreeMap<String, Arc<ClusterState>>;

/// Runs until every source is gone. A cluster unreachable for longer than `grace` has its
/// endpoints withdrawn from the other clusters' global Services (its own nodes keep what
/// they have); they come back when it answers again.
pub async fn run(
    mut sources: BTreeMap<String, (StateReceiver, ReachabilityReceiver)>,
    options: BuildOptions,
    grace: Duration,
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    metrics: Arc<ControlPlaneMetrics>,
) {
    let mut previous = Arc::new(Snapshot::default());
    // What the last snapshot was built from: the states and the withdrawn clusters.
    let mut built: Option<(States, BTreeSet<String>)> = None;
    loop {
        let states: Option<States> = sources
            .iter_mut()
            .map(|(name, (rx, _))| rx.borrow_and_update().clone().map(|s| (name.clone(), s)))
            .collect();
        let mut next_expiry: Option<Instant> = None;
        let mut withdrawn = BTreeSet::new();
        for (name, (_, reachability)) in sources.iter_mut() {
            let Some(since) = reachability.borrow_and_update().unreachable_since else { continue };
            if since.elapsed() >= grace {
                withdrawn.insert(name.clone());
            } else {
                let at = since + grace;
                next_expiry = Some(next_expiry.map_or(at, |n| n.min(at)));
            }
        }
        if let Some(states) = states {
            let unchanged = built.as_ref().is_some_and(|(s, w)| {
                *w == withdrawn
                    && s.len() == states.len()
                    && s.iter().zip(&states).all(|(a, b)| a.0 == b.0 && Arc::ptr_eq(a.1, b.1))
            });
            if !unchanged {
                let before = built.as_ref().map(|(_, w)| w.clone()).unwrap_or_default();
                for cluster in withdrawn.difference(&before) {
                    tracing::warn!(cluster, grace_s = grace.as_secs(), "cluster unreachable for longer than the grace period: its endpoints are withdrawn from the other clusters");
                }
                for cluster in before.difference(&withdrawn) {
                    tracing::info!(
                        cluster,
                        "cluster back: its endpoints are offered to the other clusters again"
                    );
                }
                let options = BuildOptions { withdrawn: withdrawn.clone(), ..options.clone() };
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
                built = Some((states, withdrawn));
            }
        }
        let changes = sources.values_mut().flat_map(|(rx, reachability)| {
            [
                Box::pin(rx.changed()) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
                Box::pin(reachability.changed()),
            ]
        });
        let expiry = async {
            match next_expiry {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (result, _, _) = futures::future::select_all(changes) => {
                if result.is_err() {
                    return;
                }
            }
            () = expiry => {}
        }
    }
}
