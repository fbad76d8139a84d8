//! One Service's views: the default one, and per zone and per node only the views that
//! differ from what those nodes would get otherwise (their zone's, else the default), so
//! what is stored grows with the variants that differ, not with Services × nodes.
//!
//! A node whose Node object is unknown has no zone, but still gets its own variant where
//! the Service's endpoints or `forNodes` hints name it (kube-proxy's locality is the
//! node name, not the Node object).

use kpx_proto::types::ServiceView;

use super::{Locality, Placement, ViewBuilder};

/// A Service's default view and the variants that differ from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceViews {
    pub default: ServiceView,
    /// Per known zone (one some node is in): the view of its nodes, where not the default.
    pub zones: Vec<(String, ServiceView)>,
    /// Per node: its view, where not its zone's (or the default).
    pub nodes: Vec<(String, ServiceView)>,
    /// Whether the view may depend on a node's name or zone at all: when nodes move
    /// between zones, only such Services need their views again.
    pub varies: bool,
}

impl ServiceViews {
    /// The views of the Service `builder` holds, for nodes placed as `placement` says.
    pub fn new(builder: &ViewBuilder<'_>, placement: &Placement) -> Self {
        let default = builder.view(Locality::UNKNOWN);
        let localities = builder.localities();
        let mut zones: Vec<(String, ServiceView)> = Vec::new();
        for &zone in localities.zones.iter().filter(|z| placement.knows_zone(z)) {
            let view = builder.view(Locality { node: None, zone: Some(zone) });
            if view != default {
                zones.push((zone.to_owned(), view));
            }
        }
        let mut nodes = Vec::new();
        for &node in &localities.nodes {
            let zone = placement.zone(node);
            // `zones` is in zone order (from a BTreeSet).
            let fallback = zone
                .and_then(|z| zones.binary_search_by(|(name, _)| name.as_str().cmp(z)).ok())
                .map_or(&default, |i| &zones[i].1);
            let view = builder.view(Locality { node: Some(node), zone });
            if view != *fallback {
                nodes.push((node.to_owned(), view));
            }
        }
        ServiceViews { default, zones, nodes, varies: !localities.is_empty() }
    }
}
