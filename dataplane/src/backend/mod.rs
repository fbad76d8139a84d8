//! The one seam between the node's desired state and the kernel.
//!
//! A backend receives the whole desired [`NodeState`] and what changed since
//! its last successful apply, and makes the kernel match in one atomic step.
//! After a failure it must not trust its idea of the kernel: the next apply is
//! a full sync.

#[cfg(test)]
pub mod fixtures;
pub mod iptables;
pub mod ipvs;
pub mod nftables;
pub mod owners;
pub mod tool;

pub use kpx_proto::family::Family;

use crate::state::{ChangeSet, NodeState};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{tool} refused the update: {message}")]
    Refused { tool: &'static str, message: String },
    #[error("cannot run {tool}: {source}")]
    Spawn { tool: &'static str, source: std::io::Error },
}

pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// Makes the kernel match `desired`; `changes` says what differs from the
    /// last successful apply. All or nothing.
    fn apply(&mut self, desired: &NodeState, changes: &ChangeSet) -> Result<(), BackendError>;

    /// Programs everything from scratch, atomically.
    fn full_sync(&mut self, desired: &NodeState) -> Result<(), BackendError>;

    /// Removes everything this backend owns, and nothing else.
    fn cleanup(&mut self) -> Result<(), BackendError>;

    /// The rules as programmed, in the tool's own text.
    fn dump(&mut self) -> Result<String, BackendError>;

    /// Work that is due with time rather than with a change (the IPVS backend removes
    /// drained destinations); called every few seconds.
    fn housekeeping(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The node agent's proxy settings, the same for every backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyOptions {
    /// kube-proxy's `masqueradeAll`: masquerade all Service traffic.
    pub masquerade_all: bool,
    /// NodePorts open on the node's addresses inside these prefixes; empty: all of its addresses.
    pub nodeport_cidrs: Vec<ipnet::IpNet>,
    /// Pod traffic comes from these prefixes (local-traffic detection); empty: what the
    /// control plane's node config says.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
}

impl ProxyOptions {
    /// The node's addresses NodePorts open on (inside `--nodeport-addresses`).
    pub fn nodeport_addresses(&self, node: Option<&kpx_proto::types::NodeConfig>) -> Vec<std::net::IpAddr> {
        let addresses = node.map(|n| n.addresses.as_slice()).unwrap_or_default();
        addresses
            .iter()
            .filter(|a| self.nodeport_cidrs.is_empty() || self.nodeport_cidrs.iter().any(|c| c.contains(*a)))
            .copied()
            .collect()
    }

    /// The prefixes of pod traffic on this node.
    pub fn local_cidrs(&self, node: Option<&kpx_proto::types::NodeConfig>) -> Vec<ipnet::IpNet> {
        if !self.cluster_cidrs.is_empty() {
            return self.cluster_cidrs.iter().map(|c| c.trunc()).collect();
        }
        node.map(|n| n.local_traffic_cidrs().iter().map(|c| c.trunc()).collect()).unwrap_or_default()
    }
}

/// The backends a node agent can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Nftables,
    Iptables,
    Ipvs,
}

impl BackendKind {
    pub fn create(self, config: &crate::config::AgentConfig) -> Result<Box<dyn Backend>, String> {
        let options = config.options.clone();
        let iptables_mode = config.iptables_mode;
        match self {
            BackendKind::Nftables => {
                Ok(Box::new(nftables::NftablesBackend::new(nftables::runner::best_runner(), options)))
            }
            BackendKind::Iptables => {
                let mode = iptables_mode.resolve();
                tracing::info!(?mode, "iptables flavour");
                Ok(Box::new(iptables::IptablesBackend::new(iptables::IptablesProcess { mode }, options)))
            }
            BackendKind::Ipvs => Ok(Box::new(ipvs::IpvsBackend::new(
                options,
                ipvs::IpvsOptions {
                    scheduler: config.ipvs_scheduler.clone(),
                    drain_grace: config.ipvs_drain_grace,
                    iptables_mode,
                },
            ))),
        }
    }
}

/// The rules of a dump that mention the traced destination: nft set and map elements as
/// `map: element`, iptables rules as they are.
pub fn matching_rules(dump: &str, packet: &kpx_proto::trace::Packet) -> Vec<String> {
    let (ip, port, proto) = (packet.destination.ip(), packet.destination.port(), packet.protocol);
    let nft = format!("{ip} . {proto} . {port}");
    let host = if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") };
    let iptables = format!("-d {host} -p {proto} -m {proto} --dport {port} ");
    let mut collection = "";
    let mut out = Vec::new();
    for line in dump.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("map ").or_else(|| trimmed.strip_prefix("set ")) {
            collection = rest.trim_end_matches('{').trim();
        }
        if trimmed.contains(&iptables) {
            out.push(trimmed.to_owned());
        } else if trimmed.contains(&nft) {
            let element = trimmed.trim_start_matches("elements = {").trim_end_matches(['}', ',']).trim();
            for one in element.split(", ").filter(|e| e.contains(&nft)) {
                out.push(format!("{collection}: {one}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod trace_tests {
    use super::*;
    use kpx_proto::admin::TraceRequest;
    use kpx_proto::trace::Packet;
    use kpx_proto::types::Protocol;

    #[test]
    fn finds_the_rule_of_a_destination_in_either_backend_text() {
        let packet = Packet {
            destination: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            source: None,
        };
        let nft = "\t\telements = { 10.96.0.10 . tcp . 80 : goto pick-v4-2,\n\t\t\t     10.96.0.11 . tcp . 80 : goto pick-v4-1 }";
        let nft = format!("\tmap service-ips-v4 {{\n{nft}");
        assert_eq!(matching_rules(&nft, &packet), ["service-ips-v4: 10.96.0.10 . tcp . 80 : goto pick-v4-2"]);
        let ipt = "-A KPX-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment \"a/b:http cluster IP\" -j KPX-SVC-X\n-A KPX-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 8080 -j Y";
        assert_eq!(matching_rules(ipt, &packet).len(), 1);
        let bad = TraceRequest { destination: "nope".into(), ..Default::default() };
        assert!(Packet::from_request(&bad).is_err());
        let v6 = TraceRequest {
            destination: "[fd00::1]:53".into(),
            protocol: "UDP".into(),
            source: String::new(),
        };
        assert!(Packet::from_request(&v6).is_ok());
    }
}
