//! Leader election over a `coordination.k8s.io/v1` Lease, so that one control-plane
//! replica writes the MCS objects while every replica serves nodes. The leader renews
//! the Lease every [`RETRY`]; another replica takes it over once it has seen the same
//! holder and renew time for longer than the Lease's duration, by its own clock (no
//! clocks are compared across replicas), so a dead leader is replaced within
//! [`LEASE_DURATION`] + [`RETRY`]. Writes race through the Lease's resourceVersion: of two
//! replicas that take it at once, one gets 409 Conflict and stays a follower. A leader
//! that cannot renew steps down when its Lease would have expired.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::kube::{read_lease, write_lease, RequestError};
use crate::model::ObjectKey;
use crate::source::kubernetes::ApiClient;

/// How long a Lease holds without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the Lease is read, and renewed by its holder.
pub const RETRY: Duration = Duration::from_secs(2);

/// This replica's identity in the Lease: its host name and a random suffix (two
/// processes on one host, or one restarted, are different candidates).
pub fn identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kpx-controlplane".into());
    format!("{host}-{:08x}", rand::random::<u32>())
}

/// What a follower has seen of the holder: who, renewed when (as written), and since
/// when (by this replica's clock) it has looked like that.
struct Seen {
    holder: Option<String>,
    renewed: Option<String>,
    since: Instant,
}

/// Runs the election until the process ends, saying on `leader` whether this replica leads.
pub async fn run(client: ApiClient, lease: ObjectKey, identity: String, leader: watch::Sender<bool>) {
    let mut seen: Option<Seen> = None;
    let mut renewed_at: Option<Instant> = None;
    let mut last_error: Option<String> = None;
    loop {
        // A Lease unanswered for a third of its duration counts as not renewed.
        let round = tokio::time::timeout(LEASE_DURATION / 3, step(&client, &lease, &identity, &mut seen));
        let leads = match round.await.unwrap_or_else(|_| Err(Unanswered)) {
            Ok(leads) => {
                last_error = None;
                if leads {
                    renewed_at = Some(Instant::now());
                }
                leads
            }
            Err(e) => {
                let cause = e.to_string();
                if last_error.as_deref() != Some(cause.as_str()) {
                    tracing::warn!(lease = %lease, error = %cause, "cannot read or renew the MCS writer's Lease");
                    last_error = Some(cause);
                }
                renewed_at.is_some_and(|at| at.elapsed() < LEASE_DURATION)
            }
        };
        leader.send_if_modified(|was| {
            if *was == leads {
                return false;
            }
            if leads {
                tracing::info!(lease = %lease, identity, "leading: this replica writes the MCS objects");
            } else {
                tracing::info!(lease = %lease, identity, "following: another replica writes the MCS objects");
            }
            *was = leads;
            true
        });
        tokio::time::sleep(RETRY).await;
    }
}

/// A round of the election that failed: refused, or not answered in time.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Refused(#[from] RequestError),
    #[error("the API server did not answer within {:?}", LEASE_DURATION / 3)]
    Unanswered,
}
use RoundError::Unanswered;

/// One round: whether this replica holds the Lease after it.
async fn step(
    client: &ApiClient,
    lease: &ObjectKey,
    identity: &str,
    seen: &mut Option<Seen>,
) -> Result<bool, RoundError> {
    let record = read_lease(client, lease).await?;
    let take = match &record {
        None => true,
        Some(r) if r.holder.as_deref() == Some(identity) => true,
        Some(r) => {
            let same = seen.as_ref().is_some_and(|s| s.holder == r.holder && s.renewed == r.renewed);
            if !same {
                *seen = Some(Seen {
                    holder: r.holder.clone(),
                    renewed: r.renewed.clone(),
                    since: Instant::now(),
                });
            }
            let quiet = seen.as_ref().map_or(Duration::ZERO, |s| s.since.elapsed());
            r.holder.is_none() || quiet > r.duration
        }
    };
    if !take {
        return Ok(false);
    }
    Ok(write_lease(client, lease, record.as_ref(), identity, LEASE_DURATION).await?)
}
