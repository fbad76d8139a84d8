//! The ipsets that tell kpx's few iptables rules (see [`chains`](super::chains)) which
//! packets IPVS alone cannot handle: one set per role and family, members typed
//! ([`Member`], `10.96.0.10,tcp:80` in ipset's text). A full sync fills a fresh set and
//! swaps it in (atomic per set) for each set whose members differ from those the kernel
//! holds; an apply adds and deletes only the members that changed
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

    /// A member in ipset's text as `ipset save` prints it for a set of this role (a
    /// network of one address without its prefix length); `None` if it is not one.
    fn parse_member(self, text: &str) -> Option<Member> {
        let mut parts = text.split(',');
        let address: IpAddr = parts.next()?.parse().ok()?;
        let (protocol, port) = parts.next()?.split_once(':')?;
        let protocol = match protocol {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            _ => return None,
        };
        let last = match (self, parts.next()) {
            (SetRole::LoopBack, Some(a)) => Some(Last::Address(a.parse().ok()?)),
            (SetRole::LoadBalancerSource, Some(n)) => Some(Last::Net(match n.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => IpNet::from(n.parse::<IpAddr>().ok()?),
            })),
            (SetRole::LoopBack | SetRole::LoadBalancerSource, None) | (_, Some(_)) => return None,
            (_, None) => None,
        };
        parts.next().is_none().then_some(Member { address, protocol, port: port.parse().ok()?, last })
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

/// The most members a set of kpx's may hold.
const MAX_MEMBERS: &str = "1048576";

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

    fn family_word(&self) -> &'static str {
        match self.family {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        }
    }

    fn create(&self, name: &str) -> String {
        format!(
            "create {name} {} family {} hashsize 1024 maxelem {MAX_MEMBERS}\n",
            self.role.set_type(),
            self.family_word()
        )
    }

    /// Whether a `create` line's words after the name (`ipset save`'s: type, then
    /// `family F hashsize H maxelem M …`) describe the set kpx creates under this name.
    fn has_header<'a>(&self, mut words: impl Iterator<Item = &'a str>) -> bool {
        if words.next() != Some(self.role.set_type()) {
            return false;
        }
        let (mut family, mut max) = (None, None);
        while let (Some(key), Some(value)) = (words.next(), words.next()) {
            match key {
                "family" => family = Some(value),
                "maxelem" => max = Some(value),
                _ => {}
            }
        }
        family == Some(self.family_word()) && max == Some(MAX_MEMBERS)
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

/// `address,proto:port,net` (an allowed source of a load-balancer entry; the network as
/// the kernel keeps it, host bits cleared).
pub fn source_member(address: IpAddr, protocol: Protocol, port: u16, source: &IpNet) -> Member {
    Member { address, protocol, port, last: Some(Last::Net(source.trunc())) }
}

/// `ipset restore` input that makes every set hold exactly `members`, given the sets the
/// kernel holds (`held`, from [`held_members`]): each set that differs is filled as a fresh
/// set and swapped in, so a set is never seen half filled; a set that already holds its
/// members is left alone (a restart over intact sets writes none). Returns the input and
/// how many sets it swaps.
pub fn swap_script(members: &SetMembers, held: &SetMembers) -> (String, usize) {
    let empty = BTreeSet::new();
    let mut s = String::new();
    let mut swapped = 0;
    for set in SetName::all() {
        let wanted = members.get(&set).unwrap_or(&empty);
        if held.get(&set) == Some(wanted) {
            continue;
        }
        swapped += 1;
        let name = set.to_string();
        let fresh = format!("{name}-N");
        s.push_str(&set.create(&name));
        s.push_str(&set.create(&fresh));
        let _ = writeln!(s, "flush {fresh}");
        for member in wanted {
            let _ = writeln!(s, "add {fresh} {member}");
        }
        let _ = writeln!(s, "swap {fresh} {name}");
        let _ = writeln!(s, "destroy {fresh}");
    }
    (s, swapped)
}

/// What kpx's sets hold, read from `ipset save`: the members of each set whose type,
/// family and size limit are those kpx creates. A set missing, of another shape, or with
/// a member kpx could not have written is not in the map (to be made anew).
pub fn held_members(saved: &str) -> SetMembers {
    let by_name: BTreeMap<String, SetName> = SetName::all().map(|s| (s.to_string(), s)).collect();
    let mut held = SetMembers::new();
    let mut unreadable = BTreeSet::new();
    for line in saved.lines() {
        let mut words = line.split_whitespace();
        let (Some(verb), Some(name)) = (words.next(), words.next()) else { continue };
        let Some(&set) = by_name.get(name) else { continue };
        match verb {
            "create" if set.has_header(&mut words) => {
                held.insert(set, BTreeSet::new());
            }
            "add" => match (words.next().and_then(|m| set.role.parse_member(m)), held.get_mut(&set)) {
                (Some(member), Some(members)) => {
                    members.insert(member);
                }
                _ => {
                    unreadable.insert(set);
                }
            },
            _ => {
                unreadable.insert(set);
            }
        }
    }
    held.retain(|set, _| !unreadable.contains(set));
    held
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
        let (script, swapped) =
            swap_script(&members(set, &[entry_member(vip, Protocol::Tcp, 80)]), &SetMembers::new());
        assert_eq!(swapped, 14);
        assert!(script.contains(
            "create KPX-CLUSTER-IP-4-N hash:ip,port family inet hashsize 1024 maxelem 1048576\nflush KPX-CLUSTER-IP-4-N\nadd KPX-CLUSTER-IP-4-N 10.96.0.10,tcp:80\nswap KPX-CLUSTER-IP-4-N KPX-CLUSTER-IP-4\ndestroy KPX-CLUSTER-IP-4-N\n"
        ));
        assert_eq!(script.matches("swap ").count(), 14, "every role in both families");
        let existing = ["KUBE-CLUSTER-IP".to_owned(), "KPX-DROP-6".to_owned()];
        assert_eq!(destroy_script(&existing), "destroy KPX-DROP-6\n");
    }

    #[test]
    fn sets_the_kernel_holds_as_wanted_are_not_swapped() {
        let vip: IpAddr = "10.96.0.10".parse().expect("ip");
        let lb: IpAddr = "192.0.2.20".parse().expect("ip");
        let v6: IpAddr = "fd00::5".parse().expect("ip");
        let host: IpNet = "198.51.100.7/32".parse().expect("net");
        let wide: IpNet = "203.0.113.9/24".parse().expect("net");
        let mut wanted = SetMembers::new();
        wanted.insert(
            SetName::new(SetRole::ClusterIp, Family::V4),
            [entry_member(vip, Protocol::Tcp, 80)].into(),
        );
        wanted.insert(
            SetName::new(SetRole::LoadBalancerSource, Family::V4),
            [source_member(lb, Protocol::Tcp, 80, &host), source_member(lb, Protocol::Udp, 53, &wide)].into(),
        );
        wanted.insert(
            SetName::new(SetRole::LoopBack, Family::V6),
            [loop_back_member(v6, Protocol::Sctp, 9)].into(),
        );
        // `ipset save` as the kernel prints those: a one-address net without its length,
        // the wide one with its host bits cleared, headers with what ipset adds.
        let header = |name: &str, kind: &str, family: &str| {
            format!("create {name} {kind} family {family} hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x1\n")
        };
        let mut saved = String::new();
        for set in SetName::all() {
            saved.push_str(&header(&set.to_string(), set.role.set_type(), set.family_word()));
        }
        saved.push_str("add KPX-CLUSTER-IP-4 10.96.0.10,tcp:80\n");
        saved.push_str("add KPX-LB-SOURCE-4 192.0.2.20,tcp:80,198.51.100.7\n");
        saved.push_str("add KPX-LB-SOURCE-4 192.0.2.20,udp:53,203.0.113.0/24\n");
        saved.push_str("add KPX-LOOP-BACK-6 fd00::5,sctp:9,fd00::5\n");
        saved.push_str("create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n");
        assert_eq!(swap_script(&wanted, &held_members(&saved)), (String::new(), 0));

        // One member too many, one set of another shape, one missing: those three only.
        let changed = saved
            .replace(
                "add KPX-CLUSTER-IP-4 10.96.0.10,tcp:80\n",
                "add KPX-CLUSTER-IP-4 10.96.0.10,tcp:80\nadd KPX-CLUSTER-IP-4 10.96.0.11,tcp:80\n",
            )
            .replace(
                "create KPX-DROP-6 hash:ip,port family inet6 hashsize 1024 maxelem 1048576",
                "create KPX-DROP-6 hash:ip,port family inet6 hashsize 1024 maxelem 65536",
            )
            .replace(&header("KPX-EXTERNAL-4", "hash:ip,port", "inet"), "");
        let (script, swapped) = swap_script(&wanted, &held_members(&changed));
        assert_eq!(swapped, 3, "{script}");
        for set in ["KPX-CLUSTER-IP-4", "KPX-DROP-6", "KPX-EXTERNAL-4"] {
            assert!(script.contains(&format!("swap {set}-N {set}\n")), "{set}: {script}");
        }
        assert!(script.contains("add KPX-CLUSTER-IP-4-N 10.96.0.10,tcp:80\nswap"), "{script}");
    }
}
