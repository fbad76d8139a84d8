//! One control plane, two clusters (two API servers speaking list/watch): a node
//! of cluster east, a Service marked global in both, traffic that proves which
//! cluster's endpoints the node uses, and a cluster lost for longer than the
//! grace period.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpx_e2e::harness::fake_apiserver::FakeApiServer;
use kpx_e2e::harness::manifests::{documents, ep, service, slice};
use kpx_e2e::harness::process::KpxProcess;
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::{tcp_request, Answer, Backend};
use kpx_e2e::DEADLINE;

const VIP: &str = "10.96.0.10";
const GLOBAL: &str = "service.kpx.io/global: 'true'";

struct Clusters {
    t: Topology,
    east: FakeApiServer,
    west: FakeApiServer,
    kubeconfigs: [PathBuf; 2],
    _backends: Vec<Backend>,
}

/// This node (east), a west node, pod0 serving as east's endpoint and pod1 as west's.
fn clusters() -> Clusters {
    let t = Topology::new(2);
    let backends = t.start_backends(8080);
    let east = FakeApiServer::start(&t.node, sock("127.0.0.1", 16443));
    let west = FakeApiServer::start(&t.node, sock("127.0.0.1", 16444));
    east.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    west.apply_yaml(
        &node_yaml("node-w", "zone-w")
            .replace("10.0.0.1", "10.0.9.1")
            .replace("10.0.1.1", "10.0.9.2")
            .replace("fd00::1", "fd00:9::1"),
    );
    let kubeconfigs = [t.dir.path().join("east.kubeconfig"), t.dir.path().join("west.kubeconfig")];
    east.write_kubeconfig(&kubeconfigs[0]);
    west.write_kubeconfig(&kubeconfigs[1]);
    Clusters { t, east, west, kubeconfigs, _backends: backends }
}

impl Clusters {
    fn start_control_plane(&self, grace: &str) -> KpxProcess {
        let sources = [
            format!("east=kubeconfig:{}", self.kubeconfigs[0].display()),
            format!("west=kubeconfig:{}", self.kubeconfigs[1].display()),
        ];
        self.t.start_control_plane_from(&sources, &[&format!("--cluster-grace-period={grace}")])
    }

    /// The endpoints this node's view of test/web has, as "address@cluster".
    fn endpoints(&self) -> Vec<String> {
        let out = self.t.kpxctl(&["endpoints", "test/web", "--node", NODE_NAME, "-o", "json"]);
        if !out.status.success() {
            return vec![format!("kpxctl failed: {}", String::from_utf8_lossy(&out.stderr).trim())];
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let mut list: Vec<String> = json["views"][0]["view"]["ports"][0]["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!("{}@{}", e["address"].as_str().unwrap_or("?"), e["cluster"].as_str().unwrap_or("?"))
            })
            .collect();
        list.sort();
        list
    }

    fn wait_endpoints(&self, want: &[String]) {
        let mut last = Vec::new();
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            last = self.endpoints();
            if last == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("node-a's view of test/web: {last:?}, not {want:?}");
    }

    /// Every one of `n` connections is answered by `pod`.
    fn all_answered_by(&self, pod: &str, n: usize) {
        let to = sock(VIP, 80);
        for _ in 0..n {
            assert_eq!(self.t.client.run_in(move || tcp_request(to)), Answer::From(pod.into()));
        }
    }
}

/// Service test/web (`annotations`) with one endpoint `address` on `node`, ready or not.
fn web(annotations: &str, address: &str, node: &str, ready: bool) -> String {
    let spec = format!("  clusterIP: {VIP}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n");
    let svc = service("web", &spec, "").replace(
        "metadata: {name: web, namespace: test}",
        &format!("metadata: {{name: web, namespace: test, annotations: {{{annotations}}}}}"),
    );
    let endpoint = if ready { ep(address).on(node) } else { ep(address).on(node).not_ready() };
    documents(&[svc, slice("web", "web-1", false, &[("http", "TCP", 8080)], &[endpoint])])
}

fn pod(i: usize) -> String {
    Topology::pod_ip(i)
}

#[test]
fn a_global_service_balances_across_clusters_and_falls_back_to_remote_endpoints() {
    let c = clusters();
    c.east.apply_yaml(&web(GLOBAL, &pod(0), NODE_NAME, true));
    c.west.apply_yaml(&web(GLOBAL, &pod(1), "node-w", true));
    let _cp = c.start_control_plane("5m");
    let _dp = c.t.start_dataplane();
    c.wait_endpoints(&[format!("{}@east", pod(0)), format!("{}@west", pod(1))]);
    c.t.wait_answered_by(VIP, 80, "pod0");
    c.t.wait_answered_by(VIP, 80, "pod1");

    // Affinity local: east's own endpoint only, while it is ready...
    let local = format!("{GLOBAL}, service.kpx.io/affinity: local");
    c.east.apply_yaml(&web(&local, &pod(0), NODE_NAME, true));
    c.wait_endpoints(&[format!("{}@east", pod(0))]);
    c.t.wait_answered_by(VIP, 80, "pod0");
    c.all_answered_by("pod0", 20);
    // ...and the remote one when east has none ready.
    c.east.apply_yaml(&web(&local, &pod(0), NODE_NAME, false));
    c.wait_endpoints(&[format!("{}@west", pod(1))]);
    c.t.wait_answered_by(VIP, 80, "pod1");
    c.all_answered_by("pod1", 20);

    // A Service that is global in one cluster only is not merged.
    c.west.apply_yaml(&web("", &pod(1), "node-w", true));
    c.east.apply_yaml(&web(GLOBAL, &pod(0), NODE_NAME, true));
    c.wait_endpoints(&[format!("{}@east", pod(0))]);
}

#[test]
fn a_lost_clusters_endpoints_are_withdrawn_after_the_grace_period_and_come_back() {
    let mut c = clusters();
    c.east.apply_yaml(&web(GLOBAL, &pod(0), NODE_NAME, true));
    c.west.apply_yaml(&web(GLOBAL, &pod(1), "node-w", true));
    let cp = c.start_control_plane("6s");
    let _dp = c.t.start_dataplane();
    let both = [format!("{}@east", pod(0)), format!("{}@west", pod(1))];
    c.wait_endpoints(&both);

    c.west.stop();
    cp.wait_event("west to be seen unreachable", DEADLINE, |e| {
        e["message"] == "cluster unreachable" && e["cluster"] == "west"
    });
    let lost = Instant::now();
    // Within the grace period the last known endpoints stay.
    assert_eq!(c.endpoints(), both, "kept during the grace period");
    c.wait_endpoints(&[format!("{}@east", pod(0))]);
    assert!(
        lost.elapsed() >= Duration::from_secs(5),
        "withdrawn after {:?}, before the 6 s grace",
        lost.elapsed()
    );
    c.all_answered_by("pod0", 10);

    c.west.restart();
    c.wait_endpoints(&both);
    c.t.wait_answered_by(VIP, 80, "pod1");
}
