//! Per-node views: kube-proxy's endpoint selection, done centrally, and what it is
//! done on: which clusters' slices a Service gets and where nodes are.
//!
//! Pure functions of the cluster model: [`select`] (kube-proxy's CategorizeEndpoints
//! for one port and family), [`ViewBuilder`] (one Service's view for one locality),
//! [`ServiceViews`] (its default view and the zone and node variants that differ),
//! [`Placement`] (each node's zone and home cluster) and [`Inputs`] (composition across
//! clusters: a global Service's remote slices, node configs, the views of the Services
//! and nodes a change touched). A Service means the same on every node
//! unless locality matters: `internalTrafficPolicy: Local`, an effective
//! `externalTrafficPolicy: Local`, or topology hints on its endpoints. Even then
//! it differs only for the nodes and zones its endpoints name
//! ([`ViewBuilder::localities`]); every other node gets the view of
//! [`Locality::UNKNOWN`], so it is encoded once and the same bytes (the same
//! content-hash version) go to all of them.
//!
//! Topology hints (`hints.forNodes`, `hints.forZones`) are honoured whenever
//! every ready endpoint has them, without kube-proxy's additional requirement
//! of `spec.trafficDistribution` or the `service.kubernetes.io/topology-mode:
//! Auto` annotation on the Service: the EndpointSlice controller only writes
//! hints for such Services anyway.

mod compose;
mod import;
mod placement;
mod select;
#[cfg(test)]
mod tests;
mod variants;

pub use compose::{Inputs, ViewChanges};
pub use placement::{Moved, Placement};
pub use variants::ServiceViews;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::family::Family;
use kpx_proto::types::{NodeConfig, Protocol, ServicePort, ServiceView};

use crate::model::{ClusterAffinity, EndpointSlice, Node, Service, ServiceType};
use select::{categorize, serving_unused, Candidate, Policy};

/// Whether kpx programs this Service at all (a Service labelled with a
/// `service.kubernetes.io/service-proxy-name` goes only to the agents of that name).
pub fn is_proxied(svc: &Service) -> bool {
    svc.service_type != ServiceType::ExternalName && !svc.cluster_ips.is_empty() && !svc.headless_label
}

/// Where a node is, as far as endpoint selection cares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Locality<'a> {
    /// The node's name; `None` for a node that has none of the Service's endpoints.
    pub node: Option<&'a str>,
    /// The node's `topology.kubernetes.io/zone`, when known.
    pub zone: Option<&'a str>,
}

impl Locality<'_> {
    /// A node that has no endpoints of the Service and no known zone: the default view.
    pub const UNKNOWN: Locality<'static> = Locality { node: None, zone: None };
}

/// The nodes and zones for which a Service's view may differ from the default
/// one. A node not in `nodes` gets the view of its zone when that is in
/// `zones` (computed with no node name), and the default view otherwise.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Localities<'a> {
    /// Nodes its endpoints run on (with a Local traffic policy) or name in `forNodes` hints.
    pub nodes: BTreeSet<&'a str>,
    /// Zones named in `forZones` hints.
    pub zones: BTreeSet<&'a str>,
}

impl Localities<'_> {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.zones.is_empty()
    }
}

/// The view of one Service for a node at `at`; `slices` are the Service's
/// EndpointSlices (see [`crate::model::Cluster::slices_of`]).
pub fn view_for(cluster: &str, svc: &Service, slices: &[&EndpointSlice], at: Locality<'_>) -> ServiceView {
    ViewBuilder::new(cluster, svc, slices).view(at)
}

/// One Service's endpoints, gathered once, to build its view for many nodes.
#[derive(Debug)]
pub struct ViewBuilder<'a> {
    cluster: &'a str,
    svc: &'a Service,
    /// Per Service port: its endpoints, one list per IP family of the Service.
    ports: Vec<Vec<Vec<Candidate<'a>>>>,
}

impl<'a> ViewBuilder<'a> {
    pub fn new(cluster: &'a str, svc: &'a Service, slices: &[&'a EndpointSlice]) -> Self {
        Self::global(cluster, svc, slices, &[])
    }

    /// A global Service: its own `slices` and, from other clusters, `remote` ones (with
    /// their cluster's name), weighed by the Service's cluster affinity.
    pub fn global(
        cluster: &'a str,
        svc: &'a Service,
        slices: &[&'a EndpointSlice],
        remote: &[(&'a str, &'a EndpointSlice)],
    ) -> Self {
        let all: Vec<(Option<&'a str>, &'a EndpointSlice)> =
            slices.iter().map(|s| (None, *s)).chain(remote.iter().map(|(c, s)| (Some(*c), *s))).collect();
        let ports = svc
            .ports
            .iter()
            .map(|port| {
                let mut families = candidates(svc, port, &all);
                for family in &mut families {
                    prefer(family, svc.cluster_affinity);
                }
                families
            })
            .collect();
        ViewBuilder { cluster, svc, ports }
    }

    fn all(&self) -> impl Iterator<Item = &Candidate<'a>> + '_ {
        self.ports.iter().flatten().flatten()
    }

    /// Where the view may differ from the default one. Empty for a Service
    /// whose view is the same on every node.
    pub fn localities(&self) -> Localities<'a> {
        let mut out = Localities::default();
        let by_node = self.svc.internal_traffic_local() || self.svc.external_traffic_local();
        for c in self.all() {
            if by_node {
                out.nodes.extend(c.source.node_name.as_deref());
            }
            out.nodes.extend(c.source.node_hints.iter().map(String::as_str));
            out.zones.extend(c.source.zone_hints.iter().map(String::as_str));
        }
        out
    }

    /// Whether some node gets another view than the default one.
    pub fn varies_by_node(&self) -> bool {
        let by_node = self.svc.internal_traffic_local() || self.svc.external_traffic_local();
        self.all().any(|c| {
            (by_node && c.source.node_name.is_some())
                || !c.source.node_hints.is_empty()
                || !c.source.zone_hints.is_empty()
        })
    }

    /// The view for a node at `at`. Lists are sorted and deduplicated, so
    /// equal content gives equal bytes.
    pub fn view(&self, at: Locality<'_>) -> ServiceView {
        let svc = self.svc;
        let service_policy = Policy {
            internal_local: svc.internal_traffic_local(),
            external_local: svc.external_traffic_local(),
            external_entries: false,
        };
        let external_ips = !svc.external_ips.is_empty() || !svc.load_balancer_ips.is_empty();
        let ports = svc
            .ports
            .iter()
            .zip(&self.ports)
            .map(|(port, families)| {
                let policy =
                    Policy { external_entries: external_ips || port.node_port.is_some(), ..service_policy };
                let mut out = ServicePort {
                    node_port: port.node_port,
                    ..ServicePort::new(&port.name, port.protocol, port.port, Vec::new())
                };
                for family in families {
                    let selected = categorize(family, policy, at);
                    if port.protocol == Protocol::Udp {
                        out.serving_endpoints.extend(serving_unused(family, &selected));
                    }
                    out.endpoints.extend(selected.cluster);
                    out.external_endpoints.extend(selected.external);
                    out.local_endpoints.extend(selected.local);
                    if policy.internal_local && selected.any {
                        out.endpoint_families.extend(family.first().map(|c| Family::of(&c.address)));
                    }
                }
                out.endpoints.sort();
                out.serving_endpoints.sort();
                out.external_endpoints.sort();
                out.local_endpoints.sort();
                out.endpoint_families.sort();
                out
            })
            .collect();
        ServiceView {
            external_ips: sorted(&svc.external_ips),
            load_balancer_ips: sorted(&svc.load_balancer_ips),
            load_balancer_source_ranges: sorted(&svc.load_balancer_source_ranges),
            external_traffic_local: service_policy.external_local,
            internal_traffic_local: service_policy.internal_local,
            health_check_node_port: svc.effective_health_check_node_port(),
            session_affinity_timeout: svc.session_affinity_timeout,
            ipvs_scheduler: svc.ipvs_scheduler.clone(),
            service_proxy_name: svc.proxy_name.clone(),
            ..ServiceView::new(
                self.cluster,
                &svc.key.namespace,
                &svc.key.name,
                svc.cluster_ips.clone(),
                ports,
            )
        }
    }
}

fn sorted<T: Ord + Clone>(list: &[T]) -> Vec<T> {
    let set: BTreeSet<&T> = list.iter().collect();
    set.into_iter().cloned().collect()
}

/// The endpoints of one Service port, one list per IP family the Service has
/// a ClusterIP of (endpoints of other families are left out). The target port
/// comes from the slice port of the same name and protocol, which is how a
/// named `targetPort` resolves per endpoint. An `address:port` listed twice (while
/// slices are being rebalanced, or a pod's address reused while the pod that had it
/// still terminates) counts once, as the entry that is most usable: ready, else serving.
fn candidates<'a>(
    svc: &Service,
    port: &crate::model::ServicePort,
    slices: &[(Option<&'a str>, &'a EndpointSlice)],
) -> Vec<Vec<Candidate<'a>>> {
    let mut unique: BTreeMap<(IpAddr, u16), Candidate<'a>> = BTreeMap::new();
    for &(cluster, slice) in slices {
        let Some(slice_port) =
            slice.ports.iter().find(|p| p.name == port.name && p.protocol == port.protocol)
        else {
            continue;
        };
        for source in &slice.endpoints {
            for &address in &source.addresses {
                let candidate = Candidate { address, port: slice_port.port, source, cluster };
                unique
                    .entry((address, slice_port.port))
                    .and_modify(|known| {
                        if candidate.usability() > known.usability() {
                            *known = candidate;
                        }
                    })
                    .or_insert(candidate);
            }
        }
    }
    let families: BTreeSet<bool> = svc.cluster_ips.iter().map(IpAddr::is_ipv4).collect();
    families
        .into_iter()
        .map(|v4| unique.values().filter(|c| c.address.is_ipv4() == v4).copied().collect())
        .collect()
}

/// A global Service's cluster affinity: with `Local`, endpoints of other clusters are
/// used only while its own cluster has no ready endpoint (`Remote` the other way round).
fn prefer(family: &mut Vec<Candidate<'_>>, affinity: ClusterAffinity) {
    let preferred = |c: &Candidate<'_>| match affinity {
        ClusterAffinity::None => true,
        ClusterAffinity::Local => c.cluster.is_none(),
        ClusterAffinity::Remote => c.cluster.is_some(),
    };
    if family.iter().any(|c| c.ready() && preferred(c)) {
        family.retain(preferred);
    }
}

/// The node config of a Node object; `cluster_cidrs` are the control plane's `--cluster-cidr`s,
/// `service_cidrs` the ranges of its cluster's ServiceCIDRs.
pub fn node_config(node: &Node, cluster_cidrs: &[IpNet], service_cidrs: Vec<IpNet>) -> NodeConfig {
    NodeConfig {
        name: node.name.clone(),
        addresses: node.addresses.clone(),
        pod_cidrs: node.pod_cidrs.clone(),
        zone: node.zone.clone().unwrap_or_default(),
        cluster_cidrs: cluster_cidrs.to_vec(),
        being_deleted: node.being_deleted,
        service_cidrs,
    }
}
