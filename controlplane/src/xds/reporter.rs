//! Where a stream reports what it does: the node registry's entry (what `kpxctl nodes`
//! shows) and the control plane's metrics.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::nodes::{StreamEntry, TypeProgress};
use super::snapshot::ResourceType;
use super::stream::{Response, StreamState};
use crate::metrics::ControlPlaneMetrics;

/// Where a stream reports what it does.
pub(super) struct Reporter {
    pub(super) entry: StreamEntry,
    pub(super) metrics: Arc<ControlPlaneMetrics>,
    /// The node's `kpx_xds_stream_queue_depth` series, once the node is known.
    pub(super) queue_depth: std::sync::OnceLock<prometheus_client::metrics::gauge::Gauge>,
}

impl Reporter {
    pub(super) fn sent(&self, state: &StreamState, ty: ResourceType, response: &Response) {
        let m = &self.metrics;
        m.responses_sent.inc();
        m.resources_sent.inc_by(response.resources.len() as u64);
        m.removals_sent.inc_by(response.removed.len() as u64);
        self.progress(state, ty, |p| {
            p.responses_sent += 1;
            p.sent_at = Some(Instant::now());
            p.behind_since.get_or_insert_with(Instant::now);
        });
    }

    pub(super) fn answered(&self, state: &StreamState, ty: ResourceType, nack: Option<&str>) {
        self.progress(state, ty, |p| {
            if let Some(sent) = p.sent_at.take() {
                self.metrics.ack_latency.observe(sent.elapsed().as_secs_f64());
            }
            match nack {
                Some(reason) => {
                    self.metrics.nacks.inc();
                    p.last_nack = Some((reason.to_owned(), SystemTime::now()));
                }
                None => p.behind_since = None,
            }
        });
    }

    /// Refreshes the node's entry for `ty` from the stream state, then applies `f`.
    pub(super) fn progress(&self, state: &StreamState, ty: ResourceType, f: impl FnOnce(&mut TypeProgress)) {
        let node = state.node().unwrap_or_default();
        let (acked, in_flight) = state.type_status(ty).unwrap_or_default();
        let mut depth = 0;
        self.entry.update(|entry| {
            if entry.node != node {
                entry.node = node.to_owned();
            }
            if entry.proxy_name != state.proxy_name() {
                entry.proxy_name = state.proxy_name().to_owned();
            }
            let p = entry.types.or_default(ty);
            p.acked = acked;
            p.in_flight = in_flight.is_some();
            p.pending = in_flight.unwrap_or(0);
            f(p);
            depth = entry.types.values().map(|t| t.pending as i64).sum();
        });
        if !node.is_empty() {
            // The node's series, looked up once per stream (the gauge is shared).
            let gauge = self.queue_depth.get_or_init(|| {
                self.metrics.queue_depth.get_or_create(&ControlPlaneMetrics::node(node)).clone()
            });
            gauge.set(depth);
        }
    }

    pub(super) fn closed(self, node: &str) {
        let nodes = self.entry.close();
        self.metrics.streams.dec();
        if !node.is_empty() && !nodes.has_node(node) {
            self.metrics.queue_depth.remove(&ControlPlaneMetrics::node(node));
        }
    }
}
