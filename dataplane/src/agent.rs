//! The apply pipeline for one delta: validate → desired state → backend
//! (one atomic kernel transaction) → store commit (flushed) → ACK. A failure
//! anywhere is a NACK with the reason; kernel and store keep the last good state.

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use kpx_proto::types::{Protocol, ServiceView};
use tokio::sync::watch;

use crate::backend::Backend;
use crate::conntrack;
use crate::healthcheck::{self, ServiceHealth};
use crate::state::{Delta, NodeState, RawResource};
use crate::store::Store;

pub struct Agent {
    node_name: String,
    state: NodeState,
    backend: Box<dyn Backend>,
    store: Store,
    /// The health-check ports the accepted state asks for.
    health: watch::Sender<BTreeMap<u16, ServiceHealth>>,
}

/// The result of applying one response.
#[derive(Debug)]
pub struct Applied {
    pub resources: usize,
    pub removed: usize,
    pub elapsed: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid: {0}")]
    Invalid(#[from] crate::state::InvalidDelta),
    #[error("{backend} backend: {source}")]
    Backend { backend: &'static str, source: crate::backend::BackendError },
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
}

impl Agent {
    /// Loads the stored state and programs the kernel from it, before any control plane answers.
    pub fn start(node_name: String, mut backend: Box<dyn Backend>, store: Store) -> anyhow::Result<Agent> {
        let state = match store.load()? {
            Ok(state) => state,
            Err(damaged) => {
                tracing::error!(%damaged, "stored state is damaged; starting empty and asking the control plane for everything");
                let empty = NodeState::default();
                store.replace_all(&empty)?;
                empty
            }
        };
        let started = Instant::now();
        backend.full_sync(&state).map_err(|e| {
            anyhow::anyhow!("{} backend: programming the stored state failed: {e}", backend.name())
        })?;
        tracing::info!(
            services = state.services.len(),
            node_config = state.node.is_some(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "programmed stored state"
        );
        let (health, _) = watch::channel(healthcheck::desired(&state));
        Ok(Agent { node_name, state, backend, store, health })
    }

    /// Programs the whole state again (the periodic full resync).
    pub fn resync(&mut self) {
        let started = Instant::now();
        match self.backend.full_sync(&self.state) {
            Ok(()) => tracing::info!(
                services = self.state.services.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "periodic full resync"
            ),
            Err(e) => tracing::error!(error = %e, "periodic full resync failed; retrying at the next period"),
        }
    }

    /// The health-check ports to serve, kept current (see [`healthcheck::serve`]).
    pub fn health_checks(&self) -> watch::Receiver<BTreeMap<u16, ServiceHealth>> {
        self.health.subscribe()
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn state(&self) -> &NodeState {
        &self.state
    }

    /// Applies one response of `type_url`.
    pub fn apply(
        &mut self,
        type_url: &str,
        resources: Vec<RawResource>,
        removed: Vec<String>,
    ) -> Result<Applied, ApplyError> {
        let started = Instant::now();
        let delta = Delta::validate(&self.node_name, type_url, resources, removed)?;
        let (resources, removed) = (delta.resource_count(), delta.removed_services.len());
        let udp_before = self.udp_services(&delta);
        let (changes, undo) = self.state.apply(delta);
        if changes.is_empty() {
            return Ok(Applied { resources, removed, elapsed: started.elapsed() });
        }
        if let Err(source) = self.backend.apply(&self.state, &changes) {
            self.state.undo(undo);
            // A backend that commits per table (iptables) may have taken part of it:
            // put the kernel back to the last good state.
            if let Err(resync) = self.backend.full_sync(&self.state) {
                tracing::error!(error = %resync, "could not restore the last good rules after a refused update");
            }
            return Err(ApplyError::Backend { backend: self.backend.name(), source });
        }
        if let Err(e) = self.store.commit(&self.state, &changes) {
            // The kernel moved ahead of the store: put both back to the last good state.
            self.state.undo(undo);
            if let Err(resync) = self.backend.full_sync(&self.state) {
                tracing::error!(error = %resync, "could not restore the last good rules after a store failure");
            }
            return Err(e.into());
        }
        for (name, old) in udp_before {
            let new = self.state.services.get(&name).map(|s| &s.value);
            let stale = conntrack::stale_flows(old.as_ref(), new);
            if !stale.is_empty() {
                conntrack::delete(&stale);
            }
        }
        self.health.send_if_modified(|h| {
            let now = healthcheck::desired(&self.state);
            let changed = *h != now;
            *h = now;
            changed
        });
        Ok(Applied { resources, removed, elapsed: started.elapsed() })
    }

    /// The Services of a delta that have (or get) UDP ports, as they are before it.
    fn udp_services(&self, delta: &Delta) -> Vec<(String, Option<ServiceView>)> {
        let has_udp = |v: &ServiceView| v.ports.iter().any(|p| p.protocol == Protocol::Udp);
        let old = |name: &str| self.state.services.get(name).map(|s| s.value.clone());
        let mut out: BTreeMap<String, Option<ServiceView>> = BTreeMap::new();
        for svc in &delta.services {
            let name = svc.value.resource_name();
            let before = self.state.services.get(&name).map(|s| &s.value);
            if has_udp(&svc.value) || before.is_some_and(has_udp) {
                out.insert(name.clone(), old(&name));
            }
        }
        for name in &delta.removed_services {
            if self.state.services.get(name).is_some_and(|s| has_udp(&s.value)) {
                out.insert(name.clone(), old(name));
            }
        }
        out.into_iter().collect()
    }
}
