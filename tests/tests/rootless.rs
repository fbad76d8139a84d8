//! The rootless tier: kpx-controlplane's own run and node agents in this process, over
//! loopback gRPC, the agents programming the in-memory kernel. `cargo test -p kpx-e2e
//! --test rootless` needs no root and takes seconds. It proves the protocol and the
//! pipeline, each test asserting what the kernel holds: a refused change NACKed with the
//! last good state kept and sent again on the resumed stream, a control-plane restart
//! that sends only what changed while it was down, an agent that was down sent only the
//! change and the removal made meanwhile, and an agent restarted from its store
//! (over its kernel: nothing rewritten, nothing resent; over an empty kernel with no
//! control plane: programmed from the store).

use std::net::SocketAddr;

use kpx_e2e::harness::in_process::{write_manifest, InProcessControlPlane, InProcessNode};
use kpx_e2e::harness::topology::service_yaml;
use kpx_e2e::{wait_for, DEADLINE};

const WEB_VIP: &str = "10.96.0.10";
const API_VIP: &str = "10.96.0.11";

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// Service `name` at `vip` (TCP 80 → 8080) over `endpoints`.
fn service(name: &str, vip: &str, endpoints: &[&str]) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
    service_yaml(name, vip, &[("http", "TCP", 80, 8080)], &endpoints)
}

/// The kernel's endpoint element of `vip`:80 to `endpoint`:8080 (the Service's only one).
fn element(vip: &str, endpoint: &str) -> String {
    format!("{vip} . tcp . 80 . 0 : {endpoint} . 8080")
}

/// A manifest folder with `web` over `web` and `api` over 10.244.0.9.
fn manifests(web: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a manifest folder");
    write_manifest(&dir.path().join("web.yaml"), &service("web", WEB_VIP, web));
    write_manifest(&dir.path().join("api.yaml"), &service("api", API_VIP, &["10.244.0.9"]));
    dir
}

fn both(web: &str) -> Vec<String> {
    let mut all = vec![element(WEB_VIP, web), element(API_VIP, "10.244.0.9")];
    all.sort();
    all
}

/// A control plane over `dir` and node n1 started on it, its first sync in the kernel.
fn synced(dir: &tempfile::TempDir) -> (InProcessControlPlane, InProcessNode) {
    let cp = InProcessControlPlane::start(dir.path(), any_port());
    let mut node = InProcessNode::new("n1");
    node.start(&cp.url());
    node.wait_endpoints("the first sync in the kernel", &both("10.244.0.1"));
    (cp, node)
}

#[test]
fn a_refused_change_is_nacked_the_last_good_kept_and_sent_again_on_the_resumed_stream() {
    let dir = manifests(&["10.244.0.1"]);
    let (cp, node) = synced(&dir);
    assert_eq!(cp.metric("kpx_xds_nacks_total"), 0.0);

    // The kernel refuses the next three transactions: each try is NACKed, the node keeps
    // its last good state, resumes with its versions and is sent the change again.
    for _ in 0..3 {
        node.nft.fail_next("Could not process rule: No buffer space available");
    }
    let transactions = node.nft.transactions();
    write_manifest(&dir.path().join("web.yaml"), &service("web", WEB_VIP, &["10.244.0.2"]));
    wait_for("two NACKs at the control plane", DEADLINE, || {
        (cp.metric("kpx_xds_nacks_total") >= 2.0).then_some(())
    });
    assert_eq!(node.endpoints(), both("10.244.0.1"), "the last good state stays in the kernel");
    node.wait_endpoints("the change, once the kernel takes it", &both("10.244.0.2"));
    assert_eq!(cp.metric("kpx_xds_nacks_total"), 3.0, "one NACK per refusal, no more");
    assert!(node.nft.transactions() > transactions, "the change went in as a transaction of its own");
    // Each resumed stream asked with the versions the node held: only web was sent again.
    // The first sync's 2 Services (no Node object: no node config), then web once per try.
    assert_eq!(cp.metric("kpx_xds_resources_sent_total"), 2.0 + 4.0);
}

#[test]
fn a_restarted_control_plane_sends_only_what_changed_while_it_was_down() {
    let dir = manifests(&["10.244.0.1"]);
    let (mut cp, node) = synced(&dir);
    let address = cp.grpc;
    cp.stop();

    write_manifest(&dir.path().join("web.yaml"), &service("web", WEB_VIP, &["10.244.0.2"]));
    assert_eq!(node.endpoints(), both("10.244.0.1"), "the rules stay while it is down");
    let cp = InProcessControlPlane::start(dir.path(), address);
    node.wait_endpoints("the change made while the control plane was down", &both("10.244.0.2"));
    assert_eq!(cp.metric("kpx_xds_resources_sent_total"), 1.0, "only web, which changed, is sent again");
}

#[test]
fn an_agent_restarted_from_its_store_rewrites_nothing_is_sent_nothing_and_needs_no_control_plane() {
    let dir = manifests(&["10.244.0.1"]);
    let (mut cp, mut node) = synced(&dir);
    let sent = cp.metric("kpx_xds_resources_sent_total");

    // Over its kernel: the table is as the store says, so nothing is written.
    node.stop();
    let transactions = node.nft.transactions();
    node.start(&cp.url());
    assert_eq!(node.nft.transactions(), transactions, "nothing rewritten at start");
    assert_eq!(node.endpoints(), both("10.244.0.1"));
    // Resumed with its versions, it is sent nothing: the next change is the only resource
    // sent since the restart.
    write_manifest(&dir.path().join("web.yaml"), &service("web", WEB_VIP, &["10.244.0.2"]));
    node.wait_endpoints("a change after the restart", &both("10.244.0.2"));
    assert_eq!(cp.metric("kpx_xds_resources_sent_total"), sent + 1.0, "only the change was sent");

    // Over an empty kernel (a reboot) with the control plane gone: programmed from the
    // store before any control plane answers.
    node.stop();
    let address = cp.grpc;
    cp.stop();
    node.reboot_kernel();
    node.start(&format!("http://{address}"));
    assert_eq!(node.endpoints(), both("10.244.0.2"), "the stored state, programmed at start");
}

#[test]
fn an_agent_that_was_down_is_sent_what_changed_and_what_was_removed_meanwhile() {
    let dir = manifests(&["10.244.0.1"]);
    let (cp, mut node) = synced(&dir);
    let (sent, removed) =
        (cp.metric("kpx_xds_resources_sent_total"), cp.metric("kpx_xds_removals_sent_total"));

    node.stop();
    write_manifest(&dir.path().join("web.yaml"), &service("web", WEB_VIP, &["10.244.0.2"]));
    std::fs::remove_file(dir.path().join("api.yaml")).expect("remove api");
    wait_for("the control plane to have dropped api", DEADLINE, || {
        (cp.metric("kpx_services") == 1.0).then_some(())
    });
    assert_eq!(node.endpoints(), both("10.244.0.1"), "a stopped agent's kernel is as it left it");

    node.start(&cp.url());
    node.wait_endpoints("the change and the removal", &[element(WEB_VIP, "10.244.0.2")]);
    assert_eq!(cp.metric("kpx_xds_resources_sent_total"), sent + 1.0, "only web is sent again");
    assert_eq!(cp.metric("kpx_xds_removals_sent_total"), removed + 1.0, "and api's removal");
}
