//! Real listeners and real clients. A backend answers every TCP connection
//! and every UDP datagram with its own name, so a client sees where the
//! kernel sent it, and remembers who connected, so a test sees whether the
//! client address was kept or masqueraded.

use kpx_proto::sync::Locked as _;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::netns::Netns;

/// TCP and UDP listeners on one port (IPv4 and IPv6) in a namespace, stopped on drop.
pub struct Backend {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The source address and port of every connection and datagram seen.
    peers: Arc<Mutex<BTreeSet<SocketAddr>>>,
}

impl Backend {
    pub fn start(ns: &Netns, name: &str, port: u16) -> Backend {
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(BTreeSet::new()));
        let mut threads = Vec::new();
        for addr in [SocketAddr::from(([0, 0, 0, 0], port)), SocketAddr::from(([0u16; 8], port))] {
            threads.extend(listen(ns, name, addr, &stop, &peers));
        }
        Backend { stop, threads, peers }
    }

    /// The source addresses of every connection and datagram seen so far.
    pub fn peers(&self) -> BTreeSet<IpAddr> {
        self.peer_sockets().iter().map(SocketAddr::ip).collect()
    }

    /// The source addresses and ports of every connection and datagram seen so far.
    pub fn peer_sockets(&self) -> BTreeSet<SocketAddr> {
        self.peers.locked().clone()
    }

    pub fn clear_peers(&self) {
        self.peers.locked().clear();
    }
}

fn listen(
    ns: &Netns,
    name: &str,
    addr: SocketAddr,
    stop: &Arc<AtomicBool>,
    peers: &Arc<Mutex<BTreeSet<SocketAddr>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    let (tcp, udp) = ns.run_in(move || {
        let tcp = bind_tcp(addr);
        tcp.set_nonblocking(true).expect("nonblocking");
        let udp = bind_udp(addr);
        udp.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        (tcp, udp)
    });
    let (name_tcp, stop_tcp, peers_tcp) = (name.to_owned(), Arc::clone(stop), Arc::clone(peers));
    let tcp_thread = std::thread::spawn(move || {
        while !stop_tcp.load(Ordering::Relaxed) {
            match tcp.accept() {
                Ok((mut conn, from)) => {
                    peers_tcp.locked().insert(canonical(from));
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.write_all(name_tcp.as_bytes());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    let (name_udp, stop_udp, peers_udp) = (name.to_owned(), Arc::clone(stop), Arc::clone(peers));
    let udp_thread = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !stop_udp.load(Ordering::Relaxed) {
            if let Ok((_, from)) = udp.recv_from(&mut buf) {
                peers_udp.locked().insert(canonical(from));
                let _ = udp.send_to(name_udp.as_bytes(), from);
            }
        }
    });
    vec![tcp_thread, udp_thread]
}

fn canonical(from: SocketAddr) -> SocketAddr {
    match from.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(from, |v4| SocketAddr::new(IpAddr::V4(v4), from.port())),
        _ => from,
    }
}

/// A socket of `kind` bound to `addr`; IPv6 sockets are IPv6-only so both families can bind the port.
fn bound_socket(addr: SocketAddr, kind: libc::c_int) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket calls on a descriptor this function owns; errors are checked.
    unsafe {
        let fd = libc::socket(domain, kind | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let on: libc::c_int = 1;
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&on as *const libc::c_int).cast(), size);
        if addr.is_ipv6() {
            libc::setsockopt(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                (&on as *const libc::c_int).cast(),
                size,
            );
        }
        let (storage, len) = sockaddr(addr);
        let rc = libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len);
        assert_eq!(rc, 0, "bind {addr}: {}", std::io::Error::last_os_error());
        owned
    }
}

/// Sends one bare TCP segment with `flags` (e.g. SYN|FIN, which conntrack calls INVALID)
/// from `from` to `to` over a raw socket: no connection, nothing waited for.
pub fn send_tcp_segment(from: std::net::Ipv4Addr, to: std::net::SocketAddrV4, flags: u8) {
    let mut segment = [0u8; 20];
    segment[0..2].copy_from_slice(&40_000u16.to_be_bytes());
    segment[2..4].copy_from_slice(&to.port().to_be_bytes());
    segment[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    segment[12] = 5 << 4; // 20-byte header
    segment[13] = flags;
    segment[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    // The checksum over the pseudo-header (source, destination, protocol, length) and the segment.
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    };
    add(&from.octets());
    add(&to.ip().octets());
    add(&[0, libc::IPPROTO_TCP as u8, 0, 20]);
    add(&segment);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    segment[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    // SAFETY: a raw socket used for one sendto of a local buffer, then closed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_TCP);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let owned = <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let (storage, len) = sockaddr(SocketAddr::V4(to));
        let sent = libc::sendto(
            std::os::fd::AsRawFd::as_raw_fd(&owned),
            segment.as_ptr().cast(),
            segment.len(),
            0,
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        );
        assert_eq!(sent, 20, "sendto: {}", std::io::Error::last_os_error());
    }
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zeroed is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn bind_tcp(addr: SocketAddr) -> TcpListener {
    let fd = bound_socket(addr, libc::SOCK_STREAM);
    // SAFETY: listen on the socket we own.
    let rc = unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&fd), 128) };
    assert_eq!(rc, 0, "listen {addr}: {}", std::io::Error::last_os_error());
    TcpListener::from(fd)
}

fn bind_udp(addr: SocketAddr) -> UdpSocket {
    UdpSocket::from(bound_socket(addr, libc::SOCK_DGRAM))
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Answer {
    From(String),
    Refused,
    Failed(String),
}

/// One TCP connection: who answered.
pub fn tcp_request(to: SocketAddr) -> Answer {
    tcp_request_within(to, Duration::from_secs(2))
}

/// How many times longer than on this machine a [`Prober`]'s request may take before it
/// counts as failed: 1, or more where the CPU is emulated (see [`emulated_cpu`]).
static PATIENCE: AtomicU32 = AtomicU32::new(1);

/// Says the tests run on an emulated CPU (the VMs of `tests/vm`, TCG, ten to thirty
/// times slower): a [`Prober`] then waits 5× longer (10 s, three SYN retransmissions)
/// before a request counts as failed. A connection the rules break stays broken for that
/// long too (its retransmissions meet the same conntrack entry); one that is only slow is
/// counted in [`ProbeResult::slow`] instead.
pub fn emulated_cpu() {
    PATIENCE.store(5, Ordering::Relaxed);
}

/// How many times longer than on this machine requests may take: 1, or 5 on an emulated CPU.
pub fn patience() -> u32 {
    PATIENCE.load(Ordering::Relaxed)
}

/// Like [`tcp_request_within`], from local port `local_port` (IPv4, `SO_REUSEADDR`): what
/// a retransmission, or a later connection that reuses a client's port, meets.
pub fn tcp_request_from_port(local_port: u16, to: SocketAddr, timeout: Duration) -> Answer {
    tcp_request_bound(SocketAddr::from(([0, 0, 0, 0], local_port)), to, timeout)
}

/// One TCP connection, connecting and reading each within `timeout`: who answered.
pub fn tcp_request_within(to: SocketAddr, timeout: Duration) -> Answer {
    match TcpStream::connect_timeout(&to, timeout) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(timeout));
            let mut name = String::new();
            match s.read_to_string(&mut name) {
                Ok(_) if !name.is_empty() => Answer::From(name),
                Ok(_) => Answer::Failed("empty answer".into()),
                Err(e) => Answer::Failed(e.to_string()),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Answer::Refused,
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// One TCP connection from source address `from` (one of the caller's namespace).
pub fn tcp_request_from(from: IpAddr, to: SocketAddr) -> Answer {
    tcp_request_bound(SocketAddr::new(from, 0), to, Duration::from_secs(2))
}

/// One TCP connection from `local`, connecting and reading each within `timeout`.
fn tcp_request_bound(local: SocketAddr, to: SocketAddr, timeout: Duration) -> Answer {
    let fd = bound_socket(local, libc::SOCK_STREAM);
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    let (storage, len) = sockaddr(to);
    // SAFETY: socket calls on a descriptor we own; on Linux SO_SNDTIMEO bounds a blocking connect.
    let rc = unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        libc::connect(raw, (&storage as *const libc::sockaddr_storage).cast(), len)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::ConnectionRefused {
            Answer::Refused
        } else {
            Answer::Failed(e.to_string())
        };
    }
    let mut stream = TcpStream::from(fd);
    let _ = stream.set_read_timeout(Some(timeout));
    let mut name = String::new();
    match stream.read_to_string(&mut name) {
        Ok(_) if !name.is_empty() => Answer::From(name),
        Ok(_) => Answer::Failed("empty answer".into()),
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// `GET /` over HTTP/1.1: the status code and the body, or why it failed.
pub fn http_get(to: SocketAddr) -> Result<(u16, String), String> {
    http_get_path(to, "/")
}

/// `GET path` over HTTP/1.1: the status code and the body, or why it failed.
pub fn http_get_path(to: SocketAddr, path: &str) -> Result<(u16, String), String> {
    http_get_with_headers(to, path).map(|(status, _, body)| (status, body))
}

/// `GET path` over HTTP/1.1: the status code, the header lines and the body.
pub fn http_get_with_headers(to: SocketAddr, path: &str) -> Result<(u16, Vec<String>, String), String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let headers = head.lines().skip(1).map(str::to_owned).collect();
    Ok((status, headers, body.to_owned()))
}

/// One sample of a metric of the agent running in `node`, read over HTTP (`/metrics` on
/// 127.0.0.1:10249).
pub fn agent_metric(node: &crate::harness::netns::Netns, name: &str) -> f64 {
    // A busy (or emulated) machine may answer later than one request waits: ask again.
    let (code, body) = crate::wait_for("the agent's metrics", crate::DEADLINE, || {
        node.run_in(|| http_get_path(SocketAddr::from(([127, 0, 0, 1], 10249)), "/metrics")).ok()
    });
    assert_eq!(code, 200, "{body}");
    metric_value(&body, name).unwrap_or_else(|| panic!("{name} in {body}"))
}

/// The value of metric `name` (no labels) in a Prometheus text exposition.
pub fn metric_value(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// One UDP exchange from a fresh socket (a fresh conntrack entry): who answered.
pub fn udp_request(to: SocketAddr) -> Answer {
    let any: SocketAddr = if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let sock = match UdpSocket::bind(any) {
        Ok(s) => s,
        Err(e) => return Answer::Failed(e.to_string()),
    };
    udp_exchange(&sock, to)
}

/// One datagram and its answer on an existing socket.
pub fn udp_exchange(sock: &UdpSocket, to: SocketAddr) -> Answer {
    let _ = sock.set_read_timeout(Some(Duration::from_secs(1)));
    if let Err(e) = sock.send_to(b"who", to) {
        return if e.kind() == std::io::ErrorKind::ConnectionRefused {
            Answer::Refused
        } else {
            Answer::Failed(e.to_string())
        };
    }
    let mut buf = [0u8; 512];
    match sock.recv_from(&mut buf) {
        Ok((n, _)) => Answer::From(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Answer::Refused,
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// Counts answers over `n` requests made from inside `ns`.
pub fn tally(
    ns: &Netns,
    n: usize,
    request: fn(SocketAddr) -> Answer,
    to: SocketAddr,
) -> BTreeMap<Answer, usize> {
    ns.run_in(move || {
        let mut counts = BTreeMap::new();
        for _ in 0..n {
            *counts.entry(request(to)).or_insert(0) += 1;
        }
        counts
    })
}

/// A bounded load generator: from a thread in a namespace, one TCP request to each target
/// every `interval`, until stopped or `limit` has passed, counting the answers that are
/// not the expected one (and keeping the first few).
pub struct Prober {
    stop: Arc<AtomicBool>,
    result: Arc<Mutex<ProbeResult>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `HH:MM:SS.micros` in UTC, as the processes' log timestamps end.
fn time_of_day(at: std::time::SystemTime) -> String {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}.{:06}", secs / 3600, secs / 60 % 60, secs % 60, since.subsec_micros())
}

/// One request a [`Prober`] did not get the expected answer to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    pub to: SocketAddr,
    pub answer: Answer,
    pub at: String,
    pub took_ms: u128,
}

/// What a [`Prober`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeResult {
    pub sent: usize,
    pub failed: usize,
    /// Answered as expected, but later than a request on this machine may take (2 s):
    /// only where the CPU is emulated.
    pub slow: usize,
    /// The first failures: target, answer, and when the request started (UTC, as in the
    /// processes' logs) and how long it took.
    pub failures: Vec<ProbeFailure>,
}

impl Prober {
    /// Starts probing `targets` from `ns`; each must be answered by `expected`.
    pub fn start(
        ns: &Netns,
        targets: &[SocketAddr],
        expected: &str,
        interval: Duration,
        limit: Duration,
    ) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let result = Arc::new(Mutex::new(ProbeResult::default()));
        let (flag, shared, targets, want) =
            (Arc::clone(&stop), Arc::clone(&result), targets.to_vec(), Answer::From(expected.to_owned()));
        let thread = ns.spawn_in(move || {
            let started = std::time::Instant::now();
            while !flag.load(Ordering::Relaxed) && started.elapsed() < limit {
                for to in &targets {
                    let (at, began) = (std::time::SystemTime::now(), std::time::Instant::now());
                    let answer =
                        tcp_request_within(*to, Duration::from_secs(2) * PATIENCE.load(Ordering::Relaxed));
                    let mut r = shared.locked();
                    r.sent += 1;
                    if answer == want && began.elapsed() > Duration::from_secs(2) {
                        r.slow += 1;
                    }
                    if answer != want {
                        r.failed += 1;
                        if r.failures.len() < 10 {
                            let at = time_of_day(at);
                            r.failures.push(ProbeFailure {
                                to: *to,
                                answer,
                                at,
                                took_ms: began.elapsed().as_millis(),
                            });
                        }
                    }
                }
                std::thread::sleep(interval);
            }
        });
        Prober { stop, result, thread: Some(thread) }
    }

    /// What it saw so far.
    pub fn result(&self) -> ProbeResult {
        self.result.locked().clone()
    }

    /// Waits until it has run its time limit, and returns what it saw.
    pub fn wait(mut self) -> ProbeResult {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.result()
    }

    /// Stops it and returns what it saw.
    pub fn finish(mut self) -> ProbeResult {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.result()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Asserts that every request of `total` was answered by one of `backends`, each taking
/// at least 15 % of them.
pub fn assert_balanced(counts: &BTreeMap<Answer, usize>, backends: &[&str], total: usize) {
    for b in backends {
        let got = counts.get(&Answer::From((*b).to_owned())).copied().unwrap_or(0);
        assert!(got * 100 >= total * 15, "{b} got {got} of {total}: {counts:?}");
    }
    let answered: usize = backends.iter().filter_map(|b| counts.get(&Answer::From((*b).to_owned()))).sum();
    assert_eq!(answered, total, "every request answered by a backend: {counts:?}");
}
