//! A node's life around its rules, end to end over real processes and real traffic:
//! the control plane and the agent restarted (from its store, nothing resent), an
//! invalid resource NACKed with the old rules kept, a malformed manifest reported while
//! the rest is served, and `--cleanup` removing only what kpx owns.
//! Run as root (network namespaces); binaries built first (see README).

use kpx_e2e::harness::fake_control_plane::{service_views, FakeControlPlane};
use kpx_e2e::harness::manifests::web_tcp_and_udp;
use kpx_e2e::harness::topology::{sock, Topology, CONTROL_PLANE_ADDR};
use kpx_e2e::harness::traffic::{assert_balanced, tally, tcp_request, Answer};
use kpx_e2e::DEADLINE;

const VIP: &str = "10.96.0.10";

fn web(endpoints: &[usize]) -> String {
    web_tcp_and_udp(VIP, endpoints)
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
