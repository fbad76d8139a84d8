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
    open_socket, Destination, Ipvs, ServiceKey, VirtualService, FLAG_PERSISTENT, PROTO_TCP,
};
use kpx_e2e::topology::{sock, Topology};
use kpx_e2e::traffic::{tcp_request, Answer};

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
}
