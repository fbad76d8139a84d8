//! The iptables backend's own promises, beyond the behaviour suite: it runs
//! beside a kube-proxy (its `KUBE-*` chains and a user's rules stay as they
//! are) and `--cleanup` removes exactly what kpx owns, in both flavours; a
//! program that holds the xtables lock makes the node unhealthy, not stuck.
//! Run as root (network namespaces); binaries built first (see README).

use kpx_e2e::harness::manifests::web_on_pod0;
use kpx_e2e::harness::process::binary;
use kpx_e2e::harness::topology::{ProxyBackend, Topology};
use kpx_e2e::{wait_for, DEADLINE};
use std::time::Duration;

/// The rules and user chains of `*-save` output (per tool and table), without counters.
fn saved(t: &Topology, flavour: &str) -> String {
    let mut out = Vec::new();
    for tool in ["iptables", "ip6tables"] {
        let text = t.node.try_exec(&format!("{tool}-{flavour}-save"), &[]).stdout;
        let mut table = String::new();
        for line in String::from_utf8_lossy(&text).lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name.to_owned();
            } else if line.starts_with("-A ") || (line.starts_with(':') && line.contains(" - ")) {
                let line = line.split(" [").next().unwrap_or(line);
                out.push(format!("{tool} {table} {line}"));
            }
        }
    }
    out.join("\n")
}

fn runs_beside_kube_proxy_and_cleans_up_only_its_own(backend: ProxyBackend, flavour: &str) {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    let tool = format!("iptables-{flavour}");
    // What a kube-proxy and a user left there.
    t.node.exec(&tool, &["-t", "nat", "-N", "KUBE-SERVICES"]);
    t.node.exec(
        &tool,
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "10.96.9.9/32",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "RETURN",
        ],
    );
    t.node.exec(&tool, &["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"]);
    t.node.exec(
        &tool,
        &[
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            "2222",
            "-m",
            "comment",
            "--comment",
            "a user rule",
            "-j",
            "ACCEPT",
        ],
    );
    let before = saved(&t, flavour);

    t.write_manifest("web.yaml", &web_on_pod0("web", "10.96.2.1"));
    let _cp = t.start_control_plane();
    let mut dp = t.start_dataplane_with(backend, &[]);
    t.wait_answered_by("10.96.2.1", 80, "pod0");
    let programmed = saved(&t, flavour);
    assert!(programmed.contains("-m comment --comment \"test/web:http cluster IP\""), "{programmed}");
    assert!(programmed.contains("-j KPX-SVC-"), "{programmed}");
    for line in before.lines() {
        assert!(programmed.contains(line), "kpx changed a rule it does not own: {line:?}\n{programmed}");
    }

    dp.stop();
    // A cleanup sets nothing and says nothing of localhost NodePorts.
    t.node.exec("sysctl", &["-qw", "net.ipv4.conf.all.route_localnet=0"]);
    let cleanup = t.node.try_exec(
        &binary("kpx-dataplane").display().to_string(),
        &[
            "--cleanup",
            "--backend=iptables",
            &format!("--iptables-mode={flavour}"),
            &format!("--state-dir={}", t.dir.path().join("state").display()),
        ],
    );
    let said = String::from_utf8_lossy(&cleanup.stderr).into_owned();
    assert!(cleanup.status.success(), "{said}");
    assert!(!said.contains("127.0.0.1") && !said.contains("route_localnet"), "{said}");
    assert_eq!(t.node.exec("sysctl", &["-n", "net.ipv4.conf.all.route_localnet"]).trim(), "0");
    let after = saved(&t, flavour);
    assert!(!after.contains("KPX-"), "{after}");
    assert_eq!(after, before, "cleanup leaves exactly what was there before");
}

#[test]
fn nft_flavour_runs_beside_kube_proxy_and_cleans_up_only_its_own() {
    runs_beside_kube_proxy_and_cleans_up_only_its_own(ProxyBackend::Iptables, "nft");
}

#[test]
fn legacy_flavour_runs_beside_kube_proxy_and_cleans_up_only_its_own() {
    runs_beside_kube_proxy_and_cleans_up_only_its_own(ProxyBackend::IptablesLegacy, "legacy");
}

#[test]
fn the_periodic_full_resync_repairs_rules_changed_behind_its_back() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web_on_pod0("web", "10.96.2.2"));
    let _cp = t.start_control_plane();
    let dp = t.start_dataplane_with(ProxyBackend::Iptables, &["--full-sync-period=2s"]);
    t.wait_answered_by("10.96.2.2", 80, "pod0");
    let resyncs = || dp.events().iter().filter(|e| e["message"] == "periodic full resync").count();
    let before = resyncs();
    t.node.exec("iptables-nft", &["-t", "nat", "-F", "KPX-SERVICES"]);
    let rule_there = || saved(&t, "nft").contains("test/web:http cluster IP");
    wait_for("two periodic full resyncs after the flush (one wholly after it)", DEADLINE, || {
        (resyncs() > before + 1).then_some(())
    });
    assert!(rule_there(), "the resync put the rule back");
    t.wait_answered_by("10.96.2.2", 80, "pod0");
}

/// Another program holds the xtables lock (the legacy flavour takes it; the agent's
/// lock file is the test's own, through `XTABLES_LOCKFILE`): a change cannot be
/// programmed (iptables gives up after 5 s), so the node says it is unhealthy — the
/// `healthCheckNodePort` answers 503 with `serviceProxyHealthy: false` although its
/// local endpoint is there, and `/healthz` answers 503 — and once the lock is free the
/// change is asked for again, programmed, and both answer 200.
#[test]
fn a_held_xtables_lock_makes_the_node_unhealthy_until_it_is_free() {
    use kpx_e2e::harness::manifests::{documents, ep, service, slice};
    use kpx_e2e::harness::topology::{sock, NODE_IP};
    use kpx_e2e::harness::traffic::http_get_path;
    use std::os::fd::AsRawFd;

    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_node();
    let spec = "  type: LoadBalancer\n  clusterIP: 10.96.7.1\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32070\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30170}\n";
    let local = documents(&[
        service("local", spec, ""),
        slice("local", "local-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(0))]),
    ]);
    t.write_manifest("local.yaml", &local);
    let _cp = t.start_control_plane();
    let lock_path = t.dir.path().join("xtables.lock");
    let env = [("XTABLES_LOCKFILE", lock_path.display().to_string())];
    let dp = t.start_dataplane_with_env(ProxyBackend::IptablesLegacy, &[], &env);
    let answer =
        |port: u16, path: &'static str| t.client.run_in(move || http_get_path(sock(NODE_IP, port), path));
    let health_check = || answer(32070, "/");
    wait_for("the health check to say 200", DEADLINE, || {
        health_check()
            .ok()
            .filter(|(status, body)| *status == 200 && body.contains("\"serviceProxyHealthy\":true"))
    });

    let lock = std::fs::File::create(&lock_path).expect("the lock file");
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0, "take the xtables lock");
    t.write_manifest("more.yaml", &web_on_pod0("more", "10.96.7.2"));
    let (_, body) =
        wait_for("the health check to say 503: the proxy is unhealthy", Duration::from_secs(60), || {
            health_check().ok().filter(|(status, _)| *status == 503)
        });
    assert!(
        body.contains("\"localEndpoints\":1") && body.contains("\"serviceProxyHealthy\":false"),
        "{body}"
    );
    let (healthz, _) = answer(10256, "/healthz").expect("/healthz");
    assert_eq!(healthz, 503, "/healthz: the rules do not match what the node accepted");
    dp.wait_event("the change NACKed", Duration::from_secs(60), |e| {
        e["message"] == "delta refused (NACK); keeping the last good state"
    });

    // SAFETY: as above.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) }, 0, "free the xtables lock");
    let freed = std::time::Instant::now();
    wait_for("the health check to say 200 again", Duration::from_secs(60), || {
        health_check()
            .ok()
            .filter(|(status, body)| *status == 200 && body.contains("\"serviceProxyHealthy\":true"))
    });
    t.wait_answered_by("10.96.7.2", 80, "pod0");
    assert_eq!(answer(10256, "/healthz").expect("/healthz").0, 200);
    println!(
        "the lock freed: healthy again and the change programmed {:.1} s later",
        freed.elapsed().as_secs_f64()
    );
}

/// Docker and many hardened hosts set filter FORWARD's policy to DROP. kpx's `KPX-FORWARD`
/// (kube-proxy's `KUBE-FORWARD`) accepts Service traffic marked for masquerade and the
/// replies of tracked connections, so a NodePort of policy Cluster keeps answering; with that
/// hook taken away the same NodePort is dropped, which shows the policy bites.
fn a_forward_policy_of_drop_does_not_break_node_ports(backend: ProxyBackend, flavour: &str) {
    use kpx_e2e::harness::manifests::{documents, ep, service, slice};
    use kpx_e2e::harness::topology::{sock, NODE_IP};
    use kpx_e2e::harness::traffic::{tcp_request, Answer};
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_node();
    let spec = "  type: NodePort\n  clusterIP: 10.96.2.7\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30097}\n";
    t.write_manifest(
        "np.yaml",
        &documents(&[
            service("np", spec, ""),
            slice("np", "np-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(0))]),
        ]),
    );
    let tool = format!("iptables-{flavour}");
    t.node.exec(&tool, &["-P", "FORWARD", "DROP"]);
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane_with(backend, &[]);
    let node_port = sock(NODE_IP, 30097);
    wait_for("the NodePort to answer through a FORWARD policy of DROP", DEADLINE, || {
        (t.client.run_in(move || tcp_request(node_port)) == Answer::From("pod0".into())).then_some(())
    });
    // A forwarded packet conntrack calls INVALID (SYN and FIN at once, to a pod) is dropped
    // by KPX-FORWARD: its rule's packet counter in the kernel counts each one.
    let invalid_drops = || -> u64 {
        let listing = t.node.exec(&tool, &["-t", "filter", "-L", "KPX-FORWARD", "-v", "-x", "-n"]);
        let line =
            listing.lines().find(|l| l.contains("ctstate INVALID")).unwrap_or_else(|| panic!("{listing}"));
        line.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    t.wait_invalid_segments_dropped(0, "KPX-FORWARD", invalid_drops);
    let filter = saved(&t, flavour);
    let hook = "-A FORWARD -m comment --comment \"kpx forwarding rules\" -j KPX-FORWARD";
    assert!(filter.contains(&format!("iptables filter {hook}")), "{filter}");
    t.node.exec(
        &tool,
        &["-D", "FORWARD", "-m", "comment", "--comment", "kpx forwarding rules", "-j", "KPX-FORWARD"],
    );
    assert!(!saved(&t, flavour).contains(&format!("iptables filter {hook}")), "the hook is gone");
    let answer = t.client.run_in(move || tcp_request(node_port));
    assert!(matches!(answer, Answer::Failed(_)), "without KPX-FORWARD the policy drops it: {answer:?}");
}

#[test]
fn nft_flavour_accepts_service_traffic_through_a_forward_policy_of_drop() {
    a_forward_policy_of_drop_does_not_break_node_ports(ProxyBackend::Iptables, "nft");
}

#[test]
fn legacy_flavour_accepts_service_traffic_through_a_forward_policy_of_drop() {
    a_forward_policy_of_drop_does_not_break_node_ports(ProxyBackend::IptablesLegacy, "legacy");
}
