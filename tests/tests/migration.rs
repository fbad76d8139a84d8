//! Migrating a node from kube-proxy to kpx and back, under traffic that must not notice:
//! kube-proxy's rules in its own layout serve a ClusterIP; kpx starts beside them;
//! `kpx-dataplane --cleanup --kube-proxy-only` removes kube-proxy's (and only kube-proxy's:
//! kubelet's chains and kpx's rules stay); then back: kube-proxy's rules return, kpx stops
//! and `kpx-dataplane --cleanup` removes kpx's. A per-request HTTP client runs throughout
//! and every request must be answered.

use std::time::Duration;

use kpx_e2e::harness::http_traffic::{Client, HttpPod, Load};
use kpx_e2e::harness::kube_apiserver::{self, KubeApiServer, KubeProxy};
use kpx_e2e::harness::manifests::{documents, ep, service, slice};
use kpx_e2e::harness::netns::Netns;
use kpx_e2e::harness::process::binary;
use kpx_e2e::harness::topology::{node_yaml, sock, ProxyBackend, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::http_get_path;
use kpx_e2e::{wait_for, DEADLINE};

const VIP: &str = "10.96.3.30";
const PORT: u16 = 8080;

/// How kube-proxy wrote a ClusterIP in the mode the node ran.
#[derive(Debug, Clone, Copy)]
enum KubeProxyMode {
    /// iptables mode (iptables-nft): KUBE-SERVICES → KUBE-SVC- → KUBE-SEP- chains.
    Iptables,
    /// nftables mode: the table `ip kube-proxy`.
    Nftables,
}

/// kube-proxy's rules for VIP:80 → the two pods, in its layout, plus kubelet's own chain.
fn install_kube_proxy(node: &Netns, mode: KubeProxyMode) {
    let (pod0, pod1) = (Topology::pod_ip(0), Topology::pod_ip(1));
    let restore = |input: String| {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), input).expect("rules");
        node.exec("iptables-nft-restore", &["--noflush", &file.path().display().to_string()]);
    };
    // kubelet's chain, which a migration must leave alone.
    restore(
        "*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n\
         -A KUBE-FIREWALL -m comment --comment \"kubelet firewall\" -j RETURN\nCOMMIT\n"
            .into(),
    );
    match mode {
        KubeProxyMode::Iptables => restore(format!(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
             :KUBE-SVC-MIGRATEWEB - [0:0]\n:KUBE-SEP-MIGRATEPOD0 - [0:0]\n:KUBE-SEP-MIGRATEPOD1 - [0:0]\n\
             -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
             -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
             -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
             -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
             -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n\
             -A KUBE-SERVICES -d {VIP}/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-MIGRATEWEB\n\
             -A KUBE-SVC-MIGRATEWEB -m statistic --mode random --probability 0.5 -j KUBE-SEP-MIGRATEPOD0\n\
             -A KUBE-SVC-MIGRATEWEB -j KUBE-SEP-MIGRATEPOD1\n\
             -A KUBE-SEP-MIGRATEPOD0 -p tcp -m tcp -j DNAT --to-destination {pod0}:{PORT}\n\
             -A KUBE-SEP-MIGRATEPOD1 -p tcp -m tcp -j DNAT --to-destination {pod1}:{PORT}\n\
             COMMIT\n\
             *filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n\
             -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
             COMMIT\n"
        )),
        KubeProxyMode::Nftables => {
            let script = format!(
                "table ip kube-proxy {{\n\
                 chain endpoint-0 {{\n meta l4proto tcp dnat to {pod0}:{PORT}\n }}\n\
                 chain endpoint-1 {{\n meta l4proto tcp dnat to {pod1}:{PORT}\n }}\n\
                 chain service-web {{\n numgen random mod 2 vmap {{ 0 : goto endpoint-0, 1 : goto endpoint-1 }}\n }}\n\
                 map service-ips {{\n type ipv4_addr . inet_proto . inet_service : verdict\n elements = {{ {VIP} . tcp . 80 : goto service-web }}\n }}\n\
                 chain services {{\n ip daddr . meta l4proto . th dport vmap @service-ips\n }}\n\
                 chain nat-prerouting {{\n type nat hook prerouting priority -100; policy accept;\n jump services\n }}\n\
                 chain nat-output {{\n type nat hook output priority -100; policy accept;\n jump services\n }}\n\
                 }}\n"
            );
            let file = tempfile::NamedTempFile::new().expect("temp file");
            std::fs::write(file.path(), script).expect("rules");
            node.exec("nft", &["-f", &file.path().display().to_string()]);
        }
    }
}

/// Whether kube-proxy's rules are in the node's kernel (checked with the tools' exit status).
fn kube_proxy_present(node: &Netns) -> bool {
    let iptables = node.exec("iptables-nft-save", &[]);
    let tables = node.exec("nft", &["list", "tables"]);
    iptables.contains("KUBE-SVC-") || iptables.contains("KUBE-SERVICES") || tables.contains("kube-proxy")
}

/// A per-request HTTP load from the client to `vip`, one request a millisecond at most.
fn load_to(t: &Topology, vip: std::net::SocketAddr) -> Load {
    Load::start(&t.client, Client::HttpPerRequest, vip, Duration::from_millis(1), Duration::from_secs(600))
}

/// Waits until `load` has had at least `at_least` requests answered.
fn wait_answered(load: &Load, at_least: usize) {
    wait_for("requests answered", DEADLINE, || {
        (load.result().answered_by.values().sum::<usize>() >= at_least).then_some(())
    });
}

/// `kpx-dataplane ARGS` in the node's namespace; it must succeed.
fn kpx_dataplane(node: &Netns, args: &[&str]) {
    let out = node.try_exec(&binary("kpx-dataplane").display().to_string(), args);
    assert!(out.status.success(), "kpx-dataplane {}: {out:?}", args.join(" "));
}

fn migrate_and_back(mode: KubeProxyMode) {
    let t = Topology::new(2);
    t.write_node();
    let _pods: Vec<HttpPod> = (0..2).map(|i| HttpPod::start(&t.pods[i], &format!("pod{i}"), PORT)).collect();
    install_kube_proxy(&t.node, mode);
    let vip = sock(VIP, 80);
    let load = load_to(&t, vip);
    let answered = |at_least: usize| wait_answered(&load, at_least);
    answered(50);
    let by_kube_proxy = load.sent();

    // kpx beside kube-proxy, then kube-proxy's rules removed.
    let spec = format!("  clusterIP: {VIP}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n");
    let eps = [ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1))];
    t.write_manifest(
        "web.yaml",
        &documents(&[
            service("web", &spec, ""),
            slice("web", "web-1", false, &[("http", "TCP", PORT)], &eps),
        ]),
    );
    let cp = t.start_control_plane();
    let mut dp = t.start_dataplane();
    t.wait_rules_contain(VIP);
    answered(load.sent() + 50);
    kpx_dataplane(&t.node, &["--cleanup", "--kube-proxy-only", "--log-format=json"]);
    assert!(
        !kube_proxy_present(&t.node),
        "kube-proxy's rules are gone:\n{}",
        t.node.exec("iptables-nft-save", &[])
    );
    let iptables = t.node.exec("iptables-nft-save", &[]);
    assert!(
        iptables.contains("-A INPUT -j KUBE-FIREWALL") && iptables.contains("kubelet firewall"),
        "kubelet's chain stays: {iptables}"
    );
    assert!(t.ruleset().contains(VIP), "kpx's rules stay");
    let sent = load.sent();
    answered(sent + 200);
    let by_kpx = load.sent() - sent;

    // And back: kube-proxy's rules return, kpx stops (its rules stay) and is cleaned up.
    install_kube_proxy(&t.node, mode);
    dp.stop();
    answered(load.sent() + 50);
    let state = format!("--state-dir={}", t.dir.path().join("state").display());
    kpx_dataplane(&t.node, &["--cleanup", &state, "--log-format=json"]);
    assert!(!t.ruleset().contains("table inet kpx"), "kpx's rules are gone: {}", t.ruleset());
    assert!(kube_proxy_present(&t.node), "kube-proxy's stay");
    let sent = load.sent();
    answered(sent + 200);
    let result = load.finish();
    println!(
        "{mode:?}: {} requests ({by_kube_proxy} through kube-proxy's rules first, {by_kpx} through kpx's alone), {} failed, answered by {:?}",
        result.sent, result.failed, result.answered_by
    );
    assert_eq!(result.failed, 0, "{:?}", result.failures);
    drop(cp);
}

#[test]
fn from_kube_proxy_iptables_mode_and_back_without_a_failed_request() {
    migrate_and_back(KubeProxyMode::Iptables);
}

#[test]
fn from_kube_proxy_nftables_mode_and_back_without_a_failed_request() {
    migrate_and_back(KubeProxyMode::Nftables);
}

/// A real kube-proxy v1.36 process (nftables mode, `../shared/k8s/bin`) serves the Service
/// from a real API server, as the ServiceAccount kube-proxy with the API server's own
/// `system:node-proxier` role; kpx is installed beside it with the chart's ports while it
/// runs, then kube-proxy is stopped and its rules removed, and the agent moves to
/// kube-proxy's ports (the migration's last step), where it answers as kube-proxy did:
/// `/healthz` on 10256, `/proxyMode` and `/healthz` on 10249; then back. Every request of
/// the load must be answered.
#[test]
fn beside_a_running_kube_proxy_process_and_back_without_a_failed_request() {
    let test = "beside_a_running_kube_proxy_process";
    let Some(kube_proxy) = kube_apiserver::kube_proxy(test) else { return };
    let t = Topology::new(2);
    let _pods: Vec<HttpPod> = (0..2).map(|i| HttpPod::start(&t.pods[i], &format!("pod{i}"), PORT)).collect();
    let Some(api) = KubeApiServer::start(&t.node, 16443, test) else { return };
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    let spec = format!("  clusterIP: {VIP}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n");
    let eps = [ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1))];
    api.apply_yaml(&documents(&[
        service("web", &spec, ""),
        slice("web", "web-1", false, &[("http", "TCP", PORT)], &eps),
    ]));
    let kube_proxy_of_node = KubeProxy::new(&api, &kube_proxy, &t);
    let start_kube_proxy = || kube_proxy_of_node.start(&t.node);
    let mut kp = start_kube_proxy();
    let vip = sock(VIP, 80);
    wait_for("kube-proxy's rules", DEADLINE, || {
        t.node.exec("nft", &["list", "tables"]).contains("kube-proxy").then_some(())
    });
    let load = load_to(&t, vip);
    let answered = |at_least: usize| wait_answered(&load, at_least);
    answered(50);
    // What kube-proxy answers on its ports: a load balancer's node check, and its mode.
    let get = |port: u16, path: &'static str| {
        t.node.run_in(move || http_get_path(sock("127.0.0.1", port), path)).ok()
    };
    let kube_proxys = wait_for("kube-proxy's healthz to say it is healthy", DEADLINE, || {
        get(10256, "/healthz").filter(|(code, _)| *code == 200)
    });
    let kube_proxys_mode = get(10249, "/proxyMode").expect("kube-proxy's /proxyMode");
    let kube_proxys_metrics_healthz = get(10249, "/healthz").expect("kube-proxy's metrics /healthz");
    assert_eq!(kube_proxys_mode, (200, "nftables".to_owned()));
    // kube-proxy's ports are taken: the agent runs beside it on the chart's.
    api.apply_yaml(&kpx_e2e::harness::install::rbac());
    let kubeconfig = t.dir.path().join("kpx.kubeconfig");
    api.write_kubeconfig(&kubeconfig, &api.create_token("kube-system", "kpx-controlplane", &[]));
    let cp = t.start_control_plane_from(&[format!("kubeconfig:{}", kubeconfig.display())], &[]);
    let beside = ["--healthz-listen=0.0.0.0:10356", "--metrics-listen=127.0.0.1:10349"];
    let mut dp = t.start_dataplane_with(ProxyBackend::Nftables, &beside);
    t.wait_rules_contain(VIP);
    wait_for("the agent's own healthz on 10356", DEADLINE, || {
        get(10356, "/healthz").filter(|(code, _)| *code == 200)
    });
    answered(load.sent() + 50);

    // kube-proxy goes (its DaemonSet deleted), its rules stay until kpx removes them.
    let status = kp.terminate();
    println!("kube-proxy ended: {status:?}");
    kpx_dataplane(&t.node, &["--cleanup", "--kube-proxy-only", "--log-format=json"]);
    assert!(
        !kube_proxy_present(&t.node),
        "kube-proxy's rules are gone: {}",
        t.node.exec("nft", &["list", "tables"])
    );
    let sent = load.sent();
    answered(sent + 200);
    let by_kpx = load.sent() - sent;

    // The last step: the agent moves to kube-proxy's ports (helm upgrade, kube-proxy gone)
    // and answers there as kube-proxy did.
    dp.stop();
    let mut dp = t.start_dataplane_with(ProxyBackend::Nftables, &[]);
    let kpxs = wait_for("the agent's healthz on 10256", DEADLINE, || {
        get(10256, "/healthz").filter(|(code, _)| *code == 200)
    });
    println!("kube-proxy's /healthz: {}\nkpx's /healthz: {}", kube_proxys.1, kpxs.1);
    // The same fields, to the families' own: a load balancer or a tool reading either
    // finds what it looks for.
    let shape = |body: &str| -> Vec<String> {
        let value: serde_json::Value = serde_json::from_str(body).expect("JSON");
        let mut keys = Vec::new();
        for (key, inner) in value.as_object().expect("an object") {
            keys.push(key.clone());
            for (family, fields) in inner.as_object().into_iter().flatten() {
                let fields =
                    fields.as_object().map(|f| f.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
                keys.push(format!("{key}.{family}: {}", fields.join(",")));
            }
        }
        keys.sort();
        keys
    };
    assert_eq!(shape(&kpxs.1), shape(&kube_proxys.1), "kpx's /healthz answers as kube-proxy's did");
    assert_eq!(get(10249, "/proxyMode"), Some(kube_proxys_mode));
    assert_eq!(get(10249, "/healthz"), Some(kube_proxys_metrics_healthz));
    answered(load.sent() + 50);

    // And back: kpx stopped (its rules stay and serve), kube-proxy again, kpx cleaned up.
    dp.stop();
    let mut kp = start_kube_proxy();
    wait_for("kube-proxy's rules again", DEADLINE, || kube_proxy_present(&t.node).then_some(()));
    answered(load.sent() + 50);
    let state = format!("--state-dir={}", t.dir.path().join("state").display());
    kpx_dataplane(&t.node, &["--cleanup", &state, "--log-format=json"]);
    assert!(!t.ruleset().contains("table inet kpx"), "kpx's rules are gone");
    answered(load.sent() + 200);
    let result = load.finish();
    println!(
        "a running kube-proxy ({}): {} requests, {by_kpx} through kpx's rules alone, {} failed, answered by {:?}",
        kube_proxy.display(),
        result.sent,
        result.failed,
        result.answered_by
    );
    assert_eq!(result.failed, 0, "{:?}", result.failures);
    kp.stop();
    drop(cp);
}
