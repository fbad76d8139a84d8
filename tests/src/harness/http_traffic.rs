//! HTTP/1.1 pods and the clients of a rolling update. A pod answers `GET` with its
//! name, keeps connections alive when asked, echoes UDP, and shuts down as a
//! well-behaved server does: its listeners close first (new connections are refused
//! from then on), and every open connection gets one more answer, marked
//! `Connection: close`, before it is closed. The clients count every request that
//! failed and keep the latency of each.

use kpx_proto::sync::Locked as _;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::harness::netns::Netns;
use crate::harness::traffic::patience;

/// How long a client waits for a connection or an answer before the request counts as failed.
fn request_timeout() -> Duration {
    Duration::from_secs(2) * patience()
}

/// What a pod's server counts.
#[derive(Debug, Default)]
struct Served {
    requests: AtomicUsize,
    /// Answers on connections that were open when the listeners closed.
    after_close: AtomicUsize,
}

/// An HTTP/1.1 server and a UDP echo on `0.0.0.0:port` in a pod's namespace.
pub struct HttpPod {
    pub name: String,
    closing: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    listeners: Vec<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    served: Arc<Served>,
}

impl HttpPod {
    pub fn start(ns: &Netns, name: &str, port: u16) -> HttpPod {
        let addr = SocketAddr::from(([0, 0, 0, 0], port));
        let (tcp, udp) = ns.run_in(move || {
            let tcp = TcpListener::bind(addr).expect("bind the pod's TCP port");
            tcp.set_nonblocking(true).expect("nonblocking");
            let udp = UdpSocket::bind(addr).expect("bind the pod's UDP port");
            udp.set_read_timeout(Some(Duration::from_millis(20))).expect("timeout");
            (tcp, udp)
        });
        let mut pod = HttpPod {
            name: name.to_owned(),
            closing: Arc::default(),
            stop: Arc::default(),
            listeners: vec![],
            connections: Arc::default(),
            served: Arc::default(),
        };
        let accept = {
            let (closing, stop, connections, served, name) = (
                Arc::clone(&pod.closing),
                Arc::clone(&pod.stop),
                Arc::clone(&pod.connections),
                Arc::clone(&pod.served),
                name.to_owned(),
            );
            std::thread::spawn(move || {
                while !closing.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((conn, _)) => {
                            let (closing, stop, served, name) =
                                (Arc::clone(&closing), Arc::clone(&stop), Arc::clone(&served), name.clone());
                            let handle =
                                std::thread::spawn(move || serve(conn, &name, &closing, &stop, &served));
                            let mut open = connections.locked();
                            // A finished connection's thread is let go (its handle dropped).
                            open.retain(|h| !h.is_finished());
                            open.push(handle);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                // Dropping the listener here closes it: new connections are refused.
            })
        };
        let echo = {
            let (closing, name) = (Arc::clone(&pod.closing), name.to_owned());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !closing.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(name.as_bytes(), from);
                    }
                }
            })
        };
        pod.listeners = vec![accept, echo];
        pod
    }

    /// Closes the TCP listener and the UDP socket, as a process that is shutting down
    /// does; returns once both are closed. Open connections get one more answer.
    pub fn close_listeners(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        for t in self.listeners.drain(..) {
            let _ = t.join();
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.served.requests.load(Ordering::Relaxed)
    }

    /// Requests answered on connections that were open when the listeners closed.
    pub fn answered_after_close(&self) -> usize {
        self.served.after_close.load(Ordering::Relaxed)
    }
}

impl Drop for HttpPod {
    fn drop(&mut self) {
        self.close_listeners();
        self.stop.store(true, Ordering::Relaxed);
        let connections = std::mem::take(&mut *self.connections.locked());
        for t in connections {
            let _ = t.join();
        }
    }
}

/// Answers the requests of one connection until the client closes it, asks to close it,
/// or the pod is shutting down (then with `Connection: close`).
fn serve(conn: TcpStream, name: &str, closing: &AtomicBool, stop: &AtomicBool, served: &Served) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let Ok(mut writer) = conn.try_clone() else { return };
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        // One request: its lines up to the empty one.
        let mut client_closes = false;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => client_closes |= line.to_ascii_lowercase().starts_with("connection: close"),
                // Idle: look at the stop flag again (clients send a request in one write).
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        let shutting_down = closing.load(Ordering::Relaxed);
        let close = client_closes || shutting_down;
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}\r\n{name}",
            name.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
        served.requests.fetch_add(1, Ordering::Relaxed);
        if shutting_down {
            served.after_close.fetch_add(1, Ordering::Relaxed);
        }
        if close {
            return;
        }
    }
}

/// How a [`Load`] talks to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// A new TCP connection for every request (`Connection: close`).
    HttpPerRequest,
    /// One connection for as long as the server keeps it; a new one when it says
    /// `Connection: close`. An error on a kept connection is a failed request.
    HttpKeepAlive,
    /// One UDP socket for the whole run; each datagram must be answered.
    Udp,
}

/// One request that failed.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    pub after: Duration,
    pub error: String,
}

/// What a [`Load`] saw.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    pub sent: usize,
    pub failed: usize,
    /// The first failures, with when they happened after the start.
    pub failures: Vec<LoadFailure>,
    /// Which pod answered, and how often.
    pub answered_by: BTreeMap<String, usize>,
    /// TCP connections opened.
    pub connections: usize,
    /// UDP datagrams that got no answer and were sent again on the same socket (as a
    /// resolver does), the second one answered; a second loss is a failed request.
    pub resent: usize,
    /// (when, after the start; how long the request took) of every request.
    pub latencies: Vec<(Duration, Duration)>,
}

impl LoadResult {
    /// The 99th percentile latency of the requests made in `[from, to)` after the start.
    pub fn p99_between(&self, from: Duration, to: Duration) -> Option<Duration> {
        let mut window: Vec<Duration> =
            self.latencies.iter().filter(|(at, _)| *at >= from && *at < to).map(|(_, took)| *took).collect();
        window.sort();
        let n = window.len();
        (n > 0).then(|| window[(n * 99 / 100).min(n - 1)])
    }

    pub fn sent_between(&self, from: Duration, to: Duration) -> usize {
        self.latencies.iter().filter(|(at, _)| *at >= from && *at < to).count()
    }
}

/// A bounded load generator: one client of a kind in a namespace, sending to one target
/// back to back (with `pause` between requests), until stopped, `limit` has passed or
/// `max_requests` were sent.
pub struct Load {
    pub started: Instant,
    stop: Arc<AtomicBool>,
    result: Arc<Mutex<LoadResult>>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    pub fn start(ns: &Netns, client: Client, to: SocketAddr, pause: Duration, limit: Duration) -> Load {
        const MAX_REQUESTS: usize = 500_000;
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let result = Arc::new(Mutex::new(LoadResult::default()));
        let (flag, shared) = (Arc::clone(&stop), Arc::clone(&result));
        let thread = ns.spawn_in(move || {
            let mut session = Session::new(client, to);
            while !flag.load(Ordering::Relaxed) && started.elapsed() < limit {
                let began = Instant::now();
                let outcome = session.request(&shared);
                let took = began.elapsed();
                let mut r = shared.locked();
                r.sent += 1;
                r.latencies.push((began - started, took));
                match outcome {
                    Ok(name) => *r.answered_by.entry(name).or_insert(0) += 1,
                    Err(error) => {
                        r.failed += 1;
                        if r.failures.len() < 10 {
                            r.failures.push(LoadFailure { after: began - started, error });
                        }
                    }
                }
                let done = r.sent >= MAX_REQUESTS;
                drop(r);
                if done {
                    break;
                }
                std::thread::sleep(pause);
            }
        });
        Load { started, stop, result, thread: Some(thread) }
    }

    /// What it saw so far.
    pub fn result(&self) -> LoadResult {
        self.result.locked().clone()
    }

    /// Requests sent so far.
    pub fn sent(&self) -> usize {
        self.result.locked().sent
    }

    /// Stops it and returns what it saw.
    pub fn finish(mut self) -> LoadResult {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.result()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A client's connection state between requests.
struct Session {
    client: Client,
    to: SocketAddr,
    kept: Option<BufReader<TcpStream>>,
    udp: Option<UdpSocket>,
}

impl Session {
    fn new(client: Client, to: SocketAddr) -> Session {
        Session { client, to, kept: None, udp: None }
    }

    /// One request: the name of the pod that answered, or why it failed.
    fn request(&mut self, shared: &Mutex<LoadResult>) -> Result<String, String> {
        match self.client {
            Client::HttpPerRequest => {
                let mut conn = connect(self.to, shared)?;
                let (name, _) = exchange(&mut conn, self.to, true)?;
                Ok(name)
            }
            Client::HttpKeepAlive => {
                let mut conn = match self.kept.take() {
                    Some(conn) => conn,
                    None => connect(self.to, shared)?,
                };
                let (name, server_closes) = exchange(&mut conn, self.to, false)?;
                if !server_closes {
                    self.kept = Some(conn);
                }
                Ok(name)
            }
            Client::Udp => {
                if self.udp.is_none() {
                    let sock =
                        UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0))).map_err(|e| e.to_string())?;
                    sock.set_read_timeout(Some(request_timeout() / 2)).map_err(|e| e.to_string())?;
                    self.udp = Some(sock);
                }
                let sock = self.udp.as_ref().ok_or("no UDP socket")?;
                let exchange = || {
                    sock.send_to(b"who", self.to).map_err(|e| format!("send: {e}"))?;
                    let mut buf = [0u8; 512];
                    let (n, _) = sock.recv_from(&mut buf).map_err(|e| format!("no answer: {e}"))?;
                    Ok::<_, String>(String::from_utf8_lossy(&buf[..n]).into_owned())
                };
                exchange().or_else(|_| {
                    shared.locked().resent += 1;
                    exchange()
                })
            }
        }
    }
}

/// A new connection to `to`, counted in `shared`.
fn connect(to: SocketAddr, shared: &Mutex<LoadResult>) -> Result<BufReader<TcpStream>, String> {
    let conn = open(to)?;
    shared.locked().connections += 1;
    Ok(conn)
}

fn open(to: SocketAddr) -> Result<BufReader<TcpStream>, String> {
    let conn = TcpStream::connect_timeout(&to, request_timeout()).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(request_timeout())).map_err(|e| e.to_string())?;
    Ok(BufReader::new(conn))
}

/// Sends `GET /` on `conn` and reads the answer: the body, and whether the server closes.
fn exchange(conn: &mut BufReader<TcpStream>, to: SocketAddr, close: bool) -> Result<(String, bool), String> {
    let request =
        format!("GET / HTTP/1.1\r\nHost: {to}\r\n{}\r\n", if close { "Connection: close\r\n" } else { "" });
    conn.get_mut().write_all(request.as_bytes()).map_err(|e| format!("send: {e}"))?;
    let mut status = String::new();
    conn.read_line(&mut status).map_err(|e| format!("read: {e}"))?;
    if !status.starts_with("HTTP/1.1 200 ") {
        return Err(format!("status line {status:?}"));
    }
    let (mut length, mut server_closes) = (None, false);
    loop {
        let mut header = String::new();
        conn.read_line(&mut header).map_err(|e| format!("read: {e}"))?;
        let lower = header.to_ascii_lowercase();
        if header == "\r\n" {
            break;
        }
        if header.is_empty() {
            return Err("closed in the headers".into());
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
        server_closes |= lower.starts_with("connection: close");
    }
    let mut body = vec![0u8; length.ok_or("no Content-Length")?];
    conn.read_exact(&mut body).map_err(|e| format!("read body: {e}"))?;
    Ok((String::from_utf8_lossy(&body).into_owned(), server_closes))
}

/// `GET /` once over a new connection: the pod that answered.
pub fn http_name(to: SocketAddr) -> Result<String, String> {
    exchange(&mut open(to)?, to, true).map(|(name, _)| name)
}
