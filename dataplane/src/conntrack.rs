//! Stale conntrack entries, whatever the backend.
//!
//! UDP has no connection to close: a client that keeps one socket keeps its
//! conntrack entry, and with it the endpoint NAT chose for the first datagram.
//! When that endpoint goes away, kpx deletes the entries that were NATed to it
//! through the Service's addresses and NodePorts, so the next datagram is NATed
//! afresh. When a UDP port gains its first endpoint, entries towards its
//! addresses (made while nothing could answer) are deleted too.
//!
//! TCP has the same trap at a port's first endpoint: a SYN sent before the rules
//! existed leaves an untranslated `SYN_SENT` entry for two minutes. Its
//! retransmissions, and any later connection that happens to reuse the client's
//! port, follow that entry past the new rules and time out. Those entries (and only
//! those: unanswered, untranslated) are deleted once the port is programmed. One
//! listing per family finds them, so a start with thousands of new Services runs
//! one `conntrack` process, not thousands. Pure but for [`delete`], which hands
//! the work to [`crate::exec::conntrack`].

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kpx_proto::family::Family;

use kpx_proto::types::{Protocol, ServicePort, ServiceView};

use crate::exec::conntrack::{Conntrack, FlowFilter};

/// One `conntrack -D` filter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum StaleFlows {
    /// Flows to `address:port` that were NATed to `endpoint` (its address and port: a
    /// target port that moves on the same pod leaves the flows to the old port stale).
    ToAddress { address: IpAddr, port: u16, endpoint: SocketAddr },
    /// Flows to any local address on NodePort `port` NATed to `endpoint`.
    ToNodePort { port: u16, endpoint: SocketAddr },
    /// Every flow to `address:port` (the port had no endpoint).
    AllToAddress { address: IpAddr, port: u16 },
    /// TCP attempts to `address:port` that no rule translated (the port had no endpoint).
    Untranslated { address: IpAddr, port: u16 },
}

impl StaleFlows {
    /// The IP family of the flows.
    pub fn family(&self) -> Family {
        match self {
            StaleFlows::ToNodePort { endpoint, .. } => Family::of(&endpoint.ip()),
            StaleFlows::ToAddress { address: a, .. }
            | StaleFlows::AllToAddress { address: a, .. }
            | StaleFlows::Untranslated { address: a, .. } => Family::of(a),
        }
    }

    /// The conntrack filter that deletes these flows.
    pub fn filter(&self) -> FlowFilter {
        let (destination, port, nat_to) = match *self {
            StaleFlows::ToAddress { address, port, endpoint } => (Some(address), port, Some(endpoint)),
            StaleFlows::ToNodePort { port, endpoint } => (None, port, Some(endpoint)),
            StaleFlows::AllToAddress { address, port } | StaleFlows::Untranslated { address, port } => {
                (Some(address), port, None)
            }
        };
        let ipv6 = self.family() == Family::V6;
        let untranslated = matches!(self, StaleFlows::Untranslated { .. });
        let protocol = if untranslated { Protocol::Tcp } else { Protocol::Udp };
        FlowFilter { protocol, ipv6, destination, port, nat_to, untranslated }
    }
}

/// The endpoints (address and port, as kube-proxy compares them) the rules send the
/// port's traffic to.
fn endpoints_of(port: &ServicePort) -> BTreeSet<SocketAddr> {
    port.endpoints
        .iter()
        .chain(&port.local_endpoints)
        .chain(&port.external_endpoints)
        .map(|e| SocketAddr::new(e.address, e.port))
        .collect()
}

/// The endpoints whose flows stay: those in use, and those still serving (kube-proxy's
/// conntrack reconciler deletes a flow only once its endpoint stops serving).
fn kept_endpoints_of(port: &ServicePort) -> BTreeSet<SocketAddr> {
    let mut kept = endpoints_of(port);
    kept.extend(port.serving_endpoints.iter().map(|e| SocketAddr::new(e.address, e.port)));
    kept
}

/// The flows that became stale when a Service went from `old` to `new` (`None`: absent).
pub fn stale_flows(old: Option<&ServiceView>, new: Option<&ServiceView>) -> Vec<StaleFlows> {
    let mut out = BTreeSet::new();
    let addresses = |v: &ServiceView| -> Vec<IpAddr> {
        v.cluster_ips.iter().chain(&v.external_ips).chain(&v.load_balancer_ips).copied().collect()
    };
    let of = |v: Option<&ServiceView>, protocol: Protocol| -> Vec<ServicePort> {
        v.map(|v| v.ports.iter().filter(|p| p.protocol == protocol).cloned().collect()).unwrap_or_default()
    };
    let (old_ports, new_ports) = (of(old, Protocol::Udp), of(new, Protocol::Udp));
    let same = |ports: &[ServicePort], p: &ServicePort| -> Option<ServicePort> {
        ports.iter().find(|q| q.name == p.name && q.port == p.port).cloned()
    };
    let find = |ports: &[ServicePort], p: &ServicePort| {
        same(ports, p).as_ref().map(endpoints_of).unwrap_or_default()
    };
    if let Some(old) = old {
        for port in &old_ports {
            let kept = same(&new_ports, port).as_ref().map(kept_endpoints_of).unwrap_or_default();
            let gone: Vec<SocketAddr> = kept_endpoints_of(port).difference(&kept).copied().collect();
            for endpoint in gone {
                for address in addresses(old) {
                    out.insert(StaleFlows::ToAddress { address, port: port.port, endpoint });
                }
                if let Some(node_port) = port.node_port {
                    out.insert(StaleFlows::ToNodePort { port: node_port, endpoint });
                }
            }
        }
    }
    if let Some(new) = new {
        for port in &new_ports {
            if find(&old_ports, port).is_empty() && !endpoints_of(port).is_empty() {
                for address in addresses(new) {
                    out.insert(StaleFlows::AllToAddress { address, port: port.port });
                }
            }
        }
        let (old_tcp, new_tcp) = (of(old, Protocol::Tcp), of(Some(new), Protocol::Tcp));
        for port in &new_tcp {
            if find(&old_tcp, port).is_empty() && !endpoints_of(port).is_empty() {
                for address in addresses(new) {
                    out.insert(StaleFlows::Untranslated { address, port: port.port });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// What deleting one family's stale flows did (kube-proxy's conntrack reconciler metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    pub family: Family,
    /// Entries the kernel deleted.
    pub deleted: u64,
    pub elapsed: Duration,
}

/// Deletes the flows, one family after the other; [`StaleFlows::Untranslated`] ones only
/// where a listing shows some. Failures are logged: a stale flow is a nuisance, not a
/// reason to refuse the update.
pub fn delete(conntrack: &dyn Conntrack, flows: &[StaleFlows]) -> Vec<Reconciled> {
    let mut done = Vec::new();
    for family in Family::ALL {
        let started = Instant::now();
        let of_family: Vec<&StaleFlows> = flows.iter().filter(|f| f.family() == family).collect();
        if of_family.is_empty() {
            continue;
        }
        let deleted = delete_family(conntrack, family, &of_family);
        done.push(Reconciled { family, deleted, elapsed: started.elapsed() });
    }
    done
}

/// Deletes `flows`, all of `family`; the unanswered TCP attempts are listed once, if any is asked for.
fn delete_family(conntrack: &dyn Conntrack, family: Family, flows: &[&StaleFlows]) -> u64 {
    let mut listed: Option<BTreeSet<(IpAddr, u16)>> = None;
    let mut deleted = 0;
    for flow in flows {
        if let StaleFlows::Untranslated { address, port } = **flow {
            let found = listed.get_or_insert_with(|| {
                conntrack.untranslated_tcp(family == Family::V6).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "cannot list unanswered TCP attempts; they stay until they time out");
                    BTreeSet::new()
                })
            });
            if !found.contains(&(address, port)) {
                continue;
            }
        }
        match conntrack.delete(&flow.filter()) {
            Ok(n) => deleted += n,
            Err(e) => {
                tracing::warn!(?flow, error = %e, "cannot delete stale flows; they stay until they time out");
                return deleted;
            }
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::Endpoint;

    fn view(endpoints: &[&str]) -> ServiceView {
        view_on(endpoints, 53)
    }

    /// The endpoints serve on `target` (the Service's target port).
    fn view_on(endpoints: &[&str], target: u16) -> ServiceView {
        let eps =
            endpoints.iter().map(|a| Endpoint::new(a.parse().expect("ip"), target, "", "", false)).collect();
        let mut port = ServicePort::new("dns", Protocol::Udp, 53, eps);
        port.node_port = Some(30053);
        ServiceView::new("c", "ns", "dns", vec!["10.96.0.53".parse().expect("ip")], vec![port])
    }

    fn at(address: &str, port: u16) -> SocketAddr {
        SocketAddr::new(address.parse().expect("ip"), port)
    }

    #[test]
    fn a_target_port_that_moves_on_the_same_pod_makes_the_old_ports_flows_stale() {
        // kube-proxy compares endpoints by address and port: the pod stays, its port does not.
        assert_eq!(
            stale_flows(Some(&view_on(&["10.0.0.1"], 8080)), Some(&view_on(&["10.0.0.1"], 9090))),
            vec![
                StaleFlows::ToAddress {
                    address: "10.96.0.53".parse().expect("ip"),
                    port: 53,
                    endpoint: at("10.0.0.1", 8080)
                },
                StaleFlows::ToNodePort { port: 30053, endpoint: at("10.0.0.1", 8080) },
            ]
        );
    }

    #[test]
    fn a_removed_endpoint_makes_its_flows_stale_and_a_first_endpoint_clears_the_address() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(
            stale_flows(Some(&view(&["10.0.0.1", "10.0.0.2"])), Some(&view(&["10.0.0.2"]))),
            vec![
                StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: at("10.0.0.1", 53) },
                StaleFlows::ToNodePort { port: 30053, endpoint: at("10.0.0.1", 53) },
            ]
        );
        assert_eq!(
            stale_flows(Some(&view(&[])), Some(&view(&["10.0.0.2"]))),
            vec![StaleFlows::AllToAddress { address: ip("10.96.0.53"), port: 53 }]
        );
        assert!(stale_flows(Some(&view(&["10.0.0.1"])), Some(&view(&["10.0.0.1", "10.0.0.2"]))).is_empty());
        let flow =
            StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: at("10.0.0.1", 53) };
        assert_eq!(
            flow.filter().args().join(" "),
            "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.0.0.1 --reply-port-src 53"
        );
        let node_port = StaleFlows::ToNodePort { port: 30053, endpoint: at("fd00::1", 53) };
        assert_eq!(
            node_port.filter().args().join(" "),
            "-D -p udp -f ipv6 --orig-port-dst 30053 --dst-nat fd00::1 --reply-port-src 53"
        );
        assert_eq!(stale_flows(Some(&view(&["10.0.0.1"])), None).len(), 2);
    }

    #[test]
    fn a_flow_to_an_endpoint_still_serving_is_kept_until_it_stops() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let serving = |used: &[&str], still: &[&str]| {
            let mut v = view(used);
            v.ports[0].serving_endpoints = view(still).ports[0].endpoints.clone();
            v
        };
        let before = view(&["10.0.0.1", "10.0.0.2"]);
        // 10.0.0.1 terminates while 10.0.0.2 is ready: no new flow goes to it, old ones stay.
        assert!(stale_flows(Some(&before), Some(&serving(&["10.0.0.2"], &["10.0.0.1"]))).is_empty());
        // It stops serving: now its flows go.
        let gone = stale_flows(Some(&serving(&["10.0.0.2"], &["10.0.0.1"])), Some(&view(&["10.0.0.2"])));
        assert_eq!(
            gone[0],
            StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: at("10.0.0.1", 53) }
        );
        // A port whose endpoints only served (none used) gaining one in use: a first endpoint.
        let first = stale_flows(Some(&serving(&[], &["10.0.0.1"])), Some(&view(&["10.0.0.1"])));
        assert_eq!(first, vec![StaleFlows::AllToAddress { address: ip("10.96.0.53"), port: 53 }]);
    }

    fn tcp_view(endpoints: &[&str]) -> ServiceView {
        let mut v = view(endpoints);
        v.ports[0].protocol = Protocol::Tcp;
        v
    }

    #[test]
    fn a_first_tcp_endpoint_deletes_only_the_untranslated_attempts_a_listing_shows() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let first = StaleFlows::Untranslated { address: ip("10.96.0.53"), port: 53 };
        assert_eq!(stale_flows(None, Some(&tcp_view(&["10.0.0.1"]))), vec![first.clone()]);
        assert_eq!(stale_flows(Some(&tcp_view(&[])), Some(&tcp_view(&["10.0.0.1"]))), vec![first.clone()]);
        assert!(stale_flows(Some(&tcp_view(&["10.0.0.1"])), Some(&tcp_view(&["10.0.0.2"]))).is_empty());
        assert!(stale_flows(None, Some(&tcp_view(&[]))).is_empty(), "nothing answers yet");

        let conntrack = crate::exec::fake::FakeConntrack::new();
        delete(&conntrack, std::slice::from_ref(&first));
        assert!(conntrack.take().is_empty(), "no attempt listed: no deletion");
        conntrack.attempt(ip("10.96.0.53"), 53);
        conntrack.attempt(ip("10.96.0.99"), 80);
        delete(&conntrack, std::slice::from_ref(&first));
        assert_eq!(conntrack.take(), [first.filter()]);
        assert_eq!(conntrack.untranslated_tcp(false).expect("list"), [(ip("10.96.0.99"), 80)].into());
    }
}
