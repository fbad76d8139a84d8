use super::*;

fn node() -> NodeConfig {
    NodeConfig {
        name: "n1".into(),
        addresses: vec!["10.0.0.1".parse().expect("ip"), "192.168.1.1".parse().expect("ip")],
        pod_cidrs: vec!["10.244.1.0/24".parse().expect("cidr")],
        ..Default::default()
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}

#[test]
fn nodeport_addresses_are_the_node_addresses_inside_the_prefixes() {
    let all = NodeContext::derive(&ProxySettings::default(), Some(&node()));
    assert_eq!(all.nodeport_addresses, all.node_addresses);
    let settings = ProxySettings {
        nodeport_addresses: NodePortAddresses::Cidrs(vec!["10.0.0.0/8".parse().expect("cidr")]),
        ..Default::default()
    };
    let some = NodeContext::derive(&settings, Some(&node()));
    assert_eq!(some.nodeport_addresses, vec!["10.0.0.1".parse::<IpAddr>().expect("ip")]);
    assert_eq!(some.node_addresses.len(), 2, "every node address still counts as the node's");
    assert_eq!(NodeContext::derive(&settings, None), NodeContext::default());
    // The interfaces' addresses too, after the node config's; not for `primary`.
    let on = |settings: &ProxySettings| {
        NodeContext::derive_on(settings, Some(&node()), &[ip("10.0.0.1"), ip("10.0.9.9"), ip("fd00::9")])
            .nodeport_addresses
    };
    assert_eq!(
        on(&ProxySettings::default()),
        [ip("10.0.0.1"), ip("192.168.1.1"), ip("10.0.9.9"), ip("fd00::9")]
    );
    assert_eq!(on(&settings), [ip("10.0.0.1"), ip("10.0.9.9")]);
    let primary = ProxySettings { nodeport_addresses: NodePortAddresses::Primary, ..Default::default() };
    assert_eq!(on(&primary), [ip("10.0.0.1")]);
}

#[test]
fn primary_node_port_addresses_are_the_first_of_each_family() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let mut node = node();
    node.addresses = vec![ip("10.0.0.1"), ip("fd00::1"), ip("10.0.1.1"), ip("fd00::2"), ip("192.0.2.1")];
    let settings = ProxySettings { nodeport_addresses: NodePortAddresses::Primary, ..Default::default() };
    let context = NodeContext::derive(&settings, Some(&node));
    assert_eq!(context.nodeport_addresses, [ip("10.0.0.1"), ip("fd00::1")]);
    node.addresses.retain(IpAddr::is_ipv6);
    assert_eq!(NodeContext::derive(&settings, Some(&node)).nodeport_addresses, [ip("fd00::1")]);
}

#[test]
fn the_agents_cluster_cidr_wins_over_the_node_configs() {
    let from_node = NodeContext::derive(&ProxySettings::default(), Some(&node()));
    assert_eq!(from_node.local.cidrs(), ["10.244.1.0/24".parse::<IpNet>().expect("cidr")]);
    let mut with_cluster = node();
    with_cluster.cluster_cidrs = vec!["10.244.0.0/16".parse().expect("cidr")];
    let cluster = NodeContext::derive(&ProxySettings::default(), Some(&with_cluster));
    assert_eq!(cluster.local.cidrs(), ["10.244.0.0/16".parse::<IpNet>().expect("cidr")]);
    let settings = ProxySettings {
        cluster_cidrs: vec!["10.32.0.1/12".parse().expect("cidr"), "fd00:10::/56".parse().expect("cidr")],
        masquerade_all: true,
        ..Default::default()
    };
    let flag = NodeContext::derive(&settings, Some(&with_cluster));
    assert_eq!(flag.local.of_family(Family::V4), ["10.32.0.0/12".parse::<IpNet>().expect("cidr")]);
    assert!(flag.local.knows(Family::V6) && flag.masquerade_all);
    assert_eq!(flag.local.is_local(&"10.40.0.9".parse().expect("ip")), Some(true));
    assert_eq!(
        flag.local.is_local(&"10.244.0.9".parse().expect("ip")),
        Some(false),
        "the node's CIDRs no longer count"
    );
}

#[test]
fn node_cidr_takes_the_nodes_pod_cidrs_whatever_the_cluster_cidr() {
    let mut node = node();
    node.cluster_cidrs = vec!["10.0.0.0/8".parse().expect("cidr")];
    let settings = ProxySettings {
        cluster_cidrs: vec!["10.32.0.0/12".parse().expect("cidr")],
        local_mode: LocalMode::NodeCidr,
        ..Default::default()
    };
    let context = NodeContext::derive(&settings, Some(&node));
    assert_eq!(context.local.cidrs(), ["10.244.1.0/24".parse::<IpNet>().expect("cidr")]);
    assert!(!context.local.knows(Family::V6));
    assert_eq!(context.local.matcher(Family::V6), None);
}

#[test]
fn an_interface_detector_holds_for_both_families_and_names_are_checked() {
    let settings =
        ProxySettings { local_mode: LocalMode::interface("veth", true).expect("name"), ..Default::default() };
    let context = NodeContext::derive(&settings, None);
    for f in Family::ALL {
        assert_eq!(context.local.matcher(f), Some(LocalMatch::Interface { name: "veth", prefix: true }));
    }
    assert_eq!(context.local.is_local(&"10.244.0.9".parse().expect("ip")), None);
    assert_eq!(context.local.describe(), "iifname veth*");
    for bad in ["", "a\"quote", "sixteen-chars-xx", "sp ace", "star*"] {
        assert_eq!(LocalMode::interface(bad, false), Err(BadInterfaceName(bad.to_owned())), "{bad:?}");
    }
    assert_eq!(LocalMode::interface("cbr0", false), Ok(LocalMode::BridgeInterface("cbr0".into())));
}

#[test]
fn a_cidr_matcher_holds_the_prefixes_of_its_family_only() {
    let d = LocalDetector::new(["fd00:10::/56".parse().expect("c"), "10.32.0.0/12".parse().expect("c")]);
    let v4: Vec<IpNet> = vec!["10.32.0.0/12".parse().expect("c")];
    let v6: Vec<IpNet> = vec!["fd00:10::/56".parse().expect("c")];
    assert_eq!(d.matcher(Family::V4), Some(LocalMatch::Sources(&v4)));
    assert_eq!(d.matcher(Family::V6), Some(LocalMatch::Sources(&v6)));
}
