//! The behaviour suite: one scenario per Service behaviour kube-proxy has,
//! proven with real traffic, parameterised by backend. Every backend's test
//! file runs all of them through [`crate::behaviour_suite!`]; a scenario
//! knows nothing of the backend beyond passing it to the node agent (the only
//! backend-specific look is [`Scene::rules_mention`], which reads whatever the
//! backend programmed as text).
//!
//! The node (`node-a`, zone `zone-a`, 10.0.0.1 / 10.0.1.1 / fd00::1, pod CIDR
//! 10.244.0.0/16) runs the control plane and the agent; backends listen on
//! 8080 in every pod; the client is 10.0.0.2 (and 10.0.0.3, fd00::2).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::harness::manifests::{documents, ep, service, slice, Ep};
use crate::harness::netns::Netns;
use crate::harness::process::KpxProcess;
use crate::harness::topology::{
    sock, ProxyBackend, Topology, CLIENT_IP, CLIENT_IP_2, CLUSTER_CIDR, NODE_IP, NODE_IP6, NODE_IP_2,
};
use crate::harness::traffic::{
    http_get, http_get_with_headers, tcp_request, tcp_request_from, tcp_request_from_port, udp_exchange,
    udp_request, Answer, Backend, Prober,
};
use crate::{wait_for, DEADLINE};

/// Generates one `#[test]` per scenario for a backend.
#[macro_export]
macro_rules! behaviour_suite {
    ($backend:expr) => {
        $crate::behaviour_suite!(@tests $backend;
            node_port, node_ports_on_interface_addresses, external_and_load_balancer_ips, external_traffic_policy_local,
            internal_traffic_policy_local, topology_hints, session_affinity, terminating_endpoints,
            masquerade, dual_stack, ports, long_names, udp_conntrack, udp_conntrack_gone, tcp_before_the_rules, ignored_services, bad_input, damaged_store, flushed_behind_its_back,
            full_syncs_under_traffic, rolling_update, rolling_update_local);
    };
    (@tests $backend:expr; $($scenario:ident),*) => {
        $(
            #[test]
            fn $scenario() {
                $crate::scenarios::behaviour::$scenario($backend);
            }
        )*
    };
}

/// One scenario: it builds its own topology for the backend and proves one behaviour.
pub type Scenario = fn(ProxyBackend);

/// Every scenario by name, for runners that are not test harnesses (the IPVS suite runs
/// in a VM); the same list as [`behaviour_suite!`] but [`udp_conntrack_gone`], which
/// reads conntrack's NAT of nftables and iptables.
pub const ALL: &[(&str, Scenario)] = &[
    ("node_port", node_port),
    ("node_ports_on_interface_addresses", node_ports_on_interface_addresses),
    ("external_and_load_balancer_ips", external_and_load_balancer_ips),
    ("external_traffic_policy_local", external_traffic_policy_local),
    ("internal_traffic_policy_local", internal_traffic_policy_local),
    ("topology_hints", topology_hints),
    ("session_affinity", session_affinity),
    ("terminating_endpoints", terminating_endpoints),
    ("masquerade", masquerade),
    ("dual_stack", dual_stack),
    ("ports", ports),
    ("long_names", long_names),
    ("udp_conntrack", udp_conntrack),
    ("tcp_before_the_rules", tcp_before_the_rules),
    ("ignored_services", ignored_services),
    ("bad_input", bad_input),
    ("damaged_store", damaged_store),
    ("flushed_behind_its_back", flushed_behind_its_back),
    ("full_syncs_under_traffic", full_syncs_under_traffic),
    ("rolling_update", rolling_update),
    ("rolling_update_local", rolling_update_local),
];

pub use crate::scenarios::rolling_update::{rolling_update, rolling_update_local};

/// A started topology with backends on 8080 in every pod.
pub struct Scene {
    // Dropped in this order: the processes (which print their logs when a test fails)
    // before the topology that holds those logs.
    pub cp: KpxProcess,
    pub dp: KpxProcess,
    pub backends: Vec<Backend>,
    pub t: Topology,
    pub backend: ProxyBackend,
}

impl Scene {
    /// Writes the node's Node object and `manifests`, then starts everything.
    pub fn start(
        backend: ProxyBackend,
        pods: usize,
        manifests: &[(&str, String)],
        cp_args: &[&str],
        dp_args: &[&str],
    ) -> Scene {
        let t = Topology::new(pods);
        let backends = t.start_backends(8080);
        t.write_node();
        for (file, text) in manifests {
            t.write_manifest(file, text);
        }
        let cp = t.start_control_plane_with(cp_args);
        let dp = t.start_dataplane_with(backend, dp_args);
        Scene { t, backends, cp, dp, backend }
    }

    /// Whether what the backend programmed mentions `text` (nft, iptables-save or ipvsadm output).
    pub fn rules_mention(&self, text: &str) -> bool {
        self.rules().to_lowercase().contains(&text.to_lowercase())
    }

    /// What the backend programmed, as text (nft, iptables-save, or the IPVS table and sets).
    pub fn rules(&self) -> String {
        match self.backend {
            ProxyBackend::Nftables => self.t.ruleset(),
            ProxyBackend::Iptables | ProxyBackend::IptablesLegacy => {
                let flavour = if self.backend == ProxyBackend::Iptables { "nft" } else { "legacy" };
                ["iptables", "ip6tables"]
                    .iter()
                    .map(|tool| {
                        let out = self.t.node.try_exec(&format!("{tool}-{flavour}-save"), &[]);
                        String::from_utf8_lossy(&out.stdout).into_owned()
                    })
                    .collect()
            }
            ProxyBackend::Ipvs => {
                // The node agent's own dump (`kpxctl rules`): IPVS services and destinations.
                String::from_utf8_lossy(&self.t.kpxctl(&["rules"]).stdout).into_owned()
            }
        }
    }

    /// One sample of the agent's metrics, read over HTTP (`/metrics` on 127.0.0.1:10249).
    pub fn agent_metric(&self, name: &str) -> f64 {
        crate::harness::traffic::agent_metric(&self.t.node, name)
    }

    /// The peers pod `i`'s backend has seen.
    fn peers(&self, i: usize) -> BTreeSet<IpAddr> {
        self.backends[i].peers()
    }

    fn clear_peers(&self) {
        self.backends.iter().for_each(Backend::clear_peers);
    }
}

fn pod(i: usize) -> String {
    Topology::pod_ip(i)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("IP address")
}

/// Who answered `n` TCP requests from `ns` to `to`.
fn answers(ns: &Netns, n: usize, to: SocketAddr) -> BTreeSet<Answer> {
    ns.run_in(move || (0..n).map(|_| tcp_request(to)).collect())
}

/// Waits until `n` TCP requests in a row from `ns` to `to` are answered by exactly the backends `expected`.
fn wait_answered_by(ns: &Netns, to: SocketAddr, expected: &[&str]) {
    let want: BTreeSet<Answer> = expected.iter().map(|e| Answer::From((*e).to_owned())).collect();
    let n = 12 * expected.len().max(1);
    wait_for(&format!("{to} to be answered by exactly {expected:?}"), DEADLINE, || {
        let got = answers(ns, n, to);
        (got == want).then_some(())
    });
}

/// Waits until a TCP request from `ns` to `to` gets no answer at all (dropped: neither answered nor refused).
fn wait_dropped(ns: &Netns, to: SocketAddr) {
    wait_for(&format!("{to} to be dropped"), DEADLINE, || {
        matches!(ns.run_in(move || tcp_request(to)), Answer::Failed(_)).then_some(())
    });
}

fn wait_udp_answered_by(ns: &Netns, to: SocketAddr, expected: &str) {
    wait_for(&format!("UDP {to} to be answered by {expected}"), DEADLINE, || {
        (ns.run_in(move || udp_request(to)) == Answer::From(expected.to_owned())).then_some(())
    });
}

/// NodePort on the node's addresses inside `--nodeport-addresses`, TCP and UDP, masqueraded
/// (policy Cluster); not on another node address, not on 127.0.0.1. SCTP: rules only (no SCTP
/// sockets on this kernel; SCTP traffic is proven in the VM). `primary`: only on the node's
/// primary address of each family; without the flag, kube-proxy's default of the backend
/// (`primary` with nftables, every node address otherwise), and then with iptables
/// NodePorts on 127.0.0.1 too ([`localhost_node_ports`]).
pub fn node_port(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.1.1\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30080}\n  - {name: dns, protocol: UDP, port: 53, nodePort: 30053}\n  - {name: sctp, protocol: SCTP, port: 9, nodePort: 30009}\n";
    let eps = [ep(pod(0)), ep(pod(1))];
    let ports = [("http", "TCP", 8080), ("dns", "UDP", 8080), ("sctp", "SCTP", 8080)];
    let s = Scene::start(
        backend,
        2,
        &[("np.yaml", documents(&[service("np", spec, ""), slice("np", "np-1", false, &ports, &eps)]))],
        &[],
        &["--nodeport-addresses=10.0.0.0/24"],
    );
    wait_answered_by(&s.t.client, sock(NODE_IP, 30080), &["pod0", "pod1"]);
    wait_udp_answered_by(&s.t.client, sock(NODE_IP, 30053), "pod0");
    wait_udp_answered_by(&s.t.client, sock(NODE_IP, 30053), "pod1");
    let seen: BTreeSet<IpAddr> = s.peers(0).union(&s.peers(1)).copied().collect();
    assert!(!seen.contains(&ip(CLIENT_IP)), "policy Cluster masquerades NodePort traffic: {seen:?}");
    assert_eq!(
        s.t.client.run_in(|| tcp_request(sock(NODE_IP_2, 30080))),
        Answer::Refused,
        "no NodePort on an address outside --nodeport-addresses"
    );
    assert_eq!(
        s.t.node.run_in(|| tcp_request(sock("127.0.0.1", 30080))),
        Answer::Refused,
        "no NodePort on loopback"
    );
    assert!(s.rules_mention("30009"), "the SCTP NodePort is programmed");

    let mut s = s;
    for (flags, second_address_open) in
        [(&["--nodeport-addresses=primary"][..], false), (&[][..], backend != ProxyBackend::Nftables)]
    {
        s.dp.kill();
        s.dp = s.t.start_dataplane_with(backend, flags);
        s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
            e["message"] == "programmed stored state"
        });
        wait_answered_by(&s.t.client, sock(NODE_IP, 30080), &["pod0", "pod1"]);
        let second = s.t.client.run_in(|| tcp_request(sock(NODE_IP_2, 30080)));
        if second_address_open {
            assert!(matches!(second, Answer::From(_)), "{flags:?}: every node address: {second:?}");
        } else {
            assert_eq!(second, Answer::Refused, "{flags:?}: the primary address only");
        }
    }
    localhost_node_ports(&mut s);
}

/// NodePorts on every local address: with `--nodeport-addresses` unset, kube-proxy's
/// iptables and IPVS modes open NodePorts on every address of the node's interfaces, a
/// secondary one added later too (kube-proxy's packet-flow tests, IPv4 and IPv6), not only
/// on the Node object's; nftables' default (`primary`) does not. The agent reads the
/// addresses over rtnetlink, follows them as they come and go, and shows them in
/// `kpxctl status`.
pub fn node_ports_on_interface_addresses(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.1.50\n  clusterIPs: [10.96.1.50, 'fd00:96::50']\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30090}\n";
    let ports = [("http", "TCP", 8080)];
    let s = Scene::start(
        backend,
        1,
        &[(
            "np.yaml",
            documents(&[
                service("np", spec, ""),
                slice("np", "np-4", false, &ports, &[ep(pod(0))]),
                slice("np", "np-6", true, &ports, &[ep(Topology::pod_ip6(0))]),
            ]),
        )],
        &[],
        &[],
    );
    wait_answered_by(&s.t.client, sock(NODE_IP, 30090), &["pod0"]);
    wait_answered_by(&s.t.client, sock(NODE_IP6, 30090), &["pod0"]);
    let secondary = [("10.0.2.1", "10.0.2.1/24"), ("fd00:2::1", "fd00:2::1/64")];
    for (_, prefix) in secondary {
        s.t.node.ip(&["addr", "add", prefix, "dev", "to-client", "nodad"]);
    }
    let status = || String::from_utf8_lossy(&s.t.kpxctl(&["status"]).stdout).into_owned();
    wait_for("kpxctl status to show the secondary addresses", DEADLINE, || {
        let shown = status();
        secondary.iter().all(|(address, _)| shown.contains(address)).then_some(())
    });
    let every_address = backend != ProxyBackend::Nftables;
    for (address, _) in secondary {
        let to = sock(address, 30090);
        if every_address {
            wait_answered_by(&s.t.client, to, &["pod0"]);
        } else {
            assert_eq!(s.t.client.run_in(move || tcp_request(to)), Answer::Refused, "primary only: {to}");
        }
    }
    // Gone again: NodePorts no longer translated there.
    for (_, prefix) in secondary {
        s.t.node.ip(&["addr", "del", prefix, "dev", "to-client"]);
    }
    wait_for("kpxctl status to drop the secondary addresses", DEADLINE, || {
        let shown = status();
        secondary.iter().all(|(address, _)| !shown.contains(address)).then_some(())
    });
    for (address, _) in secondary {
        let to = sock(address, 30090);
        wait_for(&format!("{to} to stop reaching pod0"), DEADLINE, || {
            (!matches!(s.t.client.run_in(move || tcp_request(to)), Answer::From(_))).then_some(())
        });
    }
}

/// kube-proxy's `localhostNodePorts`, on by default with iptables where every node address
/// is a NodePort address: NodePorts answer on 127.0.0.1 too, which takes `route_localnet`;
/// packets to 127.0.0.0/8 from another host are then dropped unless a NodePort translated
/// them, so what listens on loopback only stays unreachable from outside. Other backends
/// never open NodePorts on 127.0.0.1.
fn localhost_node_ports(s: &mut Scene) {
    let loopback = sock("127.0.0.1", 30080);
    let iptables = matches!(s.backend, ProxyBackend::Iptables | ProxyBackend::IptablesLegacy);
    if !iptables {
        assert_eq!(
            s.t.node.run_in(move || tcp_request(loopback)),
            Answer::Refused,
            "no NodePort on loopback"
        );
        return;
    }
    assert!(
        matches!(s.t.node.run_in(move || tcp_request(loopback)), Answer::From(_)),
        "a NodePort on 127.0.0.1"
    );
    // The client routes 127.0.0.0/8 to the node, as a neighbour sending to the node's MAC would.
    let c = &s.t.client;
    c.ip(&["route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"]);
    c.ip(&["route", "del", "local", "127.0.0.1", "dev", "lo", "table", "local"]);
    c.ip(&["route", "add", "127.0.0.0/8", "via", NODE_IP]);
    c.exec("sysctl", &["-qw", "net.ipv4.conf.all.route_localnet=1"]);
    c.exec("sysctl", &["-qw", "net.ipv4.conf.eth0.route_localnet=1"]);
    // UDP, which needs no answer: the client drops replies from 127.0.0.1 as martians.
    let on_the_node = Backend::start(&s.t.node, "node", 18999);
    let inner = sock("127.0.0.1", 18999);
    assert_eq!(s.t.node.run_in(move || udp_request(inner)), Answer::From("node".into()), "the node's own");
    on_the_node.clear_peers();
    let _ = c.run_in(move || udp_request(inner));
    assert!(
        on_the_node.peers().is_empty(),
        "127.0.0.1 from another host is dropped: {:?}",
        on_the_node.peers()
    );
    s.clear_peers();
    let _ = c.run_in(|| udp_request(sock("127.0.0.1", 30053)));
    let reached: BTreeSet<IpAddr> = s.peers(0).union(&s.peers(1)).copied().collect();
    assert_eq!(reached.len(), 1, "a NodePort it translated is not dropped: {reached:?}");

    s.dp.kill();
    s.dp = s.t.start_dataplane_with(s.backend, &["--iptables-localhost-nodeports=false"]);
    s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
        e["message"] == "programmed stored state"
    });
    wait_for("the NodePort to close on 127.0.0.1", DEADLINE, || {
        (s.t.node.run_in(move || tcp_request(loopback)) == Answer::Refused).then_some(())
    });
    // route_localnet stays set (kube-proxy leaves it too): only the drop rule had kept the
    // listener from the client, and it went with the localhost NodePorts.
    let _ = c.run_in(move || udp_request(inner));
    assert_eq!(on_the_node.peers(), BTreeSet::from([ip(CLIENT_IP)]), "without the drop rule");
}

/// External IPs and load-balancer IPs; source ranges filter the load-balancer IPs only; a node
/// whose address is inside the ranges reaches the load-balancer IP.
pub fn external_and_load_balancer_ips(backend: ProxyBackend) {
    let spec = format!(
        "  type: LoadBalancer\n  clusterIP: 10.96.1.2\n  externalIPs: [192.0.2.10]\n  loadBalancerSourceRanges: [{CLIENT_IP_2}/32, {NODE_IP}/32]\n  ports:\n  - {{name: http, protocol: TCP, port: 80, nodePort: 30081}}\n"
    );
    let status = "  loadBalancer: {ingress: [{ip: 192.0.2.20}]}\n";
    let mut s = Scene::start(
        backend,
        1,
        &[(
            "lb.yaml",
            documents(&[
                service("lb", &spec, status),
                slice("lb", "lb-1", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
            ]),
        )],
        &[],
        &[],
    );
    wait_answered_by(&s.t.client, sock("192.0.2.10", 80), &["pod0"]);
    let lb = sock("192.0.2.20", 80);
    wait_for("the load-balancer IP to answer an allowed source", DEADLINE, || {
        (s.t.client.run_in(move || tcp_request_from(ip(CLIENT_IP_2), lb)) == Answer::From("pod0".into()))
            .then_some(())
    });
    let denied = s.t.client.run_in(move || tcp_request_from(ip(CLIENT_IP), lb));
    assert!(matches!(denied, Answer::Failed(_)), "a source outside the ranges is dropped: {denied:?}");
    let external = s.t.client.run_in(|| tcp_request_from(ip(CLIENT_IP), sock("192.0.2.10", 80)));
    assert_eq!(external, Answer::From("pod0".into()), "external IPs are not filtered");
    let node_port = s.t.client.run_in(|| tcp_request_from(ip(CLIENT_IP), sock(NODE_IP, 30081)));
    assert_eq!(node_port, Answer::From("pod0".into()), "NodePorts are not filtered");
    assert_eq!(
        s.t.node.run_in(move || tcp_request(lb)),
        Answer::From("pod0".into()),
        "the node itself is allowed"
    );
    let says = |s: &Scene, what: &str, text: &'static str| {
        s.dp.wait_event(what, DEADLINE, |e| e["message"].as_str().is_some_and(|m| m.contains(text)));
    };
    says(&s, "that externalIPs are deprecated", "spec.externalIPs is deprecated");
    // kube-proxy 1.40's defaults (the AllowServiceExternalIPs gate off): the external IP
    // is no entry point any more, the load-balancer IP and the NodePort still are; the
    // gate set again brings it back. (KubeProxyIPVS, off too at 1.40, is opted into so
    // that the IPVS run keeps its backend.)
    let restart = |s: &mut Scene, gates: &str| {
        s.dp.kill();
        s.dp = s.t.start_dataplane_with(backend, &["--kubernetes-version=1.40", gates]);
        s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
            e["message"] == "programmed stored state"
        });
    };
    restart(&mut s, "--feature-gates=KubeProxyIPVS=true");
    says(&s, "that externalIPs are not programmed", "externalIPs are not programmed");
    let external = sock("192.0.2.10", 80);
    wait_for("the external IP to go unanswered at 1.40's defaults", DEADLINE, || {
        (!matches!(s.t.client.run_in(move || tcp_request(external)), Answer::From(_))).then_some(())
    });
    assert_eq!(s.t.client.run_in(move || tcp_request_from(ip(CLIENT_IP_2), lb)), Answer::From("pod0".into()));
    assert_eq!(s.t.client.run_in(|| tcp_request(sock(NODE_IP, 30081))), Answer::From("pod0".into()));
    restart(&mut s, "--feature-gates=KubeProxyIPVS=true,AllowServiceExternalIPs=true");
    wait_answered_by(&s.t.client, external, &["pod0"]);
}

/// externalTrafficPolicy Local: external traffic only to this node's endpoints, client address kept,
/// dropped without local endpoints; the health-check node port counts them (its server takes
/// the port once another process, kube-proxy beside kpx, lets go of it); pods are
/// short-circuited.
pub fn external_traffic_policy_local(backend: ProxyBackend) {
    let spec = "  type: LoadBalancer\n  clusterIP: 10.96.1.3\n  externalIPs: [192.0.2.11]\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30082}\n";
    let write = |t: &Topology, eps: &[Ep]| {
        t.write_manifest(
            "local.yaml",
            &documents(&[
                service("local", spec, ""),
                slice("local", "local-1", false, &[("http", "TCP", 8080)], eps),
            ]),
        );
    };
    let s = Scene::start(backend, 2, &[], &[&format!("--cluster-cidr={CLUSTER_CIDR}")], &[]);
    // Another process holds the health-check port at first, as kube-proxy holds it while
    // kpx runs beside it during a migration.
    let held = s.t.node.run_in(|| std::net::TcpListener::bind("0.0.0.0:32000").expect("port 32000"));
    write(&s.t, &[ep(pod(0)), ep(pod(1)).on("node-b")]);
    wait_answered_by(&s.t.client, sock(NODE_IP, 30082), &["pod0"]);
    wait_answered_by(&s.t.client, sock("192.0.2.11", 80), &["pod0"]);
    assert!(s.peers(0).contains(&ip(CLIENT_IP)), "the client address is kept: {:?}", s.peers(0));
    wait_answered_by(&s.t.client, sock("10.96.1.3", 80), &["pod0", "pod1"]);
    // It lets go (kube-proxy removed): the agent takes the port.
    drop(held);
    wait_for("the health-check server to take the port once free", DEADLINE, || {
        s.t.client.run_in(|| http_get(sock(NODE_IP, 32000))).ok()
    });
    // kube-proxy's answer, on both families: 200, the endpoint weight, nosniff.
    for addr in [NODE_IP, crate::harness::topology::NODE_IP6] {
        let health = s.t.client.run_in(move || http_get_with_headers(sock(addr, 32000), "/"));
        let (status, headers, body) = health.expect("health-check answer");
        assert_eq!(status, 200, "{addr}: {body}");
        assert!(body.contains("\"localEndpoints\":1") && body.contains("\"name\":\"local\""), "{body}");
        assert!(body.contains("\"serviceProxyHealthy\":true"), "{body}");
        for header in ["X-Load-Balancing-Endpoint-Weight: 1", "X-Content-Type-Options: nosniff"] {
            assert!(headers.iter().any(|h| h == header), "{addr}: {header} in {headers:?}");
        }
    }
    // A pod on this node is short-circuited to all endpoints.
    assert!(matches!(s.t.pods[1].run_in(|| tcp_request(sock(NODE_IP, 30082))), Answer::From(_)));

    write(&s.t, &[ep(pod(0)).on("node-b"), ep(pod(1)).on("node-b")]);
    wait_dropped(&s.t.client, sock(NODE_IP, 30082));
    wait_for("the health check to report no local endpoint", DEADLINE, || {
        s.t.client.run_in(|| http_get(sock(NODE_IP, 32000))).ok().filter(|(status, _)| *status == 503)
    });
    let (_, body) = s.t.client.run_in(|| http_get(sock(NODE_IP, 32000))).expect("health-check answer");
    assert!(body.contains("\"localEndpoints\":0"), "{body}");
}

/// internalTrafficPolicy Local: ClusterIP traffic only to this node's endpoints, dropped without
/// while other nodes have some, refused when none has; external traffic (NodePort, policy
/// Cluster) to every endpoint.
pub fn internal_traffic_policy_local(backend: ProxyBackend) {
    let spec = "  clusterIP: 10.96.1.4\n  internalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    // The same policy on a NodePort Service, whose external policy stays Cluster.
    let node_port = "  type: NodePort\n  clusterIP: 10.96.1.14\n  internalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30094}\n";
    let write = |t: &Topology, eps: &[Ep]| {
        let http = [("http", "TCP", 8080)];
        t.write_manifest(
            "itp.yaml",
            &documents(&[
                service("itp", spec, ""),
                slice("itp", "itp-1", false, &http, eps),
                service("itp-np", node_port, ""),
                slice("itp-np", "itp-np-1", false, &http, eps),
            ]),
        );
    };
    let (vip, np_vip, np) = (sock("10.96.1.4", 80), sock("10.96.1.14", 80), sock(NODE_IP, 30094));
    let s = Scene::start(backend, 2, &[], &[], &[]);
    write(&s.t, &[ep(pod(0)), ep(pod(1)).on("node-b")]);
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    wait_answered_by(&s.t.client, np_vip, &["pod0"]);
    // External traffic follows externalTrafficPolicy (Cluster): every endpoint, masqueraded.
    wait_answered_by(&s.t.client, np, &["pod0", "pod1"]);
    let seen: BTreeSet<IpAddr> = s.peers(0).union(&s.peers(1)).copied().collect();
    assert!(!seen.contains(&ip(CLIENT_IP)), "external policy Cluster masquerades: {seen:?}");
    write(&s.t, &[ep(pod(0)).on("node-b"), ep(pod(1)).on("node-b")]);
    wait_dropped(&s.t.client, vip);
    wait_dropped(&s.t.client, np_vip);
    wait_answered_by(&s.t.client, np, &["pod0", "pod1"]);
    // No endpoint on any node: refused at once, like any Service without endpoints.
    write(&s.t, &[]);
    for to in [vip, np_vip, np] {
        wait_for(&format!("{to} to be refused"), DEADLINE, || {
            (s.t.client.run_in(move || tcp_request(to)) == Answer::Refused).then_some(())
        });
    }
}

/// Topology hints: same node when every endpoint has node hints and one names this node, else
/// same zone when all have zone hints and one matches, else all.
pub fn topology_hints(backend: ProxyBackend) {
    let spec = "  clusterIP: 10.96.1.5\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let write = |t: &Topology, eps: &[Ep]| {
        t.write_manifest(
            "hints.yaml",
            &documents(&[
                service("hints", spec, ""),
                slice("hints", "hints-1", false, &[("http", "TCP", 8080)], eps),
            ]),
        );
    };
    let s = Scene::start(backend, 3, &[], &[], &[]);
    let vip = sock("10.96.1.5", 80);
    write(
        &s.t,
        &[ep(pod(0)).for_zone("zone-a"), ep(pod(1)).for_zone("zone-b"), ep(pod(2)).for_zone("zone-b")],
    );
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    write(
        &s.t,
        &[
            ep(pod(0)).for_zone("zone-a").for_node("node-b"),
            ep(pod(1)).for_zone("zone-a").for_node("node-c"),
            ep(pod(2)).for_zone("zone-b").for_node("node-a"),
        ],
    );
    wait_answered_by(&s.t.client, vip, &["pod2"]);
    write(&s.t, &[ep(pod(0)).for_zone("zone-a"), ep(pod(1)), ep(pod(2)).for_zone("zone-b")]);
    wait_answered_by(&s.t.client, vip, &["pod0", "pod1", "pod2"]);
}

/// sessionAffinity ClientIP: a client keeps its endpoint while it keeps coming back within the
/// timeout; after the timeout its next connection is balanced afresh.
pub fn session_affinity(backend: ProxyBackend) {
    let spec = "  clusterIP: 10.96.1.6\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 2}}\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let eps = [ep(pod(0)), ep(pod(1)), ep(pod(2))];
    let s = Scene::start(
        backend,
        3,
        &[(
            "sa.yaml",
            documents(&[service("sa", spec, ""), slice("sa", "sa-1", false, &[("http", "TCP", 8080)], &eps)]),
        )],
        &[],
        &[],
    );
    let vip = sock("10.96.1.6", 80);
    wait_for("the Service to answer", DEADLINE, || {
        matches!(s.t.client.run_in(move || tcp_request(vip)), Answer::From(_)).then_some(())
    });
    let mut stuck = Vec::new();
    for from in [CLIENT_IP, CLIENT_IP_2] {
        let got: BTreeSet<Answer> =
            s.t.client.run_in(move || (0..30).map(|_| tcp_request_from(ip(from), vip)).collect());
        assert_eq!(got.len(), 1, "{from} sticks to one endpoint: {got:?}");
        assert!(got.iter().all(|a| matches!(a, Answer::From(_))), "{got:?}");
        stuck.extend(got);
    }
    // After the timeout the next connection is balanced afresh: within a few expiries the
    // first client lands elsewhere (the same endpoint each time by chance: (1/3)^8 ≈ 0.02%;
    // IPVS's round robin moves it at the first expiry).
    let tries = if backend.affinity_linger().is_zero() { 8 } else { 2 };
    let mut seen = Vec::new();
    for _ in 0..tries {
        std::thread::sleep(Duration::from_millis(3200) + backend.affinity_linger());
        let next = s.t.client.run_in(move || tcp_request_from(ip(CLIENT_IP), vip));
        seen.push(next.clone());
        if next != stuck[0] {
            break;
        }
    }
    assert!(seen.iter().any(|a| *a != stuck[0]), "affinity expires: stuck to {:?}, then {seen:?}", stuck[0]);
}

/// Terminating endpoints serve only when no ready endpoint exists, separately for the cluster set
/// and the node's local set; one its slice calls ready (publishNotReadyAddresses) is ready.
pub fn terminating_endpoints(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.1.7\n  externalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30083}\n";
    let write = |t: &Topology, eps: &[Ep]| {
        t.write_manifest(
            "term.yaml",
            &documents(&[
                service("term", spec, ""),
                slice("term", "term-1", false, &[("http", "TCP", 8080)], eps),
            ]),
        );
    };
    let s = Scene::start(backend, 2, &[], &[], &[]);
    let vip = sock("10.96.1.7", 80);
    write(&s.t, &[ep(pod(0)), ep(pod(1)).terminating()]);
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    write(&s.t, &[ep(pod(0)).not_ready(), ep(pod(1)).terminating()]);
    wait_answered_by(&s.t.client, vip, &["pod1"]);
    // pod0 is this node's only endpoint and terminating; pod1 is ready elsewhere.
    write(&s.t, &[ep(pod(0)).terminating(), ep(pod(1)).on("node-b")]);
    wait_answered_by(&s.t.client, vip, &["pod1"]);
    wait_answered_by(&s.t.client, sock(NODE_IP, 30083), &["pod0"]);
    // publishNotReadyAddresses: terminating endpoints the slice calls ready (serving false)
    // are ready, as kube-proxy takes `ready` as written, beside the other ready ones
    // (Kubernetes' e2e "should be able to connect to terminating and unready endpoints if
    // PublishNotReadyAddresses is true").
    write(&s.t, &[ep(pod(0)).published_terminating(), ep(pod(1)).published_terminating()]);
    wait_answered_by(&s.t.client, vip, &["pod0", "pod1"]);
    // A pod IP reused while the pod that had it is still terminating (kube-proxy 1.36,
    // k/k#135593): pod0's address is listed twice, terminating first and then ready, in one
    // slice and then across two. The ready one wins: pod0 takes traffic beside pod1 (were
    // the terminating one to win, only pod1 would, as a ready endpoint exists).
    write(&s.t, &[ep(pod(0)).not_ready(), ep(pod(1)).terminating()]);
    wait_answered_by(&s.t.client, vip, &["pod1"]);
    write(&s.t, &[ep(pod(0)).terminating(), ep(pod(1)), ep(pod(0))]);
    wait_answered_by(&s.t.client, vip, &["pod0", "pod1"]);
    write(&s.t, &[ep(pod(0)).not_ready(), ep(pod(1)).terminating()]);
    wait_answered_by(&s.t.client, vip, &["pod1"]);
    s.t.write_manifest(
        "term.yaml",
        &documents(&[
            service("term", spec, ""),
            slice("term", "term-1", false, &[("http", "TCP", 8080)], &[ep(pod(0)).terminating(), ep(pod(1))]),
            slice("term", "term-2", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
        ]),
    );
    wait_answered_by(&s.t.client, vip, &["pod0", "pod1"]);
}

/// Masquerade: ClusterIP traffic from outside the cluster CIDR is masqueraded, pod traffic is not,
/// hairpin is; the agent's `--cluster-cidr` wins over the control plane's; the other
/// local-traffic detectors (node CIDR, interface prefix, bridge); `--masquerade-all`
/// masquerades ClusterIP traffic from pods too, but not external traffic of policy Local,
/// from outside or from pods.
pub fn masquerade(backend: ProxyBackend) {
    let spec = "  clusterIP: 10.96.1.8\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let local = "  type: LoadBalancer\n  clusterIP: 10.96.1.18\n  externalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30108}\n";
    let remote = "  type: NodePort\n  clusterIP: 10.96.1.19\n  externalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30109}\n";
    let manifests = [(
        "m.yaml",
        documents(&[
            service("m", spec, ""),
            slice("m", "m-1", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
            service("mlocal", local, "  loadBalancer: {ingress: [{ip: 192.0.2.28}]}\n"),
            slice("mlocal", "mlocal-1", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
            service("mremote", remote, ""),
            slice("mremote", "mremote-1", false, &[("http", "TCP", 8080)], &[ep(pod(0)).on("node-b")]),
        ]),
    )];
    let cidr = format!("--cluster-cidr={CLUSTER_CIDR}");
    let mut s = Scene::start(backend, 2, &manifests, &[&cidr], &[]);
    // The cluster CIDR comes with the node's config, which may arrive after the Services.
    s.dp.wait_event("the node's config (with the cluster CIDR) applied", DEADLINE, |e| {
        e["message"] == "delta applied" && e["type_url"].as_str().is_some_and(|t| t.ends_with("NodeConfig"))
    });
    let vip = sock("10.96.1.8", 80);
    let node_side = ip(&Topology::node_ip_towards_pod(0));
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    assert_eq!(s.peers(0), BTreeSet::from([node_side]), "from outside the cluster CIDR: masqueraded");
    // Fully random, as kube-proxy masquerades: the source port is drawn afresh, not kept
    // (a kept port is what lets two clients' flows collide in conntrack).
    s.clear_peers();
    let client_ports = [41001, 41002, 41003];
    for port in client_ports {
        let answer = s.t.client.run_in(move || tcp_request_from_port(port, vip, Duration::from_secs(5)));
        assert_eq!(answer, Answer::From("pod0".into()), "from client port {port}");
    }
    let seen: Vec<u16> = s.backends[0].peer_sockets().iter().map(SocketAddr::port).collect();
    assert_eq!(seen.len(), client_ports.len(), "one masqueraded source per connection: {seen:?}");
    assert!(
        seen.iter().any(|p| !client_ports.contains(p)),
        "masquerading kept every client port ({seen:?}): not fully random"
    );
    s.clear_peers();
    assert_eq!(s.t.pods[1].run_in(move || tcp_request(vip)), Answer::From("pod0".into()));
    assert_eq!(s.peers(0), BTreeSet::from([ip(&pod(1))]), "from a pod: the pod's own address");
    s.clear_peers();
    assert_eq!(s.t.pods[0].run_in(move || tcp_request(vip)), Answer::From("pod0".into()), "hairpin");
    assert_eq!(s.peers(0), BTreeSet::from([node_side]), "hairpin is masqueraded");

    // The agent's own --cluster-cidr wins over the control plane's, in every backend: pods
    // outside it are not pods to this node.
    s.dp.kill();
    s.dp = s.t.start_dataplane_with(backend, &["--cluster-cidr=10.99.0.0/16"]);
    s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
        e["message"] == "programmed stored state"
    });
    s.clear_peers();
    assert_eq!(s.t.pods[1].run_in(move || tcp_request(vip)), Answer::From("pod0".into()));
    assert_eq!(s.peers(0), BTreeSet::from([node_side]), "outside the agent's --cluster-cidr: masqueraded");

    // kube-proxy's other local-traffic detectors, each of which makes pod1 a pod again
    // although it is outside the agent's --cluster-cidr: the node's pod CIDRs (its Node
    // object's), the pods' interface name prefix, and a bridge (here pod1's own link).
    let client = ip(CLIENT_IP);
    for (detector, flags) in [
        ("NodeCIDR", &["--detect-local-mode=NodeCIDR"][..]),
        (
            "InterfaceNamePrefix",
            &["--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=to-pod"],
        ),
        ("BridgeInterface", &["--detect-local-mode=BridgeInterface", "--pod-bridge-interface=to-pod1"]),
    ] {
        s.dp.kill();
        let mut args = vec!["--cluster-cidr=10.99.0.0/16"];
        args.extend_from_slice(flags);
        s.dp = s.t.start_dataplane_with(backend, &args);
        s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
            e["message"] == "programmed stored state"
        });
        s.clear_peers();
        assert_eq!(s.t.pods[1].run_in(move || tcp_request(vip)), Answer::From("pod0".into()));
        assert_eq!(s.peers(0), BTreeSet::from([ip(&pod(1))]), "{detector}: pod1 is a pod, not masqueraded");
        s.clear_peers();
        assert_eq!(s.t.client.run_in(move || tcp_request(vip)), Answer::From("pod0".into()));
        assert_eq!(
            s.peers(0),
            BTreeSet::from([node_side]),
            "{detector}: the client is not a pod: masqueraded"
        );
        // Policy-Local external traffic from a pod goes to all endpoints (30109's only one
        // is on another node); from outside, to this node's only (30108's). IPVS gives a
        // policy-Local virtual service this node's endpoints only, for pods too.
        let remote = sock(NODE_IP, 30109);
        if backend != ProxyBackend::Ipvs {
            let answer = s.t.pods[1].run_in(move || tcp_request(remote));
            assert_eq!(answer, Answer::From("pod0".into()), "{detector}: a pod to a policy-Local NodePort");
        }
        assert!(!matches!(s.t.client.run_in(move || tcp_request(remote)), Answer::From(_)), "{detector}");
        s.clear_peers();
        assert_eq!(s.t.client.run_in(|| tcp_request(sock(NODE_IP, 30108))), Answer::From("pod0".into()));
        assert_eq!(s.peers(0), BTreeSet::from([client]), "{detector}: the client to an ETP Local NodePort");
    }

    s.dp.kill();
    s.dp = s.t.start_dataplane_with(backend, &["--masquerade-all"]);
    s.dp.wait_event("the restarted agent programmed its state", DEADLINE, |e| {
        e["message"] == "programmed stored state"
    });
    s.clear_peers();
    assert_eq!(s.t.pods[1].run_in(move || tcp_request(vip)), Answer::From("pod0".into()));
    assert_eq!(s.peers(0), BTreeSet::from([node_side]), "--masquerade-all: masqueraded");
    // External traffic of policy Local keeps its client address, masqueradeAll or not.
    s.clear_peers();
    assert_eq!(s.t.client.run_in(|| tcp_request(sock(NODE_IP, 30108))), Answer::From("pod0".into()));
    assert_eq!(
        s.peers(0),
        BTreeSet::from([ip(CLIENT_IP)]),
        "--masquerade-all: an ETP Local NodePort is not masqueraded"
    );
    // kube-proxy's masqueradeAll masquerades traffic to ClusterIPs: a pod's traffic to a
    // policy-Local NodePort or load-balancer IP, short-circuited to all endpoints, keeps the
    // pod's address (kube-proxy's packet-flow expectation, nftables and iptables).
    if backend != ProxyBackend::Ipvs {
        for to in [sock(NODE_IP, 30108), sock("192.0.2.28", 80)] {
            s.clear_peers();
            assert_eq!(s.t.pods[1].run_in(move || tcp_request(to)), Answer::From("pod0".into()), "{to}");
            assert_eq!(
                s.peers(0),
                BTreeSet::from([ip(&pod(1))]),
                "--masquerade-all: a pod to the policy-Local {to} is not masqueraded"
            );
        }
    }
}

/// Dual-stack and single-stack IPv6 Services, TCP and UDP.
pub fn dual_stack(backend: ProxyBackend) {
    let dual = "  clusterIP: 10.96.1.9\n  clusterIPs: [10.96.1.9, 'fd00:96::9']\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n  - {name: dns, protocol: UDP, port: 53}\n";
    let v6 = "  clusterIP: 'fd00:96::10'\n  ipFamilies: [IPv6]\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let ports = [("http", "TCP", 8080), ("dns", "UDP", 8080)];
    let pods6 = [ep(Topology::pod_ip6(0)), ep(Topology::pod_ip6(1))];
    let manifests = [
        (
            "dual.yaml",
            documents(&[
                service("dual", dual, ""),
                slice("dual", "dual-4", false, &ports, &[ep(pod(0)), ep(pod(1))]),
                slice("dual", "dual-6", true, &ports, &pods6),
            ]),
        ),
        ("v6.yaml", documents(&[service("v6", v6, ""), slice("v6", "v6-1", true, &ports[..1], &pods6[1..])])),
    ];
    let s = Scene::start(backend, 2, &manifests, &[], &[]);
    wait_answered_by(&s.t.client, sock("10.96.1.9", 80), &["pod0", "pod1"]);
    wait_answered_by(&s.t.client, sock("fd00:96::9", 80), &["pod0", "pod1"]);
    wait_udp_answered_by(&s.t.client, sock("fd00:96::9", 53), "pod0");
    wait_udp_answered_by(&s.t.client, sock("fd00:96::9", 53), "pod1");
    wait_answered_by(&s.t.client, sock("fd00:96::10", 80), &["pod1"]);
}

/// Several ports per Service; a named targetPort resolved per endpoint (different numbers).
pub fn ports(backend: ProxyBackend) {
    let spec = "  clusterIP: 10.96.1.10\n  ports:\n  - {name: web, protocol: TCP, port: 80, targetPort: web}\n  - {name: alt, protocol: TCP, port: 81, targetPort: 7070}\n  - {name: stream, protocol: SCTP, port: 82}\n";
    let t_manifests = [(
        "ports.yaml",
        documents(&[
            service("multi", spec, ""),
            slice(
                "multi",
                "multi-a",
                false,
                &[("web", "TCP", 8080), ("alt", "TCP", 7070), ("stream", "SCTP", 7070)],
                &[ep(pod(0))],
            ),
            slice(
                "multi",
                "multi-b",
                false,
                &[("web", "TCP", 9090), ("alt", "TCP", 7070), ("stream", "SCTP", 7070)],
                &[ep(pod(1))],
            ),
        ]),
    )];
    let s = Scene::start(backend, 2, &t_manifests, &[], &[]);
    // pod0 serves web on 8080 (started by the scene); pod1 on 9090; both serve alt on 7070.
    let _more = [
        Backend::start(&s.t.pods[1], "pod1", 9090),
        Backend::start(&s.t.pods[0], "pod0-alt", 7070),
        Backend::start(&s.t.pods[1], "pod1-alt", 7070),
    ];
    wait_answered_by(&s.t.client, sock("10.96.1.10", 80), &["pod0", "pod1"]);
    wait_answered_by(&s.t.client, sock("10.96.1.10", 81), &["pod0-alt", "pod1-alt"]);
    assert!(s.rules_mention("sctp"), "the SCTP port is programmed");
}

/// Names at Kubernetes' limits: a namespace and a Service name of 63 characters and a port
/// name of 15 make kube-proxy's `namespace/name:port` 142 bytes, more than the 128 bytes an
/// nftables comment may hold (the kernel then refuses the whole transaction: k/k#139515);
/// with session affinity, so that the Service has chains of its own. It is programmed
/// and answers, on every backend, beside a Service of short names.
pub fn long_names(backend: ProxyBackend) {
    let namespace = format!("ns-{}", "n".repeat(60));
    let name = format!("svc-{}", "s".repeat(59));
    let port = "port-name-15-ch";
    assert_eq!((namespace.len(), name.len(), port.len()), (63, 63, 15));
    let spec = format!(
        "  clusterIP: 10.96.1.41\n  sessionAffinity: ClientIP\n  ports:\n  - {{name: {port}, protocol: TCP, port: 80}}\n"
    );
    let long = documents(&[
        service(&name, &spec, ""),
        slice(&name, &format!("{name}-1"), false, &[(port, "TCP", 8080)], &[ep(pod(0)), ep(pod(1))]),
    ])
    .replace("namespace: test", &format!("namespace: {namespace}"));
    let short = documents(&[
        service(
            "short",
            "  clusterIP: 10.96.1.42\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n",
            "",
        ),
        slice("short", "short-1", false, &[("http", "TCP", 8080)], &[ep(pod(1))]),
    ]);
    let s = Scene::start(backend, 2, &[("long.yaml", long), ("short.yaml", short)], &[], &[]);
    wait_answered_by(&s.t.client, sock("10.96.1.42", 80), &["pod1"]);
    // Session affinity: one client keeps one of the two.
    wait_for("the long-named Service to answer", DEADLINE, || {
        matches!(s.t.client.run_in(|| tcp_request(sock("10.96.1.41", 80))), Answer::From(_)).then_some(())
    });
    assert_eq!(answers(&s.t.client, 6, sock("10.96.1.41", 80)).len(), 1, "session affinity holds");
}

/// After a UDP endpoint goes away, a client that keeps one socket and keeps sending reaches a live
/// endpoint (its stale conntrack entries, to the ClusterIP and the NodePort, are deleted).
pub fn udp_conntrack(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.1.11\n  ports:\n  - {name: dns, protocol: UDP, port: 53, nodePort: 30054}\n";
    let write_on = |t: &Topology, target: u16, eps: &[Ep]| {
        t.write_manifest(
            "udp.yaml",
            &documents(&[
                service("udp", spec, ""),
                slice("udp", "udp-1", false, &[("dns", "UDP", target)], eps),
            ]),
        );
    };
    let write = |t: &Topology, eps: &[Ep]| write_on(t, 8080, eps);
    let s = Scene::start(backend, 2, &[], &[], &[]);
    write(&s.t, &[ep(pod(0))]);
    for to in [sock("10.96.1.11", 53), sock(NODE_IP, 30054)] {
        wait_udp_answered_by(&s.t.client, to, "pod0");
    }
    let (stop, handles): (std::sync::Arc<std::sync::atomic::AtomicBool>, Vec<_>) = {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handles = [sock("10.96.1.11", 53), sock(NODE_IP, 30054)]
            .into_iter()
            .map(|to| {
                let stop = std::sync::Arc::clone(&stop);
                let (tx, rx) = std::sync::mpsc::channel();
                let thread = s.t.client.spawn_in(move || {
                    // One socket for the whole test, sending all the time.
                    let sock = std::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0))).expect("bind");
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = tx.send(udp_exchange(&sock, to));
                        std::thread::sleep(Duration::from_millis(50));
                    }
                });
                (to, rx, thread)
            })
            .collect();
        (stop, handles)
    };
    for (to, rx, _) in &handles {
        wait_for(&format!("the kept socket to {to} to reach pod0"), DEADLINE, || {
            (rx.recv_timeout(Duration::from_secs(2)).ok()? == Answer::From("pod0".into())).then_some(())
        });
    }
    // pod0 terminates while pod1 is ready: new flows go to pod1, and the kept sockets stay
    // with pod0, which still serves (kube-proxy deletes a UDP flow only once its endpoint
    // stops serving).
    let deleted =
        || s.agent_metric("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}");
    let before = deleted();
    write(&s.t, &[ep(pod(0)).terminating(), ep(pod(1))]);
    for to in [sock("10.96.1.11", 53), sock(NODE_IP, 30054)] {
        wait_udp_answered_by(&s.t.client, to, "pod1");
    }
    assert_eq!(deleted(), before, "no flow deleted while pod0 serves");
    for (to, rx, _) in &handles {
        while rx.try_recv().is_ok() {}
        let seen: Vec<Answer> =
            (0..10).filter_map(|_| rx.recv_timeout(Duration::from_secs(2)).ok()).collect();
        assert!(
            seen.len() >= 5 && seen.iter().all(|a| *a == Answer::From("pod0".into())),
            "the kept socket to {to} stays with the serving, terminating pod0: {seen:?}"
        );
    }
    // pod0 stops serving: its flows go, and the kept sockets reach pod1.
    write(&s.t, &[ep(pod(0)).terminating().not_ready(), ep(pod(1))]);
    for (to, rx, _) in &handles {
        wait_for(&format!("the kept socket to {to} to reach pod1"), DEADLINE, || {
            (rx.recv_timeout(Duration::from_secs(2)).ok()? == Answer::From("pod1".into())).then_some(())
        });
    }
    // kube-proxy's reconciler metric counts what the kernel deleted: the two kept flows.
    // (IPVS moves them itself, as their destination went: conntrack holds no NAT to delete.)
    let after = deleted();
    if backend != ProxyBackend::Ipvs {
        assert!(
            after >= before + 2.0,
            "kubeproxy_conntrack_reconciler_deleted_entries_total: {before} then {after}"
        );
    }
    // The Service's target port moves from 8080 to 9090 on the same pod (Kubernetes' e2e
    // "cleanup conntrack entries when UDP service target port changes"): the kept sockets'
    // flows to pod1:8080 are stale although pod1's address stays, and they reach :9090
    // while pod1 still answers on 8080.
    let _moved = Backend::start(&s.t.pods[1], "pod1-9090", 9090);
    write_on(&s.t, 9090, &[ep(pod(1))]);
    for (to, rx, _) in &handles {
        wait_for(&format!("the kept socket to {to} to reach pod1's new port"), DEADLINE, || {
            (rx.recv_timeout(Duration::from_secs(2)).ok()? == Answer::From("pod1-9090".into())).then_some(())
        });
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (_, _, thread) in handles {
        let _ = thread.join();
    }
}

/// The UDP flows of a Service left with no endpoint, and of a deleted Service, are deleted
/// within the sync of that change (kube-proxy 1.36–1.38: k/k#139629, k/k#141371): a client
/// that keeps one socket and keeps sending (statsd's one-way traffic) would otherwise stay
/// pinned to the old endpoint for as long as it sends (here pod0 stays up, so such a flow
/// would still be answered). A flow of another Service, to an
/// endpoint that still serves, is not touched: the same conntrack entry (by its id) before
/// and after. nftables and iptables (IPVS keeps no NAT in conntrack: `ipvs_scenarios`).
pub fn udp_conntrack_gone(backend: ProxyBackend) {
    let gone_spec = "  clusterIP: 10.96.1.31\n  ports:\n  - {name: dns, protocol: UDP, port: 53}\n";
    let stays_spec = "  clusterIP: 10.96.1.32\n  ports:\n  - {name: dns, protocol: UDP, port: 53}\n";
    let write = |t: &Topology, gone: Option<&[Ep]>| {
        let mut docs = vec![
            service("stays", stays_spec, ""),
            slice("stays", "stays-1", false, &[("dns", "UDP", 8080)], &[ep(pod(1))]),
        ];
        if let Some(eps) = gone {
            docs.push(service("gone", gone_spec, ""));
            docs.push(slice("gone", "gone-1", false, &[("dns", "UDP", 8080)], eps));
        }
        t.write_manifest("udp-gone.yaml", &documents(&docs));
    };
    let s = Scene::start(backend, 2, &[], &[], &[]);
    write(&s.t, Some(&[ep(pod(0))]));
    let (gone, stays) = (sock("10.96.1.31", 53), sock("10.96.1.32", 53));
    wait_udp_answered_by(&s.t.client, gone, "pod0");
    wait_udp_answered_by(&s.t.client, stays, "pod1");
    // One socket per Service from a fixed port, as kube-proxy's tests send, sending all the time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kept: Vec<_> = [(gone, 40053u16), (stays, 40054u16)]
        .into_iter()
        .map(|(to, from)| {
            let stop = std::sync::Arc::clone(&stop);
            let (tx, rx) = std::sync::mpsc::channel();
            let thread = s.t.client.spawn_in(move || {
                let sock = std::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], from))).expect("bind");
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = tx.send(udp_exchange(&sock, to));
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
            (rx, thread)
        })
        .collect();
    let next = |i: usize| kept[i].0.recv_timeout(Duration::from_secs(3)).ok();
    let wait_kept = |i: usize, what: &str, ok: &dyn Fn(&Answer) -> bool| {
        wait_for(what, DEADLINE, || next(i).filter(|a| ok(a)).map(|_| ()));
    };
    wait_kept(0, "the kept socket to the gone Service to reach pod0", &|a| *a == Answer::From("pod0".into()));
    wait_kept(1, "the kept socket to the staying Service to reach pod1", &|a| {
        *a == Answer::From("pod1".into())
    });
    // The staying Service's flow from port 40054, by its conntrack id.
    let stays_flow = || {
        let out = s
            .t
            .node
            .try_exec("conntrack", &["-L", "-p", "udp", "-d", "10.96.1.32", "--sport", "40054", "-o", "id"]);
        assert!(out.status.success(), "conntrack -L: {}", String::from_utf8_lossy(&out.stderr));
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        let ids: Vec<String> =
            listed.split_whitespace().filter(|w| w.starts_with("id=")).map(str::to_owned).collect();
        assert_eq!(ids.len(), 1, "one flow from port 40054 to the staying Service: {listed}");
        assert!(listed.contains(&format!("src={}", pod(1))), "NATed to pod1: {listed}");
        ids[0].clone()
    };
    let flow = stays_flow();
    let not_pod0 = |a: &Answer| !matches!(a, Answer::From(p) if p == "pod0");
    let deleted =
        || s.agent_metric("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}");

    // The gone Service drops to zero endpoints (pod0 is still there, and would answer a
    // flow that kept its NAT): the kept socket is rejected from the next datagram on.
    let before = deleted();
    write(&s.t, Some(&[]));
    let stopped_reaching_pod0 = |what: &str| {
        // Five datagrams in a row not answered by pod0 (rejected: the socket is not
        // connected, so it sees no ICMP error, only silence).
        wait_for(what, DEADLINE, || (0..5).all(|_| next(0).is_some_and(|a| not_pod0(&a))).then_some(()));
    };
    stopped_reaching_pod0("the kept socket to a Service without endpoints to stop reaching pod0");
    assert!(deleted() > before, "the flow to pod0 was deleted, and counted");
    assert_eq!(stays_flow(), flow, "the staying Service's flow is the same conntrack entry");
    wait_kept(1, "the kept socket to the staying Service to still reach pod1", &|a| {
        *a == Answer::From("pod1".into())
    });

    // pod0 is back, then the Service is deleted: the kept socket no longer reaches pod0.
    write(&s.t, Some(&[ep(pod(0))]));
    wait_kept(0, "the kept socket to reach pod0 again", &|a| *a == Answer::From("pod0".into()));
    let before = deleted();
    write(&s.t, None);
    stopped_reaching_pod0("the kept socket to a deleted Service to stop reaching pod0");
    assert!(deleted() > before, "the deleted Service's flow was deleted, and counted");
    assert_eq!(stays_flow(), flow, "the staying Service's flow is still the same conntrack entry");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (_, thread) in kept {
        let _ = thread.join();
    }
}

/// A client whose SYN reaches the node before a Service's rules exist leaves an
/// untranslated `SYN_SENT` conntrack entry there, which lives two minutes and is renewed by
/// every SYN that matches it. Once the Service is programmed, a connection from that same
/// client port (its retransmission, or a later connection that reuses the port, as a busy
/// client's do) is answered: kpx deleted the entry. Without that, every such SYN follows the
/// entry past the new rules and times out.
pub fn tcp_before_the_rules(backend: ProxyBackend) {
    const PORT: u16 = 41_016;
    let warm = "  clusterIP: 10.96.1.15\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let late = "  clusterIP: 10.96.1.16\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let http = [("http", "TCP", 8080)];
    let warm_docs = [service("warm", warm, ""), slice("warm", "warm-1", false, &http, &[ep(pod(0))])];
    let s = Scene::start(backend, 1, &[("warm.yaml", documents(&warm_docs))], &[], &[]);
    // kpx's rules are in place (and with them connection tracking in the node).
    wait_answered_by(&s.t.client, sock("10.96.1.15", 80), &["pod0"]);
    let to = sock("10.96.1.16", 80);
    let early = s.t.client.run_in(move || tcp_request_from_port(PORT, to, Duration::from_secs(1)));
    assert!(matches!(early, Answer::Failed(_)), "before its rules: {early:?}");
    let listed = s.t.node.try_exec("conntrack", &["-L", "-p", "tcp", "--sport", &PORT.to_string()]);
    let entries = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.status.success(), "conntrack -L: {}", String::from_utf8_lossy(&listed.stderr));
    assert!(
        entries
            .lines()
            .any(|l| l.contains("SYN_SENT") && l.contains(&format!("src=10.96.1.16 dst={CLIENT_IP}"))),
        "the early SYN left an untranslated entry: {entries:?}"
    );
    let mut docs = warm_docs.to_vec();
    docs.extend([service("late", late, ""), slice("late", "late-1", false, &http, &[ep(pod(0))])]);
    s.t.write_manifest("warm.yaml", &documents(&docs));
    wait_answered_by(&s.t.client, to, &["pod0"]);
    let programmed = std::time::Instant::now();
    wait_for(&format!("a connection from port {PORT} to {to} to be answered"), DEADLINE, || {
        let answer = s.t.client.run_in(move || tcp_request_from_port(PORT, to, Duration::from_secs(1)));
        (answer == Answer::From("pod0".into())).then_some(())
    });
    println!(
        "{backend:?}: a SYN sent before the rules left {early:?}; the same client port answered {} ms after the Service was",
        programmed.elapsed().as_millis()
    );
}

/// Services of another proxy (`service.kubernetes.io/service-proxy-name`), headless and
/// ExternalName Services are left alone; an agent started with `--service-proxy-name`
/// takes the Services labelled with it, and only those.
pub fn ignored_services(backend: ProxyBackend) {
    let other = "apiVersion: v1\nkind: Service\nmetadata:\n  name: other\n  namespace: test\n  labels: {service.kubernetes.io/service-proxy-name: someone-else}\nspec:\n  clusterIP: 10.96.1.12\n  ports: [{name: http, port: 80}]\n".to_owned();
    let headless = service("headless", "  clusterIP: None\n  ports: [{port: 80}]\n", "");
    let external = service("ext", "  type: ExternalName\n  externalName: example.invalid\n", "");
    let normal = service("normal", "  clusterIP: 10.96.1.13\n  ports: [{name: http, port: 80}]\n", "");
    let labelled = "apiVersion: v1\nkind: Service\nmetadata:\n  name: labelled\n  namespace: test\n  labels: {service.kubernetes.io/headless: ''}\nspec:\n  clusterIP: 10.96.1.14\n  ports: [{name: http, port: 80}]\n".to_owned();
    let http = [("http", "TCP", 8080)];
    // A Service whose EndpointSlice carries the headless label (Kubernetes' e2e "should
    // implement service.kubernetes.io/headless" labels the Service, whose controller copies
    // the label to its slices): kube-proxy never watches that slice.
    let sliced = service("sliced", "  clusterIP: 10.96.1.17\n  ports: [{name: http, port: 80}]\n", "");
    let sliced_slice = slice("sliced", "sliced-1", false, &http, &[ep(pod(0))]).replace(
        "labels: {kubernetes.io/service-name: sliced}",
        "labels: {kubernetes.io/service-name: sliced, service.kubernetes.io/headless: ''}",
    );
    let manifests = [(
        "ignored.yaml",
        documents(&[
            sliced,
            sliced_slice,
            other,
            slice("other", "other-1", false, &http, &[ep(pod(0))]),
            headless,
            slice("headless", "headless-1", false, &http, &[ep(pod(0))]),
            external,
            normal,
            slice("normal", "normal-1", false, &http, &[ep(pod(0))]),
            labelled,
            slice("labelled", "labelled-1", false, &http, &[ep(pod(0))]),
        ]),
    )];
    let mut s = Scene::start(backend, 1, &manifests, &[], &[]);
    wait_answered_by(&s.t.client, sock("10.96.1.13", 80), &["pod0"]);
    // Its Service is programmed, with no endpoint: refused, like any Service without one.
    let sliced = s.t.client.run_in(|| tcp_request(sock("10.96.1.17", 80)));
    assert!(matches!(sliced, Answer::Refused), "a Service whose only slice is labelled headless: {sliced:?}");
    for (vip, what) in
        [("10.96.1.12", "another proxy's Service"), ("10.96.1.14", "a Service labelled headless")]
    {
        assert!(!s.rules_mention(vip), "{what} is not programmed");
        assert!(!matches!(s.t.client.run_in(move || tcp_request(sock(vip, 80))), Answer::From(_)), "{what}");
    }

    // Started as that other proxy (`--service-proxy-name`), the agent takes its labelled
    // Service, and leaves the others alone (also those it had stored before).
    s.dp.kill();
    s.dp = s.t.start_dataplane_with(backend, &["--service-proxy-name=someone-else"]);
    wait_answered_by(&s.t.client, sock("10.96.1.12", 80), &["pod0"]);
    for (vip, what) in
        [("10.96.1.13", "a Service without the label"), ("10.96.1.14", "a Service labelled headless")]
    {
        assert!(!s.rules_mention(vip), "--service-proxy-name: {what} is not programmed");
        let answer = s.t.client.run_in(move || tcp_request(sock(vip, 80)));
        assert!(!matches!(answer, Answer::From(_)), "--service-proxy-name: {what}: {answer:?}");
    }
}

/// Bad input in a Service's fields: an error naming the Service and the field; the rest is
/// served. Addresses of an IP family the Service does not have are not bad input: ignored
/// (and logged) as kube-proxy does, the Service served.
pub fn bad_input(backend: ProxyBackend) {
    let http = [("http", "TCP", 8080)];
    let bad = [
        ("badport", "  type: NodePort\n  clusterIP: 10.96.1.20\n  ports: [{name: http, port: 80, nodePort: 70000}]\n", "spec.ports[0].nodePort"),
        ("badrange", "  type: LoadBalancer\n  clusterIP: 10.96.1.21\n  loadBalancerSourceRanges: [10.0.0.0/33]\n  ports: [{name: http, port: 80}]\n", "spec.loadBalancerSourceRanges[0]"),
    ];
    let mut docs: Vec<String> = bad
        .iter()
        .flat_map(|(name, spec, _)| {
            [service(name, spec, ""), slice(name, &format!("{name}-1"), false, &http, &[ep(pod(0))])]
        })
        .collect();
    docs.push(service("good", "  clusterIP: 10.96.1.23\n  ports: [{name: http, port: 80}]\n", ""));
    docs.push(slice("good", "good-1", false, &http, &[ep(pod(0))]));
    let s = Scene::start(backend, 1, &[("bad.yaml", documents(&docs))], &[], &[]);
    wait_answered_by(&s.t.client, sock("10.96.1.23", 80), &["pod0"]);
    for (name, _, field) in bad {
        let error = s.cp.wait_event(&format!("the error about {name}"), DEADLINE, |e| {
            e["field"] == field && e["object"].as_str().is_some_and(|o| o.contains(&format!("test/{name}")))
        });
        assert!(error["reason"].as_str().is_some_and(|r| !r.is_empty()), "{error}");
    }
    for vip in ["10.96.1.20", "10.96.1.21"] {
        assert!(!s.rules_mention(vip), "{vip}: a Service with a bad field is not programmed");
    }

    // A live Service gets an external IP and a load-balancer IP of the other family (a
    // cloud load balancer adding IPv6 to a single-stack IPv4 Service): those addresses
    // are ignored and logged, as kube-proxy does; the Service goes on being served.
    let mixed = |extra: &str| {
        let spec = format!(
            "  type: LoadBalancer\n  clusterIP: 10.96.1.22\n  externalIPs: [192.0.2.22{extra}]\n  ports: [{{name: http, port: 80}}]\n"
        );
        let status = if extra.is_empty() {
            "  loadBalancer: {ingress: [{ip: 192.0.2.23}]}\n".to_owned()
        } else {
            "  loadBalancer: {ingress: [{ip: 192.0.2.23}, {ip: 'fd00::23'}]}\n".to_owned()
        };
        documents(&[service("mixed", &spec, &status), slice("mixed", "mixed-1", false, &http, &[ep(pod(0))])])
    };
    s.t.write_manifest("mixed.yaml", &mixed(""));
    wait_answered_by(&s.t.client, sock("10.96.1.22", 80), &["pod0"]);
    let prober = Prober::start(
        &s.t.client,
        &[sock("10.96.1.22", 80), sock("192.0.2.22", 80), sock("192.0.2.23", 80)],
        "pod0",
        Duration::from_millis(20),
        Duration::from_secs(60),
    );
    s.t.write_manifest("mixed.yaml", &mixed(", 'fd00::22'"));
    for field in ["spec.externalIPs[1]", "status.loadBalancer.ingress[1].ip"] {
        s.cp.wait_event(&format!("{field} ignored"), DEADLINE, |e| {
            e["field"] == field && e["service"].as_str().is_some_and(|o| o.contains("test/mixed"))
        });
    }
    std::thread::sleep(Duration::from_secs(1));
    let seen = prober.finish();
    assert!(seen.sent > 20, "{seen:?}");
    assert_eq!(seen.failed, 0, "the Service stays served with its own family's addresses: {seen:?}");
    assert!(!s.rules_mention("fd00::22") && !s.rules_mention("fd00::23"), "{}", s.rules());
}

/// How a scenario damages the agent's state directory.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// sled's `conf` overwritten: sled cannot open the database.
    Conf,
    /// Bytes in the middle of sled's log overwritten.
    Log,
    /// The log truncated to nothing.
    Truncated,
    /// The whole state directory gone.
    Removed,
}

impl Damage {
    fn apply(self, state: &std::path::Path) {
        let db = state.join("state.sled");
        match self {
            Damage::Conf => std::fs::write(db.join("conf"), b"not sled's config").expect("damage conf"),
            Damage::Log => {
                let path = db.join("db");
                let mut bytes = std::fs::read(&path).expect("read log");
                let middle = bytes.len() / 2;
                for b in bytes.iter_mut().skip(middle).take(64) {
                    *b = !*b;
                }
                std::fs::write(&path, bytes).expect("damage log");
            }
            Damage::Truncated => {
                std::fs::File::create(db.join("db")).expect("truncate log");
            }
            Damage::Removed => std::fs::remove_dir_all(state).expect("remove state"),
        }
    }

    /// Whether the agent must notice it (bytes flipped in the log may fall where sled
    /// keeps nothing it still needs).
    fn must_be_seen(self) -> bool {
        !matches!(self, Damage::Log)
    }
}

/// A damaged state store (overwritten conf, flipped log bytes, a truncated log, no state
/// directory at all), found at start while the control plane is down: the agent says so
/// and keeps the kernel's rules untouched, then programs the control plane's full state
/// once it is back. Not one request fails throughout.
pub fn damaged_store(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.1.20\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30120}\n";
    let manifests = [(
        "kept.yaml",
        documents(&[
            service("kept", spec, ""),
            slice("kept", "kept-1", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
        ]),
    )];
    let mut s = Scene::start(backend, 2, &manifests, &[], &[]);
    let (vip, node_port) = (sock("10.96.1.20", 80), sock(NODE_IP, 30120));
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    wait_answered_by(&s.t.client, node_port, &["pod0"]);
    let state = s.t.dir.path().join("state");
    let prober = Prober::start(
        &s.t.client,
        &[vip, node_port],
        "pod0",
        Duration::from_millis(20),
        Duration::from_secs(240),
    );
    for damage in [Damage::Conf, Damage::Log, Damage::Truncated, Damage::Removed] {
        s.dp.kill();
        s.cp.kill();
        damage.apply(&state);
        s.dp = s.t.start_dataplane_with(backend, &[]);
        let first = s.dp.wait_event("what it made of its store", DEADLINE, |e| {
            e["message"] == "programmed stored state"
                || e["message"].as_str().is_some_and(|m| m.starts_with("stored state is damaged"))
        });
        let damaged = first["message"] != "programmed stored state";
        assert!(damaged || !damage.must_be_seen(), "{damage:?} went unnoticed: {first}");
        // The control plane is away for a while: the kernel must keep serving.
        std::thread::sleep(Duration::from_secs(1));
        s.cp = s.t.start_control_plane();
        if damaged {
            s.dp.wait_event("the control plane's full state programmed", DEADLINE, |e| {
                e["message"].as_str().is_some_and(|m| m.starts_with("recovered"))
            });
        }
        wait_for("the agent to follow the control plane again", DEADLINE, || {
            s.dp.events()
                .iter()
                .any(|e| e["message"].as_str().is_some_and(|m| m.starts_with("stream open")))
                .then_some(())
        });
        let now = prober.result();
        assert_eq!(now.failed, 0, "after {damage:?}: {now:?}");
        println!(
            "{damage:?}: noticed {damaged}; {} requests so far, none failed ({} slow)",
            now.sent, now.slow
        );
    }
    let seen = prober.finish();
    assert!(seen.sent > 100, "{seen:?}");
    assert_eq!(seen.failed, 0, "{seen:?}");
    // The rules are the control plane's again: a change still arrives.
    s.t.write_manifest(
        "kept.yaml",
        &documents(&[
            service("kept", spec, ""),
            slice("kept", "kept-1", false, &[("http", "TCP", 8080)], &[ep(pod(1))]),
        ]),
    );
    wait_answered_by(&s.t.client, vip, &["pod1"]);
}

/// Full syncs in a loop (`--full-sync-period 50ms`) under a prober that opens a connection
/// to the ClusterIP and the NodePort every 2 ms: a full sync rewrites everything in the
/// kernel, but a connection that begins meanwhile must not notice. Not one request fails.
/// (Replacing nftables' table whole lost 1–2 connections in 400 full syncs here: a packet
/// entering just before the commit runs the old rules against sets the transaction deleted.
/// That is a matter of chance; the kernel handles checked below are not.) A client of a
/// Service with `sessionAffinity: ClientIP` over three endpoints keeps its endpoint
/// through all those full syncs.
pub fn full_syncs_under_traffic(backend: ProxyBackend) {
    let spec = "  type: NodePort\n  clusterIP: 10.96.1.40\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30140}\n";
    let sticky = "  clusterIP: 10.96.1.41\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let manifests = [(
        "synced.yaml",
        documents(&[
            service("synced", spec, ""),
            slice("synced", "synced-1", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
            service("sticky", sticky, ""),
            slice(
                "sticky",
                "sticky-1",
                false,
                &[("http", "TCP", 8080)],
                &[ep(pod(0)), ep(pod(1)), ep(pod(2))],
            ),
        ]),
    )];
    let s = Scene::start(backend, 3, &manifests, &[], &["--full-sync-period", "50ms"]);
    let (vip, node_port, sticky_vip) = (sock("10.96.1.40", 80), sock(NODE_IP, 30140), sock("10.96.1.41", 80));
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    wait_answered_by(&s.t.client, node_port, &["pod0"]);
    let stuck_to = wait_for("the sticky Service to answer", DEADLINE, || {
        match s.t.client.run_in(move || tcp_request(sticky_vip)) {
            Answer::From(name) => Some(name),
            _ => None,
        }
    });
    let full_syncs =
        || s.agent_metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}");
    let before = full_syncs();
    // nftables: the table, its base chains and the endpoint maps stay the same kernel
    // objects throughout (by handle).
    let kept = || (backend == ProxyBackend::Nftables).then(|| s.t.nft_kept_object_handles());
    let kept_before = kept();
    let prober = Prober::start(
        &s.t.client,
        &[vip, node_port],
        "pod0",
        Duration::from_millis(2),
        Duration::from_secs(20),
    );
    let affinity = Prober::start(
        &s.t.client,
        &[sticky_vip],
        &stuck_to,
        Duration::from_millis(10),
        Duration::from_secs(20),
    );
    let seen = prober.wait();
    let kept_affinity = affinity.wait();
    let synced = full_syncs() - before;
    assert_eq!(kept(), kept_before, "a full sync keeps kpx's table, base chains and endpoint maps");
    println!(
        "{} full syncs under traffic: {} requests, {} failed ({} slow)",
        synced, seen.sent, seen.failed, seen.slow
    );
    println!(
        "session affinity through them: {} requests, {} not answered by {stuck_to}",
        kept_affinity.sent, kept_affinity.failed
    );
    // IPVS on the VMs' emulated CPU manages a few dozen in 20 s, fewer on a busy machine.
    let wanted = if crate::harness::traffic::patience() > 1 { 5.0 } else { 10.0 };
    assert!(synced >= wanted, "the agent ran full syncs: {synced}");
    assert!(seen.sent > 1000, "{seen:?}");
    assert_eq!(seen.failed, 0, "{seen:?}");
    assert!(kept_affinity.sent > 100, "{kept_affinity:?}");
    assert_eq!(kept_affinity.failed, 0, "the client keeps its endpoint: {kept_affinity:?}");
}

/// kpx's rules flushed behind its back (`nft flush ruleset`, then `nft flush table`; `iptables -F` of nat and
/// filter, both families): the backend's canary finds it and the agent programs
/// everything again within its check period (10 s), without a `--full-sync-period`;
/// `kpx_rules_repaired_total` counts it, and traffic flows again. Then once more with the
/// control plane killed: the agent repairs from what it holds, needing nobody.
pub fn flushed_behind_its_back(backend: ProxyBackend) {
    let manifests = [(
        "web.yaml",
        documents(&[
            service(
                "web",
                "  clusterIP: 10.96.1.30\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n",
                "",
            ),
            slice("web", "web-1", false, &[("http", "TCP", 8080)], &[ep(pod(0))]),
        ]),
    )];
    let mut s = Scene::start(backend, 1, &manifests, &[], &[]);
    let vip = sock("10.96.1.30", 80);
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    assert_eq!(s.agent_metric("kpx_rules_repaired_total"), 0.0, "nothing repaired while nothing was touched");
    flush_and_wait_for_repair(&s, 1, "control plane up");
    s.cp.kill();
    flush_and_wait_for_repair(&s, 2, "control plane down");
    assert!(s.rules_mention("kpx canary"), "{}", s.rules());
}

/// Flushes kpx's rules and waits until the agent has repaired them (`repairs` in all)
/// and the ClusterIP answers again.
fn flush_and_wait_for_repair(s: &Scene, repairs: u64, while_: &str) {
    let vip = sock("10.96.1.30", 80);
    let logged = || s.dp.events().iter().filter(|e| e["message"] == "rules repaired").count() as u64;
    let flushed = std::time::Instant::now();
    match s.backend {
        // The first time everything goes (the table with it); the second time only the
        // rules, while the table, its sets and their elements stay.
        ProxyBackend::Nftables if repairs == 1 => {
            s.t.node.exec("nft", &["flush", "ruleset"]);
        }
        ProxyBackend::Nftables => {
            s.t.node.exec("nft", &["flush", "table", "inet", "kpx"]);
        }
        ProxyBackend::Iptables | ProxyBackend::IptablesLegacy | ProxyBackend::Ipvs => {
            let flavour = if s.backend == ProxyBackend::IptablesLegacy { "legacy" } else { "nft" };
            for tool in ["iptables", "ip6tables"] {
                for table in ["nat", "filter"] {
                    s.t.node.exec(&format!("{tool}-{flavour}"), &["-t", table, "-F"]);
                }
            }
        }
    }
    if s.backend != ProxyBackend::Ipvs {
        // The flush takes kpx's rules away: an answer now means the canary already found
        // it and the agent repaired it (IPVS's virtual services are not in iptables:
        // they keep answering).
        let answered = matches!(s.t.client.run_in(move || tcp_request(vip)), Answer::From(_));
        assert!(
            !answered || s.agent_metric("kpx_rules_repaired_total") as u64 == repairs,
            "answered while kpx's rules were flushed"
        );
    }
    wait_for("the agent to find its rules flushed and program them again", DEADLINE, || {
        (s.agent_metric("kpx_rules_repaired_total") as u64 == repairs).then_some(())
    });
    let found = flushed.elapsed();
    assert_eq!(logged(), repairs, "each repair is logged: {}", s.dp.log_text());
    wait_answered_by(&s.t.client, vip, &["pod0"]);
    println!(
        "flushed ({while_}): repaired {:.1} s after the flush, traffic again {:.1} s after",
        found.as_secs_f64(),
        flushed.elapsed().as_secs_f64()
    );
}
