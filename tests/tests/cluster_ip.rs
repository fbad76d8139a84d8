//! ClusterIP in the kernel, end to end: manifests → kpx-controlplane → delta xDS →
//! kpx-dataplane → nftables in a node namespace → real traffic. Balance over TCP and
//! UDP, endpoint changes, a Service without endpoints, ports a ClusterIP does not have,
//! the unallocated addresses of a ServiceCIDR, and invalid forwarded packets.
//! Run as root (network namespaces); binaries built first (see README).

use std::time::{Duration, Instant};

use kpx_e2e::harness::manifests::web_tcp_and_udp;
use kpx_e2e::harness::topology::{service_yaml, sock, Topology};
use kpx_e2e::harness::traffic::{assert_balanced, tally, tcp_request, udp_request, Answer};
use kpx_e2e::{wait_for, DEADLINE};

const VIP: &str = "10.96.0.10";

fn pods(ids: &[usize]) -> Vec<String> {
    ids.iter().map(|i| Topology::pod_ip(*i)).collect()
}

fn web(endpoints: &[usize]) -> String {
    web_tcp_and_udp(VIP, endpoints)
}

/// Waits until `n` requests in a row are all answered by backends in `expected`.
fn wait_traffic_only_to(t: &Topology, expected: &[&str], deadline: Duration) -> Duration {
    let start = Instant::now();
    wait_for(&format!("traffic to go only to {expected:?}"), deadline, || {
        let counts = tally(&t.client, 30, tcp_request, sock(VIP, 80));
        let ok = counts.keys().all(|a| matches!(a, Answer::From(n) if expected.contains(&n.as_str())))
            && expected.iter().all(|e| counts.contains_key(&Answer::From((*e).to_owned())));
        ok.then_some(())
    });
    start.elapsed()
}

#[test]
fn cluster_ip_balances_tcp_and_udp_over_three_endpoints() {
    let t = Topology::new(3);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web(&[0, 1, 2]));
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_rules_contain("goto pick-v4-3");

    let tcp = tally(&t.client, 300, tcp_request, sock(VIP, 80));
    assert_balanced(&tcp, &["pod0", "pod1", "pod2"], 300);
    let udp = tally(&t.client, 300, udp_request, sock(VIP, 53));
    assert_balanced(&udp, &["pod0", "pod1", "pod2"], 300);
}

#[test]
fn endpoint_changes_follow_the_manifests_and_a_deleted_service_leaves_no_rules() {
    let t = Topology::new(3);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web(&[0, 1]));
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_rules_contain("goto pick-v4-2");
    wait_traffic_only_to(&t, &["pod0", "pod1"], DEADLINE);

    t.write_manifest("web.yaml", &web(&[0, 1, 2]));
    let added = wait_traffic_only_to(&t, &["pod0", "pod1", "pod2"], DEADLINE);
    t.write_manifest("web.yaml", &web(&[1, 2]));
    let removed = wait_traffic_only_to(&t, &["pod1", "pod2"], DEADLINE);
    eprintln!("manifest change → traffic follows: endpoint added {added:?}, endpoint removed {removed:?}");
    assert!(
        added < Duration::from_secs(2) && removed < Duration::from_secs(2),
        "added {added:?}, removed {removed:?}"
    );

    t.remove_manifest("web.yaml");
    wait_for("the Service's rules to go", DEADLINE, || (!t.ruleset().contains(VIP)).then_some(()));
    assert!(t.ruleset().contains("table inet kpx"), "the table itself stays");
    let after = tally(&t.client, 5, tcp_request, sock(VIP, 80));
    assert!(
        after.keys().all(|a| !matches!(a, Answer::From(_))),
        "no backend answers a deleted Service: {after:?}"
    );
}

#[test]
fn a_service_without_endpoints_is_rejected_and_hairpin_traffic_works() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest("empty.yaml", &service_yaml("empty", "10.96.0.20", &[("http", "TCP", 80, 8080)], &[]));
    t.write_manifest(
        "self.yaml",
        &service_yaml("self", "10.96.0.21", &[("http", "TCP", 80, 8080)], &pods(&[0])),
    );
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_rules_contain("10.96.0.21 . tcp . 80 . 0");
    t.wait_rules_contain("10.96.0.20 . tcp . 80");

    let started = Instant::now();
    let answer = t.client.run_in(|| tcp_request(sock("10.96.0.20", 80)));
    assert_eq!(answer, Answer::Refused, "no endpoints → connection refused, not a timeout");
    assert!(started.elapsed() < Duration::from_secs(1), "refused at once, took {:?}", started.elapsed());

    // pod0 reaches itself through its own Service.
    let answer = t.pods[0].run_in(|| tcp_request(sock("10.96.0.21", 80)));
    assert_eq!(answer, Answer::From("pod0".into()));
}

/// A connected UDP socket's exchange, which sees the ICMP error a reject sends.
fn connected_udp(to: std::net::SocketAddr) -> Answer {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    sock.connect(to).expect("connect");
    let mut buf = [0u8; 64];
    match sock.send(b"who").and_then(|_| sock.recv(&mut buf)) {
        Ok(n) => Answer::From(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Answer::Refused,
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// A new connection to a ClusterIP on a port or protocol none of its Services has is
/// refused at once (kube-proxy's nftables `cluster-ips-check`), from another machine and
/// from the node itself; the Services' own ports still answer.
#[test]
fn a_cluster_ip_refuses_ports_its_services_do_not_have() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest(
        "web.yaml",
        &service_yaml("web", "10.96.0.30", &[("http", "TCP", 80, 8080)], &pods(&[0])),
    );
    t.write_manifest(
        "dns.yaml",
        &service_yaml("dns", "10.96.0.31", &[("dns", "UDP", 53, 8080)], &pods(&[0])),
    );
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_answered_by("10.96.0.30", 80, "pod0");
    wait_for("the UDP Service to answer", DEADLINE, || {
        (t.client.run_in(|| connected_udp(sock("10.96.0.31", 53))) == Answer::From("pod0".into()))
            .then_some(())
    });
    let refused_at_once = |ns: &kpx_e2e::harness::netns::Netns, what: &str, request: fn() -> Answer| {
        let started = Instant::now();
        let answer = ns.run_in(request);
        assert_eq!(answer, Answer::Refused, "{what}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{what}: refused at once, took {:?}",
            started.elapsed()
        );
    };
    refused_at_once(&t.client, "TCP to a port the Service lacks", || tcp_request(sock("10.96.0.30", 81)));
    refused_at_once(&t.client, "UDP to a TCP-only port", || connected_udp(sock("10.96.0.30", 80)));
    refused_at_once(&t.client, "one Service's IP with another's port", || {
        connected_udp(sock("10.96.0.30", 53))
    });
    refused_at_once(&t.client, "TCP to a UDP-only Service", || tcp_request(sock("10.96.0.31", 53)));
    refused_at_once(&t.node, "from the node itself", || tcp_request(sock("10.96.0.30", 81)));
    assert_eq!(t.client.run_in(|| tcp_request(sock("10.96.0.30", 80))), Answer::From("pod0".into()));
    assert_eq!(t.node.run_in(|| tcp_request(sock("10.96.0.30", 80))), Answer::From("pod0".into()));
}

/// With ServiceCIDR objects known, a new connection to an address inside one that no
/// Service has is dropped (kube-proxy's nftables mode drops it), although here the node
/// routes that address to a pod that answers on it: before the ServiceCIDR, and to an
/// address outside it, the pod answers; a ClusterIP of the range still does.
#[test]
fn unallocated_addresses_of_a_service_cidr_are_dropped() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_node(); // the ranges reach the node with its config
                    // 10.96.77.7 (inside 10.96.0.0/16) and 10.97.77.7 (outside) are pod0's, routed to it.
    for spare in ["10.96.77.7", "10.97.77.7"] {
        t.pods[0].ip(&["addr", "add", &format!("{spare}/32"), "dev", "lo"]);
        t.node.ip(&["route", "add", &format!("{spare}/32"), "via", "10.244.1.2"]);
    }
    t.write_manifest(
        "web.yaml",
        &service_yaml("web", "10.96.0.30", &[("http", "TCP", 80, 8080)], &pods(&[0])),
    );
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_answered_by("10.96.0.30", 80, "pod0");
    let (inside, outside) = (sock("10.96.77.7", 8080), sock("10.97.77.7", 8080));
    assert_eq!(
        t.client.run_in(move || tcp_request(inside)),
        Answer::From("pod0".into()),
        "no ServiceCIDR yet"
    );
    t.write_manifest(
        "cidr.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16, 'fd00:10:96::/112']}\n",
    );
    t.wait_rules_contain("10.96.0.0/16");
    let dropped = t.client.run_in(move || tcp_request(inside));
    assert!(matches!(dropped, Answer::Failed(_)), "dropped, not refused or answered: {dropped:?}");
    assert!(matches!(t.node.run_in(move || tcp_request(inside)), Answer::Failed(_)), "from the node too");
    assert_eq!(
        t.client.run_in(move || tcp_request(outside)),
        Answer::From("pod0".into()),
        "outside the range"
    );
    assert_eq!(t.client.run_in(|| tcp_request(sock("10.96.0.30", 80))), Answer::From("pod0".into()));
    // The ServiceCIDR gone, the address is left alone again.
    t.remove_manifest("cidr.yaml");
    wait_for("the dropped address to answer again", DEADLINE, || {
        (t.client.run_in(move || tcp_request(inside)) == Answer::From("pod0".into())).then_some(())
    });
}

/// A forwarded packet conntrack calls INVALID (SYN and FIN at once, from the client to a
/// pod) is dropped in kpx's forward hook, as kube-proxy drops them: the kernel's counter on
/// that rule counts each one.
#[test]
fn forwarded_packets_conntrack_calls_invalid_are_dropped() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web(&[0]));
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_rules_contain("ct state invalid");
    let dropped = || -> u64 {
        let chain = t.node.exec("nft", &["list", "chain", "inet", "kpx", "filter-forward"]);
        let line =
            chain.lines().find(|l| l.contains("ct state invalid")).unwrap_or_else(|| panic!("{chain}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "packets").unwrap_or_else(|| panic!("{line}"));
        words.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    t.wait_invalid_segments_dropped(0, "the forward hook", dropped);
}
