//! What one Service puts into IPVS on a node ([`Piece`]): one virtual service per entry
//! point (ClusterIP, external IP, load-balancer IP, NodePort on each node address) of every
//! port and family, its destinations the endpoints `categorize` chose; the addresses the
//! dummy interface must carry so the node accepts traffic to them; and the members of the
//! [`ipset`](super::ipset) sets that tell the iptables rules what to masquerade, filter and
//! drop. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpx_proto::family::Family;
use kpx_proto::policy::{self, Action, EntryKind, PortFamily};
use kpx_proto::types::{Endpoint, Protocol, ServiceView};

use super::ipset::{self, Member, SetName, SetRole};
use crate::backend::NodeContext;
use crate::exec::ipvs::{
    Destination, ServiceKey, VirtualService, FLAG_PERSISTENT, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

/// What every Service's piece depends on besides the Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The node: where NodePorts open, its addresses (a source range containing one lets
    /// the node in), whether external IPs are entry points.
    pub node: NodeContext,
    /// The scheduler of Services that do not choose one.
    pub scheduler: String,
}

impl Context {
    pub fn new(node: &NodeContext, scheduler: &str) -> Context {
        Context { node: node.clone(), scheduler: scheduler.to_owned() }
    }
}

/// One Service's share of the kernel's state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Piece {
    pub services: BTreeMap<ServiceKey, (VirtualService, Vec<Destination>)>,
    /// Service addresses the node must accept traffic for (bound to the dummy interface).
    pub addresses: BTreeSet<IpAddr>,
    pub members: BTreeSet<(SetName, Member)>,
}

pub fn protocol(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => PROTO_TCP,
        Protocol::Udp => PROTO_UDP,
        Protocol::Sctp => PROTO_SCTP,
    }
}

/// `endpoints` as destinations of `weight`, sorted, one per address and port (the first
/// wins).
fn destinations<'e>(endpoints: impl IntoIterator<Item = &'e Endpoint>, weight: u32) -> Vec<Destination> {
    let mut out: Vec<Destination> = endpoints
        .into_iter()
        .map(|e| Destination { address: e.address, port: e.port, weight, active: 0, inactive: 0 })
        .collect();
    out.sort_by_key(|d| (d.address, d.port));
    out.dedup_by_key(|d| (d.address, d.port));
    out
}

/// Where traffic to an entry of `kind` goes: the endpoints IPVS may pick, and whether the
/// traffic is dropped before IPVS sees it. Without endpoints and not dropped, IPVS itself
/// rejects (ICMP port unreachable).
fn route<'a>(pf: &'a PortFamily<'a>, kind: EntryKind) -> (&'a [&'a Endpoint], bool) {
    match pf.local_action(kind) {
        Some(Action::Pick) => (&pf.local, false),
        Some(Action::Drop) => (&[], true),
        Some(Action::Reject) => (&[], false),
        None => match pf.cluster_action(kind) {
            Action::Pick => (pf.endpoints(pf.main_set(kind)), false),
            Action::Drop => (&[], true),
            Action::Reject => (&[], false),
        },
    }
}

/// A UDP port's serving endpoints that no new flow goes to, after the `picked` ones, at
/// weight 0: IPVS schedules nothing new to them but the flows they have go on (kube-proxy
/// keeps a UDP flow until its endpoint stops serving); once they stop, they are removed.
fn with_serving(pf: &PortFamily<'_>, picked: &[&Endpoint]) -> Vec<Destination> {
    let serving = pf.port.serving_endpoints.iter().filter(|e| Family::of(&e.address) == pf.family);
    // Picked first: where both name an endpoint, its weight is 1.
    let mut all = destinations(picked.iter().copied(), 1);
    all.extend(destinations(serving, 0));
    all.sort_by_key(|d| (d.address, d.port, d.weight == 0));
    all.dedup_by_key(|d| (d.address, d.port));
    all
}

/// What `view` puts into IPVS, ipsets and the dummy interface.
pub fn piece(view: &ServiceView, ctx: &Context) -> Piece {
    let (flags, timeout) = match view.session_affinity_timeout {
        Some(seconds) => (FLAG_PERSISTENT, seconds),
        None => (0, 0),
    };
    let mut out = Piece::default();
    for pf in policy::port_families(view, &ctx.node) {
        let proto = pf.port.protocol;
        let set = |role| SetName::new(role, pf.family);
        for ep in pf.all_endpoints() {
            out.members.insert((set(SetRole::LoopBack), ipset::loop_back_member(ep.address, proto, ep.port)));
        }
        for entry in &pf.entries {
            let (endpoints, dropped) = route(&pf, entry.kind);
            let key = ServiceKey { address: entry.address, protocol: protocol(proto), port: entry.port };
            let scheduler = view.ipvs_scheduler.clone().unwrap_or_else(|| ctx.scheduler.clone());
            let service = VirtualService { key, scheduler, flags, timeout };
            let destinations = if proto == Protocol::Udp && !endpoints.is_empty() {
                with_serving(&pf, endpoints)
            } else {
                destinations(endpoints.iter().copied(), 1)
            };
            out.services.insert(key, (service, destinations));
            if entry.kind != EntryKind::NodePort {
                out.addresses.insert(entry.address);
            }
            let member = ipset::entry_member(entry.address, proto, entry.port);
            let role = match entry.kind {
                EntryKind::ClusterIp => SetRole::ClusterIp,
                kind if pf.masquerade_external(kind) => SetRole::External,
                _ => SetRole::ExternalLocal,
            };
            out.members.insert((set(role), member.clone()));
            if dropped {
                out.members.insert((set(SetRole::Drop), member.clone()));
            }
            if let Some(allowed) = pf.allowed_sources(entry, &ctx.node.node_addresses) {
                out.members.insert((set(SetRole::LoadBalancerFirewall), member));
                for source in &allowed {
                    let m = ipset::source_member(entry.address, proto, entry.port, source);
                    out.members.insert((set(SetRole::LoadBalancerSource), m));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{fixtures, Family};

    fn with_node(_view: &ServiceView) -> Context {
        Context::new(&fixtures::node_context(), "rr")
    }

    fn members(p: &Piece, role: SetRole) -> Vec<String> {
        p.members
            .iter()
            .filter(|(s, _)| *s == SetName::new(role, Family::V4))
            .map(|(_, m)| m.to_string())
            .collect()
    }

    #[test]
    fn every_entry_is_a_virtual_service_with_the_chosen_endpoints() {
        let mut view = fixtures::web(&["10.244.1.2"]);
        view.ports[0].node_port = Some(30080);
        view.session_affinity_timeout = Some(600);
        let want = piece(&view, &with_node(&view));
        let keys: Vec<String> = want.services.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["10.0.0.1:30080/tcp", "10.96.0.10:80/tcp"]);
        for (service, dests) in want.services.values() {
            assert_eq!(
                (service.flags, service.timeout, service.scheduler.as_str()),
                (FLAG_PERSISTENT, 600, "rr")
            );
            assert_eq!(dests.iter().map(|d| d.address.to_string()).collect::<Vec<_>>(), ["10.244.1.2"]);
        }
        let vip: IpAddr = "10.96.0.10".parse().expect("ip");
        assert_eq!(want.addresses, [vip].into(), "NodePorts use the node's own addresses");
        assert_eq!(members(&want, SetRole::ClusterIp), ["10.96.0.10,tcp:80"]);
        assert_eq!(members(&want, SetRole::External), ["10.0.0.1,tcp:30080"], "policy Cluster: masqueraded");
        assert_eq!(members(&want, SetRole::LoopBack), ["10.244.1.2,tcp:8080,10.244.1.2"]);
        assert!(members(&want, SetRole::Drop).is_empty());
    }

    #[test]
    fn without_endpoints_ipvs_rejects_and_policy_local_drops() {
        let view = fixtures::web(&[]);
        let want = piece(&view, &Context::default());
        assert_eq!(want.services.len(), 1);
        assert!(want.services.values().all(|(_, d)| d.is_empty()));
        assert!(members(&want, SetRole::Drop).is_empty(), "no endpoints at all: rejected by IPVS");
        let mut local = fixtures::web(&[]);
        local.internal_traffic_local = true;
        let want = piece(&local, &Context::default());
        assert!(members(&want, SetRole::Drop).is_empty(), "none on any node: rejected by IPVS");
        local.ports[0].endpoint_families = vec![kpx_proto::family::Family::V4];
        let want = piece(&local, &Context::default());
        assert_eq!(members(&want, SetRole::Drop), ["10.96.0.10,tcp:80"], "some on other nodes");
    }

    #[test]
    fn source_ranges_let_in_the_ranges_and_the_node() {
        let mut view = fixtures::web(&["10.244.1.2"]);
        view.load_balancer_ips = vec!["192.0.2.20".parse().expect("ip")];
        view.load_balancer_source_ranges = vec!["10.0.0.0/24".parse().expect("net")];
        view.external_traffic_local = true;
        let want = piece(&view, &with_node(&view));
        assert_eq!(members(&want, SetRole::LoadBalancerFirewall), ["192.0.2.20,tcp:80"]);
        assert_eq!(
            members(&want, SetRole::LoadBalancerSource),
            ["192.0.2.20,tcp:80,10.0.0.0/24", "192.0.2.20,tcp:80,192.0.2.20/32"]
        );
        assert_eq!(
            members(&want, SetRole::ExternalLocal),
            ["192.0.2.20,tcp:80"],
            "policy Local: client kept"
        );
    }
}
