//! The MCS controller's writer: while this replica leads, it carries out the newest
//! [`Plan`] against each cluster's API server. A write that fails (RBAC, a conflict, a
//! missing namespace, an API server down) is logged when it starts failing and when it
//! is done, and tried again with
//! backoff (1 s doubling to 30 s) for as long as it is planned; nothing is lost, since
//! the plan is remade from the API objects whenever they change, and what was not written
//! is still in it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::kube::{
    apply_import, apply_slice, delete_import, delete_slice, set_export_conditions, RequestError,
};
use super::plan::{MissingNamespaces, Plan, Write};
use crate::metrics::ControlPlaneMetrics;
use crate::model::ObjectKey;
use crate::source::kubernetes::ApiClient;

/// No write is retried sooner than a second after it failed.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);
/// How long one write may take before it counts as failed: an API server that accepts
/// connections and answers nothing must not hold the other clusters' writes for the
/// client's own timeouts (minutes).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A target whose last write failed.
struct Failing {
    cause: String,
    attempts: u32,
    next: Instant,
}

impl Failing {
    /// Records one more failure: logged (WARN) when the target starts failing, and once it
    /// writes again ("done after failures"); a cause that changes meanwhile is DEBUG (a
    /// cluster that is down alternates between "did not answer" and "Connect" errors,
    /// which would otherwise be a WARN every few retries for as long as it is down).
    fn failed(&mut self, at: &Target, write: &Write, cause: String) -> Instant {
        if self.cause.is_empty() {
            tracing::warn!(cluster = at.0, kind = at.1, object = %at.2, write = kind_of(write), error = %cause, "MCS write failed; retrying with backoff");
        } else if self.cause != cause {
            tracing::debug!(cluster = at.0, kind = at.1, object = %at.2, write = kind_of(write), error = %cause, "MCS write failed again, otherwise");
        }
        if self.cause != cause {
            self.cause = cause;
        }
        let backoff = FIRST_RETRY.saturating_mul(1 << self.attempts.min(8)).min(LAST_RETRY);
        self.attempts += 1;
        self.next = Instant::now() + backoff;
        self.next
    }
}

/// Why a write failed.
enum Failure {
    Refused(RequestError),
    /// No answer within [`WRITE_TIMEOUT`].
    Silent,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(e) => e.fmt(f),
            Failure::Silent => write!(f, "the API server did not answer within {WRITE_TIMEOUT:?}"),
        }
    }
}

/// Carries out one write, within [`WRITE_TIMEOUT`].
async fn execute(client: &ApiClient, write: &Write) -> Result<(), Failure> {
    let request = async {
        match write {
            Write::ApplyImport { key, import, .. } => apply_import(client, key, import).await,
            Write::DeleteImport { key, .. } => delete_import(client, key).await,
            Write::ExportConditions { key, conditions, .. } => {
                set_export_conditions(client, key, conditions).await
            }
            Write::ApplySlice { key, slice, .. } => apply_slice(client, key, slice).await,
            Write::DeleteSlice { key, .. } => delete_slice(client, key).await,
        }
    };
    match tokio::time::timeout(WRITE_TIMEOUT, request).await {
        Ok(result) => result.map_err(Failure::Refused),
        Err(_) => Err(Failure::Silent),
    }
}

type Target = (String, &'static str, ObjectKey);

fn target(write: &Write) -> Target {
    let (cluster, kind, key) = write.target();
    (cluster.to_owned(), kind, key.clone())
}

fn kind_of(write: &Write) -> &'static str {
    match write {
        Write::ApplyImport { .. } => "apply_import",
        Write::DeleteImport { .. } => "delete_import",
        Write::ExportConditions { .. } => "export_conditions",
        Write::ApplySlice { .. } => "apply_slice",
        Write::DeleteSlice { .. } => "delete_slice",
    }
}

/// Logs, once per change (conditions are written only when their meaning changes), an
/// export that is not valid or conflicts, naming the object and the field.
fn say_what_is_wrong(at: &Target, conditions: &[crate::model::Condition]) {
    for c in conditions {
        match (c.kind.as_str(), c.status) {
            ("Valid", false) => {
                tracing::warn!(cluster = at.0, object = %at.2, reason = c.reason, "ServiceExport not valid: {}", c.message)
            }
            ("Conflict", true) => {
                tracing::warn!(cluster = at.0, object = %at.2, reason = c.reason, "ServiceExport in conflict: {}", c.message)
            }
            _ => {}
        }
    }
}

/// Writes the plans of `plans` to `clients` (by cluster) while `leader` says so, until
/// the process ends; says on `missing` where an import waits for its namespace.
pub async fn run(
    clients: BTreeMap<String, ApiClient>,
    mut plans: watch::Receiver<Arc<Plan>>,
    mut leader: watch::Receiver<bool>,
    missing: watch::Sender<MissingNamespaces>,
    metrics: Arc<ControlPlaneMetrics>,
) {
    let mut failing: BTreeMap<Target, Failing> = BTreeMap::new();
    loop {
        let leads = *leader.borrow_and_update();
        metrics.mcs_leader.set(i64::from(leads));
        let plan = Arc::clone(&plans.borrow_and_update());
        let mut next_retry: Option<Instant> = None;
        // Clusters that answered nothing in this pass: their other writes wait for the next.
        let mut silent: std::collections::BTreeSet<String> = Default::default();
        if leads {
            for write in &plan.writes {
                let at = target(write);
                if let Some(f) = failing.get(&at).filter(|f| f.next > Instant::now()) {
                    next_retry = Some(next_retry.map_or(f.next, |n| n.min(f.next)));
                    continue;
                }
                if silent.contains(&at.0) {
                    continue;
                }
                let Some(client) = clients.get(&at.0) else { continue };
                let result = execute(client, write).await;
                if matches!(result, Err(Failure::Silent)) {
                    silent.insert(at.0.clone());
                }
                if let Write::ApplyImport { cluster, key, .. } = write {
                    let waits = matches!(&result, Err(Failure::Refused(e)) if e.namespace_missing());
                    let at = (cluster.clone(), key.clone());
                    missing.send_if_modified(|m| if waits { m.insert(at) } else { m.remove(&at) });
                }
                match result {
                    Ok(()) => {
                        metrics.mcs_writes.get_or_create(&vec![("kind".into(), kind_of(write).into())]).inc();
                        if let Write::ExportConditions { conditions, .. } = write {
                            say_what_is_wrong(&at, conditions);
                        }
                        if let Some(f) = failing.remove(&at) {
                            tracing::info!(cluster = at.0, kind = at.1, object = %at.2, attempts = f.attempts + 1, "MCS write done after failures");
                        } else {
                            tracing::debug!(cluster = at.0, kind = at.1, object = %at.2, write = kind_of(write), "MCS write done");
                        }
                    }
                    Err(e) => {
                        metrics
                            .mcs_write_failures
                            .get_or_create(&vec![("kind".into(), kind_of(write).into())])
                            .inc();
                        let entry = failing.entry(at.clone()).or_insert(Failing {
                            cause: String::new(),
                            attempts: 0,
                            next: Instant::now(),
                        });
                        let next = entry.failed(&at, write, e.to_string());
                        next_retry = Some(next_retry.map_or(next, |n| n.min(next)));
                    }
                }
            }
        }
        // A target no longer planned has nothing left to retry, nor waits.
        failing.retain(|at, _| plan.writes.iter().any(|w| target(w) == *at));
        let planned = |(cluster, key): &(String, ObjectKey)| {
            plan.writes.iter().any(
                |w| matches!(w, Write::ApplyImport { cluster: c, key: k, .. } if c == cluster && k == key),
            )
        };
        missing.send_if_modified(|m| {
            let before = m.len();
            m.retain(planned);
            m.len() != before
        });
        let retry = async {
            match next_retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = plans.changed() => if changed.is_err() { return },
            changed = leader.changed() => if changed.is_err() { return },
            () = retry => {}
        }
    }
}
