//! What kpx's netlink clients share: a message (the netlink header, a 4-byte family
//! header — generic netlink's or nfnetlink's — and attributes), a socket that sends one
//! request and collects its replies, and attribute parsing.

use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_CREATE: u16 = 0x400;
const NLM_F_REQUEST: u16 = 0x1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
/// An attribute whose value is in network byte order (ipset insists on the flag).
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
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

    /// Its length so far, in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
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
    /// What the send buffer was sized to take (0: the kernel's default).
    send_buffer: usize,
}

impl Socket {
    pub fn open(protocol: i32) -> Result<Socket, NetlinkError> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if raw < 0 {
            return Err(NetlinkError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let socket = Socket { fd: unsafe { OwnedFd::from_raw_fd(raw) }, seq: 0, send_buffer: 0 };
        // Errors carry the request's header only (a batch's messages are large, its errors
        // need only their code); a kernel without it echoes them whole, which is harmless.
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with a pointer to an int of the size given.
        unsafe {
            libc::setsockopt(raw, libc::SOL_NETLINK, NETLINK_CAP_ACK, (&on as *const libc::c_int).cast(), 4);
        }
        Ok(socket)
    }

    /// Sends one request and collects the bodies (after the family header) of its
    /// replies; `dump` requests end with DONE, others with the kernel's ACK.
    pub fn request(&mut self, m: Message, dump: bool) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let mut bodies = Vec::new();
        self.each_reply(m, dump, |body| {
            bodies.push(body.to_vec());
            Ok(())
        })?;
        Ok(bodies)
    }

    /// Sends one request and gives the body (after the family header) of each reply to
    /// `each` as it is read, none kept: a dump of a quarter-million set elements is read
    /// 64 KiB at a time. The first error `each` answers ends it (the rest is read and dropped).
    pub fn each_reply(
        &mut self,
        m: Message,
        dump: bool,
        mut each: impl FnMut(&[u8]) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        let seq = self.next_seq();
        self.send(&m.finish(if dump { NLM_F_DUMP } else { NLM_F_ACK }, seq))?;
        let mut failed = None;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let got = self.receive(&mut buf)?;
            for reply in replies(&buf[..got]) {
                let (kind, reply_seq, payload) = reply?;
                if reply_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return failed.map_or(Ok(()), Err),
                    NLMSG_ERROR => return error_code(payload).and(failed.map_or(Ok(()), Err)),
                    _ if failed.is_some() => {}
                    _ => failed = each(payload.get(4..).unwrap_or_default()).err(),
                }
            }
        }
    }

    /// Sends `messages` in one send, each asking for an answer, and reads the answers: the
    /// kernel handles each in turn as it reads the send (a refused one stops none of the
    /// others); the first refusal.
    pub fn requests(&mut self, messages: Vec<Message>) -> Result<(), NetlinkError> {
        let Ok(count) = u32::try_from(messages.len()) else { return Err(NetlinkError::Malformed) };
        if count == 0 {
            return Ok(());
        }
        let first = self.seq.wrapping_add(1);
        let mut bytes = Vec::new();
        for m in messages {
            let seq = self.next_seq();
            bytes.extend_from_slice(&m.finish(NLM_F_ACK, seq));
        }
        self.size_send_buffer(bytes.len())?;
        self.send(&bytes)?;
        let (mut answered, mut failure) = (0, None);
        self.answers(first, |n, verdict| {
            if n >= count {
                return ControlFlow::Continue(());
            }
            answered += 1;
            if let Err(e) = verdict {
                failure.get_or_insert(e);
            }
            if answered < count {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(failure.take().map_or(Ok(()), Err))
            }
        })
    }

    /// Sends `messages` (each with its flags) as one nfnetlink batch — `begin`, the
    /// messages, `end` — in one send, and waits for the kernel's answer: all of them
    /// applied in one transaction, or none and the first error.
    pub fn batch(
        &mut self,
        begin: Message,
        messages: Vec<(Message, u16)>,
        end: Message,
    ) -> Result<(), NetlinkError> {
        let mut batch = self.begin_batch(begin);
        for (m, flags) in messages {
            batch.push(m, flags);
        }
        batch.commit(end)
    }

    /// An nfnetlink batch starting with `begin`, its messages to be pushed one at a time.
    pub fn begin_batch(&mut self, begin: Message) -> Batch<'_> {
        let begin_seq = self.next_seq();
        let bytes = begin.finish(0, begin_seq);
        Batch { socket: self, bytes, begin_seq, count: 0, last: 0 }
    }

    /// Waits for the kernel's answer to the batch of `count` messages after `begin_seq`.
    fn batch_answer(&mut self, begin_seq: u32, count: u32) -> Result<(), NetlinkError> {
        let mut failure = None;
        self.answers(begin_seq, |n, verdict| match n {
            // The beginning or the end refused: the batch was not read.
            0 => verdict.map_or_else(|e| ControlFlow::Break(Err(e)), ControlFlow::Continue),
            n if n == count + 1 => verdict.map_or_else(|e| ControlFlow::Break(Err(e)), ControlFlow::Continue),
            n if n > count => ControlFlow::Continue(()),
            n => {
                if let Err(e) = verdict {
                    failure.get_or_insert(e);
                }
                if n == count {
                    ControlFlow::Break(failure.take().map_or(Ok(()), Err))
                } else {
                    ControlFlow::Continue(())
                }
            }
        })
    }

    /// Reads answers (`NLMSG_ERROR`: an ACK or a refusal) and gives each, with how far its
    /// sequence number is past `first`, to `each`, until it says what they come to.
    fn answers(
        &mut self,
        first: u32,
        mut each: impl FnMut(u32, Result<(), NetlinkError>) -> ControlFlow<Result<(), NetlinkError>>,
    ) -> Result<(), NetlinkError> {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let got = self.receive(&mut buf)?;
            for reply in replies(&buf[..got]) {
                let (kind, seq, payload) = reply?;
                if kind != NLMSG_ERROR {
                    continue;
                }
                if let ControlFlow::Break(outcome) = each(seq.wrapping_sub(first), error_code(payload)) {
                    return outcome;
                }
            }
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(&self, bytes: &[u8]) -> Result<(), NetlinkError> {
        // SAFETY: sending an initialized buffer on our socket (to the kernel: no address).
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        if sent < 0 {
            return Err(NetlinkError::Socket(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Receives one datagram of replies into `buf`; its length.
    fn receive(&self, buf: &mut [u8]) -> Result<usize, NetlinkError> {
        loop {
            // SAFETY: receiving into a buffer we own, at most its length.
            let got = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if got >= 0 {
                return Ok(got as usize);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(NetlinkError::Socket(error));
            }
        }
    }

    /// Makes the socket's send buffer take one datagram of `len` bytes (a batch must be one:
    /// the kernel reads a batch from a single datagram).
    fn size_send_buffer(&mut self, len: usize) -> Result<(), NetlinkError> {
        if len <= DEFAULT_SEND_BUFFER.max(self.send_buffer) {
            return Ok(());
        }
        let fd = self.fd.as_raw_fd();
        let wanted = len + 4096;
        let size = libc::c_int::try_from(wanted).unwrap_or(libc::c_int::MAX);
        for option in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            // SAFETY: as above.
            let done = unsafe {
                libc::setsockopt(fd, libc::SOL_SOCKET, option, (&size as *const libc::c_int).cast(), 4)
            };
            if done == 0 {
                self.send_buffer = wanted;
                return Ok(());
            }
        }
        Err(NetlinkError::Socket(io::Error::last_os_error()))
    }
}

/// An nfnetlink batch being written: each message is finished and appended to the
/// batch's bytes as it is pushed, so that what is held is the batch, not its messages
/// and then the batch (a full sync's elements are tens of MB).
pub struct Batch<'s> {
    socket: &'s mut Socket,
    bytes: Vec<u8>,
    begin_seq: u32,
    count: u32,
    /// Where the last message pushed starts.
    last: usize,
}

impl Batch<'_> {
    pub fn push(&mut self, m: Message, flags: u16) {
        let seq = self.socket.next_seq();
        self.last = self.bytes.len();
        self.bytes.extend_from_slice(&m.finish(flags, seq));
        self.count += 1;
    }

    /// Sends the batch, closed by `end`, in one send and waits for the kernel's answer:
    /// all of its messages applied in one transaction, or none and the first error. A
    /// batch of no message is not sent.
    pub fn commit(mut self, end: Message) -> Result<(), NetlinkError> {
        if self.count == 0 {
            return Ok(());
        }
        // Only the last is acknowledged: errors of the others come before its ACK.
        let at = self.last + 6;
        let flags = u16::from_ne_bytes([self.bytes[at], self.bytes[at + 1]]) | NLM_F_ACK;
        self.bytes[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
        let end_seq = self.socket.next_seq();
        self.bytes.extend_from_slice(&end.finish(0, end_seq));
        let bytes = std::mem::take(&mut self.bytes);
        self.socket.size_send_buffer(bytes.len())?;
        // The kernel reads the batch during the send: its bytes can go before the answer.
        self.socket.send(&bytes)?;
        drop(bytes);
        self.socket.batch_answer(self.begin_seq, self.count)
    }
}

/// `NETLINK_CAP_ACK`: errors carry the request's header only.
const NETLINK_CAP_ACK: libc::c_int = 10;
/// What a send buffer takes without being sized (the kernel's default, less its overhead).
const DEFAULT_SEND_BUFFER: usize = 128 << 10;

/// The messages of one datagram: type, sequence number, payload.
fn replies(mut data: &[u8]) -> impl Iterator<Item = Result<(u16, u32, &[u8]), NetlinkError>> {
    std::iter::from_fn(move || {
        if data.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
        if len < 16 || len > data.len() {
            data = &[];
            return Some(Err(NetlinkError::Malformed));
        }
        let payload = &data[16..len];
        data = &data[len.next_multiple_of(4).min(data.len())..];
        Some(Ok((kind, seq, payload)))
    })
}

/// An NLMSG_ERROR's verdict: 0 is the kernel's ACK.
fn error_code(payload: &[u8]) -> Result<(), NetlinkError> {
    match payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])) {
        Some(0) => Ok(()),
        Some(code) => Err(NetlinkError::Kernel(io::Error::from_raw_os_error(-code))),
        None => Err(NetlinkError::Malformed),
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
