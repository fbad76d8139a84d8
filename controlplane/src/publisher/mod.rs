//! The flow of the control plane, in one direction: the sources' events → the models
//! and what they touched ([`tracker`]) → the views of those only ([`crate::view`]) → the
//! next [`Snapshot`], which interns them → published on a `watch` for the streams.
//!
//! Nothing is published until every source has sent its first state, so a starting
//! control plane never serves an empty or partial state that would wipe rules on nodes.
//! Events that arrive while a snapshot is built are all taken before the next one, so a
//! burst becomes one snapshot. A cluster unreachable for longer than the grace period has
//! its endpoints withdrawn from the other clusters' global Services (its own nodes keep
//! what they have); they come back when it answers again.

#[cfg(test)]
mod tests;
pub mod tracker;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::metrics::ControlPlaneMetrics;
use crate::source::{ReachabilityReceiver, Update};
use crate::xds::snapshot::BuildOptions;
use crate::xds::snapshot::SnapshotReceiver;
use crate::xds::Snapshot;
use tracker::{ChangeSet, Tracker};

/// What a source has given so far, for the admin API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceStatus {
    /// Whether its first state has arrived.
    pub synced: bool,
    pub services: usize,
    pub endpoint_slices: usize,
    pub nodes: usize,
}

/// Every source's status, by cluster name.
pub type StatusReceiver = watch::Receiver<BTreeMap<String, SourceStatus>>;

/// The clusters unreachable for longer than `grace` at `now`, and when the next of the
/// others will be.
pub fn withdrawn_at<'a>(
    unreachable_since: impl IntoIterator<Item = (&'a str, Option<Instant>)>,
    grace: Duration,
    now: Instant,
) -> (BTreeSet<String>, Option<Instant>) {
    let mut withdrawn = BTreeSet::new();
    let mut next: Option<Instant> = None;
    for (cluster, since) in unreachable_since {
        // A grace period too long to add up never ends.
        let Some(at) = since.and_then(|since| since.checked_add(grace)) else { continue };
        if at <= now {
            withdrawn.insert(cluster.to_owned());
        } else {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    }
    (withdrawn, next)
}

/// How many Services' views are computed before they are taken into the snapshot (the
/// first snapshot need not hold every view at once).
const PART: usize = 512;

/// What the publisher needs to plan the MCS controller's writes (`--clusterset-cidr`).
pub struct McsPlanning {
    pub clusterset_cidrs: Vec<ipnet::IpNet>,
    /// The clusters kpx writes to (its Kubernetes sources).
    pub writable: BTreeSet<String>,
    pub plans: watch::Sender<Arc<crate::mcs::plan::Plan>>,
    /// Where the writer found an import's namespace missing (it goes into the exports'
    /// `Ready` condition): a change plans again.
    pub missing: watch::Receiver<crate::mcs::plan::MissingNamespaces>,
}

/// What the clusterset imports, for the admin API.
pub type ImportsReceiver = watch::Receiver<Arc<Vec<crate::mcs::report::ImportReport>>>;

pub struct Publisher {
    tracker: Tracker,
    mcs: Option<McsPlanning>,
    /// Whether the MCS objects were looked at since every source sent its first state.
    planned: bool,
    imports: watch::Sender<Arc<Vec<crate::mcs::report::ImportReport>>>,
    grace: Duration,
    /// The last snapshot published; empty before the first.
    snapshot: Arc<Snapshot>,
    published: bool,
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    status: watch::Sender<BTreeMap<String, SourceStatus>>,
    metrics: Arc<ControlPlaneMetrics>,
}

impl Publisher {
    /// A publisher for the sources of `clusters`; what it publishes is read from the receivers.
    pub fn new(
        clusters: impl IntoIterator<Item = String>,
        options: BuildOptions,
        grace: Duration,
        metrics: Arc<ControlPlaneMetrics>,
    ) -> (Self, SnapshotReceiver, StatusReceiver) {
        let tracker = Tracker::new(clusters, options.cluster_cidrs);
        let (snapshots, snapshot_rx) = watch::channel(None);
        let (status, status_rx) = watch::channel(tracker.status());
        let publisher = Publisher {
            tracker,
            mcs: None,
            planned: false,
            imports: watch::channel(Arc::default()).0,
            grace,
            snapshot: Arc::new(Snapshot::default()),
            published: false,
            snapshots,
            status,
            metrics,
        };
        (publisher, snapshot_rx, status_rx)
    }

    /// Plans the MCS controller's writes too, whenever an export, import or exported
    /// Service changes (and once every source has sent its first state).
    pub fn with_mcs(mut self, planning: McsPlanning) -> Self {
        self.mcs = Some(planning);
        self
    }

    /// What the clusterset imports, as last reported.
    pub fn imports(&self) -> ImportsReceiver {
        self.imports.subscribe()
    }

    /// The report of the imports and the next plan of the MCS writes, if an MCS object
    /// may have changed.
    fn follow_mcs(&mut self, changes: &ChangeSet) {
        let touched = changes.services.iter().any(|(_, key)| crate::mcs::imported(key).is_some());
        if self.planned && !touched {
            return;
        }
        self.planned = true;
        let report = crate::mcs::report::report(self.tracker.clusters());
        self.metrics.mcs_imports.set(report.iter().filter(|r| !r.exported_by.is_empty()).count() as i64);
        self.metrics.mcs_conflicts.set(report.iter().filter(|r| !r.conflicts.is_empty()).count() as i64);
        self.imports.send_if_modified(|known| {
            let differs = **known != report;
            if differs {
                *known = Arc::new(report);
            }
            differs
        });
        let Some(mcs) = &self.mcs else { return };
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let missing = mcs.missing.borrow().clone();
        let plan = crate::mcs::plan::plan(
            self.tracker.clusters(),
            &mcs.writable,
            &mcs.clusterset_cidrs,
            &missing,
            &now,
        );
        mcs.plans.send_if_modified(|known| {
            // Said once, when it first stands in a plan.
            for (key, error) in &plan.unallocated {
                if known.unallocated.get(key) != Some(error) {
                    tracing::warn!(import = %key, error = %error, "no ClusterSetIP for an import");
                }
            }
            let differs = **known != plan;
            if differs {
                *known = Arc::new(plan);
            }
            differs
        });
    }

    /// Runs until the sources are gone.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Update>,
        mut reachability: BTreeMap<String, ReachabilityReceiver>,
    ) {
        let mut pending = ChangeSet::default();
        let mut missing = self.mcs.as_ref().map(|m| m.missing.clone());
        loop {
            let since: Vec<(String, Option<Instant>)> = reachability
                .iter_mut()
                .map(|(cluster, rx)| (cluster.clone(), rx.borrow_and_update().unreachable_since))
                .collect();
            let (withdrawn, next_expiry) =
                withdrawn_at(since.iter().map(|(c, s)| (c.as_str(), *s)), self.grace, Instant::now());
            self.log_withdrawal(&withdrawn);
            self.tracker.set_withdrawn(withdrawn, &mut pending);
            if self.tracker.synced() {
                self.follow_mcs(&pending);
                self.publish(std::mem::take(&mut pending));
            }
            let status = self.tracker.status();
            self.status.send_if_modified(|known| {
                let differs = *known != status;
                if differs {
                    *known = status;
                }
                differs
            });
            let changes: Vec<Pin<Box<dyn Future<Output = _> + Send + '_>>> =
                reachability.values_mut().map(|rx| Box::pin(rx.changed()) as Pin<Box<_>>).collect();
            let reachability_changed = async {
                if changes.is_empty() {
                    std::future::pending::<Result<(), watch::error::RecvError>>().await
                } else {
                    futures::future::select_all(changes).await.0
                }
            };
            let expiry = async {
                match next_expiry {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let missing_changed = async {
                match &mut missing {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                update = events.recv() => {
                    let Some(update) = update else { return };
                    self.tracker.apply(&update.cluster, update.event, &mut pending);
                    // Take everything already waiting: one snapshot for all of it.
                    while let Ok(update) = events.try_recv() {
                        self.tracker.apply(&update.cluster, update.event, &mut pending);
                    }
                }
                result = reachability_changed => {
                    if result.is_err() {
                        return;
                    }
                }
                () = expiry => {}
                changed = missing_changed => {
                    match changed {
                        // Plan again, the exports' Ready conditions with it.
                        Ok(()) => self.planned = false,
                        Err(_) => missing = None,
                    }
                }
            }
        }
    }

    fn log_withdrawal(&self, withdrawn: &BTreeSet<String>) {
        let before = self.tracker.withdrawn();
        for cluster in withdrawn.difference(before) {
            tracing::warn!(cluster, grace_s = self.grace.as_secs(), "cluster unreachable for longer than the grace period: its endpoints are withdrawn from the other clusters");
        }
        for cluster in before.difference(withdrawn) {
            tracing::info!(cluster, "cluster back: its endpoints are offered to the other clusters again");
        }
    }

    /// Computes the views of what `changes` touched (everything, the first time) and
    /// publishes the next snapshot, if any resource differs.
    fn publish(&mut self, changes: ChangeSet) {
        if self.published && changes.is_empty() {
            return;
        }
        let started = Instant::now();
        let changes = if self.published { changes } else { self.tracker.everything() };
        let mut builder = Snapshot::builder(&self.snapshot);
        let mut interning = Duration::ZERO;
        self.tracker.views_in_parts(&changes, PART, |part| {
            let at = Instant::now();
            builder.apply(part);
            interning += at.elapsed();
        });
        let at = Instant::now();
        let next = builder.finish();
        interning += at.elapsed();
        let elapsed = started.elapsed();
        let computed = elapsed.saturating_sub(interning);
        let Some(snapshot) = next else {
            tracing::debug!(services = changes.services.len(), "views computed again, nothing differs");
            return;
        };
        self.metrics.snapshot_build.observe(elapsed.as_secs_f64());
        self.metrics.services.set(snapshot.service_count() as i64);
        self.metrics.node_variants.set(snapshot.variant_count() as i64);
        tracing::info!(
            services = snapshot.service_count(),
            node_variants = snapshot.variant_count(),
            generation = snapshot.generation(),
            touched_services = changes.services.len(),
            touched_nodes = changes.nodes.len(),
            views_us = computed.as_micros() as u64,
            snapshot_us = interning.as_micros() as u64,
            elapsed_ms = elapsed.as_millis() as u64,
            "snapshot published"
        );
        self.snapshot = Arc::new(snapshot);
        self.snapshots.send_replace(Some(Arc::clone(&self.snapshot)));
        self.published = true;
    }
}
