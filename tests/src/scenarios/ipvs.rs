//! What only the IPVS backend has, proven in the VM beside the behaviour suite (run by
//! `src/bin/behaviour_in_vm.rs`): a restart that neither flushes nor cuts traffic and
//! recognises what an earlier run programmed, destinations drained rather than cut,
//! schedulers by flag and by annotation; and what only the VM can prove for every backend:
//! SCTP traffic (this VM's kernel has SCTP; the test machine's has no SCTP sockets).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::manifests::{documents, ep, service, slice};
use crate::harness::netns::Netns;
use crate::harness::topology::{sock, ProxyBackend, Topology, NODE_IP};
use crate::harness::traffic::{tcp_request, Answer, Prober};
use crate::scenarios::behaviour::{Scenario, Scene};
use crate::{wait_for, DEADLINE};

/// Every IPVS-only scenario by name.
pub const ALL: &[(&str, Scenario)] = &[
    ("ipvs_restart_keeps_traffic", restart_keeps_traffic),
    ("ipvs_drains_removed_endpoints", drains_removed_endpoints),
    ("ipvs_schedulers", schedulers),
    ("ipvs_strict_arp", strict_arp),
];

/// The scenarios only the VM runs, with every backend.
pub const VM_ONLY: &[(&str, Scenario)] = &[("sctp", sctp)];

/// A TCP (or SCTP) listener in a pod that answers each line with `NAME LINE`, keeping the
/// connection open; stopped on drop.
struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    fn start(ns: &Netns, name: &str, listener: impl FnOnce() -> TcpListener + Send + 'static) -> EchoServer {
        let listener = ns.run_in(listener);
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let (name, flag) = (name.to_owned(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let name = name.clone();
                        std::thread::spawn(move || echo(conn, &name));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        EchoServer { stop, thread: Some(thread) }
    }
}

fn echo(conn: TcpStream, name: &str) {
    let _ = conn.set_nonblocking(false);
    let Ok(mut writer) = conn.try_clone() else { return };
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        if writer.write_all(format!("{name} {line}\n").as_bytes()).is_err() {
            return;
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A kept connection: each `say` is answered by the server that holds it.
struct Kept {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Kept {
    fn open(ns: &Netns, to: SocketAddr) -> Kept {
        Kept::new(
            ns.run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(5))).expect("connect"),
        )
    }

    fn new(stream: TcpStream) -> Kept {
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Kept { writer: stream, reader }
    }

    fn say(&mut self, word: &str) -> String {
        self.writer.write_all(format!("{word}\n").as_bytes()).expect("write");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read");
        line.trim_end().to_owned()
    }
}

fn tcp_listener(port: u16) -> impl FnOnce() -> TcpListener + Send + 'static {
    move || TcpListener::bind(("0.0.0.0", port)).expect("bind")
}

/// The agent, beside [`RESTART_SERVICES`] more Services of 10 endpoints each, is killed
/// and started again: traffic to the Services never stops meanwhile (nothing is flushed,
/// the kernel keeps serving). Restarted once more with no traffic, it rewrites nothing:
/// kpx's chains keep their counters (a restore zeroes them) and its sets the hash seed
/// each was created with (a set swapped in is a new set with a seed of its own). Then an
/// agent that lost its state directory still recognises the NodePort virtual service an
/// earlier run made (through kpx's sets, NodePorts being on node addresses, not on
/// kpx-ipvs0) and removes it with its Service.
pub fn restart_keeps_traffic(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.2.2\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30090}\n";
    let manifest = documents(&[
        service("restart", spec, ""),
        slice("restart", "restart-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(0))]),
    ]);
    let mut s =
        Scene::start(backend, 1, &[("restart.yaml", manifest), ("more.yaml", more_services())], &[], &[]);
    let vip = sock("10.96.2.2", 80);
    let node_port = sock(NODE_IP, 30090);
    for to in [vip, node_port] {
        wait_for(&format!("{to} to answer"), DEADLINE, || {
            (s.t.client.run_in(move || tcp_request(to)) == Answer::From("pod0".into())).then_some(())
        });
    }
    // Requests all along the restart, from a thread in the client namespace.
    let prober = Prober::start(
        &s.t.client,
        &[vip, node_port],
        "pod0",
        Duration::from_millis(20),
        Duration::from_secs(120),
    );
    s.dp.kill();
    std::thread::sleep(Duration::from_secs(1));
    s.dp = s.t.start_dataplane_with(backend, &[]);
    s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
        e["message"] == "programmed stored state"
    });
    wait_for("the restarted agent to resume its stream", DEADLINE, || {
        s.dp.events()
            .iter()
            .any(|e| e["message"].as_str().is_some_and(|m| m.starts_with("stream open")))
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    let seen = prober.finish();
    assert!(seen.sent > 20, "requests were sent during the restart: {seen:?}");
    assert_eq!(seen.failed, 0, "requests failed while the agent restarted: {seen:?}");
    assert!(
        s.rules_mention(&format!("10.97.0.{RESTART_SERVICES}:80")),
        "the other Services are programmed: {}",
        s.rules()
    );

    // Restarted over its own rules with no traffic: nothing in the kernel rewritten.
    let (counted, seeds) = (cluster_ip_counter(&s.t.node), set_seeds(&s.t.node));
    assert!(counted > 0, "the ClusterIP rule counted the requests");
    assert_eq!(seeds.len(), 14, "every set of both families: {seeds:?}");
    s.dp.kill();
    s.dp = s.t.start_dataplane_with(backend, &[]);
    s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
        e["message"] == "programmed stored state"
    });
    assert_eq!(cluster_ip_counter(&s.t.node), counted, "kpx's chains were written again (counters zeroed)");
    assert_eq!(set_seeds(&s.t.node), seeds, "kpx's sets were swapped for new ones");

    // An agent without its state: the Service is gone meanwhile.
    s.dp.kill();
    std::fs::remove_dir_all(s.t.dir.path().join("state")).expect("remove state");
    s.t.write_manifest("restart.yaml", &documents(&[]));
    s.dp = s.t.start_dataplane_with(backend, &[]);
    wait_for("the earlier run's virtual services to be removed", DEADLINE, || {
        let rules = s.rules();
        (!rules.is_empty() && !rules.contains(":30090/tcp") && !rules.contains("10.96.2.2")).then_some(())
    });
    assert_eq!(s.t.client.run_in(move || tcp_request(node_port)), Answer::Refused);
}

/// The other Services beside the one probed across a restart (10.97.0.1…, 10 endpoints
/// each, none of them a pod): the restart has this many to find already programmed.
const RESTART_SERVICES: usize = 200;

fn more_services() -> String {
    let docs: Vec<String> = (1..=RESTART_SERVICES)
        .flat_map(|i| {
            let name = format!("more-{i}");
            let spec = format!(
                "  clusterIP: 10.97.{}.{}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n",
                i / 250,
                i % 250
            );
            let endpoints: Vec<_> = (0..10).map(|e| ep(format!("10.250.{}.{}", i % 250, e + 1))).collect();
            [
                service(&name, &spec, ""),
                slice(&name, &format!("{name}-1"), false, &[("http", "TCP", 8080)], &endpoints),
            ]
        })
        .collect();
    documents(&docs)
}

/// The packet count of kpx's rule that matches ClusterIP traffic (the first of
/// `KPX-IPVS-SERVICES`), read with `iptables-save -c` of whichever flavour holds it.
fn cluster_ip_counter(node: &Netns) -> u64 {
    let rule = "-A KPX-IPVS-SERVICES -m set --match-set KPX-CLUSTER-IP-4 ";
    for flavour in ["nft", "legacy"] {
        let out = node.try_exec(&format!("iptables-{flavour}-save"), &["-c", "-t", "nat"]);
        assert!(out.status.success(), "iptables-{flavour}-save: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(line) = text.lines().find(|l| l.contains(rule)) {
            let packets = line.strip_prefix('[').and_then(|l| l.split(':').next());
            return packets.and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no counter in {line}"));
        }
    }
    panic!("no ClusterIP rule of kpx's in either flavour");
}

/// Each of kpx's sets by name, with the random hash seed (`initval`) ipset shows for it.
fn set_seeds(node: &Netns) -> Vec<(String, String)> {
    node.exec("ipset", &["save"])
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let seed = words.iter().position(|w| *w == "initval").and_then(|i| words.get(i + 1))?;
            (words.first() == Some(&"create") && words.get(1)?.starts_with("KPX-"))
                .then(|| (words[1].to_owned(), (*seed).to_owned()))
        })
        .collect()
}

/// An endpoint that goes away keeps its open connections (weight 0, no new ones) and is
/// removed after `--ipvs-drain-grace` even while one is still open.
pub fn drains_removed_endpoints(backend: ProxyBackend) {
    let spec = "  clusterIP: 10.96.2.1\n  ports:\n  - {name: echo, protocol: TCP, port: 9000}\n";
    let write = |t: &Topology, pod: usize| {
        t.write_manifest(
            "drain.yaml",
            &documents(&[
                service("drain", spec, ""),
                slice("drain", "drain-1", false, &[("echo", "TCP", 9000)], &[ep(Topology::pod_ip(pod))]),
            ]),
        );
    };
    let s = Scene::start(backend, 2, &[], &[], &["--ipvs-drain-grace=8s"]);
    let _echo: Vec<EchoServer> =
        (0..2).map(|i| EchoServer::start(&s.t.pods[i], &format!("pod{i}"), tcp_listener(9000))).collect();
    write(&s.t, 0);
    let vip = sock("10.96.2.1", 9000);
    let mut kept = wait_for("the Service to answer from pod0", DEADLINE, || {
        s.t.client
            .run_in(move || TcpStream::connect_timeout(&vip, Duration::from_secs(2)).ok())
            .map(Kept::new)
    });
    assert_eq!(kept.say("a"), "pod0 a");
    write(&s.t, 1);
    wait_for("new connections to reach pod1", DEADLINE, || {
        let mut fresh = Kept::open(&s.t.client, vip);
        (fresh.say("x") == "pod1 x").then_some(())
    });
    assert_eq!(kept.say("b"), "pod0 b", "the open connection to the removed endpoint still works");
    let pod0 = format!("{}:9000 Masq weight 0", Topology::pod_ip(0));
    assert!(s.rules_mention(&pod0), "the removed endpoint drains at weight 0:\n{}", s.rules());
    wait_for("the drained endpoint to be removed after the grace", DEADLINE, || {
        (!s.rules_mention(&format!("{}:9000", Topology::pod_ip(0)))).then_some(())
    });
}

/// `--ipvs-scheduler` sets the default; `service.kpx.io/ipvs-scheduler` overrides it per
/// Service; both Services are served.
pub fn schedulers(backend: ProxyBackend) {
    let plain = "  clusterIP: 10.96.2.3\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let annotated = "apiVersion: v1\nkind: Service\nmetadata: {name: hashed, namespace: test, annotations: {service.kpx.io/ipvs-scheduler: mh}}\nspec:\n  clusterIP: 10.96.2.4\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n".to_owned();
    let eps = [ep(Topology::pod_ip(0))];
    let manifest = documents(&[
        service("plain", plain, ""),
        slice("plain", "plain-1", false, &[("http", "TCP", 8080)], &eps),
        annotated,
        slice("hashed", "hashed-1", false, &[("http", "TCP", 8080)], &eps),
    ]);
    let s = Scene::start(backend, 1, &[("sched.yaml", manifest)], &[], &["--ipvs-scheduler=wlc"]);
    for vip in ["10.96.2.3", "10.96.2.4"] {
        let to = sock(vip, 80);
        wait_for(&format!("{vip} to answer"), DEADLINE, || {
            (s.t.client.run_in(move || tcp_request(to)) == Answer::From("pod0".into())).then_some(())
        });
    }
    let rules = s.rules();
    assert!(rules.contains("10.96.2.3:80/tcp wlc"), "{rules}");
    assert!(rules.contains("10.96.2.4:80/tcp mh"), "{rules}");
}

/// An SCTP socket of the one-to-one style, which reads and writes like a TCP stream.
fn sctp_socket() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2); the descriptor is owned right away.
    let fd =
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, libc::IPPROTO_SCTP) };
    assert!(fd >= 0, "SCTP socket: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor nobody else owns.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

fn sockaddr_v4(to: std::net::SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(to.ip().octets()) },
        sin_zero: [0; 8],
    }
}

fn sctp_listener(port: u16) -> impl FnOnce() -> TcpListener + Send + 'static {
    move || {
        use std::os::fd::AsRawFd;
        let fd = sctp_socket();
        let addr = sockaddr_v4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, port));
        let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: bind and listen on our socket with a valid address.
        unsafe {
            assert_eq!(libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), size), 0);
            assert_eq!(libc::listen(fd.as_raw_fd(), 64), 0);
        }
        TcpListener::from(fd)
    }
}

/// One SCTP exchange with `to` (v4): who answered.
fn sctp_request(to: SocketAddr) -> Answer {
    use std::os::fd::AsRawFd;
    let SocketAddr::V4(v4) = to else { return Answer::Failed("IPv4 only".into()) };
    let fd = sctp_socket();
    let addr = sockaddr_v4(v4);
    let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let timeout = libc::timeval { tv_sec: 3, tv_usec: 0 };
    let tsize = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: socket options and connect on our socket with valid arguments.
    let rc = unsafe {
        for opt in [libc::SO_SNDTIMEO, libc::SO_RCVTIMEO] {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&timeout as *const libc::timeval).cast(),
                tsize,
            );
        }
        libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), size)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ECONNREFUSED) {
            Answer::Refused
        } else {
            Answer::Failed(e.to_string())
        };
    }
    let mut kept = Kept::new(TcpStream::from(fd));
    if kept.writer.write_all(b"hi\n").is_err() {
        return Answer::Failed("write".into());
    }
    let mut line = String::new();
    match kept.reader.read_line(&mut line) {
        Ok(n) if n > 0 => Answer::From(line.split_whitespace().next().unwrap_or_default().to_owned()),
        other => Answer::Failed(format!("{other:?}")),
    }
}

/// SCTP through IPVS: the ClusterIP balances over both endpoints, the NodePort answers.
pub fn sctp(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.2.5\n  ports:\n  - {name: sctp, protocol: SCTP, port: 9, nodePort: 30019}\n";
    let eps = [ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1))];
    let manifest = documents(&[
        service("sctp", spec, ""),
        slice("sctp", "sctp-1", false, &[("sctp", "SCTP", 9000)], &eps),
    ]);
    let s = Scene::start(backend, 2, &[("sctp.yaml", manifest)], &[], &[]);
    let _echo: Vec<EchoServer> =
        (0..2).map(|i| EchoServer::start(&s.t.pods[i], &format!("pod{i}"), sctp_listener(9000))).collect();
    for to in [sock("10.96.2.5", 9), sock(NODE_IP, 30019)] {
        wait_for(&format!("SCTP {to} to be answered by both pods"), DEADLINE, || {
            let seen: std::collections::BTreeSet<Answer> =
                s.t.client.run_in(move || (0..6).map(|_| sctp_request(to)).collect());
            (seen == [Answer::From("pod0".into()), Answer::From("pod1".into())].into()).then_some(())
        });
    }
}

/// `--ipvs-strict-arp` (kube-proxy's `ipvs.strictARP`): a client that ARPs for a
/// load-balancer IP on its link (a route on-link, as a layer-2 load balancer's peers do) is
/// answered by the node while the address sits on kpx's dummy interface; with strict ARP
/// the node no longer answers for it (and the connection fails), while the ClusterIP still
/// works. kube-proxy's IPVS sysctls are set either way.
pub fn strict_arp(backend: ProxyBackend) {
    let spec = "  type: LoadBalancer\n  clusterIP: 10.96.2.8\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30098}\n";
    let status = "  loadBalancer: {ingress: [{ip: 192.0.2.78}]}\n";
    let manifest = documents(&[
        service("arp", spec, status),
        slice("arp", "arp-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(0))]),
    ]);
    let mut s = Scene::start(backend, 1, &[("arp.yaml", manifest)], &[], &[]);
    let lb = sock("192.0.2.78", 80);
    s.t.client.ip(&["route", "add", "192.0.2.78/32", "dev", "eth0"]);
    wait_for("the load-balancer IP, resolved by ARP on the link, to answer", DEADLINE, || {
        (s.t.client.run_in(move || tcp_request(lb)) == Answer::From("pod0".into())).then_some(())
    });
    let sysctl = |name: &str| s.t.node.exec("sysctl", &["-n", name]).trim().to_owned();
    assert_eq!(sysctl("net.ipv4.vs.expire_quiescent_template"), "1");
    assert_eq!(sysctl("net.ipv4.conf.all.arp_ignore"), "0", "no strict ARP unless asked");

    s.dp.kill();
    s.dp = s.t.start_dataplane_with(backend, &["--ipvs-strict-arp"]);
    s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
        e["message"] == "programmed stored state"
    });
    assert_eq!(
        (sysctl("net.ipv4.conf.all.arp_ignore"), sysctl("net.ipv4.conf.all.arp_announce")),
        ("1".into(), "2".into())
    );
    s.t.client.ip(&["neigh", "flush", "dev", "eth0"]);
    let answer = s.t.client.run_in(move || tcp_request(lb));
    assert!(
        matches!(answer, Answer::Failed(_)),
        "strict ARP: the node does not answer ARP for the LB IP: {answer:?}"
    );
    let vip = sock("10.96.2.8", 80);
    assert_eq!(
        s.t.client.run_in(move || tcp_request(vip)),
        Answer::From("pod0".into()),
        "the ClusterIP, routed, still works"
    );
    // The LB IP itself is still served: routed through the node, no ARP for it is needed.
    s.t.client.ip(&["route", "replace", "192.0.2.78/32", "via", NODE_IP]);
    assert_eq!(
        s.t.client.run_in(move || tcp_request(lb)),
        Answer::From("pod0".into()),
        "only ARP for the LB IP went away, not the LB IP"
    );
}
