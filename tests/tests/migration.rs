//! Migrating a node from kube-proxy to kpx and back, under traffic that must not notice:
//! kube-proxy's rules in its own layout serve a ClusterIP; kpx starts beside them;
//! `kpx-dataplane --cleanup --kube-proxy-only` removes kube-proxy's (and only kube-proxy's:
//! kubelet's chains and kpx's rules stay); then back: kube-proxy's rules return, kpx stops
//! and `kpx-dataplane --cleanup` removes kpx's. A per-request HTTP client runs throughout
//! and every request must be answered.

use std::time::Duration;

use kpx_e2e::http_traffic::{Client, HttpPod, Load};
use kpx_e2e::manifests::{documents, ep, service, slice};
use kpx_e2e::netns::Netns;
use kpx_e2e::process::binary;
use kpx_e2e::topology::{sock, Topology};
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
    let load = Load::start(
        &t.client,
        Client::HttpPerRequest,
        vip,
        Duration::from_millis(1),
        Duration::from_secs(600),
    );
    let answered = |at_least: usize| {
        wait_for("requests answered", DEADLINE, || {
            (load.result().answered_by.values().sum::<usize>() >= at_least).then_some(())
        });
    };
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
    kpx_dataplane(&t.node, &["--cleanup", "--log-format=json"]);
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
