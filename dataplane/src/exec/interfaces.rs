//! The node's interface addresses, read over rtnetlink (one `RTM_GETLINK` and one
//! `RTM_GETADDR` dump): where kube-proxy's iptables and IPVS modes open NodePorts when
//! `nodePortAddresses` is empty or a prefix — every local address, secondary ones too,
//! not only those the Node object lists.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::netlink::{attributes, find, read_string, Message, NetlinkError, Socket};
use super::ExecError;

/// One address on one interface.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InterfaceAddress {
    pub interface: String,
    pub address: IpAddr,
}

/// What kpx asks of the node's interfaces.
pub trait Interfaces: Send {
    /// Every address on every interface.
    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, ExecError>;
}

/// Interfaces that hold Service addresses, not the node's: IPVS's dummy interfaces
/// (kpx's, and kube-proxy's during a migration).
const SERVICE_INTERFACES: &[&str] = &["kpx-ipvs0", "kube-ipvs0"];

/// The addresses NodePorts may open on: not loopback, not link-local, not on an
/// interface that holds Service addresses; sorted, each once.
pub fn node_addresses(listed: &[InterfaceAddress]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = listed
        .iter()
        .filter(|a| !SERVICE_INTERFACES.contains(&a.interface.as_str()))
        .map(|a| a.address)
        .filter(|a| !a.is_loopback() && !is_link_local(a) && !a.is_unspecified())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn is_link_local(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// No interface read: only the node config's addresses count (tests and tools).
pub struct Unread;

impl Interfaces for Unread {
    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, ExecError> {
        Ok(Vec::new())
    }
}

/// rtnetlink, a socket per read.
pub struct Rtnetlink;

const NETLINK_ROUTE: i32 = 0;
const RTM_GETLINK: u16 = 18;
const RTM_GETADDR: u16 = 22;
const IFLA_IFNAME: u16 = 3;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;

fn failed(e: NetlinkError) -> ExecError {
    let message = match e {
        NetlinkError::Socket(e) | NetlinkError::Kernel(e) => e.to_string(),
        NetlinkError::Malformed => "a reply that cannot be read".to_owned(),
    };
    ExecError::refused("rtnetlink", message)
}

/// The interface index at the start of a body whose family header was taken off
/// (`ifaddrmsg`: index right after it; `ifinfomsg`: too, then flags and change).
fn index(body: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(body.get(0..4)?.try_into().ok()?))
}

fn address(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?))),
        _ => None,
    }
}

impl Interfaces for Rtnetlink {
    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, ExecError> {
        let mut socket = Socket::open(NETLINK_ROUTE).map_err(failed)?;
        // AF_UNSPEC: every family.
        let links = socket.request(Message::new(RTM_GETLINK, [0; 4]), true).map_err(failed)?;
        let names: std::collections::HashMap<u32, String> = links
            .iter()
            .filter_map(|body| {
                let name = read_string(find(&attributes(body.get(12..)?), IFLA_IFNAME))?;
                Some((index(body)?, name))
            })
            .collect();
        let addresses = socket.request(Message::new(RTM_GETADDR, [0; 4]), true).map_err(failed)?;
        Ok(addresses
            .iter()
            .filter_map(|body| {
                let attrs = attributes(body.get(4..)?);
                // IPv4's own address is IFA_LOCAL (IFA_ADDRESS is the peer's on a
                // point-to-point link); IPv6 has IFA_ADDRESS only.
                let address = address(find(&attrs, IFA_LOCAL).or_else(|| find(&attrs, IFA_ADDRESS))?)?;
                let interface = names.get(&index(body)?).cloned().unwrap_or_default();
                Some(InterfaceAddress { interface, address })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(interface: &str, address: &str) -> InterfaceAddress {
        InterfaceAddress { interface: interface.into(), address: address.parse().expect("ip") }
    }

    #[test]
    fn node_addresses_leave_out_loopback_link_local_and_service_interfaces() {
        let listed = [
            at("lo", "127.0.0.1"),
            at("lo", "::1"),
            at("eth0", "10.0.0.1"),
            at("eth0", "10.0.9.1"),
            at("eth0", "fe80::1"),
            at("eth1", "169.254.3.3"),
            at("eth1", "fd00::1"),
            at("kpx-ipvs0", "10.96.0.1"),
            at("kube-ipvs0", "10.96.0.10"),
            at("eth2", "10.0.0.1"),
        ];
        let want: Vec<IpAddr> = ["10.0.0.1", "10.0.9.1", "fd00::1"].map(|a| a.parse().expect("ip")).to_vec();
        assert_eq!(node_addresses(&listed), want);
    }
}
