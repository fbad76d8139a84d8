use super::*;

fn with_file(text: &str, flags: Flags) -> Result<AgentConfig, ConfigError> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("kube-proxy.yaml");
    std::fs::write(&path, text).expect("write");
    AgentConfig::resolve(Flags { config: Some(path), ..flags })
}

fn cleanup() -> Flags {
    Flags { cleanup: true, ..Flags::default() }
}

fn running() -> Flags {
    Flags {
        node_name: Some("n".into()),
        control_plane: Some("http://127.0.0.1:18000".into()),
        state_dir: Some("/var/lib/kpx".into()),
        ..Flags::default()
    }
}

fn run(config: &AgentConfig) -> &RunConfig {
    match &config.mode {
        Mode::Run(run) => run,
        Mode::Cleanup { .. } | Mode::InitOnly | Mode::Probe { .. } => panic!("not a run"),
    }
}

#[test]
fn the_api_server_needs_its_ca_and_plaintext_needs_insecure() {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "x").expect("ca");
    let with = |url: &str, ca: Option<PathBuf>, insecure: bool| {
        AgentConfig::resolve(Flags { api_server: Some(url.into()), api_server_ca: ca, insecure, ..running() })
    };
    let c = with("https://192.168.1.10:6443", Some(ca.clone()), false).expect("valid");
    let server = run(&c).api.configured.clone().expect("configured");
    assert_eq!((server.server_name.as_str(), server.port), (crate::apiserver::IN_CLUSTER_NAME, 6443));
    let err = with("https://192.168.1.10:6443", None, false).expect_err("no CA").to_string();
    assert!(err.starts_with("--api-server-ca") && err.contains("192.168.1.10"), "{err}");
    let err = with("http://192.168.1.10:8080", None, false).expect_err("plaintext").to_string();
    assert!(err.starts_with("--api-server") && err.contains("--insecure"), "{err}");
    assert!(with("http://192.168.1.10:8080", None, true).is_ok());
    let err = with("ftp://x", None, false).expect_err("scheme").to_string();
    assert!(err.starts_with("--api-server") && err.contains("ftp://x"), "{err}");
    let file =
        "kpx: {controlPlane: 'http://127.0.0.1:18000', stateDir: /s, apiServer: 'http://127.0.0.1:6443'}\n";
    let c = with_file(file, Flags { node_name: Some("n".into()), ..Flags::default() }).expect("file");
    assert_eq!(run(&c).api.configured.as_ref().map(|s| s.url()).as_deref(), Some("http://127.0.0.1:6443"));
}

#[test]
fn the_gates_and_the_empty_mode_follow_the_configured_kubernetes_version() {
    let version = |v: &str| Some(KubernetesVersion::parse(v).expect("version"));
    // kubeadm's file leaves the mode empty: kube-proxy's default of the version.
    let empty = "mode: \"\"\n";
    let kind = |v: Option<KubernetesVersion>| {
        with_file(empty, Flags { kubernetes_version: v, ..running() }).expect("valid").backend.kind()
    };
    assert_eq!(kind(None), BackendKind::Nftables, "kpx's own default");
    assert_eq!(kind(version("1.38")), BackendKind::Iptables);
    assert_eq!(kind(version("1.40")), BackendKind::Nftables);
    // ipvs with the gate off (1.40's default) is refused, naming the field and the gate.
    let ipvs = "mode: ipvs\nkpx: {kubernetesVersion: v1.40.0}\n";
    let err = with_file(ipvs, running()).expect_err("gate off").to_string();
    assert!(err.contains("mode") && err.contains("KubeProxyIPVS") && err.contains("1.40"), "{err}");
    let opted = "mode: ipvs\nfeatureGates: {KubeProxyIPVS: true}\nkpx: {kubernetesVersion: '1.43'}\n";
    assert_eq!(with_file(opted, running()).expect("opt-in").backend.kind(), BackendKind::Ipvs);
    let flag = AgentConfig::resolve(Flags {
        backend: Some(BackendKind::Ipvs),
        kubernetes_version: version("1.41"),
        ..running()
    });
    assert!(flag.expect_err("gate off").to_string().starts_with("--config: --backend"));
    assert!(AgentConfig::resolve(Flags { backend: Some(BackendKind::Ipvs), ..running() }).is_ok());
    // Removing kpx's IPVS rules once the gate is off is not refused.
    let cleanup = AgentConfig::resolve(Flags {
        backend: Some(BackendKind::Ipvs),
        kubernetes_version: version("1.41"),
        cleanup: true,
        ..Flags::default()
    });
    assert!(matches!(cleanup.expect("cleanup").mode, Mode::Cleanup { .. }));
    // externalIPs: programmed by default before 1.40, not from 1.40, unless opted in;
    // the flag wins over the file.
    let ignored = |text: &str, flags: Flags| with_file(text, flags).expect("valid").proxy.ignore_external_ips;
    assert!(!ignored("", running()));
    assert!(ignored("kpx: {kubernetesVersion: '1.40'}\n", running()));
    let file_opt_in = "featureGates: {AllowServiceExternalIPs: true}\nkpx: {kubernetesVersion: '1.40'}\n";
    assert!(!ignored(file_opt_in, running()));
    let flag_off = crate::config::gates::parse_flag("AllowServiceExternalIPs=false").expect("flag");
    assert!(ignored(file_opt_in, Flags { feature_gates: Some(flag_off), ..running() }));
    let err = with_file("kpx: {kubernetesVersion: latest}\n", running()).expect_err("bad").to_string();
    assert!(err.contains("kpx.kubernetesVersion") && err.contains("latest"), "{err}");
    let err = with_file("featureGates: {KubeProxyIPVS: maybe}\n", running()).expect_err("bad").to_string();
    assert!(err.contains("featureGates"), "{err}");
}

#[test]
fn a_probe_asks_the_healthz_address_on_loopback() {
    let text = "healthzBindAddress: 0.0.0.0:10356\n";
    let c = with_file(
        text,
        Flags { probe: Some(ProbeKind::Ready), pod_uid: Some("u1".into()), ..Flags::default() },
    )
    .expect("probe needs no node name or control plane");
    match c.mode {
        Mode::Probe { kind, healthz, pod_uid } => {
            assert_eq!(
                (kind, healthz.to_string(), pod_uid.as_deref()),
                (ProbeKind::Ready, "127.0.0.1:10356".into(), Some("u1"))
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reads_a_kube_proxy_configuration_and_flags_win() {
    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n\
                    hostnameOverride: node-a\nclusterCIDR: 10.244.0.0/16,fd00:10::/56\nnodePortAddresses: [10.0.0.0/24]\n\
                    metricsBindAddress: 127.0.0.1:9100\niptables: {masqueradeAll: true, syncPeriod: 1m30s, minSyncPeriod: 500ms}\n\
                    kpx: {controlPlane: 'http://cp:18000', stateDir: /var/lib/kpx, iptablesMode: legacy, insecure: true}\n";
    let c = with_file(text, Flags::default()).expect("valid");
    assert_eq!(c.backend, BackendConfig::Iptables { mode: IptablesMode::Legacy, localhost_nodeports: false });
    assert_eq!(run(&c).node_name, "node-a");
    assert_eq!(run(&c).control_planes, [ControlPlane::plaintext("http://cp:18000")]);
    assert!(c.proxy.masquerade_all);
    assert_eq!(c.proxy.cluster_cidrs.len(), 2);
    assert_eq!(run(&c).sync.full, Some(Duration::from_secs(90)));
    assert_eq!(run(&c).sync.min, Duration::from_millis(500));
    assert_eq!(run(&c).listen.metrics.port(), 9100);
    let flagged = with_file(
        text,
        Flags { backend: Some(BackendKind::Nftables), node_name: Some("x".into()), ..Flags::default() },
    )
    .expect("valid");
    assert_eq!((flagged.backend.kind(), run(&flagged).node_name.as_str()), (BackendKind::Nftables, "x"));
    assert!(!flagged.proxy.masquerade_all, "the nftables section applies to mode nftables");
}

#[test]
fn kubeadms_default_configuration_is_accepted_unchanged_and_the_ignored_fields_named() {
    let text = include_str!("testdata/kubeadm-kube-proxy.yaml");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("config.conf");
    std::fs::write(&path, text).expect("write");
    let (file, ignored) = file::read(&path).expect("kubeadm's defaults are accepted");
    assert_eq!(file.mode, None, "empty strings are unset");
    for field in
        ["bindAddress", "clientConnection", "configSyncPeriod", "logging", "oomScoreAdj", "winkernel"]
    {
        assert!(ignored.iter().any(|i| i.starts_with(field)), "{field} in {ignored:?}");
    }
    assert!(
        !ignored.iter().any(|i| i.starts_with("iptables.masqueradeAll") || i.starts_with("conntrack")),
        "honoured fields are not ignored: {ignored:?}"
    );
    let c = with_file(text, running()).expect("valid");
    assert_eq!(c.conntrack, ConntrackSettings::default(), "kubeadm's nulls and zeros: kube-proxy's defaults");
    assert_eq!(c.backend.kind(), BackendKind::Nftables);
    assert_eq!(
        run(&c).sync.full,
        AgentConfig::resolve(running()).map(|d| run(&d).sync.full).expect("default")
    );
    assert_eq!(run(&c).listen.healthz.port(), 10256, "an empty address is the default");
    // Unset in mode iptables, NodePorts open on 127.0.0.1 too, as kube-proxy's do.
    let iptables = text.replace("mode: \"\"", "mode: iptables");
    let localhost = |text: &str| match with_file(text, running()).expect("valid").backend {
        BackendConfig::Iptables { localhost_nodeports, .. } => localhost_nodeports,
        other => panic!("{other:?}"),
    };
    assert!(localhost(&iptables), "kube-proxy's iptables default");
    assert!(!localhost(&iptables.replace("localhostNodePorts: null", "localhostNodePorts: false")));
}

#[test]
fn node_port_addresses_take_cidrs_or_primary_and_default_as_kube_proxy() {
    let addresses = |text: &str, flags: Flags| with_file(text, flags).map(|c| c.proxy.nodeport_addresses);
    let nft = |f: Flags| Flags { backend: Some(BackendKind::Nftables), ..f };
    let ipt = |f: Flags| Flags { backend: Some(BackendKind::Iptables), ..f };
    assert_eq!(addresses("{}\n", nft(cleanup())).expect("valid"), NodePortAddresses::Primary);
    assert_eq!(addresses("{}\n", ipt(cleanup())).expect("valid"), NodePortAddresses::All);
    assert_eq!(
        addresses("nodePortAddresses: []\n", nft(cleanup())).expect("valid"),
        NodePortAddresses::Primary
    );
    assert_eq!(
        addresses("nodePortAddresses: [primary]\n", ipt(cleanup())).expect("valid"),
        NodePortAddresses::Primary
    );
    let cidr =
        addresses("{}\n", nft(Flags { nodeport_addresses: Some(vec!["10.0.0.0/8".into()]), ..cleanup() }));
    assert_eq!(cidr.expect("valid"), NodePortAddresses::Cidrs(vec!["10.0.0.0/8".parse().expect("cidr")]));
    let err = addresses("nodePortAddresses: [10.0.0.0/8, primary]\n", ipt(cleanup())).expect_err("mixed");
    assert!(err.to_string().contains("nodePortAddresses[1]"), "{err}");
    let flag = Flags { nodeport_addresses: Some(vec!["primary".into(), "10.0.0.0/8".into()]), ..cleanup() };
    let err = addresses("{}\n", flag).expect_err("mixed");
    assert!(err.to_string().contains("--nodeport-addresses[0]"), "{err}");
}

#[test]
fn localhost_node_ports_only_where_the_node_port_addresses_allow_loopback() {
    let localhost = |text: &str, flags: Flags| match with_file(text, flags).expect("valid").backend {
        BackendConfig::Iptables { localhost_nodeports, .. } => localhost_nodeports,
        other => panic!("{other:?}"),
    };
    let ipt = |f: Flags| Flags { backend: Some(BackendKind::Iptables), ..f };
    assert!(localhost("{}\n", ipt(cleanup())), "on by default");
    assert!(!localhost("iptables: {localhostNodePorts: false}\n", ipt(cleanup())));
    let off = Flags { iptables_localhost_nodeports: Some(false), ..ipt(cleanup()) };
    assert!(!localhost("iptables: {localhostNodePorts: true}\n", off), "the flag wins");
    assert!(!localhost("nodePortAddresses: [10.0.0.0/8]\n", ipt(cleanup())));
    assert!(localhost("nodePortAddresses: [10.0.0.0/8, 127.0.0.0/8]\n", ipt(cleanup())));
    assert!(!localhost("nodePortAddresses: [primary]\n", ipt(cleanup())));
}

#[test]
fn the_service_proxy_name_comes_from_the_flag_or_the_file_and_is_checked() {
    let name = |text: &str, flags: Flags| with_file(text, flags).map(|c| c.proxy.service_proxy_name);
    assert_eq!(name("{}\n", cleanup()).expect("valid"), None);
    assert_eq!(name("kpx: {serviceProxyName: kpx-b}\n", cleanup()).expect("valid").as_deref(), Some("kpx-b"));
    let flag = Flags { service_proxy_name: Some("kpx-c".into()), ..cleanup() };
    assert_eq!(name("kpx: {serviceProxyName: kpx-b}\n", flag).expect("valid").as_deref(), Some("kpx-c"));
    let err = name("kpx: {serviceProxyName: '-b'}\n", cleanup()).expect_err("bad").to_string();
    assert!(err.contains("kpx.serviceProxyName"), "{err}");
}

#[test]
fn detect_local_modes_come_from_the_file_or_the_flags() {
    let mode = |text: &str, flags: Flags| with_file(text, flags).expect("valid").proxy.local_mode;
    assert_eq!(mode("{}\n", cleanup()), LocalMode::ClusterCidr);
    assert_eq!(mode("detectLocalMode: NodeCIDR\n", cleanup()), LocalMode::NodeCidr);
    let text = "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {bridgeInterface: '', interfaceNamePrefix: veth}\n";
    assert_eq!(mode(text, cleanup()), LocalMode::InterfaceNamePrefix("veth".into()));
    let flags = Flags {
        detect_local_mode: Some("BridgeInterface".into()),
        pod_bridge_interface: Some("cbr0".into()),
        ..cleanup()
    };
    assert_eq!(mode(text, flags), LocalMode::BridgeInterface("cbr0".into()), "flags win");
    let flags = Flags { detect_local_mode: Some("BridgeInterface".into()), ..cleanup() };
    let err = with_file("{}\n", flags).expect_err("no bridge").to_string();
    assert!(err.contains("--pod-bridge-interface"), "{err}");
}

#[test]
fn conntrack_settings_are_kube_proxys_flags_over_the_file_over_its_defaults() {
    let text =
        "conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 2h, tcpEstablishedTimeout: 0s, udpTimeout: 30s}\n";
    let c = with_file(text, cleanup()).expect("valid");
    assert_eq!(
        c.conntrack,
        ConntrackSettings {
            max_per_core: 0,
            tcp_established_timeout: None,
            tcp_close_wait_timeout: Some(Duration::from_secs(7200)),
            udp_timeout: Some(Duration::from_secs(30)),
            ..ConntrackSettings::default()
        }
    );
    let flagged = with_file(
        text,
        Flags {
            conntrack_tcp_timeout_close_wait: Some(Duration::from_secs(60)),
            conntrack_tcp_be_liberal: true,
            ..cleanup()
        },
    )
    .expect("valid");
    assert_eq!(flagged.conntrack.tcp_close_wait_timeout, Some(Duration::from_secs(60)));
    assert!(flagged.conntrack.tcp_be_liberal);
    let init = AgentConfig::resolve(Flags { init_only: true, ..Flags::default() }).expect("no more needed");
    assert!(matches!(init.mode, Mode::InitOnly));
}

#[test]
fn unknown_or_bad_fields_are_named() {
    let message = |text: &str| with_file(text, cleanup()).expect_err("refused").to_string();
    let err = message("nftables: {localhostNodePorts: true}\n");
    assert!(err.contains("nftables.localhostNodePorts") && err.contains("only the iptables"), "{err}");
    let err = message("conntrack: {tcpCloseWaitTimeout: 1 hour}\n");
    assert!(err.contains("conntrack.tcpCloseWaitTimeout"), "{err}");
    assert!(message("conntrack: {maxPerCore: -1}\n").contains("conntrack.maxPerCore"));
    assert!(message("nftables: {strictARP: true}\n").contains("nftables.strictARP"));
    assert!(message("ipvs: {tcpTimeout: 15m}\n").contains("ipvs.tcpTimeout"));
    assert!(message("nftables: {masqueradeBit: 14}\n").contains("nftables.masqueradeBit"));
    let err = message("detectLocalMode: InterfaceNamePrefix\n");
    assert!(err.contains("--pod-interface-name-prefix") && err.contains("detectLocalMode"), "{err}");
    assert!(message("detectLocalMode: Pods\n").contains("detectLocalMode"));
    let err = message("detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: 'br 0'}\n");
    assert!(err.contains("detectLocal.bridgeInterface") && err.contains("br 0"), "{err}");
    assert!(message("detectLocal: {bridge: cbr0}\n").contains("unknown field `bridge`"));
    assert!(message("conntrak: {}\nclusterCIDR: 10.0.0.0/8\nfoo: 1\n").contains("unknown field `foo`"));
    let err = message("mode: userspace\n");
    assert!(err.contains("mode") && err.contains("userspace"), "{err}");
    assert!(message("nftables: {syncPeriod: soon}\n").contains("nftables.syncPeriod"));
    assert!(message("nodePortAddresses: [10.0.0.0/33]\n").contains("nodePortAddresses[0]"));
    assert!(message("kind: Deployment\n").contains("kind"));
    let err = with_file("healthzBindAddress: everywhere\n", running()).expect_err("address").to_string();
    assert!(err.contains("healthzBindAddress") && err.contains("everywhere"), "{err}");
    let err = with_file("kpx: {controlPlane: 'not a url'}\n", Flags { control_plane: None, ..running() })
        .expect_err("url")
        .to_string();
    assert!(err.contains("not a URL"), "{err}");
}

#[test]
fn running_needs_a_node_name_a_control_plane_and_a_state_dir() {
    let err = AgentConfig::resolve(Flags::default()).expect_err("missing").to_string();
    for name in ["--node-name", "--control-plane", "--state-dir", "hostnameOverride", "kpx.stateDir"] {
        assert!(err.contains(name), "{err}");
    }
    let flags = Flags { control_plane: Some("not a url".into()), ..running() };
    let err = AgentConfig::resolve(flags).expect_err("url").to_string();
    assert!(err.starts_with("--control-plane \"not a url\": not a URL"), "{err}");
    let replicas =
        Flags { control_plane: Some("http://127.0.0.1:18000, http://[::1]:18010".into()), ..running() };
    let c = AgentConfig::resolve(replicas).expect("two replicas");
    let urls: Vec<&str> = run(&c).control_planes.iter().map(|c| c.url.as_str()).collect();
    assert_eq!(urls, ["http://127.0.0.1:18000", "http://[::1]:18010"]);
    let one_bad = Flags { control_plane: Some("http://127.0.0.1:18000,,".into()), ..running() };
    let err = AgentConfig::resolve(one_bad).expect_err("an empty replica").to_string();
    assert!(err.starts_with("--control-plane \"\""), "{err}");
    let cleaning = AgentConfig::resolve(cleanup()).expect("cleanup needs none of them");
    assert!(
        matches!(&cleaning.mode, Mode::Cleanup { own: true, kube_proxy: false, state_dir } if state_dir.as_path() == std::path::Path::new(DEFAULT_STATE_DIR))
    );
    let both = AgentConfig::resolve(Flags { kube_proxy: true, ..cleanup() }).expect("both");
    assert!(matches!(both.mode, Mode::Cleanup { own: true, kube_proxy: true, .. }));
    let theirs = AgentConfig::resolve(Flags { kube_proxy_only: true, ..cleanup() }).expect("theirs");
    assert!(matches!(theirs.mode, Mode::Cleanup { own: false, kube_proxy: true, .. }));
}

#[test]
fn tls_and_plaintext_rules() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, "pem").expect("write");
        Some(path)
    };
    let remote = |url: &str| Flags { control_plane: Some(url.into()), ..running() };
    let err = AgentConfig::resolve(remote("http://10.0.0.5:18000")).expect_err("plaintext").to_string();
    assert!(err.contains("--control-plane http://10.0.0.5:18000") && err.contains("--insecure"), "{err}");
    AgentConfig::resolve(Flags { insecure: true, ..remote("http://10.0.0.5:18000") })
        .expect("with --insecure");
    AgentConfig::resolve(remote("http://[::1]:18000")).expect("loopback needs nothing");
    AgentConfig::resolve(remote("http://localhost:18000")).expect("loopback needs nothing");
    let err = AgentConfig::resolve(remote("https://cp:18000")).expect_err("no CA").to_string();
    assert!(err.starts_with("--tls-ca"), "{err}");
    let mtls = Flags {
        tls_ca: file("ca.crt"),
        tls_cert: file("tls.crt"),
        tls_key: file("tls.key"),
        ..remote("https://cp:18000")
    };
    let c = AgentConfig::resolve(mtls.clone()).expect("mutual TLS");
    assert!(run(&c).control_planes[0].tls.as_ref().is_some_and(|t| t.identity.is_some()));
    let err = AgentConfig::resolve(Flags { tls_key: None, ..mtls.clone() }).expect_err("half").to_string();
    assert!(err.starts_with("--tls-key"), "{err}");
    let err = AgentConfig::resolve(Flags { tls_ca: Some(dir.path().join("missing.crt")), ..mtls.clone() })
        .expect_err("missing file")
        .to_string();
    assert!(err.contains("missing.crt"), "{err}");
    let err = AgentConfig::resolve(Flags { control_plane: Some("http://cp:18000".into()), ..mtls.clone() })
        .expect_err("scheme")
        .to_string();
    assert!(err.contains("use https://"), "{err}");
    let token = Flags { tls_cert: None, tls_key: None, node_token_file: file("token"), ..mtls };
    let c = AgentConfig::resolve(token).expect("server TLS and a token");
    assert!(run(&c).control_planes[0].token_file.is_some());
    let err = AgentConfig::resolve(Flags {
        admin_listen: Some("0.0.0.0:18001".parse().expect("addr")),
        ..running()
    })
    .expect_err("admin")
    .to_string();
    assert!(err.starts_with("--admin-listen 0.0.0.0:18001") && err.contains("--insecure"), "{err}");
}

#[test]
fn ipvs_scheduler_and_drain_grace() {
    let ipvs = |c: &AgentConfig| match &c.backend {
        BackendConfig::Ipvs { options, .. } => options.clone(),
        other => panic!("not ipvs: {other:?}"),
    };
    let c = with_file("mode: ipvs\nipvs: {scheduler: mh}\nkpx: {ipvsDrainGrace: 30s}\n", cleanup())
        .expect("valid");
    assert_eq!(
        ipvs(&c),
        IpvsOptions { scheduler: "mh".into(), drain_grace: Duration::from_secs(30), strict_arp: false }
    );
    let flags = Flags { ipvs_scheduler: Some("wlc".into()), backend: Some(BackendKind::Ipvs), ..cleanup() };
    assert_eq!(ipvs(&with_file("ipvs: {scheduler: mh}\n", flags).expect("valid")).scheduler, "wlc");
    let defaults =
        AgentConfig::resolve(Flags { backend: Some(BackendKind::Ipvs), ..cleanup() }).expect("defaults");
    assert_eq!(
        ipvs(&defaults),
        IpvsOptions { scheduler: "rr".into(), drain_grace: Duration::from_secs(900), strict_arp: false }
    );
    let message = |text: &str| with_file(text, cleanup()).expect_err("refused").to_string();
    let err = message("ipvs: {scheduler: fastest}\n");
    assert!(err.contains("ipvs.scheduler") && err.contains("fastest"), "{err}");
    assert!(message("nftables: {scheduler: rr}\n").contains("nftables.scheduler"));
    assert!(message("kpx: {ipvsDrainGrace: later}\n").contains("kpx.ipvsDrainGrace"));
    let strict = with_file("mode: ipvs\nipvs: {strictARP: true}\n", cleanup()).expect("valid");
    assert!(ipvs(&strict).strict_arp, "ipvs.strictARP");
    let flag = Flags { ipvs_strict_arp: true, backend: Some(BackendKind::Ipvs), ..cleanup() };
    assert!(ipvs(&AgentConfig::resolve(flag).expect("valid")).strict_arp, "--ipvs-strict-arp");
}
