//! The node agent's Prometheus metrics, under kube-proxy's names and labels where the
//! meaning is the same (`kubeproxy_…`, as the Kubernetes metrics reference lists them),
//! and kpx's own (`kpx_…`).
//!
//! kube-proxy runs one proxier per IP family and labels its sync metrics `ip_family`; kpx
//! programs both families in one sync, so a sync is recorded under each family the node
//! has (see [`node_families`]).

use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type Seconds = Family<Labels, Histogram, fn() -> Histogram>;
type Timestamp = Family<Labels, Gauge<f64, AtomicU64>>;

/// kube-proxy's names of the IP families, for the `ip_family` label.
pub const IPV4: &str = "IPv4";
pub const IPV6: &str = "IPv6";

/// The families a node proxies, for the `ip_family` label: those of its addresses
/// (IPv4 alone when it has none yet). No allocation: it is asked on every apply.
pub fn node_families(addresses: &[IpAddr]) -> &'static [&'static str] {
    let v6 = addresses.iter().any(IpAddr::is_ipv6);
    match (addresses.iter().any(IpAddr::is_ipv4), v6) {
        (true, true) => &[IPV4, IPV6],
        (false, true) => &[IPV6],
        _ => &[IPV4],
    }
}

fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

pub struct AgentMetrics {
    registry: Registry,
    /// Every kernel sync (partial or full).
    sync_duration: Seconds,
    full_sync_duration: Seconds,
    partial_sync_duration: Seconds,
    /// From a delta's arrival to its rules being in the kernel and stored.
    network_programming: Seconds,
    last_sync_timestamp: Timestamp,
    last_queued_timestamp: Timestamp,
    pub endpoint_changes: Counter,
    pub service_changes: Counter,
    /// Changes accepted but not in the kernel yet (stored while recovering).
    pub endpoint_changes_pending: Gauge,
    pub service_changes_pending: Gauge,
    /// Refused kernel updates, under the backend tool's name.
    sync_failures: Family<Labels, Counter>,
    /// The same for partial updates (iptables only, as kube-proxy counts them).
    partial_sync_failures: Option<Family<Labels, Counter>>,
    /// Services whose traffic policy is Local and which have no endpoint here.
    no_local_endpoints: Family<Labels, Gauge>,
    /// `/healthz` and `/livez` answers by HTTP status.
    pub healthz_answers: Family<Labels, Counter>,
    pub livez_answers: Family<Labels, Counter>,
    pub xds_connected: Gauge,
    /// Seconds since a control plane last answered, set at each scrape.
    pub xds_since_contact: Gauge<f64, AtomicU64>,
    /// Responses applied (`result="ack"`) or refused (`result="nack"`).
    pub xds_responses: Family<Labels, Counter>,
    pub services: Gauge,
    /// Full syncs because the canary found kpx's rules flushed behind its back.
    pub rules_repaired: Counter,
    /// Stale conntrack flows deleted, and how long each family's deletions took.
    conntrack_deleted: Family<Labels, Counter>,
    conntrack_reconcile: Seconds,
}

impl AgentMetrics {
    pub fn new(backend: &str) -> AgentMetrics {
        let mut registry = Registry::default();
        let histograms = || Seconds::new_with_constructor(seconds as fn() -> Histogram);
        let m = AgentMetrics {
            sync_duration: histograms(),
            full_sync_duration: histograms(),
            partial_sync_duration: histograms(),
            network_programming: histograms(),
            last_sync_timestamp: Timestamp::default(),
            last_queued_timestamp: Timestamp::default(),
            endpoint_changes: Counter::default(),
            service_changes: Counter::default(),
            endpoint_changes_pending: Gauge::default(),
            service_changes_pending: Gauge::default(),
            sync_failures: Family::default(),
            partial_sync_failures: (backend == "iptables").then(Family::default),
            no_local_endpoints: Family::default(),
            healthz_answers: Family::default(),
            livez_answers: Family::default(),
            xds_connected: Gauge::default(),
            xds_since_contact: Gauge::default(),
            xds_responses: Family::default(),
            services: Gauge::default(),
            rules_repaired: Counter::default(),
            conntrack_deleted: Family::default(),
            conntrack_reconcile: histograms(),
            registry: Registry::default(),
        };
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.full_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.partial_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In kpx: from a delta's arrival at the node to its rules programmed and stored",
            m.network_programming.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.last_queued_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.endpoint_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.service_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.service_changes_pending.clone(),
        );
        // kube-proxy's IPVS mode counts its iptables-restore failures under the iptables name.
        let (failures, help) = match backend {
            "nftables" => (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "Cumulative proxy nftables sync failures",
            ),
            _ => (
                "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                "Cumulative proxy iptables restore failures",
            ),
        };
        registry.register(failures, help, m.sync_failures.clone());
        if let Some(partial) = &m.partial_sync_failures {
            registry.register(
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
                "Cumulative proxy iptables partial restore failures",
                partial.clone(),
            );
        }
        registry.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        registry.register(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.healthz_answers.clone(),
        );
        registry.register(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.livez_answers.clone(),
        );
        registry.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            m.conntrack_deleted.clone(),
        );
        registry.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            m.conntrack_reconcile.clone(),
        );
        registry.register(
            "kpx_xds_connected",
            "1 while the stream to the control plane is open",
            m.xds_connected.clone(),
        );
        registry.register(
            "kpx_xds_seconds_since_contact",
            "Seconds since a control plane last answered this node (since the agent started if none has)",
            m.xds_since_contact.clone(),
        );
        registry.register(
            "kpx_xds_responses",
            "xDS responses ACKed or NACKed by this node",
            m.xds_responses.clone(),
        );
        registry.register("kpx_services", "Services in the accepted state", m.services.clone());
        registry.register(
            "kpx_rules_repaired",
            "Full syncs made because kpx's rules were found flushed or deleted behind its back",
            m.rules_repaired.clone(),
        );
        AgentMetrics { registry, ..m }
    }

    /// Makes every per-family series exist (at 0) for `families`, so that rates and alerts
    /// see them before the first event.
    pub fn declare_families(&self, families: &[&str]) {
        for f in families {
            let l = family(f);
            let _ = self.sync_failures.get_or_create(&l);
            let _ = self.conntrack_deleted.get_or_create(&l);
            let _ = self.conntrack_reconcile.get_or_create(&l);
            if let Some(partial) = &self.partial_sync_failures {
                let _ = partial.get_or_create(&l);
            }
        }
    }

    /// A successful kernel sync that took `elapsed`, at `now` (Unix seconds).
    pub fn synced(&self, families: &[&str], elapsed: Duration, full: bool, now: f64) {
        let which = if full { &self.full_sync_duration } else { &self.partial_sync_duration };
        for f in families {
            let l = family(f);
            self.sync_duration.get_or_create(&l).observe(elapsed.as_secs_f64());
            which.get_or_create(&l).observe(elapsed.as_secs_f64());
            self.last_sync_timestamp.get_or_create(&l).set(now);
        }
    }

    /// A refused kernel update (`partial`: a change, not a full sync).
    pub fn sync_failed(&self, families: &[&str], partial: bool) {
        for f in families {
            let l = family(f);
            self.sync_failures.get_or_create(&l).inc();
            if let (true, Some(p)) = (partial, &self.partial_sync_failures) {
                p.get_or_create(&l).inc();
            }
        }
    }

    /// A change arrived at `now` (Unix seconds).
    pub fn queued(&self, families: &[&str], now: f64) {
        for f in families {
            self.last_queued_timestamp.get_or_create(&family(f)).set(now);
        }
    }

    /// The stale flows of `ip_family` deleted after a change: `deleted` of them, in `elapsed`.
    pub fn conntrack_reconciled(&self, ip_family: &str, elapsed: Duration, deleted: u64) {
        let l = family(ip_family);
        self.conntrack_reconcile.get_or_create(&l).observe(elapsed.as_secs_f64());
        self.conntrack_deleted.get_or_create(&l).inc_by(deleted);
    }

    /// A change programmed and stored `elapsed` after it arrived.
    pub fn programmed(&self, families: &[&str], elapsed: Duration) {
        for f in families {
            self.network_programming.get_or_create(&family(f)).observe(elapsed.as_secs_f64());
        }
    }

    /// How many Services of `policy` ("internal", "external") have no endpoint here in `ip_family`.
    pub fn no_local_endpoints(&self, ip_family: &str, policy: &str, count: i64) {
        self.no_local_endpoints
            .get_or_create(&labels(&[("ip_family", ip_family), ("traffic_policy", policy)]))
            .set(count);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

fn family(f: &str) -> Labels {
    labels(&[("ip_family", f)])
}

pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}
