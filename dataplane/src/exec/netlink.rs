//! What kpx's netlink clients share: a message (the netlink header, a 4-byte family
//! header — generic netlink's or nfnetlink's — and attributes), a socket that sends one
//! request and collects its replies, and attribute parsing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REQUEST: u16 = 0x1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// The netlink header and the 4-byte family header every message here starts with.
#[cfg(test)]
pub const HEADERS: usize = 20;

/// Why a request failed.
#[derive(Debug)]
pub enum NetlinkError {
    /// The socket itself (open, send, receive).
    Socket(io::Error),
    /// The kernel answered with an error.
    Kernel(io::Error),
    /// A reply that cannot be read.
    Malformed,
}

/// A message being written: header, family header, attributes.
pub struct Message {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Message {
    /// A message of netlink type `kind` whose family header is `header` (generic netlink:
    /// command, version, 0, 0; nfnetlink: protocol family, version, resource id).
    pub fn new(kind: u16, header: [u8; 4]) -> Message {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set in finish
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&0u16.to_ne_bytes()); // flags, set in finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // sequence, set in finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        buf.extend_from_slice(&header);
        Message { buf, nests: Vec::new() }
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub fn put(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
        self
    }

    pub fn u16(&mut self, kind: u16, value: u16) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    pub fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    /// A NUL-terminated string.
    pub fn string(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.put(kind, &bytes)
    }

    pub fn begin(&mut self, kind: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    pub fn end(&mut self) -> &mut Self {
        if let Some(start) = self.nests.pop() {
            let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    pub fn finish(mut self, flags: u16, seq: u32) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// A netlink socket of one protocol, talking to the kernel.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    pub fn open(protocol: i32) -> Result<Socket, NetlinkError> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if raw < 0 {
            return Err(NetlinkError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        Ok(Socket { fd: unsafe { OwnedFd::from_raw_fd(raw) }, seq: 0 })
    }

    /// Sends one request and collects the bodies (after the family header) of its
    /// replies; `dump` requests end with DONE, others with the kernel's ACK.
    pub fn request(&mut self, m: Message, dump: bool) -> Result<Vec<Vec<u8>>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = m.finish(if dump { NLM_F_DUMP } else { NLM_F_ACK }, seq);
        let fd = self.fd.as_raw_fd();
        // SAFETY: sending an initialized buffer on our socket (to the kernel: no address).
        let sent = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
        if sent < 0 {
            return Err(NetlinkError::Socket(io::Error::last_os_error()));
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
                return Err(NetlinkError::Socket(error));
            }
            let mut data = &buf[..got as usize];
            while data.len() >= 16 {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let kind = u16::from_ne_bytes([data[4], data[5]]);
                let reply_seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
                if len < 16 || len > data.len() {
                    return Err(NetlinkError::Malformed);
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
                            Some(code) => Err(NetlinkError::Kernel(io::Error::from_raw_os_error(-code))),
                            None => Err(NetlinkError::Malformed),
                        };
                    }
                    _ => bodies.push(payload.get(4..).unwrap_or_default().to_vec()),
                }
            }
        }
    }
}

/// Attributes of a message body or nest, by type.
pub fn attributes(mut data: &[u8]) -> Vec<(u16, &[u8])> {
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

pub fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// A NUL-terminated string attribute.
pub fn read_string(v: Option<&[u8]>) -> Option<String> {
    let v = v?;
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    std::str::from_utf8(&v[..end]).ok().map(str::to_owned)
}
