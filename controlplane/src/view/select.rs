//! kube-proxy's `CategorizeEndpoints` for one Service port and one IP family:
//! which endpoints a node sends cluster traffic to, which it sends external
//! traffic to when a traffic policy is Local, and whether any node has one.
//!
//! kube-proxy runs one proxier per IP family, so every decision here (topology,
//! the fallback to terminating endpoints) is taken per family by the caller.

use std::collections::HashSet;
use std::net::IpAddr;

use kpx_proto::types::Endpoint;

use super::Locality;
use crate::model::SliceEndpoint;

/// One `address:port` of a Service port, with the slice endpoint it comes from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate<'a> {
    pub address: IpAddr,
    pub port: u16,
    pub source: &'a SliceEndpoint,
    /// The cluster it comes from, when not the Service's own (a global Service).
    pub cluster: Option<&'a str>,
}

impl Candidate<'_> {
    /// `ready` as the slice says it, as kube-proxy takes it: a terminating endpoint the
    /// EndpointSlice controller calls ready (a Service with `publishNotReadyAddresses`
    /// makes every endpoint ready, terminating or not) is used like any ready one.
    pub fn ready(&self) -> bool {
        self.source.ready
    }

    /// How usable the endpoint is, for choosing between two entries of one address: ready,
    /// then serving.
    pub fn usability(&self) -> (bool, bool) {
        (self.ready(), self.source.serving)
    }

    fn serving_terminating(&self) -> bool {
        self.source.serving && self.source.terminating
    }

    fn is_on(&self, node: Option<&str>) -> bool {
        node.is_some_and(|n| self.source.node_name.as_deref() == Some(n))
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::new(
            self.address,
            self.port,
            self.source.node_name.as_deref().unwrap_or_default(),
            self.cluster.unwrap_or_default(),
            !self.ready(),
        )
    }
}

/// The traffic policies in effect for a Service port.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Policy {
    pub internal_local: bool,
    pub external_local: bool,
    /// The port has external entry points (a NodePort, external or load-balancer IPs).
    pub external_entries: bool,
}

/// What one node uses, unsorted.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Selected {
    /// ClusterIP traffic (and external traffic unless a policy is Local): this node's
    /// endpoints when the internal policy is Local, else the cluster-wide set.
    pub cluster: Vec<Endpoint>,
    /// Internal policy Local on a port with external entry points: the cluster-wide set,
    /// for external traffic; empty otherwise.
    pub external: Vec<Endpoint>,
    /// External traffic under `externalTrafficPolicy: Local`; empty otherwise.
    pub local: Vec<Endpoint>,
    /// Some node has an endpoint to use (ready, or serving and terminating).
    pub any: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    Any,
    SameNode,
    SameZone,
}

/// Chooses the endpoints of one family of one Service port for a node at `at`.
pub(super) fn categorize(candidates: &[Candidate<'_>], policy: Policy, at: Locality<'_>) -> Selected {
    let local = || {
        let mut chosen = pick(candidates, |c| c.ready() && c.is_on(at.node));
        if chosen.is_empty() {
            chosen = pick(candidates, |c| c.serving_terminating() && c.is_on(at.node));
        }
        chosen
    };
    let cluster_wide = || {
        let topology = topology(candidates, at);
        let mut chosen = pick(candidates, |c| c.ready() && available(c, topology, at));
        if chosen.is_empty() {
            // Topology is only used when this node has a ready endpoint to use,
            // so an empty set means nothing is ready anywhere.
            chosen = pick(candidates, Candidate::serving_terminating);
        }
        chosen
    };
    let local_set = if policy.external_local { local() } else { Vec::new() };
    if !policy.internal_local {
        // The cluster-wide set is empty exactly when nothing anywhere can be used.
        let cluster = cluster_wide();
        return Selected { any: !cluster.is_empty(), cluster, external: Vec::new(), local: local_set };
    }
    // Topology hints are not applied to node-local traffic.
    let external = if policy.external_entries { cluster_wide() } else { Vec::new() };
    let any = candidates.iter().any(|c| c.ready() || c.serving_terminating());
    Selected { cluster: local(), external, local: local_set, any }
}

/// The serving endpoints (ready, or serving and terminating) that `selected` does not use:
/// a node keeps its UDP conntrack flows to them (kube-proxy deletes a flow only once its
/// endpoint stops serving).
pub(super) fn serving_unused(candidates: &[Candidate<'_>], selected: &Selected) -> Vec<Endpoint> {
    let used: HashSet<(IpAddr, u16)> = selected
        .cluster
        .iter()
        .chain(&selected.external)
        .chain(&selected.local)
        .map(|e| (e.address, e.port))
        .collect();
    pick(candidates, |c| (c.ready() || c.source.serving) && !used.contains(&(c.address, c.port)))
}

fn pick<'a>(candidates: &[Candidate<'a>], keep: impl Fn(&Candidate<'a>) -> bool) -> Vec<Endpoint> {
    candidates.iter().filter(|c| keep(c)).map(Candidate::endpoint).collect()
}

/// kube-proxy's `topologyModeFromHints`: hints are used only when every ready
/// endpoint has them and at least one is meant for this node (or its zone);
/// node hints win over zone hints.
fn topology(candidates: &[Candidate<'_>], at: Locality<'_>) -> Topology {
    let (mut all_nodes, mut for_node) = (true, false);
    let (mut all_zones, mut for_zone) = (true, false);
    for c in candidates.iter().filter(|c| c.ready()) {
        let hints = &c.source;
        if hints.node_hints.is_empty() {
            all_nodes = false;
        } else if at.node.is_some_and(|n| hints.node_hints.iter().any(|h| h == n)) {
            for_node = true;
        }
        if hints.zone_hints.is_empty() {
            all_zones = false;
        } else if at.zone.is_some_and(|z| hints.zone_hints.iter().any(|h| h == z)) {
            for_zone = true;
        }
    }
    if all_nodes && for_node {
        Topology::SameNode
    } else if all_zones && for_zone {
        Topology::SameZone
    } else {
        Topology::Any
    }
}

fn available(c: &Candidate<'_>, topology: Topology, at: Locality<'_>) -> bool {
    let named = |hints: &[String], want: Option<&str>| want.is_some_and(|w| hints.iter().any(|h| h == w));
    match topology {
        Topology::Any => true,
        Topology::SameNode => named(&c.source.node_hints, at.node),
        Topology::SameZone => named(&c.source.zone_hints, at.zone),
    }
}

#[cfg(test)]
mod tests;
