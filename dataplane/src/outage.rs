//! An agent cut off from its control plane says so on its Node, where an operator looks
//! (`kubectl describe node`, `kubectl get events`): a Warning Event
//! `ControlPlaneUnreachable` once no control plane has answered for a while, and a Normal
//! `ControlPlaneReachable` when one answers again. Posted to the API server at its real
//! address (see [`crate::home`]); an API server that cannot be reached is tried again.

use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::agent::SharedAgent;
use crate::home::ApiAccess;
use crate::status::rfc3339;

/// How often the agent looks, and at least how long between two attempts to post.
const TICK: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_secs(15);

/// The reasons of the two Events.
pub const UNREACHABLE: &str = "ControlPlaneUnreachable";
pub const REACHABLE: &str = "ControlPlaneReachable";

/// Runs forever: an Event when the agent has been without a control plane for `after`,
/// and one when a control plane answers again.
pub async fn report(agent: SharedAgent, api: ApiAccess, after: Duration) {
    if !api.usable() {
        // Nothing to post with, ever; but this runs beside the agent's other tasks until
        // the process ends, so it must not end either.
        return std::future::pending().await;
    }
    let mut reported: Option<SystemTime> = None;
    let mut last_try: Option<tokio::time::Instant> = None;
    let mut timer = tokio::time::interval(TICK);
    loop {
        timer.tick().await;
        let now = SystemTime::now();
        // Cheap every second: two fields; the rest only when an Event is due.
        let (connected, since_contact) = {
            let agent = agent.lock();
            (agent.status.connected, agent.status.since_contact(now))
        };
        let due = match reported {
            None => !connected && since_contact >= after,
            Some(_) => connected,
        };
        if !due || last_try.is_some_and(|t| t.elapsed() < RETRY) {
            continue;
        }
        last_try = Some(tokio::time::Instant::now());
        let (node, control_plane, error, servers) = {
            let agent = agent.lock();
            let s = &agent.status;
            (
                agent.node_name().to_owned(),
                s.control_plane.clone(),
                s.last_error.clone(),
                api.servers(agent.state()),
            )
        };
        let event = match reported {
            None => (
                "Warning",
                UNREACHABLE,
                format!(
                    "no control plane ({control_plane}) has answered for {}s; the node's rules stay as they are: {error}",
                    since_contact.as_secs()
                ),
            ),
            Some(since) => (
                "Normal",
                REACHABLE,
                format!("{control_plane} answers again, after {}s", now.duration_since(since).unwrap_or_default().as_secs()),
            ),
        };
        let body = node_event(&node, event.0, event.1, &event.2, now);
        let mut failures = Vec::new();
        let mut posted = false;
        for server in servers {
            match server.post_event(&body).await {
                Ok(()) => {
                    posted = true;
                    break;
                }
                Err(e) => failures.push(format!("{}: {e}", server.url())),
            }
        }
        if posted {
            tracing::info!(reason = event.1, message = event.2, "Event posted on the Node");
            last_try = None;
            reported = match reported {
                None => Some(now - since_contact),
                Some(_) => None,
            };
        } else {
            tracing::warn!(
                reason = event.1,
                failures = failures.join("; "),
                "posting the Event on the Node failed; trying again"
            );
        }
    }
}

/// A core/v1 Event about Node `node`, as kubelet writes them (namespace `default`, the
/// Node's name as its UID).
fn node_event(node: &str, kind: &str, reason: &str, message: &str, now: SystemTime) -> serde_json::Value {
    let at = rfc3339(now);
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{node}.kpx-"), "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": "kpx-dataplane", "host": node},
        "reportingComponent": "kpx-dataplane",
        "reportingInstance": node,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Agent;
    use crate::backend::nftables::NftablesBackend;
    use crate::exec::fake::{FakeConntrack, FakeNft};
    use crate::store::Store;

    /// The agent's tasks run in one select: one that ended would end the agent.
    #[tokio::test]
    async fn without_an_api_server_it_waits_forever() {
        let dir = tempfile::tempdir().expect("tmp");
        let backend = Box::new(NftablesBackend::new(Box::new(FakeNft::new())));
        let store = Store::open(dir.path()).expect("store");
        let conntrack = std::sync::Arc::new(FakeConntrack::new());
        let agent = Agent::start("n1".into(), Default::default(), backend, store, conntrack, "cp".into())
            .expect("start");
        let reporting = report(SharedAgent::new(agent), ApiAccess::default(), Duration::from_secs(30));
        let ended = tokio::time::timeout(Duration::from_millis(300), reporting).await;
        assert!(ended.is_err(), "outage::report ended without an API server");
    }
}
