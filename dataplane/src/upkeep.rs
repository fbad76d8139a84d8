//! The kernel's upkeep, whether or not a control plane is reachable: the backend's
//! timed work (drained IPVS destinations removed) and the node's interface addresses
//! (NodePorts follow them, see [`crate::agent::Agent::refresh_interfaces`]), the canary check (kpx's rules
//! flushed behind its back are programmed again from the state the node holds) and the
//! `--full-sync-period` resync. None of it needs the control plane, so a node keeps its
//! rules whole through an outage; the agent itself skips the canary and the resync
//! while it recovers a damaged store (the kernel is kept as it is then).

use std::time::Duration;

use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::agent::SharedAgent;
use crate::node_sysctls::Keeper;

/// How often the backend's timed work runs (drained IPVS destinations are removed) and the
/// interfaces' addresses are read (one rtnetlink dump).
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(5);

/// How often the backend's canary is checked (see [`crate::backend::Backend::intact`]):
/// kpx's rules flushed behind its back are programmed again within this, not only at the
/// next `--full-sync-period`. Cheap: one chain listed per table and family.
const CANARY_PERIOD: Duration = Duration::from_secs(10);

/// Runs forever: housekeeping, the canary (and with it the node's kernel settings, kept by
/// `settings`), and a full resync every `full_sync_period`.
pub async fn run(agent: SharedAgent, full_sync_period: Option<Duration>, mut settings: Keeper) {
    let every = |period: Duration| {
        let mut timer = interval_at(Instant::now() + period, period);
        timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        timer
    };
    let mut housekeeping = every(HOUSEKEEPING_PERIOD);
    let mut canary = every(CANARY_PERIOD);
    let mut resync = every(full_sync_period.unwrap_or(Duration::from_secs(365 * 24 * 3600)));
    loop {
        tokio::select! {
            _ = housekeeping.tick() => tokio::task::block_in_place(|| {
                let mut agent = agent.lock();
                agent.housekeeping();
                agent.refresh_interfaces();
            }),
            _ = canary.tick() => tokio::task::block_in_place(|| {
                settings.keep();
                agent.lock().check_rules()
            }),
            _ = resync.tick(), if full_sync_period.is_some() => {
                tokio::task::block_in_place(|| agent.lock().resync())
            }
        }
    }
}
