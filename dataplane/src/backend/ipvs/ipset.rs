//! The ipsets that tell kpx's few iptables rules (see [`chains`](super::chains)) which
//! packets IPVS alone cannot handle: one set per role and family, members typed
//! ([`Member`], `10.96.0.10,tcp:80` in ipset's text). A full sync fills a fresh set and
//! swaps it in (atomic per set); an apply adds and deletes only the members that changed
//! ([`crate::exec::ipset::Ipset::edit`]). Pure: the scripts and members go to
//! [`crate::exec::ipset`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::types::Protocol;

use crate::backend::Family;
use crate::exec::ipset::Last;
pub use crate::exec::ipset::Member;

/// What a set's members are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetRole {
    /// ClusterIP entries: traffic from outside the pod CIDRs (or all, with
    /// `--masquerade-all`) is masqueraded.
    ClusterIp,
    /// External IP, load-balancer and NodePort entries of policy Cluster: masqueraded.
    External,
    /// External entries of policy Local: the client address is kept (only the node's own
    /// traffic is masqueraded).
    ExternalLocal,
    /// `endpoint,proto:port,endpoint`: a pod reaching itself through a Service (hairpin).
    LoopBack,
    /// Load-balancer entries with source ranges.
    LoadBalancerFirewall,
    /// `lb-ip,proto:port,allowed-net`: the sources those entries accept.
    LoadBalancerSource,
    /// Entries whose traffic is dropped (a traffic policy Local without endpoints here).
    Drop,
}

impl SetRole {
    pub const ALL: [SetRole; 7] = [
        SetRole::ClusterIp,
        SetRole::External,
        SetRole::ExternalLocal,
        SetRole::LoopBack,
        SetRole::LoadBalancerFirewall,
        SetRole::LoadBalancerSource,
        SetRole::Drop,
    ];

    fn base(self) -> &'static str {
        match self {
            SetRole::ClusterIp => "CLUSTER-IP",
            SetRole::External => "EXTERNAL",
            SetRole::ExternalLocal => "EXTERNAL-LOCAL",
            SetRole::LoopBack => "LOOP-BACK",
            SetRole::LoadBalancerFirewall => "LB-FIREWALL",
            SetRole::LoadBalancerSource => "LB-SOURCE",
            SetRole::Drop => "DROP",
        }
    }

    fn set_type(self) -> &'static str {
        match self {
            SetRole::LoopBack => "hash:ip,port,ip",
            SetRole::LoadBalancerSource => "hash:ip,port,net",
            _ => "hash:ip,port",
        }
    }
}

/// A set of one role and family: `KPX-CLUSTER-IP-4`, `KPX-LOOP-BACK-6`, …
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetName {
    pub role: SetRole,
    pub family: Family,
}

/// The prefix of every set kpx owns.
pub const PREFIX: &str = "KPX-";

impl fmt::Display for SetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = match self.family {
            Family::V4 => 4,
            Family::V6 => 6,
        };
        write!(f, "{PREFIX}{}-{family}", self.role.base())
    }
}

impl SetName {
    pub fn new(role: SetRole, family: Family) -> Self {
        SetName { role, family }
    }

    /// Every set kpx's chains refer to.
    pub fn all() -> impl Iterator<Item = SetName> {
        Family::ALL
            .into_iter()
            .flat_map(|family| SetRole::ALL.into_iter().map(move |role| SetName { role, family }))
    }

    fn create(&self, name: &str) -> String {
        let family = match self.family {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        };
        format!("create {name} {} family {family} hashsize 1024 maxelem 1048576\n", self.role.set_type())
    }
}

/// The members of every set.
pub type SetMembers = BTreeMap<SetName, BTreeSet<Member>>;

/// `address,proto:port`.
pub fn entry_member(address: IpAddr, protocol: Protocol, port: u16) -> Member {
    Member { address, protocol, port, last: None }
}

/// `address,proto:port,address` (hairpin).
pub fn loop_back_member(address: IpAddr, protocol: Protocol, port: u16) -> Member {
    Member { address, protocol, port, last: Some(Last::Address(address)) }
}

/// `address,proto:port,net` (an allowed source of a load-balancer entry).
pub fn source_member(address: IpAddr, protocol: Protocol, port: u16, source: &IpNet) -> Member {
    Member { address, protocol, port, last: Some(Last::Net(*source)) }
}

/// `ipset restore` input that makes every set hold exactly `members`: each filled as a
/// fresh set and swapped in, so a set is never seen half filled.
pub fn swap_script(members: &SetMembers) -> String {
    let empty = BTreeSet::new();
    let mut s = String::new();
    for set in SetName::all() {
        let name = set.to_string();
        let fresh = format!("{name}-N");
        s.push_str(&set.create(&name));
        s.push_str(&set.create(&fresh));
        let _ = writeln!(s, "flush {fresh}");
        for member in members.get(&set).unwrap_or(&empty) {
            let _ = writeln!(s, "add {fresh} {member}");
        }
        let _ = writeln!(s, "swap {fresh} {name}");
        let _ = writeln!(s, "destroy {fresh}");
    }
    s
}

/// `ipset restore` input that destroys the sets among `existing` that kpx owns.
pub fn destroy_script(existing: &[String]) -> String {
    let ours: BTreeSet<String> = SetName::all().flat_map(|s| [s.to_string(), format!("{s}-N")]).collect();
    existing.iter().filter(|name| ours.contains(*name)).map(|name| format!("destroy {name}\n")).collect()
}

/// The lines of `ipset save` output that are about kpx's sets.
pub fn owned_lines(saved: &str) -> String {
    saved
        .lines()
        .filter(|line| line.split_whitespace().nth(1).is_some_and(|set| set.starts_with(PREFIX)))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(set: SetName, list: &[Member]) -> SetMembers {
        [(set, list.iter().cloned().collect())].into()
    }

    #[test]
    fn names_and_members_are_in_ipsets_own_text() {
        let set = SetName::new(SetRole::LoopBack, Family::V6);
        assert_eq!(set.to_string(), "KPX-LOOP-BACK-6");
        let ip: IpAddr = "fd00::5".parse().expect("ip");
        assert_eq!(loop_back_member(ip, Protocol::Udp, 53).to_string(), "fd00::5,udp:53,fd00::5");
        let net: IpNet = "192.0.2.0/24".parse().expect("net");
        let lb: IpAddr = "192.0.2.20".parse().expect("ip");
        assert_eq!(source_member(lb, Protocol::Tcp, 80, &net).to_string(), "192.0.2.20,tcp:80,192.0.2.0/24");
        assert!(SetName::all().all(|s| s.to_string().len() + 2 <= 31), "ipset names are at most 31 bytes");
    }

    #[test]
    fn a_full_sync_swaps_every_set() {
        let set = SetName::new(SetRole::ClusterIp, Family::V4);
        let vip: IpAddr = "10.96.0.10".parse().expect("ip");
        let script = swap_script(&members(set, &[entry_member(vip, Protocol::Tcp, 80)]));
        assert!(script.contains(
            "create KPX-CLUSTER-IP-4-N hash:ip,port family inet hashsize 1024 maxelem 1048576\nflush KPX-CLUSTER-IP-4-N\nadd KPX-CLUSTER-IP-4-N 10.96.0.10,tcp:80\nswap KPX-CLUSTER-IP-4-N KPX-CLUSTER-IP-4\ndestroy KPX-CLUSTER-IP-4-N\n"
        ));
        assert_eq!(script.matches("swap ").count(), 14, "every role in both families");
        let existing = ["KUBE-CLUSTER-IP".to_owned(), "KPX-DROP-6".to_owned()];
        assert_eq!(destroy_script(&existing), "destroy KPX-DROP-6\n");
    }
}
