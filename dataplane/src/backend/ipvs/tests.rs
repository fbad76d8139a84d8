//! The IPVS backend over the fake kernel: what it programs in IPVS, the sets, the
//! interface and the chains; draining; reconciling after a restart; failures.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::INTERFACE;
use super::{keys_in_sets, IpvsBackend, IpvsKernel, IpvsOptions};
use crate::backend::fixtures::{changed, node_context, state};
use crate::backend::{Backend, Family, NodeContext};
use crate::exec::fake::FakeKernel;
use crate::exec::ipvs::{Destination, Ipvs, ServiceKey, VirtualService, PROTO_TCP};
use crate::state::NodeState;

fn backend(kernel: &FakeKernel, grace: Duration) -> IpvsBackend {
    let options = IpvsOptions { scheduler: "rr".into(), drain_grace: grace, strict_arp: false };
    let handles = IpvsKernel {
        ipvs: Box::new(kernel.ipvs.clone()),
        ipset: Box::new(kernel.ipset.clone()),
        iptables: Box::new(kernel.iptables.clone()),
        links: Box::new(kernel.links.clone()),
        sysctl: Box::new(kernel.sysctl.clone()),
        conntrack: Arc::new(kernel.conntrack.clone()),
    };
    IpvsBackend::new(options, handles)
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}

fn key(address: &str, port: u16) -> ServiceKey {
    ServiceKey { address: ip(address), protocol: PROTO_TCP, port }
}

/// The virtual services as `address:port/proto -> destination(weight) …`.
fn table(kernel: &FakeKernel) -> Vec<String> {
    kernel
        .ipvs
        .table()
        .iter()
        .map(|(s, ds)| {
            let ds: Vec<String> =
                ds.iter().map(|d| format!("{}:{}({})", d.address, d.port, d.weight)).collect();
            format!("{} -> {}", s.key, ds.join(" "))
        })
        .collect()
}

fn with_node_port(mut s: NodeState) -> NodeState {
    for v in s.services_mut().values_mut() {
        Arc::make_mut(&mut v.value).ports[0].node_port = Some(30080);
    }
    s
}

#[test]
fn a_full_sync_programs_ipvs_the_sets_the_interface_and_the_chains() {
    let kernel = FakeKernel::new();
    let mut b = backend(&kernel, Duration::from_secs(900));
    let desired = with_node_port(state(&[("web", "10.96.0.10", &["10.244.0.1", "10.244.0.2"])]));
    b.full_sync(&desired, &node_context()).expect("full sync");
    assert_eq!(
        table(&kernel),
        [
            "10.0.0.1:30080/tcp -> 10.244.0.1:8080(1) 10.244.0.2:8080(1)",
            "10.96.0.10:80/tcp -> 10.244.0.1:8080(1) 10.244.0.2:8080(1)"
        ]
    );
    assert!(kernel.links.exists(INTERFACE));
    let mut links = kernel.links.clone();
    let bound = crate::exec::links::Links::addresses(&mut links, INTERFACE).expect("addresses");
    assert_eq!(
        bound.into_iter().collect::<Vec<_>>(),
        [ip("10.96.0.10")],
        "NodePorts use the node's own address"
    );
    assert_eq!(kernel.ipset.members("KPX-CLUSTER-IP-4"), ["10.96.0.10,tcp:80"]);
    assert_eq!(kernel.ipset.members("KPX-EXTERNAL-4"), ["10.0.0.1,tcp:30080"]);
    assert_eq!(
        kernel.iptables.rules(Family::V4, "nat", "KPX-IPVS-MASQ-NONLOCAL"),
        ["-s 10.244.0.0/16 -j RETURN", "-j KPX-IPVS-MARK-MASQ"],
        "the node context's pod CIDRs"
    );
    assert_eq!(kernel.iptables.rules(Family::V4, "nat", "PREROUTING").len(), 1, "one hook");
    assert_eq!(kernel.sysctl.get("net.ipv4.vs.conntrack").as_deref(), Some("1"));
    b.full_sync(&desired, &node_context()).expect("again");
    assert_eq!(
        kernel.iptables.rules(Family::V4, "nat", "PREROUTING").len(),
        1,
        "the hook is not added twice"
    );
    assert_eq!(table(&kernel).len(), 2);
}

#[test]
fn a_removed_endpoint_is_drained_and_removed_once_idle() {
    let kernel = FakeKernel::new();
    let mut b = backend(&kernel, Duration::from_secs(900));
    let ctx = NodeContext::default();
    b.full_sync(&state(&[("web", "10.96.0.10", &["10.244.0.1", "10.244.0.2"])]), &ctx).expect("full sync");
    let vip = key("10.96.0.10", 80);
    kernel.ipvs.set_connections(&vip, ip("10.244.0.1"), 8080, 1, 0);
    let after = state(&[("web", "10.96.0.10", &["10.244.0.2", "10.244.0.3"])]);
    b.apply(&after, &ctx, &changed(&["web"])).expect("apply");
    assert_eq!(
        table(&kernel),
        ["10.96.0.10:80/tcp -> 10.244.0.1:8080(0) 10.244.0.2:8080(1) 10.244.0.3:8080(1)"]
    );
    b.housekeeping().expect("housekeeping");
    assert_eq!(table(&kernel)[0].matches("10.244.0.1").count(), 1, "still a connection on it");
    kernel.ipvs.set_connections(&vip, ip("10.244.0.1"), 8080, 0, 0);
    b.housekeeping().expect("housekeeping");
    assert_eq!(table(&kernel), ["10.96.0.10:80/tcp -> 10.244.0.2:8080(1) 10.244.0.3:8080(1)"]);
    assert!(kernel.conntrack.take().is_empty(), "no new entry point, no flows deleted");
    let more = state(&[("web", "10.96.0.10", &["10.244.0.2"]), ("db", "10.96.0.11", &["10.244.0.5"])]);
    b.apply(&more, &ctx, &changed(&["db"])).expect("apply");
    let deleted = kernel.conntrack.take();
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(
        (deleted[0].destination, deleted[0].port, deleted[0].nat_to),
        (Some(ip("10.96.0.11")), 80, None)
    );
}

#[test]
fn a_change_reads_no_destinations_and_an_idle_removed_endpoint_goes_at_the_next_housekeeping() {
    let kernel = FakeKernel::new();
    let mut b = backend(&kernel, Duration::from_secs(900));
    let ctx = NodeContext::default();
    b.full_sync(&state(&[("web", "10.96.0.10", &["10.244.0.1", "10.244.0.2"])]), &ctx).expect("full sync");
    let listed = kernel.ipvs.listings();
    b.apply(&state(&[("web", "10.96.0.10", &["10.244.0.2", "10.244.0.3"])]), &ctx, &changed(&["web"]))
        .expect("apply");
    assert_eq!(kernel.ipvs.listings(), listed, "the table knows what it programmed");
    assert_eq!(
        table(&kernel),
        ["10.96.0.10:80/tcp -> 10.244.0.1:8080(0) 10.244.0.2:8080(1) 10.244.0.3:8080(1)"],
        "drained, not cut: the change does not know it is idle"
    );
    b.apply(&state(&[("web", "10.96.0.10", &["10.244.0.1", "10.244.0.3"])]), &ctx, &changed(&["web"]))
        .expect("back");
    assert_eq!(
        table(&kernel),
        ["10.96.0.10:80/tcp -> 10.244.0.1:8080(1) 10.244.0.2:8080(0) 10.244.0.3:8080(1)"],
        "a draining endpoint wanted again takes traffic again"
    );
    b.housekeeping().expect("housekeeping");
    assert_eq!(table(&kernel), ["10.96.0.10:80/tcp -> 10.244.0.1:8080(1) 10.244.0.3:8080(1)"], "idle: gone");
}

#[test]
fn a_drained_endpoint_is_removed_after_the_grace_even_with_connections() {
    let kernel = FakeKernel::new();
    let mut b = backend(&kernel, Duration::ZERO);
    let ctx = NodeContext::default();
    b.full_sync(&state(&[("web", "10.96.0.10", &["10.244.0.1", "10.244.0.2"])]), &ctx).expect("full sync");
    kernel.ipvs.set_connections(&key("10.96.0.10", 80), ip("10.244.0.1"), 8080, 3, 1);
    b.apply(&state(&[("web", "10.96.0.10", &["10.244.0.2"])]), &ctx, &changed(&["web"])).expect("apply");
    b.housekeeping().expect("housekeeping");
    assert_eq!(table(&kernel), ["10.96.0.10:80/tcp -> 10.244.0.2:8080(1)"]);
}

#[test]
fn a_restarted_agent_removes_what_an_earlier_run_left_and_nothing_foreign() {
    let kernel = FakeKernel::new();
    let ctx = node_context();
    let mut first = backend(&kernel, Duration::from_secs(900));
    first
        .full_sync(&with_node_port(state(&[("old", "10.96.0.20", &["10.244.0.1"])])), &ctx)
        .expect("first run");
    let mut foreign_ipvs = kernel.ipvs.clone();
    let foreign = VirtualService { key: key("192.0.2.1", 443), scheduler: "rr".into(), flags: 0, timeout: 0 };
    foreign_ipvs.add_service(&foreign).expect("someone else's");
    drop(first);
    // A new agent that lost its state directory: it knows nothing of "old".
    let mut second = backend(&kernel, Duration::from_secs(900));
    second.full_sync(&state(&[("web", "10.96.0.10", &["10.244.0.2"])]), &ctx).expect("second run");
    assert_eq!(
        table(&kernel),
        ["10.96.0.10:80/tcp -> 10.244.0.2:8080(1)", "192.0.2.1:443/tcp -> "],
        "the old ClusterIP (on kpx's interface) and NodePort (in kpx's sets) went, the foreign one stayed"
    );
    second.cleanup().expect("cleanup");
    assert_eq!(table(&kernel), ["192.0.2.1:443/tcp -> "]);
    assert!(!kernel.links.exists(INTERFACE));
    assert!(kernel.ipset.members("KPX-CLUSTER-IP-4").is_empty());
    assert!(
        kernel.iptables.chains(Family::V4, "nat").is_empty(),
        "{:?}",
        kernel.iptables.chains(Family::V4, "nat")
    );
    assert!(kernel.iptables.rules(Family::V4, "nat", "PREROUTING").is_empty());
}

#[test]
fn a_refused_change_is_reported_and_the_next_apply_reconciles() {
    let kernel = FakeKernel::new();
    let mut b = backend(&kernel, Duration::from_secs(900));
    let ctx = NodeContext::default();
    b.full_sync(&state(&[("web", "10.96.0.10", &["10.244.0.1"])]), &ctx).expect("full sync");
    kernel.ipvs.fail_next(libc::ENOMEM);
    let next = state(&[("web", "10.96.0.10", &["10.244.0.1"]), ("db", "10.96.0.11", &["10.244.0.5"])]);
    let err = b.apply(&next, &ctx, &changed(&["db"])).expect_err("refused");
    assert!(err.to_string().contains("ipvs refused the update"), "{err}");
    b.apply(&next, &ctx, &changed(&[])).expect("a full sync, since nothing is trusted");
    assert_eq!(table(&kernel).len(), 2, "{:?}", table(&kernel));
    let d = Destination { address: ip("10.244.0.5"), port: 8080, weight: 1, active: 0, inactive: 0 };
    assert!(kernel
        .ipvs
        .table()
        .iter()
        .any(|(s, ds)| s.key == key("10.96.0.11", 80) && ds == std::slice::from_ref(&d)));
}

#[test]
fn earlier_entries_are_read_back_from_the_sets() {
    let saved = "create KPX-EXTERNAL-4 hash:ip,port family inet hashsize 1024 maxelem 1048576\n\
                 add KPX-EXTERNAL-4 10.0.0.1,tcp:30080\nadd KPX-CLUSTER-IP-6 fd00::10,udp:53\n\
                 add KPX-LOOP-BACK-4 10.244.0.5,tcp:8080,10.244.0.5\nadd KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n";
    let keys: Vec<String> = keys_in_sets(saved).iter().map(ToString::to_string).collect();
    assert_eq!(keys, ["10.0.0.1:30080/tcp", "[fd00::10]:53/udp"]);
}
