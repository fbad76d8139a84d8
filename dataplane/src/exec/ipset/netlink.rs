//! Members added to and deleted from ipsets over netlink (the `ip_set` nfnetlink
//! subsystem): one message per set and up to [`PER_MESSAGE`] members, each acknowledged,
//! as `ipset -exist restore` would send them without the process.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpx_proto::types::Protocol;

use super::tool::IpsetProcess;
use super::{Edit, Ipset, Last, Member};
use crate::exec::netlink::{Message, NetlinkError, Socket, NLA_F_NET_BYTEORDER};
use crate::exec::ExecError;

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_IPSET: u16 = 6;
const IPSET_CMD_ADD: u16 = 9;
const IPSET_CMD_DEL: u16 = 10;
/// The protocol version spoken: the oldest a kernel of today accepts.
const IPSET_PROTOCOL: u8 = 6;

// Attributes of a command.
const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_DATA: u16 = 7;
const ATTR_ADT: u16 = 8;
const ATTR_LINENO: u16 = 9;
// Attributes of one member (inside ATTR_DATA).
const ATTR_IP: u16 = 1;
const ATTR_PORT: u16 = 4;
const ATTR_PROTO: u16 = 7;
const ATTR_IP2: u16 = 20;
const ATTR_CIDR2: u16 = 21;
// Inside ATTR_IP and ATTR_IP2.
const ATTR_IPADDR_IPV4: u16 = 1;
const ATTR_IPADDR_IPV6: u16 = 2;

/// Members per message: each at most 76 bytes, so a message's list of members stays well
/// under the 64 KiB an attribute can hold.
const PER_MESSAGE: usize = 500;

const FACILITY: &str = "ipset netlink";

/// A netlink socket to ipset.
pub struct IpsetSocket {
    socket: Socket,
}

impl IpsetSocket {
    pub fn open() -> Result<IpsetSocket, ExecError> {
        Ok(IpsetSocket { socket: Socket::open(NETLINK_NETFILTER).map_err(|e| failed("open", e))? })
    }

    /// Adds `members` to `set` or deletes them from it: a member there already (add) or
    /// not there (delete) is no error.
    pub fn edit(&mut self, edit: Edit, set: &str, members: &BTreeSet<Member>) -> Result<(), ExecError> {
        let members: Vec<&Member> = members.iter().collect();
        for part in members.chunks(PER_MESSAGE) {
            let message = message(edit, set, part);
            // Without NLM_F_EXCL the kernel takes "already there" and "not there" as done.
            self.socket.request(message, false).map_err(|e| failed(set, e))?;
        }
        Ok(())
    }
}

/// One command: `edit` of `members` (all of one family, as a set is) in `set`.
fn message(edit: Edit, set: &str, members: &[&Member]) -> Message {
    let command = match edit {
        Edit::Add => IPSET_CMD_ADD,
        Edit::Delete => IPSET_CMD_DEL,
    };
    let family = match members.first().map(|m| m.address) {
        Some(IpAddr::V6(_)) => libc::AF_INET6,
        _ => libc::AF_INET,
    };
    let mut m = Message::new((NFNL_SUBSYS_IPSET << 8) | command, [family as u8, 0, 0, 0]);
    m.put(ATTR_PROTOCOL, &[IPSET_PROTOCOL]);
    m.string(ATTR_SETNAME, set);
    m.u32(ATTR_LINENO, 0);
    m.begin(ATTR_ADT);
    for member in members {
        m.begin(ATTR_DATA);
        address(&mut m, ATTR_IP, member.address);
        m.put(ATTR_PORT | NLA_F_NET_BYTEORDER, &member.port.to_be_bytes());
        m.put(ATTR_PROTO, &[protocol_number(member.protocol)]);
        match &member.last {
            None => {}
            Some(Last::Address(a)) => {
                address(&mut m, ATTR_IP2, *a);
            }
            Some(Last::Net(net)) => {
                address(&mut m, ATTR_IP2, net.network());
                m.put(ATTR_CIDR2, &[net.prefix_len()]);
            }
        }
        m.end();
    }
    m.end();
    m
}

fn address(m: &mut Message, kind: u16, address: IpAddr) {
    m.begin(kind);
    match address {
        IpAddr::V4(a) => m.put(ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &a.octets()),
        IpAddr::V6(a) => m.put(ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &a.octets()),
    };
    m.end();
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => libc::IPPROTO_TCP as u8,
        Protocol::Udp => libc::IPPROTO_UDP as u8,
        Protocol::Sctp => libc::IPPROTO_SCTP as u8,
    }
}

fn failed(what: &str, e: NetlinkError) -> ExecError {
    let message = match e {
        NetlinkError::Socket(e) => format!("{what}: socket: {e}"),
        NetlinkError::Kernel(e) => match e.raw_os_error().and_then(ipset_error) {
            Some(why) => format!("{what}: {why}"),
            None => format!("{what}: {e}"),
        },
        NetlinkError::Malformed => format!("{what}: malformed reply from the kernel"),
    };
    ExecError::refused(FACILITY, message)
}

/// ipset's own error codes (past the errno range), as the tool words them.
fn ipset_error(code: i32) -> Option<&'static str> {
    Some(match code {
        4097 => "kernel error received: ipset protocol error",
        4102 => "the set is of another type",
        4104 => "the value of the CIDR parameter of the IP address is invalid",
        4106 => "the set is of another family",
        4352 => "hash is full, cannot add more elements",
        4353 => "null-valued element, cannot be stored in a hash type of set",
        4354 => "invalid protocol specified",
        4355 => "protocol missing, but must be specified",
        _ => return None,
    })
}

/// The node's ipset: whole sets through the tool, member edits over netlink (the socket
/// opened at the first edit, in the network namespace of the thread that makes it).
#[derive(Default)]
pub struct IpsetNetlink {
    socket: Option<IpsetSocket>,
}

impl Ipset for IpsetNetlink {
    fn restore(&mut self, script: &str) -> Result<(), ExecError> {
        IpsetProcess.restore(script)
    }

    fn names(&mut self) -> Result<Vec<String>, ExecError> {
        IpsetProcess.names()
    }

    fn save(&mut self) -> Result<String, ExecError> {
        IpsetProcess.save()
    }

    fn edit(&mut self, edit: Edit, set: &str, members: &BTreeSet<Member>) -> Result<(), ExecError> {
        if members.is_empty() {
            return Ok(());
        }
        let socket = match &mut self.socket {
            Some(socket) => socket,
            empty => empty.insert(IpsetSocket::open()?),
        };
        let result = socket.edit(edit, set, members);
        if result.is_err() {
            // Opened again next time: a socket that failed may hold a stale answer.
            self.socket = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::netlink::{attributes, find, HEADERS};

    fn member(address: &str, last: Option<Last>) -> Member {
        Member { address: address.parse().expect("ip"), protocol: Protocol::Udp, port: 53, last }
    }

    #[test]
    fn a_message_names_the_set_and_lists_each_member_in_network_order() {
        let net = Last::Net("192.0.2.0/24".parse().expect("net"));
        let members = [member("10.96.0.10", None), member("10.96.0.11", Some(net))];
        let bytes =
            message(Edit::Delete, "KPX-LB-SOURCE-4", &members.iter().collect::<Vec<_>>()).finish(0, 1);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), (6 << 8) | 10, "ip_set's DEL");
        assert_eq!(bytes[16], libc::AF_INET as u8);
        let attrs = attributes(&bytes[HEADERS..]);
        assert_eq!(find(&attrs, ATTR_PROTOCOL), Some(&[6u8][..]));
        assert_eq!(find(&attrs, ATTR_SETNAME), Some(&b"KPX-LB-SOURCE-4\0"[..]));
        let list = attributes(find(&attrs, ATTR_ADT).expect("a list of members"));
        assert_eq!(list.len(), 2);
        let second = attributes(list[1].1);
        let ip = attributes(find(&second, ATTR_IP).expect("ip"));
        assert_eq!(find(&ip, ATTR_IPADDR_IPV4), Some(&[10u8, 96, 0, 11][..]));
        assert_eq!(find(&second, ATTR_PORT), Some(&53u16.to_be_bytes()[..]));
        assert_eq!(find(&second, ATTR_PROTO), Some(&[17u8][..]));
        let ip2 = attributes(find(&second, ATTR_IP2).expect("ip2"));
        assert_eq!(find(&ip2, ATTR_IPADDR_IPV4), Some(&[192u8, 0, 2, 0][..]));
        assert_eq!(find(&second, ATTR_CIDR2), Some(&[24u8][..]));
    }
}
