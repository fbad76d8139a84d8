//! ipset: the `ipset` tool for whole sets (create, swap, destroy, save) and, for members
//! added to and deleted from sets that exist, netlink ([`netlink::IpsetNetlink`]): a change of one
//! endpoint is then two messages rather than two processes.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::types::Protocol;

pub mod netlink;
pub mod tool;

use super::ExecError;

/// One member of kpx's sets: `address,proto:port` (`hash:ip,port`), and for the sets of
/// three dimensions a second address (`hash:ip,port,ip`) or a network (`hash:ip,port,net`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    pub last: Option<Last>,
}

/// The third dimension of a member.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Last {
    Address(IpAddr),
    Net(IpNet),
}

/// In ipset's own text: `10.96.0.10,tcp:80`, `10.244.1.2,tcp:8080,10.244.1.2`.
impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}:{}", self.address, self.protocol, self.port)?;
        match &self.last {
            None => Ok(()),
            Some(Last::Address(a)) => write!(f, ",{a}"),
            Some(Last::Net(n)) => write!(f, ",{n}"),
        }
    }
}

/// Whether members are added or deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    Add,
    Delete,
}

/// What kpx asks of ipset.
pub trait Ipset: Send {
    /// Feeds `script` to `ipset -exist restore` (creating what is there, adding a member
    /// that is there or deleting one that is not is no error).
    fn restore(&mut self, script: &str) -> Result<(), ExecError>;
    /// The names of the sets in the kernel.
    fn names(&mut self) -> Result<Vec<String>, ExecError>;
    /// `ipset save` of every set.
    fn save(&mut self) -> Result<String, ExecError>;
    /// Adds `members` to the set `set`, or deletes them from it; the set exists. As with
    /// `-exist`, adding a member that is there or deleting one that is not is no error.
    /// This default says it as `restore` input.
    fn edit(&mut self, edit: Edit, set: &str, members: &BTreeSet<Member>) -> Result<(), ExecError> {
        self.restore(&edit_script(edit, set, members))
    }
}

/// `ipset restore` input that adds `members` to `set` or deletes them from it.
pub fn edit_script(edit: Edit, set: &str, members: &BTreeSet<Member>) -> String {
    let verb = match edit {
        Edit::Add => "add",
        Edit::Delete => "del",
    };
    members.iter().map(|m| format!("{verb} {set} {m}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_written_in_ipsets_own_text() {
        let member = |last| Member {
            address: "10.96.0.10".parse().expect("ip"),
            protocol: Protocol::Tcp,
            port: 80,
            last,
        };
        assert_eq!(member(None).to_string(), "10.96.0.10,tcp:80");
        let ip = Last::Address("10.244.1.2".parse().expect("ip"));
        assert_eq!(member(Some(ip)).to_string(), "10.96.0.10,tcp:80,10.244.1.2");
        let net = Last::Net("192.0.2.0/24".parse().expect("net"));
        assert_eq!(member(Some(net)).to_string(), "10.96.0.10,tcp:80,192.0.2.0/24");
        let v6 =
            Member { address: "fd00::1".parse().expect("ip"), protocol: Protocol::Sctp, port: 9, last: None };
        let members: BTreeSet<Member> = [v6].into();
        assert_eq!(edit_script(Edit::Delete, "S", &members), "del S fd00::1,sctp:9\n");
    }
}
