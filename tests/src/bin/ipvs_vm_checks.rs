//! Checks of kpx's IPVS netlink layer against a real IPVS kernel. Runs inside the VM of
//! `tests/vm/run-in-vm.sh` (started by `tests/tests/ipvs.rs`); exits non-zero on the
//! first failed check.
//!
//! A node namespace with a dummy interface holding the virtual address, two pod
//! namespaces with listeners, a client behind the node; virtual services and
//! destinations are programmed with kpx's IPVS netlink layer and proved with real connections.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx_dataplane::exec::ipvs::{
    netlink::open_socket, Destination, Ipvs, ServiceKey, VirtualService, FLAG_PERSISTENT, PROTO_TCP,
};
use kpx_e2e::harness::topology::{sock, Topology};
use kpx_e2e::harness::traffic::{tcp_request, Answer};

const VIP: &str = "10.96.0.10";

fn answers(t: &Topology, n: usize) -> BTreeMap<String, usize> {
    let to = sock(VIP, 80);
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let answer = t.client.run_in(move || tcp_request(to));
        let who = match answer {
            Answer::From(pod) => pod,
            other => format!("{other:?}"),
        };
        *seen.entry(who).or_default() += 1;
    }
    seen
}

fn dest(i: usize, weight: u32) -> Destination {
    let address: IpAddr = Topology::pod_ip(i).parse().expect("ip");
    Destination { address, port: 8080, weight, active: 0, inactive: 0 }
}

fn main() {
    let t = Topology::new(2);
    let _backends = t.start_backends(8080);
    t.node.ip(&["link", "add", "kpx-ipvs0", "type", "dummy"]);
    t.node.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "kpx-ipvs0"]);
    let key = ServiceKey { address: VIP.parse().expect("ip"), protocol: PROTO_TCP, port: 80 };
    let rr = VirtualService { key, scheduler: "rr".into(), flags: 0, timeout: 0 };

    let programmed = t.node.run_in(move || {
        let mut ipvs = open_socket().expect("IPVS in the node namespace");
        ipvs.add_service(&rr).expect("add service");
        ipvs.add_destination(&key, &dest(0, 1)).expect("add destination 0");
        ipvs.add_destination(&key, &dest(1, 1)).expect("add destination 1");
        let services = ipvs.services().expect("list services");
        let destinations = ipvs.destinations(&key).expect("list destinations");
        (services, destinations)
    });
    assert_eq!(programmed.0.len(), 1, "{programmed:?}");
    assert_eq!(programmed.0[0].scheduler, "rr");
    assert_eq!(programmed.0[0].key, key);
    let mut addresses: Vec<String> =
        programmed.1.iter().map(|d| format!("{}:{} w{}", d.address, d.port, d.weight)).collect();
    addresses.sort();
    assert_eq!(
        addresses,
        [format!("{}:8080 w1", Topology::pod_ip(0)), format!("{}:8080 w1", Topology::pod_ip(1))]
    );
    println!("ok: service and destinations listed back as programmed");

    let seen = answers(&t, 10);
    assert_eq!(seen.get("pod0"), Some(&5), "round robin: {seen:?}");
    assert_eq!(seen.get("pod1"), Some(&5), "round robin: {seen:?}");
    println!("ok: round robin over both pods {seen:?}");

    // Drain pod1: weight 0 takes no new connections.
    t.node.run_in(move || {
        let mut ipvs = open_socket().expect("ipvs");
        ipvs.edit_destination(&key, &dest(1, 0)).expect("edit destination");
    });
    let seen = answers(&t, 6);
    assert_eq!(seen.get("pod0"), Some(&6), "drained pod1 gets nothing new: {seen:?}");
    println!("ok: a destination at weight 0 gets no new connections");

    // Persistence and another scheduler, edited in place.
    let sticky = VirtualService { key, scheduler: "wrr".into(), flags: FLAG_PERSISTENT, timeout: 300 };
    let edited = t.node.run_in(move || {
        let mut ipvs = open_socket().expect("ipvs");
        ipvs.edit_destination(&key, &dest(1, 1)).expect("undrain");
        ipvs.edit_service(&sticky).expect("edit service");
        ipvs.services().expect("list")
    });
    assert_eq!(edited[0].scheduler, "wrr");
    assert_eq!((edited[0].flags, edited[0].timeout), (FLAG_PERSISTENT, 300));
    let seen = answers(&t, 8);
    assert_eq!(seen.len(), 1, "persistence keeps one client on one pod: {seen:?}");
    println!("ok: service edited in place (wrr, persistent 300 s): {seen:?}");

    // Remove a destination, then the service; errors name the operation.
    let (after, error) = t.node.run_in(move || {
        let mut ipvs = open_socket().expect("ipvs");
        ipvs.delete_destination(&key, &dest(0, 1)).expect("delete destination");
        let after = ipvs.destinations(&key).expect("list");
        ipvs.delete_service(&key).expect("delete service");
        let error = ipvs.delete_service(&key).expect_err("deleting twice fails").to_string();
        (after, error)
    });
    assert_eq!(after.len(), 1);
    assert!(error.contains("delete service"), "{error}");
    let gone = t.node.run_in(|| open_socket().expect("ipvs").services().expect("list"));
    assert!(gone.is_empty(), "{gone:?}");
    println!("ok: destination and service deleted ({error})");

    kube_proxy_leftovers_go_and_kpxs_stay(
        &t,
        VirtualService { key, scheduler: "rr".into(), flags: 0, timeout: 0 },
    );
}

/// kube-proxy's IPVS mode left behind: `kube-ipvs0` with its address, a virtual service
/// there, a `KUBE-` ipset and the iptables chains matching it. `kpx-dataplane --cleanup
/// --kube-proxy-only` removes all of it, and kpx's own virtual service keeps serving.
fn kube_proxy_leftovers_go_and_kpxs_stay(t: &Topology, ours: VirtualService) {
    const THEIRS: &str = "10.96.0.20";
    t.node.ip(&["link", "add", "kube-ipvs0", "type", "dummy"]);
    t.node.ip(&["addr", "add", &format!("{THEIRS}/32"), "dev", "kube-ipvs0"]);
    t.node.exec("ipset", &["create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    t.node.exec("ipset", &["add", "KUBE-CLUSTER-IP", &format!("{THEIRS},tcp:80")]);
    let rules = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
                 -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                 -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n\
                 -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n";
    let file = std::env::temp_dir().join(format!("kube-proxy-{}.rules", std::process::id()));
    std::fs::write(&file, rules).expect("rules");
    t.node.exec("iptables-nft-restore", &["--noflush", &file.display().to_string()]);
    let _ = std::fs::remove_file(&file);
    let theirs = ServiceKey { address: THEIRS.parse().expect("ip"), protocol: PROTO_TCP, port: 80 };
    let key = ours.key;
    t.node.run_in(move || {
        let mut ipvs = open_socket().expect("ipvs");
        ipvs.add_service(&VirtualService { key: theirs, scheduler: "rr".into(), flags: 0, timeout: 0 })
            .expect("kube-proxy's service");
        ipvs.add_destination(&theirs, &dest(0, 1)).expect("its destination");
        ipvs.add_service(&ours).expect("kpx's service");
        ipvs.add_destination(&ours.key, &dest(0, 1)).expect("destination 0");
        ipvs.add_destination(&ours.key, &dest(1, 1)).expect("destination 1");
    });

    let out = t.node.try_exec(
        &kpx_e2e::harness::process::binary("kpx-dataplane").display().to_string(),
        &["--cleanup", "--kube-proxy-only", "--backend=ipvs"],
    );
    assert!(out.status.success(), "kpx-dataplane --cleanup --kube-proxy-only: {out:?}");
    let left = t.node.run_in(|| open_socket().expect("ipvs").services().expect("list"));
    assert_eq!(left.iter().map(|s| s.key).collect::<Vec<_>>(), [key], "only kpx's virtual service stays");
    assert!(!t.node.try_exec("ip", &["link", "show", "kube-ipvs0"]).status.success(), "kube-ipvs0 is gone");
    assert!(
        !t.node.try_exec("ipset", &["list", "KUBE-CLUSTER-IP"]).status.success(),
        "the KUBE- set is gone"
    );
    let saved = t.node.exec("iptables-nft-save", &["-t", "nat"]);
    assert!(!saved.contains("KUBE-"), "kube-proxy's chains are gone: {saved}");
    let seen = answers(t, 4);
    assert_eq!(seen.values().sum::<usize>(), 4, "kpx's virtual service still serves: {seen:?}");
    println!("ok: kube-proxy's IPVS leftovers removed, kpx's virtual service serving {seen:?}");
}
