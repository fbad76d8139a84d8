//! IPVS over generic netlink (the kernel's "IPVS" family, `include/uapi/linux/ip_vs.h`):
//! virtual services and their destinations, created, edited, deleted and listed, one
//! request per call, each acknowledged by the kernel.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

#[cfg(test)]
use super::ipvs::PROTO_TCP;
use super::ipvs::{Destination, IpvsError, ServiceKey, VirtualService, FLAG_PERSISTENT, FORWARD_MASQUERADE};

const NETLINK_GENERIC: i32 = 16;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

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

/// A message being written: header, generic netlink header, attributes.
struct Message {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Message {
    fn new(family: u16, command: u8, version: u8) -> Message {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set in finish
        buf.extend_from_slice(&family.to_ne_bytes());
        buf.extend_from_slice(&0u16.to_ne_bytes()); // flags, set in finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // sequence, set in finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        buf.extend_from_slice(&[command, version, 0, 0]);
        Message { buf, nests: Vec::new() }
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn put(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
        self
    }

    fn u16(&mut self, kind: u16, value: u16) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    fn begin(&mut self, kind: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    fn end(&mut self) -> &mut Self {
        if let Some(start) = self.nests.pop() {
            let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    fn finish(mut self, flags: u16, seq: u32) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
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

/// Attributes of a message body or nest, by type.
fn attributes(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > data.len() {
            break;
        }
        out.push((kind, &data[4..len]));
        let next = len.next_multiple_of(4).min(data.len());
        data = &data[next..];
    }
    out
}

fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
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
    fd: OwnedFd,
    family: u16,
    seq: u32,
}

impl IpvsSocket {
    pub fn open() -> Result<IpvsSocket, IpvsError> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_GENERIC) };
        if raw < 0 {
            return Err(IpvsError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut socket = IpvsSocket { fd, family: GENL_ID_CTRL, seq: 0 };
        let mut m = Message::new(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1);
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

    /// Sends one request and collects the bodies (after the generic header) of its replies;
    /// `dump` requests end with DONE, others with the kernel's ACK.
    fn request(&mut self, op: &'static str, m: Message, dump: bool) -> Result<Vec<Vec<u8>>, IpvsError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = m.finish(if dump { NLM_F_DUMP } else { NLM_F_ACK }, seq);
        let fd = self.fd.as_raw_fd();
        // SAFETY: sending an initialized buffer on our socket (to the kernel: no address).
        let sent = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
        if sent < 0 {
            return Err(IpvsError::Socket(io::Error::last_os_error()));
        }
        let mut bodies = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: receiving into a buffer we own, at most its length.
            let got = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if got < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(IpvsError::Socket(error));
            }
            let mut data = &buf[..got as usize];
            while data.len() >= 16 {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let kind = u16::from_ne_bytes([data[4], data[5]]);
                let reply_seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
                if len < 16 || len > data.len() {
                    return Err(IpvsError::Malformed { op });
                }
                let payload = &data[16..len];
                data = &data[len.next_multiple_of(4).min(data.len())..];
                if reply_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(bodies),
                    NLMSG_ERROR => {
                        let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return match code {
                            Some(0) => Ok(bodies),
                            Some(code) => {
                                Err(IpvsError::Kernel { op, error: io::Error::from_raw_os_error(-code) })
                            }
                            None => Err(IpvsError::Malformed { op }),
                        };
                    }
                    _ => bodies.push(payload.get(4..).unwrap_or_default().to_vec()),
                }
            }
        }
    }

    fn message(&self, command: u8) -> Message {
        Message::new(self.family, command, IPVS_GENL_VERSION)
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

    fn destination(
        &mut self,
        command: u8,
        op: &'static str,
        key: &ServiceKey,
        d: &Destination,
    ) -> Result<(), IpvsError> {
        let mut m = self.message(command);
        m.begin(attr::SERVICE);
        service_key_attrs(&mut m, key);
        m.end();
        destination_attrs(&mut m, d);
        self.request(op, m, false).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_request_is_laid_out_as_the_kernel_reads_it() {
        let s = VirtualService {
            key: ServiceKey { address: "10.96.0.10".parse().expect("ip"), protocol: PROTO_TCP, port: 80 },
            scheduler: "rr".into(),
            flags: FLAG_PERSISTENT,
            timeout: 10800,
        };
        let mut m = Message::new(0x20, cmd::NEW_SERVICE, IPVS_GENL_VERSION);
        service_attrs(&mut m, &s);
        let bytes = m.finish(NLM_F_ACK, 7);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().expect("4")) as usize, bytes.len());
        assert_eq!(bytes[16], cmd::NEW_SERVICE);
        let top = attributes(&bytes[20..]);
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
            let mut m = Message::new(0x20, cmd::NEW_DEST, IPVS_GENL_VERSION);
            destination_attrs(&mut m, &d);
            let bytes = m.finish(NLM_F_ACK, 1);
            let top = attributes(&bytes[20..]);
            let back = parse_destination(top[0].1, libc::AF_INET as u16).expect("parses back");
            assert_eq!(back, d);
        }
    }
}
