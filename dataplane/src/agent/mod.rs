//! The apply pipeline for one delta: validate → desired state → backend
//! (one atomic kernel transaction) → store commit (flushed) → ACK. A failure
//! anywhere is a NACK with the reason; kernel and store keep the last good state.
//!
//! The agent is shared (`SharedAgent`) between the xDS client, which applies,
//! and the admin and health servers, which read.

use kpx_proto::sync::Locked as _;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use kpx_proto::family::Family;
use kpx_proto::node_context::{NodeContext, ProxySettings};
use kpx_proto::types::ServiceView;
use tokio::sync::watch;

use crate::backend::{Backend, BackendError};
use crate::conntrack;
use crate::exec::conntrack::SharedConntrack;
use crate::exec::interfaces::Interfaces;
use crate::healthcheck::{self, ServiceHealth};
use crate::metrics::{self, labels, AgentMetrics};
use crate::state::{Delta, NodeState, RawResource};
use crate::status::{unix_seconds, AgentStatus, ProxyHealth};
use crate::store::Store;

mod start;

use start::read_interface_addresses;
pub use start::Facilities;

pub struct Agent {
    node_name: String,
    state: NodeState,
    /// The proxy settings of this agent; with the node's config they make `context`.
    settings: ProxySettings,
    /// The node as every backend and the tracer see it, derived again whenever the
    /// accepted node config changes.
    context: NodeContext,
    backend: Box<dyn Backend>,
    store: Store,
    conntrack: SharedConntrack,
    /// The health-check ports the accepted state asks for.
    health: watch::Sender<BTreeMap<u16, ServiceHealth>>,
    /// Whether the kernel holds the accepted state, for `/healthz` and the health-check
    /// ports (503 while it does not), which read it without taking the agent.
    proxy_health: watch::Sender<ProxyHealth>,
    pub status: AgentStatus,
    metrics: Arc<AgentMetrics>,
    /// Since when the agent recovers from a damaged store (see [`Agent::start`]).
    recovering: Option<Instant>,
    /// The node's interfaces, and the addresses on them NodePorts may open on (read at
    /// start and again by [`Agent::refresh_interfaces`]).
    interfaces: Box<dyn Interfaces>,
    interface_addresses: Vec<IpAddr>,
    /// Whether the deprecation of `externalIPs` was logged (once per run).
    external_ips_warned: bool,
}

/// The agent, shared between the xDS client and the admin, metrics and health servers.
#[derive(Clone)]
pub struct SharedAgent(Arc<Mutex<Agent>>);

impl SharedAgent {
    pub fn new(agent: Agent) -> Self {
        SharedAgent(Arc::new(Mutex::new(agent)))
    }

    /// The agent; a panic elsewhere while it was held does not make it unusable.
    pub fn lock(&self) -> MutexGuard<'_, Agent> {
        self.0.locked()
    }
}

/// The result of applying one response.
#[derive(Debug)]
pub struct Applied {
    pub resources: usize,
    pub removed: usize,
    /// From the response's arrival until the kernel had it (until the state took it, when
    /// the kernel had nothing to do).
    pub to_kernel: Duration,
    /// Until the kernel and the store had it (the ACK follows).
    pub elapsed: Duration,
}

impl Applied {
    /// Applied without programming anything.
    fn unprogrammed(resources: usize, removed: usize, started: Instant) -> Applied {
        let elapsed = started.elapsed();
        Applied { resources, removed, to_kernel: elapsed, elapsed }
    }
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

impl ApplyError {
    /// A failure of this node (its kernel, its disk), not of what it was sent: the same
    /// delta may well be accepted later, so it is asked for again.
    pub fn is_local(&self) -> bool {
        !matches!(self, ApplyError::Invalid(_))
    }
}

/// Whether the node is still behind the control plane after a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behind {
    Yes,
    No,
}

/// Whether two views differ in more than their endpoints.
fn service_changed(a: &ServiceView, b: &ServiceView) -> bool {
    let strip = |v: &ServiceView| {
        let mut v = v.clone();
        for p in &mut v.ports {
            p.endpoints.clear();
            p.local_endpoints.clear();
        }
        v
    };
    strip(a) != strip(b)
}

impl Agent {
    /// Records a successful kernel sync: the node is as the control plane says.
    fn synced(&mut self, elapsed: Duration, full: bool) {
        self.record_sync(elapsed, full, Behind::No)
    }

    /// Records a sync that programmed the kernel; `behind`: the node still lacks a change
    /// the control plane sent (health published once, as it is).
    fn record_sync(&mut self, elapsed: Duration, full: bool, behind: Behind) {
        let now = SystemTime::now();
        self.status.last_synced_at = Some(now);
        self.status.out_of_sync = behind == Behind::Yes;
        self.publish_health();
        let families = self.families();
        self.metrics.synced(families, elapsed, full, unix_seconds(now));
        self.metrics.services.set(self.state.services.len() as i64);
        if full {
            // The node's families change only with its context, which takes a full sync.
            self.metrics.declare_families(families);
            // Whatever was stored without being programmed (while recovering) is in now.
            self.metrics.endpoint_changes_pending.set(0);
            self.metrics.service_changes_pending.set(0);
            self.refresh_locality();
            crate::memory::release_freed();
        }
    }

    /// Recomputes what depends on every Service's local endpoints: the health-check ports
    /// and the no-local-endpoint gauges. O(Services): a partial apply calls it only when
    /// the delta touches a Service with a Local policy or a health-check port.
    fn refresh_locality(&mut self) {
        let counts = self.no_local_endpoints();
        for (i, family) in [metrics::IPV4, metrics::IPV6].into_iter().enumerate() {
            if self.families().contains(&family) {
                self.metrics.no_local_endpoints(family, "internal", counts[i][0]);
                self.metrics.no_local_endpoints(family, "external", counts[i][1]);
            }
        }
        let state = &self.state;
        self.health.send_if_modified(|h| {
            let now = healthcheck::desired(state);
            let changed = *h != now;
            *h = now;
            changed
        });
    }

    /// Whether a delta adds, changes or removes a Service whose locality matters.
    fn touches_locality(&self, delta: &Delta) -> bool {
        let local = |v: &ServiceView| {
            v.internal_traffic_local || v.external_traffic_local || v.health_check_node_port.is_some()
        };
        let old = |name: &str| self.state.services.get(name).is_some_and(|s| local(&s.value));
        delta.services.iter().any(|s| local(&s.value) || old(&s.value.resource_name()))
            || delta.removed_services.iter().any(|n| old(n))
    }

    /// The IP families this node proxies (the `ip_family` label of kube-proxy's metrics).
    fn families(&self) -> &'static [&'static str] {
        metrics::node_families(&self.context.node_addresses)
    }

    /// Per family (IPv4, IPv6): how many Services of that family with internal, and with
    /// external, traffic policy Local have no endpoint of the family here. One pass.
    fn no_local_endpoints(&self) -> [[i64; 2]; 2] {
        let mut counts = [[0; 2]; 2];
        let none_here =
            |eps: &[kpx_proto::types::Endpoint], v6: bool| !eps.iter().any(|e| e.address.is_ipv6() == v6);
        for v in self.state.services.values().map(|s| &s.value) {
            if !v.internal_traffic_local && !v.external_traffic_local {
                continue;
            }
            for (i, v6) in [false, true].into_iter().enumerate() {
                if !v.cluster_ips.iter().any(|a| a.is_ipv6() == v6) {
                    continue;
                }
                let internal =
                    v.internal_traffic_local && v.ports.iter().all(|p| none_here(&p.endpoints, v6));
                let external =
                    v.external_traffic_local && v.ports.iter().all(|p| none_here(&p.local_endpoints, v6));
                counts[i][0] += i64::from(internal);
                counts[i][1] += i64::from(external);
            }
        }
        counts
    }

    /// Publishes what the health answers read: the sync status and whether the Node is
    /// being deleted (a node config change is always followed by a sync).
    fn publish_health(&mut self) {
        let leaving = self.state.node.as_ref().is_some_and(|n| n.value.being_deleted);
        self.proxy_health.send_replace(self.status.proxy_health(leaving));
    }

    fn sync_failed(&mut self, error: &BackendError, full: bool) {
        self.status.out_of_sync = true;
        self.publish_health();
        self.status.last_error = error.to_string();
        self.metrics.sync_failed(self.families(), !full);
    }

    /// The backend's timed work (see [`Backend::housekeeping`]).
    pub fn housekeeping(&mut self) {
        if let Err(e) = self.backend.housekeeping() {
            tracing::warn!(error = %e, "backend housekeeping failed; retrying shortly");
        }
    }

    /// The node context of the accepted node config, the settings and the interfaces' addresses.
    fn derive_context(&self) -> NodeContext {
        NodeContext::derive_on(
            &self.settings,
            self.state.node.as_ref().map(|n| &n.value),
            &self.interface_addresses,
        )
    }

    /// Reads the interfaces' addresses again; when the NodePorts' addresses change with
    /// them (an address added to or removed from the node), programs everything in the
    /// new context. Not while recovering (the next full sync takes them).
    pub fn refresh_interfaces(&mut self) {
        let Some(now) = read_interface_addresses(self.interfaces.as_mut()) else { return };
        if now == self.interface_addresses {
            return;
        }
        let added: Vec<String> =
            now.iter().filter(|a| !self.interface_addresses.contains(a)).map(ToString::to_string).collect();
        let removed: Vec<String> =
            self.interface_addresses.iter().filter(|a| !now.contains(a)).map(ToString::to_string).collect();
        tracing::info!(added = %added.join(","), removed = %removed.join(","), "the node's interface addresses changed");
        self.interface_addresses = now;
        let next = self.derive_context();
        if next == self.context {
            return;
        }
        self.context = next;
        if self.recovering() {
            return;
        }
        self.full_sync_logged(
            "NodePort addresses follow the interfaces",
            "programming the new NodePort addresses failed; retrying at the next change or resync",
        );
    }

    /// Logs once that `spec.externalIPs` is deprecated when one of `names` (Services of the
    /// state) uses it and the agent programs it, as kube-proxy warns of deprecated fields.
    fn warn_external_ips<'a>(&mut self, names: impl Iterator<Item = &'a String>) {
        if self.external_ips_warned || self.context.ignore_external_ips {
            return;
        }
        let using =
            names.filter_map(|n| self.state.services.get(n)).find(|s| !s.value.external_ips.is_empty());
        if let Some(service) = using {
            tracing::warn!(
                service = %service.value.resource_name(),
                "Service.spec.externalIPs is deprecated (kube-proxy's AllowServiceExternalIPs gate is off by default from Kubernetes 1.40); programmed while the gate is on"
            );
            self.external_ips_warned = true;
        }
    }

    /// The addresses on the node's interfaces, as they are now.
    pub fn interface_addresses(&self) -> &[IpAddr] {
        &self.interface_addresses
    }

    /// Programs everything again when the backend's canary says kpx's rules were flushed
    /// or deleted behind its back (a firewall reload, `nft flush ruleset`, `iptables -F`);
    /// counted in `kpx_rules_repaired_total`. Not while recovering: the kernel is kept as
    /// it is then.
    pub fn check_rules(&mut self) {
        if self.recovering() {
            return;
        }
        match self.backend.intact() {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    backend = self.backend.name(),
                    "kpx's rules were flushed or deleted behind its back: programming them all again"
                );
                self.metrics.rules_repaired.inc();
                self.full_sync_logged(
                    "rules repaired",
                    "repairing kpx's rules failed; retrying at the next check",
                );
            }
            Err(e) => tracing::warn!(error = %e, "checking kpx's rules failed; retrying at the next check"),
        }
    }

    /// Programs the whole state again (the periodic full resync); not while recovering,
    /// when the state may not be whole yet.
    pub fn resync(&mut self) {
        if self.recovering() {
            return;
        }
        self.full_sync_logged(
            "periodic full resync",
            "periodic full resync failed; retrying at the next period",
        );
    }

    /// Programs the whole state again, logging `done` (with the count and the time it
    /// took) or `failed` (with the error).
    fn full_sync_logged(&mut self, done: &str, failed: &str) {
        let started = Instant::now();
        match self.backend.full_sync(&self.state, &self.context) {
            Ok(()) => {
                self.synced(started.elapsed(), true);
                let services = self.state.services.len();
                tracing::info!(services, elapsed_ms = started.elapsed().as_millis() as u64, "{done}");
            }
            Err(e) => {
                self.sync_failed(&e, true);
                tracing::error!(error = %e, "{failed}");
            }
        }
    }

    /// The health-check ports to serve, kept current (see [`healthcheck::serve`]).
    pub fn health_checks(&self) -> watch::Receiver<BTreeMap<u16, ServiceHealth>> {
        self.health.subscribe()
    }

    /// Whether the proxy is healthy, kept current (for `/healthz` and the health-check ports).
    pub fn proxy_health(&self) -> watch::Receiver<ProxyHealth> {
        self.proxy_health.subscribe()
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// `--service-proxy-name`, when the agent runs with one.
    pub fn service_proxy_name(&self) -> Option<&str> {
        self.settings.service_proxy_name.as_deref()
    }

    pub fn state(&self) -> &NodeState {
        &self.state
    }

    /// The node as the backend programs it (and the tracer explains it).
    pub fn context(&self) -> &NodeContext {
        &self.context
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub fn metrics(&self) -> &Arc<AgentMetrics> {
        &self.metrics
    }

    /// The rules as the kernel holds them, in the backend's own text.
    pub fn rules(&mut self) -> Result<String, BackendError> {
        self.backend.dump()
    }

    /// Records the stream's state for the admin API and metrics.
    pub fn set_connected(&mut self, connected: bool, error: Option<String>) {
        if connected && !self.status.connected {
            self.status.connected_since = Some(SystemTime::now());
        }
        // An open stream is contact; so was the moment it ended.
        if connected || self.status.connected {
            self.heard_from_control_plane();
        }
        self.status.connected = connected;
        if let Some(e) = error {
            self.status.last_error = e;
        }
        self.metrics.xds_connected.set(i64::from(connected));
    }

    /// A control plane answered: the time of last contact moves (and the first contact
    /// since the start makes the agent ready).
    pub fn heard_from_control_plane(&mut self) {
        let first = self.status.last_contact.is_none();
        self.status.last_contact = Some(SystemTime::now());
        if first {
            self.publish_health();
        }
    }

    /// The install the control plane's Service belongs to now (its UID, from the API
    /// server): recorded beside the state, which from now on is this install's.
    pub fn note_install(&mut self, uid: &str) {
        match self.store.install() {
            Ok(Some(stored)) if stored == uid => return,
            Ok(Some(stored)) => tracing::warn!(
                was = stored,
                now = uid,
                "the control plane's Service is of another install now; the state will be its"
            ),
            Ok(None) => {
                tracing::info!(install = uid, "the control plane's install recorded beside the state")
            }
            Err(e) => tracing::warn!(error = %e, "reading the stored install failed"),
        }
        if let Err(e) = self.store.set_install(uid) {
            tracing::warn!(error = %e, "recording the control plane's install failed");
        }
    }

    /// Applies one response of `type_url`.
    pub fn apply(
        &mut self,
        type_url: &str,
        resources: Vec<RawResource>,
        removed: Vec<String>,
    ) -> Result<Applied, ApplyError> {
        self.heard_from_control_plane();
        let started = Instant::now();
        self.metrics.queued(self.families(), unix_seconds(SystemTime::now()));
        let result = self.apply_delta(type_url, resources, removed, started);
        let outcome = if result.is_ok() { "ack" } else { "nack" };
        self.metrics.xds_responses.get_or_create(&labels(&[("result", outcome)])).inc();
        match &result {
            Ok(applied) => {
                self.status.applies += 1;
                self.status.last_apply = Some(applied.elapsed);
                self.status.last_apply_at = Some(SystemTime::now());
                self.metrics.programmed(self.families(), applied.elapsed);
            }
            Err(e) => {
                self.status.nacks += 1;
                self.status.last_nack = Some((type_url.to_owned(), e.to_string(), SystemTime::now()));
            }
        }
        result
    }

    fn apply_delta(
        &mut self,
        type_url: &str,
        resources: Vec<RawResource>,
        removed: Vec<String>,
        started: Instant,
    ) -> Result<Applied, ApplyError> {
        let delta = Delta::validate(&self.node_name, type_url, resources, removed)?;
        delta.check_proxy_name(self.settings.service_proxy_name.as_deref())?;
        // A store whose last write failed is opened again and rewritten first.
        self.store.heal(&self.state)?;
        let (resources, removed) = (delta.resource_count(), delta.removed_services.len());
        let stale = self.stale_flows(&delta);
        let (endpoint_changes, service_changes) = self.classify(&delta);
        let locality = self.touches_locality(&delta);
        let (changes, undo) = self.state.apply(delta);
        if changes.is_empty() {
            return Ok(Applied::unprogrammed(resources, removed, started));
        }
        let previous_context = changes.node.then(|| {
            let next = self.derive_context();
            std::mem::replace(&mut self.context, next)
        });
        if self.recovering() {
            // The kernel keeps what it has until the state is whole: only store it.
            if let Err(e) = self.store.commit(&self.state, &changes) {
                self.state.undo(undo);
                if let Some(context) = previous_context {
                    self.context = context;
                }
                return Err(e.into());
            }
            self.metrics.endpoint_changes_pending.inc_by(endpoint_changes as i64);
            self.metrics.service_changes_pending.inc_by(service_changes as i64);
            return Ok(Applied::unprogrammed(resources, removed, started));
        }
        let sync_started = Instant::now();
        if let Err(source) = self.backend.apply(&self.state, &self.context, &changes) {
            self.sync_failed(&source, false);
            self.state.undo(undo);
            if let Some(context) = previous_context {
                self.context = context;
            }
            // A backend that commits per table (iptables) may have taken part of it:
            // put the kernel back to the last good state.
            let restart = Instant::now();
            match self.backend.full_sync(&self.state, &self.context) {
                // The kernel holds the last good state again, but the node is behind the
                // control plane until a change succeeds (a full sync that finds nothing to
                // write says nothing of whether a write would succeed).
                Ok(()) => self.record_sync(restart.elapsed(), true, Behind::Yes),
                Err(resync) => {
                    tracing::error!(error = %resync, "could not restore the last good rules after a refused update")
                }
            }
            return Err(ApplyError::Backend { backend: self.backend.name(), source });
        }
        let sync_elapsed = sync_started.elapsed();
        let to_kernel = started.elapsed();
        if let Err(e) = self.store.commit(&self.state, &changes) {
            // The kernel moved ahead of the store: put both back to the last good state.
            self.state.undo(undo);
            if let Some(context) = previous_context {
                self.context = context;
            }
            if let Err(resync) = self.backend.full_sync(&self.state, &self.context) {
                self.sync_failed(&resync, true);
                tracing::error!(error = %resync, "could not restore the last good rules after a store failure");
            }
            return Err(e.into());
        }
        self.synced(sync_elapsed, false);
        self.warn_external_ips(changes.services.iter());
        if changes.services.len() >= crate::memory::LARGE_CHANGE_SERVICES {
            crate::memory::release_freed();
        }
        self.metrics.endpoint_changes.inc_by(endpoint_changes);
        self.metrics.service_changes.inc_by(service_changes);
        if !stale.is_empty() {
            for r in conntrack::delete(self.conntrack.as_ref(), &stale) {
                let ip_family = if r.family == Family::V4 { metrics::IPV4 } else { metrics::IPV6 };
                self.metrics.conntrack_reconciled(ip_family, r.elapsed, r.deleted);
            }
        }
        if locality {
            self.refresh_locality();
        }
        Ok(Applied { resources, removed, to_kernel, elapsed: started.elapsed() })
    }

    /// How many Services of a delta change only their endpoints, and how many more than that.
    fn classify(&self, delta: &Delta) -> (u64, u64) {
        let (mut endpoints, mut services) = (0, 0);
        for svc in &delta.services {
            match self.state.services.get(&svc.value.resource_name()) {
                Some(old) if old.version == svc.version => {}
                Some(old) if !service_changed(&old.value, &svc.value) => endpoints += 1,
                _ => services += 1,
            }
        }
        services +=
            delta.removed_services.iter().filter(|n| self.state.services.contains_key(*n)).count() as u64;
        (endpoints, services)
    }

    /// The Services of a delta that have (or get) UDP ports, as they are before it.
    /// The conntrack entries `delta` will leave stale (see [`conntrack`]), from the
    /// Services as they are and as the delta makes them; deleted once the kernel took it.
    fn stale_flows(&self, delta: &Delta) -> Vec<conntrack::StaleFlows> {
        let now = |name: &str| self.state.services.get(name).map(|s| &*s.value);
        let changed = delta
            .services
            .iter()
            .flat_map(|svc| conntrack::stale_flows(now(&svc.value.resource_name()), Some(&svc.value)));
        let removed = delta.removed_services.iter().flat_map(|name| conntrack::stale_flows(now(name), None));
        changed.chain(removed).collect()
    }
}

#[cfg(test)]
mod protocol_tests;
#[cfg(test)]
mod tests;
