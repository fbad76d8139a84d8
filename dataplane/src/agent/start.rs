//! Starting an agent: the stored state loaded and checked (another service-proxy-name's
//! Services, an earlier install's state, a damaged or suspiciously empty store) and
//! programmed before any control plane answers; and the recovery that follows a damaged
//! store.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kpx_proto::node_context::{NodeContext, ProxySettings};
use tokio::sync::watch;

use super::Agent;
use crate::backend::Backend;
use crate::exec::conntrack::SharedConntrack;
use crate::exec::interfaces::{Interfaces, Unread};
use crate::healthcheck;
use crate::metrics::AgentMetrics;
use crate::state::NodeState;
use crate::status::{AgentStatus, ProxyHealth};
use crate::store::{Damaged, Store};

/// What the agent drives on the node: the backend, conntrack and the interfaces.
pub struct Facilities {
    pub backend: Box<dyn Backend>,
    pub conntrack: SharedConntrack,
    pub interfaces: Box<dyn Interfaces>,
}

/// The interfaces' addresses NodePorts may open on; `None` (logged) when they cannot be read.
pub(super) fn read_interface_addresses(interfaces: &mut dyn Interfaces) -> Option<Vec<IpAddr>> {
    match interfaces.addresses() {
        Ok(listed) => Some(crate::exec::interfaces::node_addresses(&listed)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the node's interface addresses; NodePorts keep the addresses they have");
            None
        }
    }
}

impl Agent {
    /// Loads the stored state and programs the kernel from it, before any control plane
    /// answers. A damaged store — or an empty one while the kernel holds kpx's rules,
    /// which is suspicious, not truth — leaves the kernel untouched: the agent asks the
    /// control plane for everything and programs it once it has all of it
    /// ([`Agent::finish_recovery`]), so there is no moment without rules.
    pub fn start(
        node_name: String,
        settings: ProxySettings,
        backend: Box<dyn Backend>,
        store: Store,
        conntrack: SharedConntrack,
        control_plane: String,
    ) -> anyhow::Result<Agent> {
        let facilities = Facilities { backend, conntrack, interfaces: Box::new(Unread) };
        Self::start_checking_install(node_name, settings, facilities, store, control_plane, |_| None)
    }

    /// [`Agent::start`], with the stored state's install checked first: `current_install`
    /// gives, from the stored state (it may read the API server's addresses there), the
    /// UID of the control plane's Service now, if it can be learned. A stored state
    /// recorded under another UID is an earlier install's (uninstalled, its Service
    /// deleted): it is not programmed, and the agent starts as a new one.
    pub fn start_checking_install(
        node_name: String,
        settings: ProxySettings,
        facilities: Facilities,
        mut store: Store,
        control_plane: String,
        current_install: impl FnOnce(&NodeState) -> Option<String>,
    ) -> anyhow::Result<Agent> {
        let Facilities { mut backend, conntrack, mut interfaces } = facilities;
        let (mut state, damaged) = match store.load()? {
            Ok(state) => (state, None),
            Err(damaged) => (NodeState::default(), Some(damaged)),
        };
        // Services stored under another --service-proxy-name are not this agent's.
        let stored = state.services.len();
        state.services_mut().retain(|_, s| s.value.service_proxy_name == settings.service_proxy_name);
        if state.services.len() < stored {
            tracing::warn!(
                dropped = stored - state.services.len(),
                service_proxy_name = settings.service_proxy_name.as_deref().unwrap_or(""),
                "stored Services are for another --service-proxy-name: dropped"
            );
            store.replace_all(&state)?;
        }
        let stored_something = !state.services.is_empty() || state.node.is_some();
        if let Some(current) = stored_something.then(|| current_install(&state)).flatten() {
            match store.install()? {
                Some(stored) if stored != current => {
                    tracing::warn!(
                        stored_install = stored,
                        current_install = current,
                        services = state.services.len(),
                        "the stored state is an earlier install's (its control plane's Service is gone): not programmed; starting as a new node"
                    );
                    state = NodeState::default();
                    store.replace_all(&state)?;
                }
                Some(_) => {}
                None => {
                    tracing::info!(install = current, "the control plane's install recorded beside the state")
                }
            }
            store.set_install(&current)?;
        }
        let nothing_stored = damaged.is_none() && state.services.is_empty() && state.node.is_none();
        let kernel_has_rules = nothing_stored && backend.holds_rules()?;
        let damaged = match damaged {
            None if kernel_has_rules => Some(Damaged {
                what: "store".into(),
                reason: "empty, but the kernel holds kpx's rules".into(),
            }),
            other => other,
        };
        let metrics = Arc::new(AgentMetrics::new(backend.name()));
        let interface_addresses = read_interface_addresses(interfaces.as_mut()).unwrap_or_default();
        let context =
            NodeContext::derive_on(&settings, state.node.as_ref().map(|n| &n.value), &interface_addresses);
        let (health, _) = watch::channel(healthcheck::desired(&state));
        let (proxy_health, _) = watch::channel(ProxyHealth::default());
        let status = AgentStatus { control_plane, started_at: Some(SystemTime::now()), ..Default::default() };
        let mut agent = Agent {
            node_name,
            state,
            settings,
            context,
            backend,
            store,
            conntrack,
            health,
            proxy_health,
            status,
            metrics,
            recovering: None,
            interfaces,
            interface_addresses,
            external_ips_warned: false,
        };
        let stored: Vec<String> = agent.state.services.keys().cloned().collect();
        agent.warn_external_ips(stored.iter());
        if let Some(damaged) = damaged {
            tracing::error!(%damaged, "stored state is damaged: the kernel keeps its rules untouched until the control plane has sent the full state");
            agent.store.replace_all(&agent.state)?;
            agent.status.last_error =
                format!("state store damaged ({damaged}): waiting for the control plane's full state");
            agent.recovering = Some(Instant::now());
            return Ok(agent);
        }
        if nothing_stored {
            // A first start: nothing to program, and the kernel holds nothing of kpx's. The
            // control plane's first response is programmed whole (one full sync, not two).
            tracing::info!("nothing stored and nothing of kpx's in the kernel: the control plane's state will be programmed as it arrives");
            agent.synced(Duration::ZERO, true);
            return Ok(agent);
        }
        let started = Instant::now();
        agent.backend.full_sync(&agent.state, &agent.context).map_err(|e| {
            anyhow::anyhow!("{} backend: programming the stored state failed: {e}", agent.backend.name())
        })?;
        let elapsed = started.elapsed();
        tracing::info!(
            services = agent.state.services.len(),
            node_config = agent.state.node.is_some(),
            elapsed_ms = elapsed.as_millis() as u64,
            "programmed stored state"
        );
        agent.synced(elapsed, true);
        Ok(agent)
    }

    /// Whether the agent is recovering from a damaged store: it takes the control
    /// plane's resources into its state and store but leaves the kernel as it found it.
    pub fn recovering(&self) -> bool {
        self.recovering.is_some()
    }

    /// Ends recovery once the control plane has sent the full state: programs it all.
    pub fn finish_recovery(&mut self) {
        let Some(since) = self.recovering.take() else { return };
        let started = Instant::now();
        match self.backend.full_sync(&self.state, &self.context) {
            Ok(()) => {
                self.synced(started.elapsed(), true);
                self.status.last_error.clear();
                tracing::info!(
                    services = self.state.services.len(),
                    waited_ms = since.elapsed().as_millis() as u64,
                    "recovered: the control plane's full state is programmed"
                );
            }
            Err(e) => {
                self.sync_failed(&e, true);
                tracing::error!(error = %e, "programming the control plane's full state failed; retrying at the next change or resync");
            }
        }
    }
}
