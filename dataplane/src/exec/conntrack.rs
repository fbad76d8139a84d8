//! Deleting conntrack entries with the `conntrack` tool (netlink underneath).

use std::net::IpAddr;
use std::sync::Arc;

use kpx_proto::types::Protocol;

use super::{process, ExecError};

/// One `conntrack -D` filter: flows of `protocol` to `destination` (any address when
/// `None`) on `port` that were NATed to `nat_to` (any endpoint when `None`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowFilter {
    pub protocol: Protocol,
    pub ipv6: bool,
    pub destination: Option<IpAddr>,
    pub port: u16,
    pub nat_to: Option<IpAddr>,
}

impl FlowFilter {
    /// The tool's arguments.
    pub fn args(&self) -> Vec<String> {
        let family = if self.ipv6 { "ipv6" } else { "ipv4" };
        let mut args: Vec<String> =
            ["-D", "-p", self.protocol.as_str(), "-f", family].map(String::from).to_vec();
        if let Some(address) = self.destination {
            args.extend(["--orig-dst".into(), address.to_string()]);
        }
        args.extend(["--orig-port-dst".into(), self.port.to_string()]);
        if let Some(endpoint) = self.nat_to {
            args.extend(["--dst-nat".into(), endpoint.to_string()]);
        }
        args
    }
}

/// What kpx asks of conntrack. Shared by the agent and a backend, hence `&self`.
pub trait Conntrack: Send + Sync {
    /// Deletes the flows `filter` matches; none matching is no error.
    fn delete(&self, filter: &FlowFilter) -> Result<(), ExecError>;
}

/// Shared handle.
pub type SharedConntrack = Arc<dyn Conntrack>;

/// The `conntrack` tool, one process per filter.
pub struct ConntrackProcess;

const TOOL: &str = "conntrack";

impl Conntrack for ConntrackProcess {
    fn delete(&self, filter: &FlowFilter) -> Result<(), ExecError> {
        let args = filter.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // conntrack exits 1 when no entry matched: nothing to delete, no error.
        let out = process::output(TOOL, TOOL, &args, None)?;
        tracing::debug!(?filter, result = %String::from_utf8_lossy(&out.stderr).trim(), "conntrack entries deleted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_the_tools_arguments() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let to_address = FlowFilter {
            protocol: Protocol::Udp,
            ipv6: false,
            destination: Some(ip("10.96.0.53")),
            port: 53,
            nat_to: Some(ip("10.0.0.1")),
        };
        assert_eq!(
            to_address.args().join(" "),
            "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.0.0.1"
        );
        let node_port = FlowFilter {
            protocol: Protocol::Udp,
            ipv6: true,
            destination: None,
            port: 30053,
            nat_to: Some(ip("fd00::1")),
        };
        assert_eq!(node_port.args().join(" "), "-D -p udp -f ipv6 --orig-port-dst 30053 --dst-nat fd00::1");
        let all = FlowFilter {
            protocol: Protocol::Sctp,
            ipv6: false,
            destination: Some(ip("10.96.0.9")),
            port: 9,
            nat_to: None,
        };
        assert_eq!(all.args().join(" "), "-D -p sctp -f ipv4 --orig-dst 10.96.0.9 --orig-port-dst 9");
    }
}
