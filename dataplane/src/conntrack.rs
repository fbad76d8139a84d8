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
mod tests;
