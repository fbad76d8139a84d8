//! The node agent's Prometheus metrics, under kube-proxy's names where the
//! meaning is the same (`kubeproxy_…`), and kpx's own (`kpx_…`).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct AgentMetrics {
    registry: Registry,
    /// Every kernel sync (partial or full).
    pub sync_duration: Histogram,
    pub full_sync_duration: Histogram,
    pub partial_sync_duration: Histogram,
    /// From a delta's arrival to its rules being in the kernel and stored.
    pub network_programming: Histogram,
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    pub last_queued_timestamp: Gauge<f64, AtomicU64>,
    pub endpoint_changes: Counter,
    pub service_changes: Counter,
    /// Refused kernel updates (kube-proxy counts them per backend tool).
    pub sync_failures: Counter,
    /// Services whose traffic policy is Local and which have no endpoint here.
    pub no_local_endpoints: Family<Labels, Gauge>,
    pub xds_connected: Gauge,
    /// Responses applied (`result="ack"`) or refused (`result="nack"`).
    pub xds_responses: Family<Labels, Counter>,
    pub services: Gauge,
    /// Full syncs because the canary found kpx's rules flushed behind its back.
    pub rules_repaired: Counter,
}

impl AgentMetrics {
    pub fn new(backend: &str) -> AgentMetrics {
        let mut registry = Registry::default();
        let seconds = || Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        let m = AgentMetrics {
            sync_duration: seconds(),
            full_sync_duration: seconds(),
            partial_sync_duration: seconds(),
            network_programming: seconds(),
            last_sync_timestamp: Gauge::default(),
            last_queued_timestamp: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes: Counter::default(),
            sync_failures: Counter::default(),
            no_local_endpoints: Family::default(),
            xds_connected: Gauge::default(),
            xds_responses: Family::default(),
            services: Gauge::default(),
            rules_repaired: Counter::default(),
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
        let failures = match backend {
            "iptables" => "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "nftables" => "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            _ => "kubeproxy_sync_proxy_rules_sync_failures",
        };
        registry.register(failures, "Cumulative proxy rules restore failures", m.sync_failures.clone());
        registry.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        registry.register(
            "kpx_xds_connected",
            "1 while the stream to the control plane is open",
            m.xds_connected.clone(),
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}
