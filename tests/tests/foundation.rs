//! The foundation, end to end: manifests → kpx-controlplane → delta xDS →
//! kpx-dataplane → nftables in a node namespace → real traffic.
//! Run as root (network namespaces); binaries built first (see README).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kpx_e2e::harness::fake_control_plane::{service_views, FakeControlPlane};
use kpx_e2e::harness::topology::{service_yaml, sock, Topology, CONTROL_PLANE_ADDR};
use kpx_e2e::harness::traffic::{tally, tcp_request, udp_request, Answer};
use kpx_e2e::{wait_for, DEADLINE};

const VIP: &str = "10.96.0.10";

fn pods(ids: &[usize]) -> Vec<String> {
    ids.iter().map(|i| Topology::pod_ip(*i)).collect()
}

fn web(endpoints: &[usize]) -> String {
    service_yaml("web", VIP, &[("http", "TCP", 80, 8080), ("dns", "UDP", 53, 8080)], &pods(endpoints))
}

fn assert_balanced(counts: &BTreeMap<Answer, usize>, backends: &[&str], total: usize) {
    for b in backends {
        let got = counts.get(&Answer::From((*b).to_owned())).copied().unwrap_or(0);
        assert!(got * 100 >= total * 15, "{b} got {got} of {total}: {counts:?}");
    }
    let answered: usize = backends.iter().filter_map(|b| counts.get(&Answer::From((*b).to_owned()))).sum();
    assert_eq!(answered, total, "every request answered by a backend: {counts:?}");
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

#[test]
fn traffic_survives_the_control_plane_and_the_agent_restarts_from_its_store() {
    let t = Topology::new(2);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web(&[0, 1]));
    let mut cp = t.start_control_plane();
    let mut dp = t.start_dataplane();
    t.wait_rules_contain("goto pick-v4-2");

    cp.stop();
    assert_balanced(&tally(&t.client, 40, tcp_request, sock(VIP, 80)), &["pod0", "pod1"], 40);

    // The agent dies and its rules are wiped; it comes back while the control plane is still down.
    dp.kill();
    t.node.exec("nft", &["delete", "table", "inet", "kpx"]);
    assert!(!t.ruleset().contains(VIP), "cleanup removed the rules");
    let dp = t.start_dataplane();
    dp.wait_event("the stored state programmed", DEADLINE, |e| {
        e["message"] == "programmed stored state" && e["services"] == 1
    });
    assert_balanced(&tally(&t.client, 40, tcp_request, sock(VIP, 80)), &["pod0", "pod1"], 40);
}

#[test]
fn a_restarted_control_plane_sends_nothing_to_a_node_that_has_everything() {
    let t = Topology::new(2);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web(&[0, 1]));
    t.write_manifest(
        "node.yaml",
        "kind: Node\nmetadata: {name: node-a}\nspec: {podCIDR: 10.244.0.0/16}\nstatus: {addresses: [{type: InternalIP, address: 10.0.0.1}]}\n",
    );
    let mut cp = t.start_control_plane();
    let dp = t.start_dataplane();
    t.wait_rules_contain("goto pick-v4-2");
    dp.wait_event("the node config applied", DEADLINE, |e| {
        e["message"] == "delta applied" && e["type_url"] == kpx_proto::NODE_CONFIG_TYPE_URL
    });
    cp.stop();
    let applied_before = dp.events().iter().filter(|e| e["message"] == "delta applied").count();

    let cp = t.start_control_plane();
    for type_url in [kpx_proto::SERVICE_VIEW_TYPE_URL, kpx_proto::NODE_CONFIG_TYPE_URL] {
        let synced = cp.wait_event("the resumed subscription synced", DEADLINE, |e| {
            e["message"] == "subscription synced" && e["type_url"] == type_url
        });
        assert_eq!((synced["sent"].as_u64(), synced["removed"].as_u64()), (Some(0), Some(0)), "{synced}");
    }
    let subscribed = cp.wait_event("the node subscribed", DEADLINE, |e| {
        e["message"] == "subscribed" && e["type_url"] == kpx_proto::SERVICE_VIEW_TYPE_URL
    });
    assert_eq!(subscribed["initial_versions"].as_u64(), Some(1), "{subscribed}");
    let applied_after = dp.events().iter().filter(|e| e["message"] == "delta applied").count();
    assert_eq!(applied_before, applied_after, "the node received nothing");
}

fn view(endpoint: &str, port: u32, protocol: i32) -> kpx_proto::pb::ServiceView {
    kpx_proto::pb::ServiceView {
        cluster: "fake".into(),
        namespace: "test".into(),
        name: "web".into(),
        cluster_ips: vec![VIP.into()],
        ports: vec![kpx_proto::pb::ServicePort {
            name: "http".into(),
            protocol,
            port,
            endpoints: vec![kpx_proto::pb::Endpoint {
                address: endpoint.into(),
                port: 8080,
                node_name: "node-a".into(),
                terminating: false,
                cluster: "".into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn an_invalid_resource_is_nacked_with_its_field_and_the_old_rules_keep_working() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    let fake = FakeControlPlane::start(&t.node, CONTROL_PLANE_ADDR.parse().expect("addr"));
    let _dp = t.start_dataplane();
    let tcp = kpx_proto::pb::Protocol::Tcp as i32;
    let url = kpx_proto::SERVICE_VIEW_TYPE_URL;
    assert!(fake.next_request(url).response_nonce.is_empty(), "subscription first");

    fake.send(service_views("1", &[view(&Topology::pod_ip(0), 80, tcp)]));
    let ack = fake.next_request(url);
    assert_eq!((ack.response_nonce.as_str(), ack.error_detail.is_none()), ("1", true), "ACK: {ack:?}");
    assert_eq!(t.client.run_in(|| tcp_request(sock(VIP, 80))), Answer::From("pod0".into()));

    let bad = [
        (view("10.244.1.300", 80, tcp), "ports[0].endpoints[0].address"),
        (view(&Topology::pod_ip(0), 0, tcp), "ports[0].port"),
        (view(&Topology::pod_ip(0), 80, 42), "ports[0].protocol"),
    ];
    for (i, (resource, field)) in bad.into_iter().enumerate() {
        let nonce = format!("bad{i}");
        fake.send(service_views(&nonce, &[resource]));
        let nack = fake.next_request(url);
        assert_eq!(nack.response_nonce, nonce);
        let reason = nack.error_detail.map(|s| s.message).unwrap_or_default();
        assert!(reason.contains(field), "NACK names {field}: {reason:?}");
        assert_eq!(
            t.client.run_in(|| tcp_request(sock(VIP, 80))),
            Answer::From("pod0".into()),
            "old rules kept"
        );
    }
}

#[test]
fn a_malformed_manifest_is_reported_and_the_other_services_are_served() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web(&[0]));
    t.write_manifest(
        "broken.yaml",
        "kind: Service\nmetadata: {name: ok2, namespace: test}\nspec: {clusterIP: 10.96.0.30, ports: [{port: 80}]}\n---\n\
         kind: Service\nmetadata: {name: bad, namespace: test}\nspec: {clusterIP: 10.96.0.31, ports: [{port: 99999}]}\n",
    );
    let cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    let error = cp.wait_event("the bad document reported", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.contains("skipping manifest document"))
    });
    assert!(error["file"].as_str().is_some_and(|f| f.ends_with("broken.yaml")), "{error}");
    assert_eq!(error["document"].as_u64(), Some(1), "{error}");
    assert_eq!(error["field"], "spec.ports[0].port", "{error}");
    t.wait_rules_contain("10.96.0.30 . tcp . 80");
    assert!(!t.ruleset().contains("10.96.0.31"));
    assert_eq!(t.client.run_in(|| tcp_request(sock(VIP, 80))), Answer::From("pod0".into()));
}

#[test]
fn cleanup_removes_only_what_kpx_owns() {
    let t = Topology::new(1);
    t.write_manifest("web.yaml", &web(&[0]));
    let _cp = t.start_control_plane();
    let mut dp = t.start_dataplane();
    t.wait_rules_contain("goto pick-v4-1");
    let state = t.dir.path().join("state");
    let state_dir = format!("--state-dir={}", state.display());
    let kpx_dataplane = kpx_e2e::harness::process::binary("kpx-dataplane").display().to_string();
    // Another backend's rules cleaned up while the agent runs (a half-done switch of
    // backends): the running agent's state is kept.
    let out = t.node.try_exec(&kpx_dataplane, &["--cleanup", "--backend=iptables", &state_dir]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("a running agent holds it"), "{out:?}");
    assert!(state.join("state.sled").exists(), "the running agent's state is kept");
    dp.stop();
    t.node.exec("nft", &["add", "table", "inet", "user"]);
    t.node.exec("nft", &["add", "chain", "inet", "user", "mine", "{ type filter hook input priority 0 ; }"]);
    // The state it kept goes too (the next agent there is a new install), and only that.
    std::fs::write(state.join("mine.txt"), "not kpx's").expect("a file of the user's");
    t.node.exec(&kpx_dataplane, &["--cleanup", &state_dir]);
    let all = t.node.exec("nft", &["list", "ruleset"]);
    assert!(!all.contains("table inet kpx"), "{all}");
    assert!(all.contains("table inet user") && all.contains("chain mine"), "{all}");
    assert!(!state.join("state.sled").exists(), "the stored state is removed");
    assert!(state.join("mine.txt").exists(), "nothing else in the state directory is");
}
