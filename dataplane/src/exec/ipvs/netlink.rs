//! IPVS over generic netlink (the kernel's "IPVS" family, `include/uapi/linux/ip_vs.h`):
//! virtual services and their destinations, created, edited, deleted and listed, one
//! request per call, each acknowledged by the kernel.

use std::net::IpAddr;

#[cfg(test)]
use super::PROTO_TCP;
use super::{
    Destination, DestinationEdit, Ipvs, IpvsError, ServiceKey, VirtualService, FLAG_PERSISTENT,
    FORWARD_MASQUERADE,
};

use crate::exec::netlink::{attributes, find, Message, NetlinkError, Socket};

const NETLINK_GENERIC: i32 = 16;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const IPVS_GENL_VERSION: u8 = 1;
mod cmd {
    pub const NEW_SERVICE: u8 = 1;
    pub const SET_SERVICE: u8 = 2;
    pub const DEL_SERVICE: u8 = 3;
    pub const GET_SERVICE: u8 = 4;
    pub const NEW_DEST: u8 = 5;
    pub const SET_DEST: u8 = 6;
    pub const DEL_DEST: u8 = 7;
    pub const GET_DEST: u8 = 8;
}
mod attr {
    pub const SERVICE: u16 = 1;
    pub const DEST: u16 = 2;
}
mod svc {
    pub const AF: u16 = 1;
    pub const PROTOCOL: u16 = 2;
    pub const ADDR: u16 = 3;
    pub const PORT: u16 = 4;
    pub const SCHED_NAME: u16 = 6;
    pub const FLAGS: u16 = 7;
    pub const TIMEOUT: u16 = 8;
    pub const NETMASK: u16 = 9;
}
mod dest {
    pub const ADDR: u16 = 1;
    pub const PORT: u16 = 2;
    pub const FWD_METHOD: u16 = 3;
    pub const WEIGHT: u16 = 4;
    pub const U_THRESH: u16 = 5;
    pub const L_THRESH: u16 = 6;
    pub const ACTIVE_CONNS: u16 = 7;
    pub const INACT_CONNS: u16 = 8;
    pub const ADDR_FAMILY: u16 = 11;
}

/// A generic netlink message: `family`'s `command` at `version`.
fn genl_message(family: u16, command: u8, version: u8) -> Message {
    Message::new(family, [command, version, 0, 0])
}

fn error(op: &'static str, e: NetlinkError) -> IpvsError {
    match e {
        NetlinkError::Socket(e) => IpvsError::Socket(e),
        NetlinkError::Kernel(error) => IpvsError::Kernel { op, error },
        NetlinkError::Malformed => IpvsError::Malformed { op },
    }
}

fn family_of(address: IpAddr) -> u16 {
    match address {
        IpAddr::V4(_) => libc::AF_INET as u16,
        IpAddr::V6(_) => libc::AF_INET6 as u16,
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first four.
fn inet_addr(address: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match address {
        IpAddr::V4(a) => out[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => out.copy_from_slice(&a.octets()),
    }
    out
}

fn service_key_attrs(m: &mut Message, key: &ServiceKey) {
    m.u16(svc::AF, family_of(key.address))
        .u16(svc::PROTOCOL, key.protocol)
        .put(svc::ADDR, &inet_addr(key.address))
        .put(svc::PORT, &key.port.to_be_bytes());
}

fn service_attrs(m: &mut Message, s: &VirtualService) {
    m.begin(attr::SERVICE);
    service_key_attrs(m, &s.key);
    let mut sched = s.scheduler.as_bytes().to_vec();
    sched.push(0);
    let netmask: u32 = if s.key.address.is_ipv4() { 0xffff_ffff } else { 128 };
    let mut flags = s.flags.to_ne_bytes().to_vec();
    flags.extend_from_slice(&u32::MAX.to_ne_bytes()); // mask: set every flag as given
    m.put(svc::SCHED_NAME, &sched)
        .put(svc::FLAGS, &flags)
        .u32(svc::TIMEOUT, s.timeout)
        .u32(svc::NETMASK, netmask);
    m.end();
}

fn destination_attrs(m: &mut Message, d: &Destination) {
    m.begin(attr::DEST)
        .put(dest::ADDR, &inet_addr(d.address))
        .put(dest::PORT, &d.port.to_be_bytes())
        .u32(dest::FWD_METHOD, FORWARD_MASQUERADE)
        .u32(dest::WEIGHT, d.weight)
        .u32(dest::U_THRESH, 0)
        .u32(dest::L_THRESH, 0)
        .u16(dest::ADDR_FAMILY, family_of(d.address))
        .end();
}

fn read_u16(v: Option<&[u8]>) -> Option<u16> {
    Some(u16::from_ne_bytes(v?.get(..2)?.try_into().ok()?))
}

fn read_u32(v: Option<&[u8]>) -> Option<u32> {
    Some(u32::from_ne_bytes(v?.get(..4)?.try_into().ok()?))
}

fn read_addr(family: u16, v: Option<&[u8]>) -> Option<IpAddr> {
    let v = v?;
    if family == libc::AF_INET as u16 {
        let o: [u8; 4] = v.get(..4)?.try_into().ok()?;
        Some(IpAddr::from(o))
    } else {
        let o: [u8; 16] = v.get(..16)?.try_into().ok()?;
        Some(IpAddr::from(o))
    }
}

fn read_port(v: Option<&[u8]>) -> Option<u16> {
    Some(u16::from_be_bytes(v?.get(..2)?.try_into().ok()?))
}

fn parse_service(nest: &[u8]) -> Option<VirtualService> {
    let a = attributes(nest);
    let family = read_u16(find(&a, svc::AF))?;
    let key = ServiceKey {
        address: read_addr(family, find(&a, svc::ADDR))?,
        protocol: read_u16(find(&a, svc::PROTOCOL))?,
        port: read_port(find(&a, svc::PORT))?,
    };
    let scheduler = find(&a, svc::SCHED_NAME)
        .map(|s| String::from_utf8_lossy(s).trim_end_matches('\0').to_owned())
        .unwrap_or_default();
    Some(VirtualService {
        key,
        scheduler,
        flags: read_u32(find(&a, svc::FLAGS)).unwrap_or(0) & FLAG_PERSISTENT,
        timeout: read_u32(find(&a, svc::TIMEOUT)).unwrap_or(0),
    })
}

fn parse_destination(nest: &[u8], service_family: u16) -> Option<Destination> {
    let a = attributes(nest);
    let family = read_u16(find(&a, dest::ADDR_FAMILY)).unwrap_or(service_family);
    Some(Destination {
        address: read_addr(family, find(&a, dest::ADDR))?,
        port: read_port(find(&a, dest::PORT))?,
        weight: read_u32(find(&a, dest::WEIGHT))?,
        active: read_u32(find(&a, dest::ACTIVE_CONNS)).unwrap_or(0),
        inactive: read_u32(find(&a, dest::INACT_CONNS)).unwrap_or(0),
    })
}

/// A generic netlink socket bound to the IPVS family.
pub struct IpvsSocket {
    socket: Socket,
    family: u16,
}

impl IpvsSocket {
    pub fn open() -> Result<IpvsSocket, IpvsError> {
        let socket = Socket::open(NETLINK_GENERIC).map_err(|e| error("open", e))?;
        let mut socket = IpvsSocket { socket, family: GENL_ID_CTRL };
        let mut m = genl_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1);
        m.put(CTRL_ATTR_FAMILY_NAME, b"IPVS\0");
        let replies = match socket.request("family lookup", m, false) {
            Ok(r) => r,
            Err(IpvsError::Kernel { error, .. }) if error.raw_os_error() == Some(libc::ENOENT) => {
                return Err(IpvsError::NoIpvs)
            }
            Err(e) => return Err(e),
        };
        let family = replies
            .iter()
            .find_map(|body| read_u16(find(&attributes(body), CTRL_ATTR_FAMILY_ID)))
            .ok_or(IpvsError::Malformed { op: "family lookup" })?;
        socket.family = family;
        Ok(socket)
    }

    /// Sends one request and collects the bodies of its replies.
    fn request(&mut self, op: &'static str, m: Message, dump: bool) -> Result<Vec<Vec<u8>>, IpvsError> {
        self.socket.request(m, dump).map_err(|e| error(op, e))
    }

    fn message(&self, command: u8) -> Message {
        genl_message(self.family, command, IPVS_GENL_VERSION)
    }

    /// Every virtual service.
    pub fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError> {
        let m = self.message(cmd::GET_SERVICE);
        let bodies = self.request("list services", m, true)?;
        bodies
            .iter()
            .map(|body| {
                let nest = find(&attributes(body), attr::SERVICE)
                    .ok_or(IpvsError::Malformed { op: "list services" })?;
                parse_service(nest).ok_or(IpvsError::Malformed { op: "list services" })
            })
            .collect()
    }

    /// The destinations of one virtual service.
    pub fn destinations(&mut self, key: &ServiceKey) -> Result<Vec<Destination>, IpvsError> {
        let mut m = self.message(cmd::GET_DEST);
        m.begin(attr::SERVICE);
        service_key_attrs(&mut m, key);
        m.end();
        let bodies = self.request("list destinations", m, true)?;
        bodies
            .iter()
            .map(|body| {
                let nest = find(&attributes(body), attr::DEST)
                    .ok_or(IpvsError::Malformed { op: "list destinations" })?;
                parse_destination(nest, family_of(key.address))
                    .ok_or(IpvsError::Malformed { op: "list destinations" })
            })
            .collect()
    }

    pub fn add_service(&mut self, s: &VirtualService) -> Result<(), IpvsError> {
        let mut m = self.message(cmd::NEW_SERVICE);
        service_attrs(&mut m, s);
        self.request("add service", m, false).map(drop)
    }

    /// Changes a service's scheduler, flags or timeout in place (its connections stay).
    pub fn edit_service(&mut self, s: &VirtualService) -> Result<(), IpvsError> {
        let mut m = self.message(cmd::SET_SERVICE);
        service_attrs(&mut m, s);
        self.request("edit service", m, false).map(drop)
    }

    pub fn delete_service(&mut self, key: &ServiceKey) -> Result<(), IpvsError> {
        let mut m = self.message(cmd::DEL_SERVICE);
        m.begin(attr::SERVICE);
        service_key_attrs(&mut m, key);
        m.end();
        self.request("delete service", m, false).map(drop)
    }

    pub fn add_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.destination(cmd::NEW_DEST, "add destination", key, d)
    }

    /// Changes a destination's weight in place (0 drains it: no new connections).
    pub fn edit_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.destination(cmd::SET_DEST, "edit destination", key, d)
    }

    pub fn delete_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.destination(cmd::DEL_DEST, "delete destination", key, d)
    }

    /// Applies `edits` to the destinations of `key`: one send, then every answer.
    pub fn edit_destinations(
        &mut self,
        key: &ServiceKey,
        edits: &[(DestinationEdit, Destination)],
    ) -> Result<(), IpvsError> {
        let messages = edits
            .iter()
            .map(|(edit, d)| {
                let command = match edit {
                    DestinationEdit::Add => cmd::NEW_DEST,
                    DestinationEdit::Edit => cmd::SET_DEST,
                    DestinationEdit::Delete => cmd::DEL_DEST,
                };
                self.destination_message(command, key, d)
            })
            .collect();
        self.socket.requests(messages).map_err(|e| error("edit destinations", e))
    }

    fn destination(
        &mut self,
        command: u8,
        op: &'static str,
        key: &ServiceKey,
        d: &Destination,
    ) -> Result<(), IpvsError> {
        let m = self.destination_message(command, key, d);
        self.request(op, m, false).map(drop)
    }

    fn destination_message(&self, command: u8, key: &ServiceKey, d: &Destination) -> Message {
        let mut m = self.message(command);
        m.begin(attr::SERVICE);
        service_key_attrs(&mut m, key);
        m.end();
        destination_attrs(&mut m, d);
        m
    }
}

/// IPVS in the kernel of the calling thread's network namespace, over a generic netlink
/// socket opened on first use.
#[derive(Default)]
pub struct NetlinkIpvs {
    socket: Option<IpvsSocket>,
}

impl NetlinkIpvs {
    fn socket(&mut self) -> Result<&mut IpvsSocket, IpvsError> {
        if self.socket.is_none() {
            self.socket = Some(IpvsSocket::open()?);
        }
        self.socket.as_mut().ok_or(IpvsError::NoIpvs)
    }
}

impl Ipvs for NetlinkIpvs {
    fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError> {
        self.socket()?.services()
    }

    fn destinations(&mut self, key: &ServiceKey) -> Result<Vec<Destination>, IpvsError> {
        self.socket()?.destinations(key)
    }

    fn add_service(&mut self, s: &VirtualService) -> Result<(), IpvsError> {
        self.socket()?.add_service(s)
    }

    fn edit_service(&mut self, s: &VirtualService) -> Result<(), IpvsError> {
        self.socket()?.edit_service(s)
    }

    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), IpvsError> {
        self.socket()?.delete_service(key)
    }

    fn add_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.socket()?.add_destination(key, d)
    }

    fn edit_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.socket()?.edit_destination(key, d)
    }

    fn delete_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.socket()?.delete_destination(key, d)
    }

    fn edit_destinations(
        &mut self,
        key: &ServiceKey,
        edits: &[(DestinationEdit, Destination)],
    ) -> Result<(), IpvsError> {
        self.socket()?.edit_destinations(key, edits)
    }

    fn reset(&mut self) {
        self.socket = None;
    }
}

/// The raw socket, for tests that check the netlink layer against a real IPVS kernel.
pub fn open_socket() -> Result<impl Ipvs, IpvsError> {
    let mut ipvs = NetlinkIpvs::default();
    ipvs.socket()?;
    Ok(ipvs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::netlink::{HEADERS, NLM_F_ACK};

    /// Against this kernel's generic netlink controller (a lookup: nothing changes):
    /// requests sent at once are each answered, and a refused one is reported.
    #[test]
    fn requests_in_one_send_are_each_answered_and_the_refusal_reported() {
        let lookup = |name: &[u8]| {
            let mut m = genl_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1);
            m.put(CTRL_ATTR_FAMILY_NAME, name);
            m
        };
        let mut socket = Socket::open(NETLINK_GENERIC).expect("a generic netlink socket");
        socket.requests(vec![lookup(b"nlctrl\0"), lookup(b"nlctrl\0")]).expect("both answered");
        let refused =
            socket.requests(vec![lookup(b"nlctrl\0"), lookup(b"no-such-family\0"), lookup(b"nlctrl\0")]);
        match refused {
            Err(NetlinkError::Kernel(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT)),
            other => panic!("the unknown family is refused: {other:?}"),
        }
        // And the socket answers the next request.
        let replies = socket.request(lookup(b"nlctrl\0"), false).expect("answered");
        assert!(replies.iter().any(
            |body| find(&attributes(body), CTRL_ATTR_FAMILY_ID) == Some(&GENL_ID_CTRL.to_ne_bytes()[..])
        ));
    }

    #[test]
    fn a_service_request_is_laid_out_as_the_kernel_reads_it() {
        let s = VirtualService {
            key: ServiceKey { address: "10.96.0.10".parse().expect("ip"), protocol: PROTO_TCP, port: 80 },
            scheduler: "rr".into(),
            flags: FLAG_PERSISTENT,
            timeout: 10800,
        };
        let mut m = genl_message(0x20, cmd::NEW_SERVICE, IPVS_GENL_VERSION);
        service_attrs(&mut m, &s);
        let bytes = m.finish(NLM_F_ACK, 7);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().expect("4")) as usize, bytes.len());
        assert_eq!(bytes[16], cmd::NEW_SERVICE);
        let top = attributes(&bytes[HEADERS..]);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].0, attr::SERVICE);
        let parsed = parse_service(top[0].1).expect("parses back");
        assert_eq!(parsed, s);
        let inner = attributes(top[0].1);
        assert_eq!(find(&inner, svc::PORT), Some(&[0u8, 80][..]), "port in network order");
        assert_eq!(find(&inner, svc::SCHED_NAME), Some(&b"rr\0"[..]));
        assert_eq!(read_u32(find(&inner, svc::NETMASK)), Some(0xffff_ffff));
    }

    #[test]
    fn destinations_round_trip_in_both_families() {
        for address in ["10.244.1.2", "fd00:244:1::2"] {
            let d = Destination {
                address: address.parse().expect("ip"),
                port: 8080,
                weight: 1,
                active: 0,
                inactive: 0,
            };
            let mut m = genl_message(0x20, cmd::NEW_DEST, IPVS_GENL_VERSION);
            destination_attrs(&mut m, &d);
            let bytes = m.finish(NLM_F_ACK, 1);
            let top = attributes(&bytes[HEADERS..]);
            let back = parse_destination(top[0].1, libc::AF_INET as u16).expect("parses back");
            assert_eq!(back, d);
        }
    }
}
