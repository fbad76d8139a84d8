use super::*;

fn valid() -> pb::ServiceView {
    pb::ServiceView {
        cluster: "default".into(),
        namespace: "ns".into(),
        name: "web".into(),
        cluster_ips: vec!["10.96.0.10".into()],
        ports: vec![pb::ServicePort {
            name: "http".into(),
            protocol: pb::Protocol::Tcp as i32,
            port: 80,
            endpoints: vec![pb::Endpoint {
                address: "10.244.0.5".into(),
                port: 8080,
                node_name: "n1".into(),
                terminating: false,
                cluster: String::new(),
            }],
            node_port: 30080,
            local_endpoints: vec![],
            external_endpoints: vec![],
            endpoint_families: vec!["IPv4".into()],
            serving_endpoints: vec![],
        }],
        external_ips: vec!["192.0.2.10".into()],
        load_balancer_ips: vec!["192.0.2.20".into()],
        load_balancer_source_ranges: vec!["198.51.100.0/24".into()],
        external_traffic_local: true,
        internal_traffic_local: false,
        health_check_node_port: 31000,
        session_affinity_timeout_seconds: 10800,
        ipvs_scheduler: "sh".into(),
        service_proxy_name: String::new(),
    }
}

#[test]
fn round_trips() {
    let view = ServiceView::from_proto(valid()).expect("valid");
    assert_eq!(ServiceView::decode(&view.encode()).expect("decodes"), view);
    assert_eq!(view.resource_name(), "default/ns/web");
}

#[test]
fn names_the_bad_field() {
    let mut bad = valid();
    bad.ports[0].endpoints[0].address = "10.0.0.300".into();
    let err = ServiceView::from_proto(bad).expect_err("bad address");
    assert_eq!(err.field, "ports[0].endpoints[0].address");

    let mut bad = valid();
    bad.ports[0].port = 0;
    assert_eq!(ServiceView::from_proto(bad).expect_err("port 0").field, "ports[0].port");

    let mut bad = valid();
    bad.ports[0].protocol = 9;
    assert_eq!(ServiceView::from_proto(bad).expect_err("protocol").field, "ports[0].protocol");

    let mut bad = valid();
    bad.ports[0].endpoints[0].port = 70000;
    assert_eq!(ServiceView::from_proto(bad).expect_err("port").field, "ports[0].endpoints[0].port");

    let mut bad = valid();
    bad.ports[0].endpoints[0].address = "fd00::1".into();
    assert_eq!(ServiceView::from_proto(bad).expect_err("family").field, "ports[0].endpoints[0].address");

    let mut bad = valid();
    bad.ports[0].node_port = 65536;
    assert_eq!(ServiceView::from_proto(bad).expect_err("node port").field, "ports[0].node_port");

    let mut bad = valid();
    bad.load_balancer_source_ranges.push("10.0.0.0/33".into());
    assert_eq!(ServiceView::from_proto(bad).expect_err("cidr").field, "load_balancer_source_ranges[1]");

    let mut bad = valid();
    bad.external_ips[0] = "2001:db8::1".into();
    assert_eq!(ServiceView::from_proto(bad).expect_err("family").field, "external_ips[0]");

    let mut bad = valid();
    bad.ports[0].endpoint_families = vec!["IPv5".into()];
    let err = ServiceView::from_proto(bad).expect_err("family name");
    assert_eq!(err.field, "ports[0].endpoint_families[0]");

    let mut bad = valid();
    bad.ports[0].endpoint_families = vec!["IPv4".into(), "IPv4".into()];
    assert_eq!(ServiceView::from_proto(bad).expect_err("twice").field, "ports[0].endpoint_families[1]");

    let mut bad = valid();
    bad.ports[0].external_endpoints = bad.ports[0].endpoints.clone();
    bad.ports[0].external_endpoints[0].address = "fd00::1".into();
    let err = ServiceView::from_proto(bad).expect_err("external family");
    assert_eq!(err.field, "ports[0].external_endpoints[0].address");

    let mut bad = valid();
    bad.ipvs_scheduler = "fastest".into();
    assert_eq!(ServiceView::from_proto(bad).expect_err("scheduler").field, "ipvs_scheduler");

    let mut bad = valid();
    bad.session_affinity_timeout_seconds = 86401;
    assert_eq!(ServiceView::from_proto(bad).expect_err("timeout").field, "session_affinity_timeout_seconds");

    let mut bad = valid();
    bad.cluster_ips.push("10.96.0.11".into());
    assert_eq!(ServiceView::from_proto(bad).expect_err("two v4").field, "cluster_ips");
}

#[test]
fn names_that_could_inject_syntax_are_refused() {
    for evil in ["web\"; drop", "a\nb", "x } flush ruleset", "a;b", "quo\"te", "sp ace", &"n".repeat(300)] {
        let mut bad = valid();
        bad.name = evil.to_owned();
        assert_eq!(ServiceView::from_proto(bad).expect_err(evil).field, "name", "{evil:?}");
        let mut bad = valid();
        bad.ports[0].name = evil.to_owned();
        assert_eq!(ServiceView::from_proto(bad).expect_err(evil).field, "ports[0].name", "{evil:?}");
        let mut bad = valid();
        bad.ports[0].endpoints[0].node_name = evil.to_owned();
        assert_eq!(
            ServiceView::from_proto(bad).expect_err(evil).field,
            "ports[0].endpoints[0].node_name",
            "{evil:?}"
        );
        let node = pb::NodeConfig { name: evil.to_owned(), ..Default::default() };
        assert_eq!(NodeConfig::from_proto(node).expect_err(evil).field, "name", "{evil:?}");
    }
    let err = ServiceView::from_proto(pb::ServiceView { name: "a b".into(), ..valid() }).expect_err("space");
    assert_eq!(err.to_string(), "name: ' ' is not allowed (letters, digits, '-', '.' and '_' only)");
    let mut fine = valid();
    fine.ports[0].name = String::new();
    fine.name = "web-1.v2_x".into();
    ServiceView::from_proto(fine).expect("valid");
}

mod properties {
    //! For any input: a clear error naming a field, or a value that encodes back to itself.

    use super::*;
    use proptest::prelude::*;

    /// Strings that are sometimes valid and often not: names, addresses, CIDRs and junk.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9.-]{1,20}",
            "10\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
            "fd00::[0-9a-f]{1,4}",
            "10\\.[0-9]{1,3}\\.0\\.0/[0-9]{1,2}",
            ".{0,12}",
            Just(String::new()),
            Just("a;b }\n\"x".to_owned()),
        ]
    }

    fn endpoint() -> impl Strategy<Value = pb::Endpoint> {
        (text(), 0u32..70000, text(), any::<bool>(), text()).prop_map(
            |(address, port, node_name, terminating, cluster)| pb::Endpoint {
                address,
                port,
                node_name,
                terminating,
                cluster,
            },
        )
    }

    fn port() -> impl Strategy<Value = pb::ServicePort> {
        (
            text(),
            0i32..5,
            0u32..70000,
            prop::collection::vec(endpoint(), 0..4),
            0u32..70000,
            prop::collection::vec(endpoint(), 0..2),
            (prop::collection::vec(endpoint(), 0..2), prop::collection::vec(text(), 0..3)),
        )
            .prop_map(
                |(
                    name,
                    protocol,
                    port,
                    endpoints,
                    node_port,
                    local_endpoints,
                    (external_endpoints, families),
                )| {
                    pb::ServicePort {
                        name,
                        protocol,
                        port,
                        endpoints,
                        node_port,
                        local_endpoints,
                        serving_endpoints: external_endpoints.clone(),
                        external_endpoints,
                        endpoint_families: families,
                    }
                },
            )
    }

    fn view() -> impl Strategy<Value = pb::ServiceView> {
        (
            (
                text(),
                text(),
                text(),
                prop::collection::vec(text(), 0..3),
                prop::collection::vec(port(), 0..3),
            ),
            (
                prop::collection::vec(text(), 0..2),
                prop::collection::vec(text(), 0..2),
                prop::collection::vec(text(), 0..2),
            ),
            (
                any::<bool>(),
                any::<bool>(),
                0u32..70000,
                0u32..90000,
                prop_oneof![Just(String::new()), Just("rr".to_owned()), text()],
                prop_oneof![Just(String::new()), Just("kpx-b".to_owned()), text()],
            ),
        )
            .prop_map(
                |(
                    (cluster, namespace, name, cluster_ips, ports),
                    (external_ips, load_balancer_ips, ranges),
                    (etl, itl, hc, sa, sched, proxy),
                )| {
                    pb::ServiceView {
                        cluster,
                        namespace,
                        name,
                        cluster_ips,
                        ports,
                        external_ips,
                        load_balancer_ips,
                        load_balancer_source_ranges: ranges,
                        external_traffic_local: etl,
                        internal_traffic_local: itl,
                        health_check_node_port: hc,
                        session_affinity_timeout_seconds: sa,
                        ipvs_scheduler: sched,
                        service_proxy_name: proxy,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_bytes_decode_or_say_why(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            match ServiceView::decode(&bytes) {
                Ok(view) => prop_assert_eq!(ServiceView::decode(&view.encode()).expect("re-decodes"), view),
                Err(e) => prop_assert!(!e.field.is_empty() && !e.reason.is_empty()),
            }
            match NodeConfig::decode(&bytes) {
                Ok(config) => prop_assert_eq!(NodeConfig::decode(&config.encode()).expect("re-decodes"), config),
                Err(e) => prop_assert!(!e.field.is_empty() && !e.reason.is_empty()),
            }
        }

        #[test]
        fn any_view_is_valid_and_round_trips_or_names_its_field(msg in view()) {
            match ServiceView::from_proto(msg) {
                Ok(v) => {
                    prop_assert_eq!(ServiceView::decode(&v.encode()).expect("re-decodes"), v.clone());
                    for name in [&v.cluster, &v.namespace, &v.name] {
                        prop_assert!(!name.is_empty() && name.len() <= MAX_NAME);
                        prop_assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)));
                    }
                }
                Err(e) => {
                    let top = e.field.split(['[', '.']).next().unwrap_or_default().to_owned();
                    let known = ["cluster", "namespace", "name", "cluster_ips", "ports", "external_ips",
                        "load_balancer_ips", "load_balancer_source_ranges", "health_check_node_port",
                        "session_affinity_timeout_seconds", "ipvs_scheduler", "service_proxy_name"];
                    prop_assert!(known.contains(&top.as_str()), "unknown field in {}", e);
                    prop_assert!(!e.reason.is_empty());
                }
            }
        }
    }
}

mod valid_properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_valid_view_passes_and_round_trips(view in crate::testing::valid_view()) {
            let decoded = ServiceView::decode(&view.encode());
            prop_assert_eq!(decoded, Ok(view));
        }

        #[test]
        fn every_valid_node_config_round_trips(config in crate::testing::node_config()) {
            prop_assert_eq!(NodeConfig::decode(&config.encode()), Ok(config));
        }
    }
}
