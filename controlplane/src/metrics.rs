//! The control plane's Prometheus metrics (`kpx_…`), served on `--metrics-listen`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::memory::HeapStats;

type Labels = Vec<(String, String)>;

pub struct ControlPlaneMetrics {
    registry: Registry,
    pub streams: Gauge,
    /// From sending a response to its ACK or NACK.
    pub ack_latency: Histogram,
    pub nacks: Counter,
    pub responses_sent: Counter,
    pub resources_sent: Counter,
    pub removals_sent: Counter,
    /// Resources sent to a node and not yet ACKed, per node.
    pub queue_depth: Family<Labels, Gauge>,
    pub snapshot_build: Histogram,
    pub services: Gauge,
    pub node_variants: Gauge,
    /// Streams and admin calls refused, by reason (no credentials, a bad token, a
    /// `node.id` that is not the caller's identity, admin).
    pub refused_streams: Family<Labels, Counter>,
    /// Streams closed because a response went unanswered past `--ack-timeout`.
    pub unresponsive_closed: Counter,
    /// jemalloc's account of the heap, by kind (`memory::HeapStats`), read at each scrape.
    heap: Family<Labels, Gauge>,
    /// 1 while this replica writes the MCS objects (`--clusterset-cidr`).
    pub mcs_leader: Gauge,
    /// Names imported across the clusterset, and those whose exports conflict.
    pub mcs_imports: Gauge,
    pub mcs_conflicts: Gauge,
    /// MCS writes done and failed, by kind (`apply_import`, `delete_import`, `export_conditions`).
    pub mcs_writes: Family<Labels, Counter>,
    pub mcs_write_failures: Family<Labels, Counter>,
}

impl Default for ControlPlaneMetrics {
    fn default() -> Self {
        let seconds = || Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        let m = ControlPlaneMetrics {
            registry: Registry::default(),
            streams: Gauge::default(),
            ack_latency: seconds(),
            nacks: Counter::default(),
            responses_sent: Counter::default(),
            resources_sent: Counter::default(),
            removals_sent: Counter::default(),
            queue_depth: Family::default(),
            snapshot_build: seconds(),
            services: Gauge::default(),
            node_variants: Gauge::default(),
            refused_streams: Family::default(),
            unresponsive_closed: Counter::default(),
            heap: Family::default(),
            mcs_leader: Gauge::default(),
            mcs_imports: Gauge::default(),
            mcs_conflicts: Gauge::default(),
            mcs_writes: Family::default(),
            mcs_write_failures: Family::default(),
        };
        let mut registry = Registry::default();
        registry.register("kpx_xds_streams", "Open delta xDS streams", m.streams.clone());
        registry.register(
            "kpx_mcs_leader",
            "1 while this replica writes the Multi-Cluster Services objects",
            m.mcs_leader.clone(),
        );
        registry.register("kpx_mcs_imports", "Names imported across the clusterset", m.mcs_imports.clone());
        registry.register(
            "kpx_mcs_conflicts",
            "Imported names whose exports conflict",
            m.mcs_conflicts.clone(),
        );
        registry.register("kpx_mcs_writes", "MCS objects written, by kind of write", m.mcs_writes.clone());
        registry.register(
            "kpx_mcs_write_failures",
            "MCS writes that failed (each retried with backoff), by kind of write",
            m.mcs_write_failures.clone(),
        );
        registry.register(
            "kpx_xds_ack_latency_seconds",
            "From sending a response to its ACK or NACK",
            m.ack_latency.clone(),
        );
        registry.register("kpx_xds_nacks", "Responses a node refused", m.nacks.clone());
        registry.register("kpx_xds_responses_sent", "Delta responses sent", m.responses_sent.clone());
        registry.register(
            "kpx_xds_resources_sent",
            "Resources sent in delta responses",
            m.resources_sent.clone(),
        );
        registry.register(
            "kpx_xds_removals_sent",
            "Resource removals sent in delta responses",
            m.removals_sent.clone(),
        );
        registry.register(
            "kpx_xds_stream_queue_depth",
            "Resources sent to a node and not yet acknowledged",
            m.queue_depth.clone(),
        );
        registry.register(
            "kpx_snapshot_build_duration_seconds",
            "Building a snapshot of all views",
            m.snapshot_build.clone(),
        );
        registry.register("kpx_services", "Services served", m.services.clone());
        registry.register(
            "kpx_node_variants",
            "Per-node and per-zone view variants",
            m.node_variants.clone(),
        );
        registry.register(
            "kpx_refused",
            "Streams and admin calls refused, by reason",
            m.refused_streams.clone(),
        );
        registry.register(
            "kpx_xds_unresponsive_streams_closed",
            "Streams closed because a response went unanswered past --ack-timeout",
            m.unresponsive_closed.clone(),
        );
        registry.register(
            "kpx_controlplane_heap_bytes",
            "The allocator's account of the heap: allocated, active (pages in use), resident, metadata, retained",
            m.heap.clone(),
        );
        ControlPlaneMetrics { registry, ..m }
    }
}

impl ControlPlaneMetrics {
    pub fn render(&self) -> String {
        if let Some(heap) = HeapStats::read() {
            for (kind, bytes) in heap.by_kind() {
                let labels = vec![("kind".to_owned(), kind.to_owned())];
                self.heap.get_or_create(&labels).set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    pub fn node(node: &str) -> Labels {
        vec![("node".to_owned(), node.to_owned())]
    }

    pub fn reason(reason: &str) -> Labels {
        vec![("reason".to_owned(), reason.to_owned())]
    }
}
