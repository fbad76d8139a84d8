//! Seeing inside kpx: every kpxctl command against the running processes,
//! Prometheus metrics names, kube-proxy's /healthz and /livez, and gRPC
//! reflection through real clients (Python grpcio-reflection for v1alpha,
//! tonic's client for v1). Run as root (network namespaces); binaries built
//! and the Python client installed first (tests/run.sh does both).

use std::path::PathBuf;

use kpx_e2e::harness::manifests::{documents, ep, service, slice};
use kpx_e2e::harness::topology::{node_yaml, sock, ProxyBackend, Topology, CLUSTER_CIDR, NODE_IP, NODE_NAME};
use kpx_e2e::harness::traffic::{http_get_path, tcp_request, Answer};
use kpx_e2e::{wait_for, DEADLINE};

const VIP: &str = "10.96.3.1";

/// A node with Service `web` (NodePort 30090, externalTrafficPolicy Local, pod0 here and pod1 on
/// node-b) and Service `empty` (no endpoints), both programmed.
fn started() -> (
    Topology,
    Vec<kpx_e2e::harness::traffic::Backend>,
    kpx_e2e::harness::process::KpxProcess,
    kpx_e2e::harness::process::KpxProcess,
) {
    started_with(ProxyBackend::Nftables)
}

fn started_with(
    backend: ProxyBackend,
) -> (
    Topology,
    Vec<kpx_e2e::harness::traffic::Backend>,
    kpx_e2e::harness::process::KpxProcess,
    kpx_e2e::harness::process::KpxProcess,
) {
    let t = Topology::new(2);
    let backends = t.start_backends(8080);
    t.write_node();
    let web = "  type: NodePort\n  clusterIP: 10.96.3.1\n  externalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80, nodePort: 30090}\n";
    let empty = "  clusterIP: 10.96.3.2\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let http = [("http", "TCP", 8080)];
    t.write_manifest(
        "web.yaml",
        &documents(&[
            service("web", web, ""),
            slice(
                "web",
                "web-1",
                false,
                &http,
                &[ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1)).on("node-b")],
            ),
            service("empty", empty, ""),
            slice("empty", "empty-1", false, &http, &[]),
        ]),
    );
    let cp = t.start_control_plane_with(&[&format!("--cluster-cidr={CLUSTER_CIDR}")]);
    let dp = t.start_dataplane_with(backend, &[]);
    wait_for("the Service to answer", DEADLINE, || {
        matches!(t.client.run_in(|| tcp_request(sock(VIP, 80))), Answer::From(_)).then_some(())
    });
    (t, backends, cp, dp)
}

/// Runs kpxctl, expects success, returns stdout.
fn ok(t: &Topology, args: &[&str]) -> String {
    let out = t.kpxctl(args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "kpxctl {args:?}: {}{text}", String::from_utf8_lossy(&out.stderr));
    text
}

fn json(t: &Topology, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["-o", "json"];
    all.extend(args);
    let text = ok(t, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("kpxctl {args:?} is not JSON ({e}): {text}"))
}

#[test]
fn kpxctl_shows_services_endpoints_nodes_rules_status_and_traces() {
    let (t, _backends, _cp, _dp) = started();

    let services = ok(&t, &["services"]);
    assert!(services.contains("default/test/web") && services.contains("10.96.3.1"), "{services}");
    assert!(services.contains("http 80/TCP:30090"), "{services}");
    let services = json(&t, &["services"]);
    let names: Vec<&str> =
        services["services"].as_array().expect("list").iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["default/test/empty", "default/test/web"]);

    let endpoints = ok(&t, &["endpoints", "test/web"]);
    assert!(endpoints.contains("10.244.1.2:8080") && endpoints.contains("10.244.2.2:8080"), "{endpoints}");
    assert!(endpoints.contains("node-b"), "{endpoints}");
    let mine = json(&t, &["endpoints", "test/web", "--node", "node-a"]);
    let local = &mine["views"][0]["view"]["ports"][0]["localEndpoints"];
    assert_eq!(local[0]["address"], "10.244.1.2", "{mine}");

    let nodes = json(&t, &["nodes"]);
    assert_eq!(nodes["nodes"][0]["name"], "node-a", "{nodes}");
    let acked: u64 = nodes["nodes"][0]["types"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(|ty| ty["acked"].as_u64())
        .sum();
    assert!(acked >= 3, "two Services and a node config ACKed: {nodes}");
    let mine = json(&t, &["nodes", "node-a"]);
    let resources = mine["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), 3, "two Services and the node config: {mine}");
    assert!(
        resources
            .iter()
            .all(|r| r["state"] == "in sync" && !r["ackedVersion"].as_str().unwrap_or_default().is_empty()),
        "{mine}"
    );
    let table = ok(&t, &["nodes", "node-a"]);
    assert!(table.contains("default/test/web") && table.contains("in sync"), "{table}");
    let sources = json(&t, &["sources"]);
    assert_eq!(sources["sources"][0]["synced"], true, "{sources}");

    let rules = ok(&t, &["rules"]);
    assert!(rules.contains("table inet kpx") && rules.contains("10.96.3.1 . tcp . 80"), "{rules}");
    let status = json(&t, &["status"]);
    assert_eq!(
        (status["connected"].as_bool(), status["backend"].as_str()),
        (Some(true), Some("nftables")),
        "{status}"
    );
    let state = ok(&t, &["state"]);
    assert!(state.contains("default/test/web"), "{state}");

    let trace = ok(&t, &["trace", "10.96.3.1:80"]);
    assert!(trace.contains("verdict     dnat") && trace.contains("masquerade  yes"), "{trace}");
    assert!(trace.contains("50.0%") && trace.contains("10.244.2.2:8080"), "{trace}");
    assert!(
        trace.contains("service-ips-v4: 10.96.3.1 . tcp . 80 : goto pick-v4-2"),
        "the matching element: {trace}"
    );
    let local = json(&t, &["trace", "10.0.0.1:30090/tcp", "--source", "192.0.2.7"]);
    assert_eq!(
        (local["verdict"].as_str(), local["masquerade"].as_bool()),
        (Some("dnat"), Some(false)),
        "{local}"
    );
    assert_eq!(local["candidates"].as_array().map(Vec::len), Some(1), "only this node's endpoint: {local}");
    let empty = json(&t, &["trace", "10.96.3.2:80"]);
    assert_eq!(empty["verdict"], "reject", "{empty}");
    let via_control_plane =
        json(&t, &["trace", "10.96.3.1:80", "--node", "node-a", "--source", "10.244.2.2"]);
    assert_eq!(
        (via_control_plane["verdict"].as_str(), via_control_plane["masquerade"].as_bool()),
        (Some("dnat"), Some(false))
    );

    let unreachable = t.kpxctl(&["--control-plane", "http://127.0.0.1:9", "services"]);
    assert_eq!(unreachable.status.code(), Some(1));
    let message = String::from_utf8_lossy(&unreachable.stderr);
    assert!(message.contains("cannot reach the control plane at http://127.0.0.1:9"), "{message}");
    let bad = t.kpxctl(&["trace", "not-an-address"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("destination"), "{bad:?}");
}

fn get(
    t: &Topology,
    ns: &kpx_e2e::harness::netns::Netns,
    addr: &str,
    port: u16,
    path: &'static str,
) -> (u16, String) {
    let _ = t;
    let to = sock(addr, port);
    ns.run_in(move || http_get_path(to, path)).unwrap_or_else(|e| panic!("GET {to}{path}: {e}"))
}

#[test]
fn metrics_under_kube_proxy_names_and_health_endpoints() {
    let (t, _backends, _cp, _dp) = started();
    let (code, agent) = get(&t, &t.node, "127.0.0.1", 10249, "/metrics");
    assert_eq!(code, 200);
    for name in ["kpx_xds_connected 1", "kpx_xds_responses_total{result=\"ack\"}"] {
        assert!(agent.contains(name), "agent metrics lack {name}:\n{agent}");
    }
    let (code, cp) = get(&t, &t.node, "127.0.0.1", 18002, "/metrics");
    assert_eq!(code, 200);
    for name in [
        "kpx_xds_streams 1",
        "kpx_xds_ack_latency_seconds_count",
        "kpx_xds_resources_sent_total",
        "kpx_xds_nacks_total",
        "kpx_xds_stream_queue_depth{node=\"node-a\"}",
        "kpx_snapshot_build_duration_seconds_count",
        "kpx_services 2",
    ] {
        assert!(cp.contains(name), "control plane metrics lack {name}:\n{cp}");
    }
    for path in ["/healthz", "/livez"] {
        let (code, body) = get(&t, &t.client, NODE_IP, 10256, path);
        assert_eq!(code, 200, "{path}: {body}");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(v["lastUpdated"].as_str().is_some_and(|s| s.ends_with('Z')), "{body}");
        assert!(v["currentTime"].is_string(), "{body}");
        let eligible = if path == "/healthz" { serde_json::json!(true) } else { serde_json::Value::Null };
        assert_eq!(v["nodeEligible"], eligible, "{path}: {body}");
    }
}

/// The control plane's allocator took its options: jemalloc runs the thread that gives
/// freed pages back (what keeps the memory per stream low once first syncs are done).
#[test]
fn the_control_plane_gives_freed_memory_back_from_jemallocs_background_thread() {
    let (_t, _backends, cp, _dp) = started();
    let pid = cp.pid().expect("the control plane runs");
    let threads = wait_for("jemalloc's background thread", DEADLINE, || {
        let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect();
        names.iter().any(|n| n.starts_with("jemalloc_bg_thd")).then_some(names)
    });
    assert!(threads.iter().any(|n| n.starts_with("tokio-rt-worker")), "{threads:?}");
}

/// The control plane's `kpx_controlplane_heap_bytes` is its allocator's live account: it
/// grows when 2,000 Services are added and falls again when they are gone.
#[test]
fn the_control_plane_reports_its_heap_as_its_allocator_counts_it() {
    let (t, _backends, _cp, _dp) = started();
    let metric = |text: &str, name: &str| {
        kpx_e2e::harness::traffic::metric_value(text, name).unwrap_or_else(|| panic!("no {name}:\n{text}"))
    };
    let heap = |services: f64| {
        wait_for(&format!("the control plane to serve {services} Services"), DEADLINE, || {
            let (code, text) = get(&t, &t.node, "127.0.0.1", 18002, "/metrics");
            (code == 200 && metric(&text, "kpx_services") == services).then(|| {
                ["allocated", "active", "resident"]
                    .map(|kind| metric(&text, &format!("kpx_controlplane_heap_bytes{{kind=\"{kind}\"}}")))
            })
        })
    };
    let before = heap(2.0);
    let [allocated, active, resident] = before;
    assert!(allocated > 0.0 && allocated <= active && active <= resident, "{before:?}");
    let http = [("http", "TCP", 8080)];
    let many: Vec<String> = (0..2000)
        .flat_map(|i| {
            let name = format!("many-{i}");
            let spec = format!(
                "  clusterIP: 10.97.{}.{}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n",
                i / 250,
                i % 250 + 1
            );
            let endpoints: Vec<_> =
                (0..10).map(|e| ep(format!("10.245.{}.{}", i / 25, (i % 25) * 10 + e + 1))).collect();
            [service(&name, &spec, ""), slice(&name, &format!("{name}-1"), false, &http, &endpoints)]
        })
        .collect();
    t.write_manifest("many.yaml", &documents(&many));
    let grown = heap(2002.0);
    assert!(grown[0] > before[0] + 2e6, "2,000 Services more, allocated only {before:?} → {grown:?}");
    t.remove_manifest("many.yaml");
    let shrunk = wait_for("the heap to shrink once the Services are gone", DEADLINE, || {
        let now = heap(2.0);
        (now[0] < grown[0] - 1e6).then_some(now)
    });
    assert!(shrunk[0] <= shrunk[1] && shrunk[1] <= shrunk[2], "{shrunk:?}");
    println!("heap (allocated, active, resident): {before:?} → {grown:?} → {shrunk:?}");
}

/// kube-proxy's `/healthz` (and `/livez`), read from the client as a load balancer would.
fn health(t: &Topology, path: &'static str) -> (u16, serde_json::Value) {
    let (code, body) = get(t, &t.client, NODE_IP, 10256, path);
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (code, v)
}

/// Waits until `/healthz` answers `code` with `nodeEligible` = `eligible`; then `/livez`
/// must answer 200 and the Service must still be served (a leaving node keeps proxying).
fn wait_healthz(t: &Topology, code: u16, eligible: bool, why: &str) {
    wait_for(&format!("/healthz to answer {code}, nodeEligible {eligible} ({why})"), DEADLINE, || {
        let (got, v) = health(t, "/healthz");
        (got == code && v["nodeEligible"] == eligible).then_some(())
    });
    let (live, body) = health(t, "/livez");
    assert_eq!(live, 200, "/livez while {why}: {body}");
    let answer = t.client.run_in(|| tcp_request(sock(VIP, 80)));
    assert!(matches!(answer, Answer::From(_)), "the Service while {why}: {answer:?}");
}

#[test]
fn healthz_turns_away_load_balancers_while_the_node_is_being_deleted() {
    let (t, _backends, _cp, _dp) = started();
    wait_healthz(&t, 200, true, "the Node is in service");
    let node = node_yaml(NODE_NAME, "zone-a");
    let tainted = node.replacen(
        "spec: {",
        "spec: {taints: [{key: ToBeDeletedByClusterAutoscaler, value: '1764756000', effect: NoSchedule}], ",
        1,
    );
    assert_ne!(tainted, node, "the Node manifest has a spec to add the taint to");
    t.write_manifest("node.yaml", &tainted);
    wait_healthz(&t, 503, false, "the autoscaler's taint is on the Node");
    t.write_manifest("node.yaml", &node);
    wait_healthz(&t, 200, true, "the taint was taken off again");
    let deleted = node.replacen(
        &format!("  name: {NODE_NAME}\n"),
        &format!("  name: {NODE_NAME}\n  deletionTimestamp: '2026-12-03T10:00:00Z'\n"),
        1,
    );
    assert_ne!(deleted, node, "the Node manifest has a name line to add the timestamp after");
    t.write_manifest("node.yaml", &deleted);
    wait_healthz(&t, 503, false, "the Node has a deletion timestamp");
}

/// kube-proxy's metrics and their labels, as the Kubernetes metrics reference lists them:
/// name (histograms by their base name), whether a histogram, label names.
const KUBE_PROXY_METRICS: &[(&str, bool, &[&str])] = &[
    ("kubeproxy_conntrack_reconciler_deleted_entries_total", false, &["ip_family"]),
    ("kubeproxy_conntrack_reconciler_sync_duration_seconds", true, &["ip_family"]),
    ("kubeproxy_network_programming_duration_seconds", true, &["ip_family"]),
    ("kubeproxy_proxy_healthz_total", false, &["code"]),
    ("kubeproxy_proxy_livez_total", false, &["code"]),
    ("kubeproxy_sync_full_proxy_rules_duration_seconds", true, &["ip_family"]),
    ("kubeproxy_sync_partial_proxy_rules_duration_seconds", true, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_duration_seconds", true, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", false, &[]),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_total", false, &[]),
    ("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", false, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", false, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", false, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", false, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", false, &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_no_local_endpoints_total", false, &["ip_family", "traffic_policy"]),
    ("kubeproxy_sync_proxy_rules_service_changes_pending", false, &[]),
    ("kubeproxy_sync_proxy_rules_service_changes_total", false, &[]),
    // Not served by kpx (see docs/operate.md): the nfacct-based `kubeproxy_iptables_{ct_state_invalid_dropped,localhost_nodeports_accepted}_packets_total`,
    // `kubeproxy_sync_proxy_rules_iptables_{total,last}` and
    // `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`.
];

/// Every `kubeproxy_` sample of `text` by metric (histograms by base name), with its label names.
fn kube_proxy_samples(
    text: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<Vec<String>>> {
    let histograms: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .collect();
    let mut out: std::collections::BTreeMap<String, std::collections::BTreeSet<Vec<String>>> =
        Default::default();
    for line in text.lines().filter(|l| l.starts_with("kubeproxy_")) {
        let (name, rest) = line.split_once(['{', ' ']).unwrap_or((line, ""));
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| histograms.contains(b)))
            .unwrap_or(name);
        let labels = if line.contains('{') { rest.split_once('}').map_or("", |(l, _)| l) } else { "" };
        let mut keys: Vec<String> = labels
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
            .filter(|k| k != "le")
            .collect();
        keys.sort();
        out.entry(base.to_owned()).or_default().insert(keys);
    }
    out
}

/// The agent's `kubeproxy_` metrics are kube-proxy's, names and labels exactly, and it has
/// every one of kube-proxy's that its backend has.
fn metrics_are_kube_proxys(backend: ProxyBackend, own: &[&str]) {
    let (t, _backends, _cp, _dp) = started_with(backend);
    for path in ["/healthz", "/livez"] {
        assert_eq!(get(&t, &t.client, NODE_IP, 10256, path).0, 200, "{path}");
    }
    // kube-proxy's metrics server also says its mode, and answers its own /healthz.
    let mode = match backend {
        ProxyBackend::Nftables => "nftables",
        ProxyBackend::Iptables | ProxyBackend::IptablesLegacy => "iptables",
        ProxyBackend::Ipvs => "ipvs",
    };
    assert_eq!(get(&t, &t.node, "127.0.0.1", 10249, "/proxyMode"), (200, mode.to_owned()));
    assert_eq!(get(&t, &t.node, "127.0.0.1", 10249, "/healthz"), (200, "ok".to_owned()));
    let (code, text) = get(&t, &t.node, "127.0.0.1", 10249, "/metrics");
    assert_eq!(code, 200);
    let samples = kube_proxy_samples(&text);
    for (name, label_sets) in &samples {
        let known = KUBE_PROXY_METRICS.iter().find(|(n, _, _)| n == name);
        let Some((_, _, labels)) = known else {
            panic!("{name} is not one of kube-proxy's metrics:\n{text}")
        };
        for keys in label_sets {
            assert_eq!(keys, labels, "{name}'s labels:\n{text}");
        }
    }
    let backend_specific = |n: &str| n.contains("_iptables_") || n.contains("_nftables_");
    for (name, histogram, _) in KUBE_PROXY_METRICS {
        let wanted = !backend_specific(name) || own.contains(name);
        assert_eq!(
            samples.contains_key(*name),
            wanted,
            "{name} (histogram: {histogram}) with {backend:?}:\n{text}"
        );
    }
    assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"), "{text}");
    assert!(text.contains("ip_family=\"IPv4\""), "{text}");
}

#[test]
fn nftables_metrics_are_kube_proxys_names_and_labels() {
    metrics_are_kube_proxys(
        ProxyBackend::Nftables,
        &["kubeproxy_sync_proxy_rules_nftables_sync_failures_total"],
    );
}

#[test]
fn iptables_metrics_are_kube_proxys_names_and_labels() {
    metrics_are_kube_proxys(
        ProxyBackend::Iptables,
        &[
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        ],
    );
}

#[test]
fn reflection_v1alpha_with_python_and_v1_with_tonic_on_both_servers() {
    let (t, _backends, _cp, _dp) = started();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reflection_v1alpha.py");
    let py = kpx_e2e::harness::process::python().display().to_string();
    let script = script.display().to_string();
    let run = |target: &str, symbol: &str| {
        let out = t.node.try_exec(&py, &[&script, target, symbol]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{target}: {}{text}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let cp = run("127.0.0.1:18000", "kpx.admin.v1.ControlPlaneAdmin");
    for line in [
        "service envoy.service.discovery.v3.AggregatedDiscoveryService",
        "service kpx.admin.v1.ControlPlaneAdmin",
        "service grpc.health.v1.Health",
        "describes service kpx.admin.v1.ControlPlaneAdmin ListServices GetServiceViews ListNodes GetNodeResources ListSources GetNodeView Trace",
    ] {
        assert!(cp.contains(line), "control plane: no {line:?} in\n{cp}");
    }
    let ads = run("127.0.0.1:18000", "envoy.service.discovery.v3.AggregatedDiscoveryService");
    assert!(ads.contains("StreamAggregatedResources DeltaAggregatedResources"), "{ads}");
    let agent = run("127.0.0.1:18001", "kpx.admin.v1.NodeAdmin");
    assert!(agent.contains("service kpx.admin.v1.NodeAdmin") && agent.contains("GetRules"), "{agent}");

    let listed = t.node.run_in(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
            use tonic_reflection::pb::v1::ServerReflectionRequest;
            let mut lists = Vec::new();
            for target in ["http://127.0.0.1:18000", "http://127.0.0.1:18001"] {
                let channel =
                    tonic::transport::Endpoint::from_static(target).connect().await.expect("connect");
                let mut client = ServerReflectionClient::new(channel);
                let request = ServerReflectionRequest {
                    host: String::new(),
                    message_request: Some(MessageRequest::ListServices(String::new())),
                };
                let mut stream = client
                    .server_reflection_info(tokio_stream::iter([request]))
                    .await
                    .expect("v1 reflection")
                    .into_inner();
                let response = stream.message().await.expect("answer").expect("one answer");
                let mut names = Vec::new();
                if let Some(MessageResponse::ListServicesResponse(list)) = response.message_response {
                    names.extend(list.service.into_iter().map(|s| s.name));
                }
                names.sort();
                lists.push(names);
            }
            lists
        })
    });
    // Each server lists exactly what it serves: not the other binary's admin service.
    let common = [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    let mut cp_wanted: Vec<&str> =
        ["envoy.service.discovery.v3.AggregatedDiscoveryService", "kpx.admin.v1.ControlPlaneAdmin"].into();
    let mut agent_wanted: Vec<&str> = ["kpx.admin.v1.NodeAdmin"].into();
    cp_wanted.extend(common);
    agent_wanted.extend(common);
    cp_wanted.sort();
    agent_wanted.sort();
    assert_eq!(listed[0], cp_wanted, "control plane");
    assert_eq!(listed[1], agent_wanted, "node agent");
    assert!(
        !cp.contains("service kpx.admin.v1.NodeAdmin"),
        "v1alpha lists the agent's service on the control plane:\n{cp}"
    );
    assert!(!agent.contains("service kpx.admin.v1.ControlPlaneAdmin"), "{agent}");
}

/// The `grpcurl …` lines of the manual's code blocks (docs/operate.md, "Seeing inside").
fn readme_grpcurl_examples() -> Vec<String> {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/operate.md"))
            .expect("docs/operate.md");
    let mut in_code = false;
    let mut out = Vec::new();
    for line in readme.lines().map(str::trim) {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if in_code && line.starts_with("grpcurl ") {
            out.push(line.to_owned());
        }
    }
    out
}

#[test]
fn every_grpcurl_example_of_the_manual_works() {
    let examples = readme_grpcurl_examples();
    assert!(examples.len() >= 4, "the manual shows grpcurl: {examples:?}");
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_node();
    let web = "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    t.write_manifest(
        "web.yaml",
        &documents(&[
            service("web", web, ""),
            slice("web", "web-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(0))]),
        ]),
    );
    let _cp = t.start_control_plane();
    let _dp = t.start_dataplane();
    t.wait_answered_by("10.96.0.10", 80, "pod0");
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin");
    assert!(bin.join("grpcurl").exists(), "tests/run.sh installs grpcurl into target/pyenv");
    for example in examples {
        let command = format!("PATH={}:$PATH {example}", bin.display());
        let out = t.node.try_exec("sh", &["-c", &command]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{example}: {}{text}", String::from_utf8_lossy(&out.stderr));
        let expect: &[&str] = match example.split_whitespace().last().unwrap_or_default() {
            "list" => &[
                "envoy.service.discovery.v3.AggregatedDiscoveryService",
                "kpx.admin.v1.ControlPlaneAdmin",
                "grpc.health.v1.Health",
            ],
            "kpx.admin.v1.ControlPlaneAdmin" => {
                &["service ControlPlaneAdmin", "rpc ListServices", "rpc Trace"]
            }
            "kpx.admin.v1.ControlPlaneAdmin/ListNodes" => &["\"name\": \"node-a\""],
            "kpx.admin.v1.NodeAdmin/Trace" => &["\"verdict\": \"dnat\"", "10.244.1.2:8080"],
            _ => &[],
        };
        for want in expect {
            assert!(text.contains(want), "{example}: no {want:?} in\n{text}");
        }
        if example.ends_with(" list") {
            assert!(!text.contains("NodeAdmin"), "the control plane lists only its own services:\n{text}");
        }
    }
}
