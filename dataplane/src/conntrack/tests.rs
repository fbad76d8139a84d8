use super::*;
use kpx_proto::types::Endpoint;

fn view(endpoints: &[&str]) -> ServiceView {
    view_on(endpoints, 53)
}

/// The endpoints serve on `target` (the Service's target port).
fn view_on(endpoints: &[&str], target: u16) -> ServiceView {
    let eps =
        endpoints.iter().map(|a| Endpoint::new(a.parse().expect("ip"), target, "", "", false)).collect();
    let mut port = ServicePort::new("dns", Protocol::Udp, 53, eps);
    port.node_port = Some(30053);
    ServiceView::new("c", "ns", "dns", vec!["10.96.0.53".parse().expect("ip")], vec![port])
}

fn at(address: &str, port: u16) -> SocketAddr {
    SocketAddr::new(address.parse().expect("ip"), port)
}

#[test]
fn a_target_port_that_moves_on_the_same_pod_makes_the_old_ports_flows_stale() {
    // kube-proxy compares endpoints by address and port: the pod stays, its port does not.
    assert_eq!(
        stale_flows(Some(&view_on(&["10.0.0.1"], 8080)), Some(&view_on(&["10.0.0.1"], 9090))),
        vec![
            StaleFlows::ToAddress {
                address: "10.96.0.53".parse().expect("ip"),
                port: 53,
                endpoint: at("10.0.0.1", 8080)
            },
            StaleFlows::ToNodePort { port: 30053, endpoint: at("10.0.0.1", 8080) },
        ]
    );
}

#[test]
fn a_removed_endpoint_makes_its_flows_stale_and_a_first_endpoint_clears_the_address() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    assert_eq!(
        stale_flows(Some(&view(&["10.0.0.1", "10.0.0.2"])), Some(&view(&["10.0.0.2"]))),
        vec![
            StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: at("10.0.0.1", 53) },
            StaleFlows::ToNodePort { port: 30053, endpoint: at("10.0.0.1", 53) },
        ]
    );
    assert_eq!(
        stale_flows(Some(&view(&[])), Some(&view(&["10.0.0.2"]))),
        vec![StaleFlows::AllToAddress { address: ip("10.96.0.53"), port: 53 }]
    );
    assert!(stale_flows(Some(&view(&["10.0.0.1"])), Some(&view(&["10.0.0.1", "10.0.0.2"]))).is_empty());
    let flow = StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: at("10.0.0.1", 53) };
    assert_eq!(
        flow.filter().args().join(" "),
        "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.0.0.1 --reply-port-src 53"
    );
    let node_port = StaleFlows::ToNodePort { port: 30053, endpoint: at("fd00::1", 53) };
    assert_eq!(
        node_port.filter().args().join(" "),
        "-D -p udp -f ipv6 --orig-port-dst 30053 --dst-nat fd00::1 --reply-port-src 53"
    );
    assert_eq!(stale_flows(Some(&view(&["10.0.0.1"])), None).len(), 2);
}

#[test]
fn a_flow_to_an_endpoint_still_serving_is_kept_until_it_stops() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let serving = |used: &[&str], still: &[&str]| {
        let mut v = view(used);
        v.ports[0].serving_endpoints = view(still).ports[0].endpoints.clone();
        v
    };
    let before = view(&["10.0.0.1", "10.0.0.2"]);
    // 10.0.0.1 terminates while 10.0.0.2 is ready: no new flow goes to it, old ones stay.
    assert!(stale_flows(Some(&before), Some(&serving(&["10.0.0.2"], &["10.0.0.1"]))).is_empty());
    // It stops serving: now its flows go.
    let gone = stale_flows(Some(&serving(&["10.0.0.2"], &["10.0.0.1"])), Some(&view(&["10.0.0.2"])));
    assert_eq!(
        gone[0],
        StaleFlows::ToAddress { address: ip("10.96.0.53"), port: 53, endpoint: at("10.0.0.1", 53) }
    );
    // A port whose endpoints only served (none used) gaining one in use: a first endpoint.
    let first = stale_flows(Some(&serving(&[], &["10.0.0.1"])), Some(&view(&["10.0.0.1"])));
    assert_eq!(first, vec![StaleFlows::AllToAddress { address: ip("10.96.0.53"), port: 53 }]);
}

fn tcp_view(endpoints: &[&str]) -> ServiceView {
    let mut v = view(endpoints);
    v.ports[0].protocol = Protocol::Tcp;
    v
}

#[test]
fn a_first_tcp_endpoint_deletes_only_the_untranslated_attempts_a_listing_shows() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let first = StaleFlows::Untranslated { address: ip("10.96.0.53"), port: 53 };
    assert_eq!(stale_flows(None, Some(&tcp_view(&["10.0.0.1"]))), vec![first.clone()]);
    assert_eq!(stale_flows(Some(&tcp_view(&[])), Some(&tcp_view(&["10.0.0.1"]))), vec![first.clone()]);
    assert!(stale_flows(Some(&tcp_view(&["10.0.0.1"])), Some(&tcp_view(&["10.0.0.2"]))).is_empty());
    assert!(stale_flows(None, Some(&tcp_view(&[]))).is_empty(), "nothing answers yet");

    let conntrack = crate::exec::fake::FakeConntrack::new();
    delete(&conntrack, std::slice::from_ref(&first));
    assert!(conntrack.take().is_empty(), "no attempt listed: no deletion");
    conntrack.attempt(ip("10.96.0.53"), 53);
    conntrack.attempt(ip("10.96.0.99"), 80);
    delete(&conntrack, std::slice::from_ref(&first));
    assert_eq!(conntrack.take(), [first.filter()]);
    assert_eq!(conntrack.untranslated_tcp(false).expect("list"), [(ip("10.96.0.99"), 80)].into());
}
