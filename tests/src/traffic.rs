//! Real listeners and real clients. A backend answers every TCP connection
//! and every UDP datagram with its own name, so a client sees where the
//! kernel sent it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::netns::Netns;

/// A TCP and a UDP listener on one port in a namespace, stopped on drop.
pub struct Backend {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Backend {
    pub fn start(ns: &Netns, name: &str, port: u16) -> Backend {
        let stop = Arc::new(AtomicBool::new(false));
        let addr: SocketAddr = ([0, 0, 0, 0], port).into();
        let (tcp, udp) = ns.run_in(move || {
            let tcp = TcpListener::bind(addr).expect("bind tcp");
            tcp.set_nonblocking(true).expect("nonblocking");
            let udp = UdpSocket::bind(addr).expect("bind udp");
            udp.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
            (tcp, udp)
        });
        let (name_tcp, stop_tcp) = (name.to_owned(), Arc::clone(&stop));
        let tcp_thread = std::thread::spawn(move || {
            while !stop_tcp.load(Ordering::Relaxed) {
                match tcp.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.write_all(name_tcp.as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        let (name_udp, stop_udp) = (name.to_owned(), Arc::clone(&stop));
        let udp_thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stop_udp.load(Ordering::Relaxed) {
                if let Ok((_, from)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(name_udp.as_bytes(), from);
                }
            }
        });
        Backend { stop, threads: vec![tcp_thread, udp_thread] }
    }
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
    match TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
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

/// One UDP exchange from a fresh socket (a fresh conntrack entry): who answered.
pub fn udp_request(to: SocketAddr) -> Answer {
    let sock = match UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0))) {
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
