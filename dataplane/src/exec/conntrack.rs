//! Deleting conntrack entries with the `conntrack` tool (netlink underneath), and
//! finding the TCP connection attempts that no Service rule translated.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpx_proto::types::Protocol;

use super::{process, ExecError};

/// One `conntrack -D` filter: flows of `protocol` to `destination` (any address when
/// `None`) on `port` that were NATed to `nat_to`, address and port (any endpoint when
/// `None`); with
/// `untranslated`, only TCP attempts still unanswered (`SYN_SENT`) that no rule NATed
/// (their answer would come from `destination` itself).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowFilter {
    pub protocol: Protocol,
    pub ipv6: bool,
    pub destination: Option<IpAddr>,
    pub port: u16,
    pub nat_to: Option<SocketAddr>,
    pub untranslated: bool,
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
            // The answer comes from the endpoint's port: flows NATed to another port of the
            // same address are not these.
            args.extend(["--dst-nat".into(), endpoint.ip().to_string()]);
            args.extend(["--reply-port-src".into(), endpoint.port().to_string()]);
        }
        if let (true, Some(address)) = (self.untranslated, self.destination) {
            args.extend(["--reply-src".into(), address.to_string(), "--state".into(), "SYN_SENT".into()]);
        }
        args
    }
}

/// The original destinations (address, port) of the TCP entries in `conntrack -L -p tcp
/// --state SYN_SENT` output whose answer would come from that destination itself: attempts
/// that no rule translated. Lines it cannot read are skipped.
pub fn untranslated_destinations(listing: &str) -> BTreeSet<(IpAddr, u16)> {
    let mut out = BTreeSet::new();
    for line in listing.lines() {
        let field = |key: &str, nth: usize| {
            line.split_whitespace().filter_map(|w| w.strip_prefix(key)).nth(nth).map(str::to_owned)
        };
        let destination = field("dst=", 0).and_then(|a| a.parse::<IpAddr>().ok());
        let port = field("dport=", 0).and_then(|p| p.parse::<u16>().ok());
        let (reply_source, reply_port) = (field("src=", 1), field("sport=", 1));
        if let (Some(destination), Some(port), Some(reply_source), Some(reply_port)) =
            (destination, port, reply_source, reply_port)
        {
            let same_address = reply_source.parse::<IpAddr>().ok() == Some(destination);
            if same_address && reply_port.parse::<u16>().ok() == Some(port) {
                out.insert((destination, port));
            }
        }
    }
    out
}

/// What kpx asks of conntrack. Shared by the agent and a backend, hence `&self`.
pub trait Conntrack: Send + Sync {
    /// Deletes the flows `filter` matches; none matching is no error.
    /// Deletes the flows `filter` matches; returns how many there were.
    fn delete(&self, filter: &FlowFilter) -> Result<u64, ExecError>;

    /// The destinations of the TCP connection attempts of one family that are still
    /// unanswered and were not translated (see [`untranslated_destinations`]).
    fn untranslated_tcp(&self, ipv6: bool) -> Result<BTreeSet<(IpAddr, u16)>, ExecError>;
}

/// Shared handle.
pub type SharedConntrack = Arc<dyn Conntrack>;

/// The `conntrack` tool, one process per filter.
pub struct ConntrackProcess;

const TOOL: &str = "conntrack";

impl Conntrack for ConntrackProcess {
    fn delete(&self, filter: &FlowFilter) -> Result<u64, ExecError> {
        let args = filter.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // conntrack exits 1 when no entry matched: nothing to delete, no error.
        let out = process::output(TOOL, TOOL, &args, None)?;
        let said = String::from_utf8_lossy(&out.stderr);
        tracing::debug!(?filter, result = %said.trim(), "conntrack entries deleted");
        Ok(deleted_count(&said))
    }

    fn untranslated_tcp(&self, ipv6: bool) -> Result<BTreeSet<(IpAddr, u16)>, ExecError> {
        let family = if ipv6 { "ipv6" } else { "ipv4" };
        let args = ["-L", "-p", "tcp", "--state", "SYN_SENT", "-f", family];
        let out = process::output(TOOL, TOOL, &args, None)?;
        if !out.status.success() {
            let message = format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
            return Err(ExecError::refused(TOOL, message));
        }
        Ok(untranslated_destinations(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// How many entries `conntrack -D` says it deleted ("… 3 flow entries have been deleted.").
fn deleted_count(said: &str) -> u64 {
    said.lines()
        .find_map(|l| l.split_once(" flow entries have been deleted")?.0.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deleted_count_is_read_from_what_the_tool_says() {
        assert_eq!(
            deleted_count("conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.\n"),
            3
        );
        assert_eq!(
            deleted_count("conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n"),
            0
        );
        assert_eq!(deleted_count("conntrack: operation failed\n"), 0);
    }

    #[test]
    fn filters_are_the_tools_arguments() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let to_address = FlowFilter {
            protocol: Protocol::Udp,
            ipv6: false,
            destination: Some(ip("10.96.0.53")),
            port: 53,
            nat_to: Some(SocketAddr::new(ip("10.0.0.1"), 8080)),
            untranslated: false,
        };
        assert_eq!(
            to_address.args().join(" "),
            "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.0.0.1 --reply-port-src 8080"
        );
        let node_port = FlowFilter {
            protocol: Protocol::Udp,
            ipv6: true,
            destination: None,
            port: 30053,
            nat_to: Some(SocketAddr::new(ip("fd00::1"), 53)),
            untranslated: false,
        };
        assert_eq!(
            node_port.args().join(" "),
            "-D -p udp -f ipv6 --orig-port-dst 30053 --dst-nat fd00::1 --reply-port-src 53"
        );
        let all = FlowFilter {
            protocol: Protocol::Sctp,
            ipv6: false,
            destination: Some(ip("10.96.0.9")),
            port: 9,
            nat_to: None,
            untranslated: false,
        };
        assert_eq!(all.args().join(" "), "-D -p sctp -f ipv4 --orig-dst 10.96.0.9 --orig-port-dst 9");
        let unanswered = FlowFilter {
            protocol: Protocol::Tcp,
            ipv6: false,
            destination: Some(ip("10.96.0.9")),
            port: 80,
            nat_to: None,
            untranslated: true,
        };
        assert_eq!(
            unanswered.args().join(" "),
            "-D -p tcp -f ipv4 --orig-dst 10.96.0.9 --orig-port-dst 80 --reply-src 10.96.0.9 --state SYN_SENT"
        );
    }

    #[test]
    fn only_attempts_that_no_rule_translated_are_untranslated() {
        let listing = "tcp      6 99 SYN_SENT src=10.0.0.2 dst=10.96.1.50 sport=4002 dport=80 [UNREPLIED] src=10.244.1.2 dst=10.0.0.2 sport=8080 dport=4002 mark=0 use=1\n\
            tcp      6 99 SYN_SENT src=10.0.0.2 dst=10.96.1.50 sport=4000 dport=80 [UNREPLIED] src=10.96.1.50 dst=10.0.0.2 sport=80 dport=4000 mark=0 use=1\n\
            tcp      6 99 SYN_SENT src=fd00::2 dst=fd00:96::1 sport=4000 dport=443 [UNREPLIED] src=fd00:96::1 dst=fd00::2 sport=443 dport=4000 mark=0 use=1\n\
            garbage dst=10.1.1.1\n";
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(
            untranslated_destinations(listing).into_iter().collect::<Vec<_>>(),
            [(ip("10.96.1.50"), 80), (ip("fd00:96::1"), 443)]
        );
    }
}
