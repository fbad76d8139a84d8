//! Stale UDP conntrack entries, whatever the backend.
//!
//! UDP has no connection to close: a client that keeps one socket keeps its
//! conntrack entry, and with it the endpoint NAT chose for the first datagram.
//! When that endpoint goes away, kpx deletes the entries that were NATed to it
//! through the Service's addresses and NodePorts, so the next datagram is NATed
//! afresh. When a UDP port gains its first endpoint, entries towards its
//! addresses (made while nothing could answer) are deleted too.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use kpx_proto::types::{Protocol, ServicePort, ServiceView};

/// One `conntrack -D` filter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum StaleFlows {
    /// Flows to `address:port` that were NATed to `endpoint`.
    ToAddress { address: IpAddr, port: u16, endpoint: IpAddr },
    /// Flows to any local address on NodePort `port` NATed to `endpoint`.
    ToNodePort { port: u16, endpoint: IpAddr },
    /// Every flow to `address:port` (the port had no endpoint).
    AllToAddress { address: IpAddr, port: u16 },
}

impl StaleFlows {
    /// The filter as (original destination, original port, NATed-to endpoint).
    fn filter(&self) -> (Option<IpAddr>, u16, Option<IpAddr>) {
        match *self {
            StaleFlows::ToAddress { address, port, endpoint } => (Some(address), port, Some(endpoint)),
            StaleFlows::ToNodePort { port, endpoint } => (None, port, Some(endpoint)),
            StaleFlows::AllToAddress { address, port } => (Some(address), port, None),
        }
    }

    fn args(&self) -> Vec<String> {
        let (address, port, endpoint) = self.filter();
        let family = address.or(endpoint).map_or("ipv4", |a| if a.is_ipv4() { "ipv4" } else { "ipv6" });
        let mut args: Vec<String> = ["-D", "-p", "udp", "-f", family].map(String::from).to_vec();
        if let Some(address) = address {
            args.extend(["--orig-dst".into(), address.to_string()]);
        }
        args.extend(["--orig-port-dst".into(), port.to_string()]);
        if let Some(endpoint) = endpoint {
            args.extend(["--dst-nat".into(), endpoint.to_string()]);
        }
        args
    }
}

fn udp_endpoints(port: &ServicePort) -> BTreeSet<IpAddr> {
    port.endpoints.iter().chain(&port.local_endpoints).map(|e| e.address).collect()
}

/// The flows that became stale when a Service went from `old` to `new` (`None`: absent).
pub fn stale_flows(old: Option<&ServiceView>, new: Option<&ServiceView>) -> Vec<StaleFlows> {
    let mut out = BTreeSet::new();
    let addresses = |v: &ServiceView| -> Vec<IpAddr> {
        v.cluster_ips.iter().chain(&v.external_ips).chain(&v.load_balancer_ips).copied().collect()
    };
    let udp = |v: Option<&ServiceView>| -> Vec<ServicePort> {
        v.map(|v| v.ports.iter().filter(|p| p.protocol == Protocol::Udp).cloned().collect())
            .unwrap_or_default()
    };
    let (old_ports, new_ports) = (udp(old), udp(new));
    let find = |ports: &[ServicePort], p: &ServicePort| {
        ports.iter().find(|q| q.name == p.name && q.port == p.port).map(udp_endpoints).unwrap_or_default()
    };
    if let Some(old) = old {
        for port in &old_ports {
            let gone: Vec<IpAddr> =
                udp_endpoints(port).difference(&find(&new_ports, port)).copied().collect();
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
            if find(&old_ports, port).is_empty() && !udp_endpoints(port).is_empty() {
                for address in addresses(new) {
                    out.insert(StaleFlows::AllToAddress { address, port: port.port });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Deletes every flow of `protocol` to `address:port`: for an entry point that did not
/// exist, whose only flows are those made before it did (a SYN routed elsewhere, whose
/// retransmission would then skip the NAT rules the entry point now has).
pub fn delete_all_to(address: IpAddr, protocol: Protocol, port: u16) {
    let family = if address.is_ipv4() { "ipv4" } else { "ipv6" };
    let port = port.to_string();
    let args = [
        "-D",
        "-p",
        protocol.as_str(),
        "-f",
        family,
        "--orig-dst",
        &address.to_string(),
        "--orig-port-dst",
        &port,
    ]
    .map(str::to_owned);
    match Command::new("conntrack").args(&args).output() {
        // conntrack exits 1 when no entry matched: nothing to delete.
        Ok(out) => {
            tracing::debug!(%address, port, result = %String::from_utf8_lossy(&out.stderr).trim(), "deleted flows made before the entry point existed")
        }
        Err(e) => {
            tracing::warn!(%address, port, error = %e, "cannot run conntrack; flows made before the entry point existed stay until they time out")
        }
    }
}

/// Deletes the flows with the `conntrack` tool (netlink underneath). Failures are
/// logged: a stale flow is a nuisance, not a reason to refuse the update.
pub fn delete(flows: &[StaleFlows]) {
    for flow in flows {
        match Command::new("conntrack").args(flow.args()).output() {
            // conntrack exits 1 when no entry matched: nothing to delete.
            Ok(out) => {
                let message = String::from_utf8_lossy(&out.stderr);
                tracing::debug!(?flow, result = %message.trim(), "deleted stale UDP flows");
            }
            Err(e) => {
                tracing::warn!(?flow, error = %e, "cannot run conntrack; stale UDP flows stay until they time out");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::Endpoint;

    fn view(endpoints: &[&str]) -> ServiceView {
        let eps = endpoints
            .iter()
            .map(|a| Endpoint {
                address: a.parse().expect("ip"),
                port: 53,
                node_name: String::new(),
                terminating: false,
                cluster: String::new(),
            })
            .collect();
        let mut port = ServicePort::new("dns", Protocol::Udp, 53, eps);
        port.node_port = Some(30053);
        ServiceView::new("c", "ns", "dns", vec!["10.96.0.53".parse().expect("ip")], vec![port])
    }

    #[test]
    fn a_removed_endpoint_makes_its_flows_stale_and_a_first_endpoint_clears_the_address() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(
            stale_flows(Some(&view(&["10.0.0.1", "10.0.0.2"])), Some(&view(&["10.0.0.2"]))),
            vec![
                StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: ip("10.0.0.1") },
                StaleFlows::ToNodePort { port: 30053, endpoint: ip("10.0.0.1") },
            ]
        );
        assert_eq!(
            stale_flows(Some(&view(&[])), Some(&view(&["10.0.0.2"]))),
            vec![StaleFlows::AllToAddress { address: ip("10.96.0.53"), port: 53 }]
        );
        assert!(stale_flows(Some(&view(&["10.0.0.1"])), Some(&view(&["10.0.0.1", "10.0.0.2"]))).is_empty());
        let flow = StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: ip("10.0.0.1") };
        assert_eq!(
            flow.args().join(" "),
            "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.0.0.1"
        );
        let node_port = StaleFlows::ToNodePort { port: 30053, endpoint: ip("fd00::1") };
        assert_eq!(node_port.args().join(" "), "-D -p udp -f ipv6 --orig-port-dst 30053 --dst-nat fd00::1");
        assert_eq!(stale_flows(Some(&view(&["10.0.0.1"])), None).len(), 2);
    }
}
