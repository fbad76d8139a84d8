//! One control plane, two clusters (two API servers speaking list/watch): a node
//! of cluster east, a Service marked global in both, or exported in both and imported
//! at a ClusterSetIP (Multi-Cluster Services), traffic that proves which cluster's
//! endpoints the node uses, and a cluster lost for longer than the grace period.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpx_e2e::harness::fake_apiserver::{FakeApiServer, Kind};
use kpx_e2e::harness::install;
use kpx_e2e::harness::kernel_rules::tcp_cluster_ips;
use kpx_e2e::harness::kube_apiserver::{KubeApiServer, CONTROL_PLANE_USER};
use kpx_e2e::harness::manifests::{documents, ep, service, slice};
use kpx_e2e::harness::process::KpxProcess;
use kpx_e2e::harness::topology::{node_yaml, sock, ProxyBackend, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::{http_get_path, metric_value, tcp_request, Answer, Backend};
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
    east.install_mcs_crds();
    west.install_mcs_crds();
    east.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    west.apply_yaml(&west_node());
    let kubeconfigs = [t.dir.path().join("east.kubeconfig"), t.dir.path().join("west.kubeconfig")];
    east.write_kubeconfig(&kubeconfigs[0]);
    west.write_kubeconfig(&kubeconfigs[1]);
    Clusters { t, east, west, kubeconfigs, _backends: backends }
}

impl Clusters {
    fn sources(&self) -> [String; 2] {
        [
            format!("east=kubeconfig:{}", self.kubeconfigs[0].display()),
            format!("west=kubeconfig:{}", self.kubeconfigs[1].display()),
        ]
    }

    fn start_control_plane(&self, grace: &str) -> KpxProcess {
        self.t.start_control_plane_from(&self.sources(), &[&format!("--cluster-grace-period={grace}")])
    }

    /// A control plane that is the clusterset's MCS controller, its gRPC on `listen` and
    /// metrics on `metrics`.
    fn start_mcs_controller(&self, listen: &str, metrics: &str) -> KpxProcess {
        let extra = [
            &format!("--listen={listen}") as &str,
            &format!("--metrics-listen={metrics}"),
            "--clusterset-cidr=10.200.0.0/24",
            "--mcs-lease=kube-system/kpx-controlplane-mcs",
        ];
        self.t.start_control_plane_from(&self.sources(), &extra)
    }

    /// The endpoints this node's view of test/web has, as "address@cluster".
    fn endpoints(&self) -> Vec<String> {
        self.endpoints_of("test/web")
    }

    /// The endpoints this node's view of `service` has, as "address@cluster".
    fn endpoints_of(&self, service: &str) -> Vec<String> {
        endpoints_of(&self.t, service)
    }

    fn wait_endpoints(&self, want: &[String]) {
        self.wait_endpoints_of("test/web", want);
    }

    fn wait_endpoints_of(&self, service: &str, want: &[String]) {
        wait_endpoints_of(&self.t, service, want);
    }

    /// Every one of `n` connections to the Service's ClusterIP is answered by `pod`.
    fn all_answered_by(&self, pod: &str, n: usize) {
        self.all_at_answered_by(VIP, pod, n);
    }

    /// Every one of `n` connections to `vip`:80 is answered by `pod`.
    fn all_at_answered_by(&self, vip: &str, pod: &str, n: usize) {
        let to = sock(vip, 80);
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

const CLUSTERSET_IP: &str = "10.200.0.10";

/// test/web's ServiceExport.
const EXPORT: &str = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: web, namespace: test}\n";

/// test/web's ServiceImport of `import_type`, at the ClusterSetIP unless headless.
fn import(import_type: &str) -> String {
    let ips = if import_type == "Headless" { String::new() } else { format!("ips: [{CLUSTERSET_IP}], ") };
    format!(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {{name: web, namespace: test}}\n\
         spec: {{type: {import_type}, {ips}ports: [{{name: http, protocol: TCP, port: 80}}]}}\n"
    )
}

/// Whether the kernel of this node holds any rule for the ClusterSetIP.
fn clusterset_ip_in_kernel(t: &Topology) -> bool {
    tcp_cluster_ips(&t.node, ProxyBackend::Nftables)
        .keys()
        .any(|k| k.starts_with(&format!("{CLUSTERSET_IP}:")))
}

#[test]
fn a_clusterset_ip_import_is_answered_by_both_clusters_and_follows_their_exports() {
    let c = clusters();
    c.east.apply_yaml(&web("", &pod(0), NODE_NAME, true));
    c.west.apply_yaml(&web("", &pod(1), "node-w", true));
    c.east.apply_yaml(EXPORT);
    c.west.apply_yaml(EXPORT);
    c.east.apply_yaml(&import("ClusterSetIP"));
    let _cp = c.start_control_plane("5m");
    let _dp = c.t.start_dataplane();
    let both = [format!("{}@east", pod(0)), format!("{}@west", pod(1))];
    c.wait_endpoints_of("test/web.clusterset", &both);
    c.t.wait_answered_by(CLUSTERSET_IP, 80, "pod0");
    c.t.wait_answered_by(CLUSTERSET_IP, 80, "pod1");
    // The Service itself is not global: its ClusterIP keeps east's own endpoint.
    c.all_answered_by("pod0", 10);

    // Unexported in west: west's endpoint leaves the import.
    c.west.delete(Kind::ServiceExport, "test", "web");
    c.wait_endpoints_of("test/web.clusterset", &both[..1]);
    c.all_at_answered_by(CLUSTERSET_IP, "pod0", 20);
    c.west.apply_yaml(EXPORT);
    c.wait_endpoints_of("test/web.clusterset", &both);

    // West's Service turned ExternalName under its export: not valid, east's only.
    let external = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: test}\n\
                    spec: {type: ExternalName, externalName: web.example}\n";
    c.west.apply_yaml(external);
    c.wait_endpoints_of("test/web.clusterset", &both[..1]);
    c.all_at_answered_by(CLUSTERSET_IP, "pod0", 20);

    // A Headless import has no address to program; the import gone, neither.
    c.east.apply_yaml(&import("Headless"));
    kpx_e2e::wait_for("the headless import's rules to leave the kernel", DEADLINE, || {
        (!clusterset_ip_in_kernel(&c.t)).then_some(())
    });
    c.east.apply_yaml(&import("ClusterSetIP"));
    c.t.wait_answered_by(CLUSTERSET_IP, 80, "pod0");
    c.east.delete(Kind::ServiceImport, "test", "web");
    kpx_e2e::wait_for("the deleted import's rules to leave the kernel", DEADLINE, || {
        (!clusterset_ip_in_kernel(&c.t)).then_some(())
    });
    let to = sock(CLUSTERSET_IP, 80);
    let answer = c.t.client.run_in(move || tcp_request(to));
    assert!(
        !matches!(answer, Answer::From(_)),
        "nothing answers at the ClusterSetIP once the import is gone: {answer:?}"
    );
    c.all_answered_by("pod0", 5);
}

const CONTROL_PLANE: (&str, &str) = ("127.0.0.1:18000", "127.0.0.1:18002");
const REPLICA: (&str, &str) = ("127.0.0.1:18010", "127.0.0.1:18012");

/// The endpoints `t`'s node's view of `service` has, as "address@cluster".
fn endpoints_of(t: &Topology, service: &str) -> Vec<String> {
    let out = t.kpxctl(&["endpoints", service, "--node", NODE_NAME, "-o", "json"]);
    if !out.status.success() {
        return vec![format!("kpxctl failed: {}", String::from_utf8_lossy(&out.stderr).trim())];
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut list: Vec<String> = json["views"][0]["view"]["ports"][0]["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{}@{}", e["address"].as_str().unwrap_or("?"), e["cluster"].as_str().unwrap_or("?")))
        .collect();
    list.sort();
    list
}

fn wait_endpoints_of(t: &Topology, service: &str, want: &[String]) {
    let mut last = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        last = endpoints_of(t, service);
        if last == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("node-a's view of {service}: {last:?}, not {want:?}");
}

/// West's node, node-w in zone-w.
fn west_node() -> String {
    node_yaml("node-w", "zone-w")
        .replace("10.0.0.1", "10.0.9.1")
        .replace("10.0.1.1", "10.0.9.2")
        .replace("fd00::1", "fd00:9::1")
}

/// `kpxctl imports`' entry of test/web.
fn imports_of(t: &Topology) -> serde_json::Value {
    let out = t.kpxctl(&["imports", "-o", "json"]);
    assert!(out.status.success(), "kpxctl imports: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let list = json["imports"].as_array().cloned().unwrap_or_default();
    list.into_iter().find(|i| i["name"] == "test/web").unwrap_or_else(|| panic!("no test/web: {json}"))
}

/// [`Clusters`] on two real kube-apiservers (`../shared/k8s`), each with the MCS CRDs and
/// the MCS install's RBAC; the control plane reads each with its ServiceAccount's token.
struct RealClusters {
    t: Topology,
    east: KubeApiServer,
    west: KubeApiServer,
    kubeconfigs: [PathBuf; 2],
    _backends: Vec<Backend>,
}

/// `None` (the test said it skipped) where there is no real kube-apiserver.
fn real_clusters(test: &str) -> Option<RealClusters> {
    real_clusters_with(test, |crds| crds)
}

/// The install's CRDs made to serve (and store) v1alpha1 only, as CRDs from before mcs-api
/// v0.5.0 do.
fn v1alpha1_only(crds: String) -> String {
    let beta = "- name: v1beta1\n    served: true\n    storage: true";
    let alpha = "- name: v1alpha1\n    served: true\n    storage: false";
    assert!(crds.contains(beta) && crds.contains(alpha), "the CRDs' versions as this test knows them");
    crds.replace(beta, "- name: v1beta1\n    served: false\n    storage: false")
        .replace(alpha, "- name: v1alpha1\n    served: true\n    storage: true")
}

/// [`real_clusters`] with the install's CRDs as `crds` makes them.
fn real_clusters_with(test: &str, crds: impl Fn(String) -> String) -> Option<RealClusters> {
    let t = Topology::new(2);
    let backends = t.start_backends(8080);
    let east = KubeApiServer::start(&t.node, 16443, test)?;
    let west = KubeApiServer::start(&t.node, 16444, test)?;
    let crds = crds(
        std::fs::read_to_string(install::repo_path("deploy/kubernetes/overlays/mcs/crds.yaml"))
            .expect("CRDs"),
    );
    let kubeconfigs = [t.dir.path().join("east.kubeconfig"), t.dir.path().join("west.kubeconfig")];
    for (api, kubeconfig) in [(&east, &kubeconfigs[0]), (&west, &kubeconfigs[1])] {
        api.install_crds(
            &crds,
            &["serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"],
        );
        api.apply_yaml(&install::rbac_of("overlays/mcs"));
        api.write_kubeconfig(kubeconfig, &api.create_token("kube-system", "kpx-controlplane", &[]));
    }
    east.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    west.apply_yaml(&west_node());
    Some(RealClusters { t, east, west, kubeconfigs, _backends: backends })
}

impl RealClusters {
    fn start_mcs_controller(&self, listen: &str, metrics: &str) -> KpxProcess {
        let sources = [
            format!("east=kubeconfig:{}", self.kubeconfigs[0].display()),
            format!("west=kubeconfig:{}", self.kubeconfigs[1].display()),
        ];
        let extra = [
            &format!("--listen={listen}") as &str,
            &format!("--metrics-listen={metrics}"),
            "--clusterset-cidr=10.200.0.0/24",
            "--mcs-lease=kube-system/kpx-controlplane-mcs",
        ];
        self.t.start_control_plane_from(&sources, &extra)
    }

    /// Service test/web with one ready endpoint in each cluster (pod0 in east, pod1 in
    /// west), exported from both.
    fn export_web_from_both(&self) {
        self.east.apply_yaml(&web("", &pod(0), NODE_NAME, true));
        self.west.apply_yaml(&web("", &pod(1), "node-w", true));
        self.east.apply_yaml(EXPORT);
        self.west.apply_yaml(EXPORT);
    }

    fn control_plane_metric(&self, name: &str) -> Option<f64> {
        let to: std::net::SocketAddr = CONTROL_PLANE.1.parse().expect("the metrics address");
        let (_, body) = self.t.node.run_in(move || http_get_path(to, "/metrics")).ok()?;
        metric_value(&body, name)
    }

    fn imports(&self) -> serde_json::Value {
        imports_of(&self.t)
    }

    fn wait_endpoints_of(&self, service: &str, want: &[String]) {
        wait_endpoints_of(&self.t, service, want);
    }
}

/// The control plane's writes to `api` so far, leases left out: "verb resource ns/name".
fn real_writes(api: &KubeApiServer) -> Vec<String> {
    api.audit()
        .into_iter()
        .filter(|a| a.user == CONTROL_PLANE_USER && a.is_write() && a.resource != "leases")
        .map(|a| format!("{} {}{} {}/{}", a.verb, a.resource, a.subresource, a.namespace, a.name))
        .collect()
}

/// What a test reads of an API server, fake or real.
trait Objects {
    fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<serde_json::Value>;
}

impl Objects for FakeApiServer {
    fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.object(kind, namespace, name)
    }
}

impl Objects for KubeApiServer {
    fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let resource = match kind {
            Kind::ServiceImport => "serviceimports.multicluster.x-k8s.io",
            Kind::ServiceExport => "serviceexports.multicluster.x-k8s.io",
            Kind::EndpointSlice => "endpointslices.discovery.k8s.io",
            other => panic!("{other:?} is not read here"),
        };
        self.object(resource, namespace, name)
    }
}

/// The address of `api`'s ServiceImport test/web, once it has one.
fn import_ip(api: &impl Objects) -> Option<String> {
    api.get(Kind::ServiceImport, "test", "web")?["spec"]["ips"][0].as_str().map(str::to_owned)
}

/// The condition `kind` of `api`'s ServiceExport test/web: (status, reason, message).
fn export_condition(api: &impl Objects, kind: &str) -> Option<(String, String, String)> {
    let export = api.get(Kind::ServiceExport, "test", "web")?;
    let conditions = export["status"]["conditions"].as_array()?.clone();
    let c = conditions.into_iter().find(|c| c["type"] == kind)?;
    let text = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

fn wait_condition(
    api: &impl Objects,
    cluster: &str,
    kind: &str,
    want: impl Fn(&(String, String, String)) -> bool,
) {
    let mut last = None;
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        last = export_condition(api, kind);
        if last.as_ref().is_some_and(&want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{cluster}'s export of test/web: {kind} is {last:?}");
}

/// `api`'s MCS EndpointSlice of test/web's slice web-1 of cluster `source`.
fn mcs_slice(api: &impl Objects, source: &str) -> Option<serde_json::Value> {
    api.get(Kind::EndpointSlice, "test", &format!("web-1-{source}"))
}

#[test]
fn kpx_as_the_mcs_controller_imports_an_export_everywhere_and_says_why_not() {
    let Some(c) = real_clusters("kpx_as_the_mcs_controller") else { return };
    c.export_web_from_both();
    let cp = c.start_mcs_controller(CONTROL_PLANE.0, CONTROL_PLANE.1);
    let _dp = c.t.start_dataplane();

    // One import in each cluster, at one address of --clusterset-cidr.
    let ip = kpx_e2e::wait_for("east's ServiceImport", DEADLINE, || import_ip(&c.east));
    let west_ip = kpx_e2e::wait_for("west's ServiceImport", DEADLINE, || import_ip(&c.west));
    assert_eq!(ip, west_ip, "the same ClusterSetIP in every cluster");
    assert!(ip.starts_with("10.200.0.") && ip != "10.200.0.0" && ip != "10.200.0.255", "{ip}");
    let import = c.east.get(Kind::ServiceImport, "test", "web").expect("east's import");
    assert_eq!(import["spec"]["type"], "ClusterSetIP");
    assert_eq!(import["spec"]["ports"][0]["port"], 80);
    assert_eq!(import["metadata"]["labels"]["app.kubernetes.io/managed-by"], "kpx-controlplane");
    // v1beta1's fields: the Services' family and policy, and the exporting clusters.
    assert_eq!(import["apiVersion"], "multicluster.x-k8s.io/v1beta1", "{import}");
    assert_eq!(import["spec"]["ipFamilies"], serde_json::json!(["IPv4"]), "{import}");
    assert_eq!(import["spec"]["internalTrafficPolicy"], "Cluster", "{import}");
    kpx_e2e::wait_for("status.clusters of east's import", DEADLINE, || {
        let import = c.east.get(Kind::ServiceImport, "test", "web")?;
        (import["status"]["clusters"] == serde_json::json!([{"cluster": "east"}, {"cluster": "west"}]))
            .then_some(())
    });
    for (name, api) in [("east", &c.east), ("west", &c.west)] {
        wait_condition(api, name, "Valid", |(status, _, _)| status == "True");
        wait_condition(api, name, "Conflict", |(status, _, _)| status == "False");
        wait_condition(api, name, "Ready", |(status, reason, _)| status == "True" && reason == "Exported");
    }
    c.t.wait_answered_by(&ip, 80, "pod0");
    c.t.wait_answered_by(&ip, 80, "pod1");

    // Each cluster holds an MCS EndpointSlice per exporting cluster, owned by its import.
    for (name, api) in [("east", &c.east), ("west", &c.west)] {
        let uid = api.get(Kind::ServiceImport, "test", "web").expect("the import")["metadata"]["uid"].clone();
        for (source, address) in [("east", pod(0)), ("west", pod(1))] {
            let slice = kpx_e2e::wait_for(&format!("{name}'s MCS slice of {source}"), DEADLINE, || {
                mcs_slice(api, source)
            });
            let labels = &slice["metadata"]["labels"];
            assert_eq!(labels["multicluster.kubernetes.io/service-name"], "web", "{slice}");
            assert_eq!(labels["multicluster.kubernetes.io/source-cluster"], source, "{slice}");
            assert_eq!(
                labels["endpointslice.kubernetes.io/managed-by"], "kpx-controlplane.kpx.io",
                "{slice}"
            );
            assert!(labels.get("kubernetes.io/service-name").is_none(), "no Service's slice: {slice}");
            assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], uid, "{slice}");
            assert_eq!(slice["endpoints"][0]["addresses"][0], address.as_str(), "{slice}");
            assert_eq!(slice["endpoints"][0]["conditions"]["ready"], true, "{slice}");
        }
    }

    // kpxctl and the metrics say so.
    let imports = c.imports();
    assert_eq!(imports["type"], "ClusterSetIP", "{imports}");
    assert_eq!(imports["ips"], serde_json::json!([ip]), "{imports}");
    assert_eq!(imports["exportedBy"], serde_json::json!(["east", "west"]), "{imports}");
    assert_eq!(imports["importedIn"], serde_json::json!(["east", "west"]), "{imports}");
    assert_eq!(imports["ports"], serde_json::json!(["http 80/TCP"]), "{imports}");
    let table = c.t.kpxctl(&["imports"]);
    assert!(table.status.success(), "kpxctl imports: {}", String::from_utf8_lossy(&table.stderr));
    println!("{}", String::from_utf8_lossy(&table.stdout));
    for (metric, want) in [("kpx_mcs_leader", 1.0), ("kpx_mcs_imports", 1.0), ("kpx_mcs_conflicts", 0.0)] {
        assert_eq!(c.control_plane_metric(metric), Some(want), "{metric}");
    }

    // Settled: nothing is written again (no status churn), over two lease renewals.
    let settled = (real_writes(&c.east), real_writes(&c.west));
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!((real_writes(&c.east), real_writes(&c.west)), settled, "writes after settling");

    // A headless Service exported (in v1alpha1, which the CRDs serve too): a Headless
    // import in both clusters, with no address but its family, and MCS EndpointSlices
    // carrying the endpoints and hostnames of the slice labelled headless.
    let db = "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: test}\n\
              spec: {clusterIP: None, ports: [{name: pg, protocol: TCP, port: 5432}]}\n---\n\
              apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
              metadata: {name: db-1, namespace: test, labels: {kubernetes.io/service-name: db, service.kubernetes.io/headless: ''}}\n\
              addressType: IPv4\nports: [{name: pg, protocol: TCP, port: 5432}]\n\
              endpoints: [{addresses: [10.244.9.7], hostname: db-0, conditions: {ready: true}}]\n---\n\
              apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: db, namespace: test}\n";
    c.west.apply_yaml(db);
    for api in [&c.east, &c.west] {
        let import =
            kpx_e2e::wait_for("the Headless import", DEADLINE, || api.get(Kind::ServiceImport, "test", "db"));
        assert_eq!(import["spec"]["type"], "Headless", "{import}");
        assert!(import["spec"].get("ips").is_none(), "no ClusterSetIP for a Headless import: {import}");
        let service = c.west.object("services", "test", "db").expect("the db Service");
        assert_eq!(import["spec"]["ipFamilies"], service["spec"]["ipFamilies"], "the Service's: {import}");
        let slice = kpx_e2e::wait_for("the Headless import's MCS slice", DEADLINE, || {
            api.get(Kind::EndpointSlice, "test", "db-1-west")
        });
        assert_eq!(slice["endpoints"][0]["addresses"][0], "10.244.9.7", "{slice}");
        assert_eq!(slice["endpoints"][0]["hostname"], "db-0", "{slice}");
        assert_eq!(slice["ports"][0]["port"], 5432, "{slice}");
    }
    c.west.delete("serviceexport", "test", "db");
    kpx_e2e::wait_for("the Headless imports deleted", DEADLINE, || {
        [&c.east, &c.west]
            .iter()
            .all(|api| api.get(Kind::ServiceImport, "test", "db").is_none())
            .then_some(())
    });

    // West's port differs: both exports say so, naming the field and the clusters.
    let other_port = web("", &pod(1), "node-w", true).replace("port: 80}", "port: 81}");
    c.west.apply_yaml(&other_port);
    for (name, api) in [("east", &c.east), ("west", &c.west)] {
        wait_condition(api, name, "Conflict", |(status, reason, message)| {
            status == "True"
                && reason == "PortConflict"
                && message.contains("east")
                && message.contains("west")
        });
    }
    let conflicts = c.imports()["conflicts"].clone();
    assert!(conflicts.to_string().contains("PortConflict"), "kpxctl imports: {conflicts}");
    assert_eq!(c.control_plane_metric("kpx_mcs_conflicts"), Some(1.0));
    cp.wait_event("the conflict logged, naming the field", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("ServiceExport in conflict"))
            && e["object"] == "test/web"
            && e["reason"] == "PortConflict"
    });
    // The import's http is east's 80; west serves its http at 81 only: traffic to the
    // ClusterSetIP's 80 reaches east's endpoint alone (StrictPortConflict).
    c.wait_endpoints_of("test/web.clusterset", &[format!("{}@east", pod(0))]);
    let to = sock(&ip, 80);
    for _ in 0..20 {
        assert_eq!(c.t.client.run_in(move || tcp_request(to)), Answer::From("pod0".into()));
    }
    c.west.apply_yaml(&web("", &pod(1), "node-w", true));
    wait_condition(&c.west, "west", "Conflict", |(status, _, _)| status == "False");

    // An ExternalName Service under an export: not valid, and the import is east's only.
    let external = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: test}\n\
                    spec: {type: ExternalName, externalName: web.example}\n";
    c.west.apply_yaml(external);
    wait_condition(&c.west, "west", "Valid", |(status, reason, _)| {
        status == "False" && reason == "InvalidServiceType"
    });
    cp.wait_event("the invalid export logged, naming the object", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("ServiceExport not valid"))
            && e["cluster"] == "west"
            && e["object"] == "test/web"
            && e["reason"] == "InvalidServiceType"
    });
    c.wait_endpoints_of("test/web.clusterset", &[format!("{}@east", pod(0))]);
    assert_eq!(c.imports()["invalid"], serde_json::json!(["west: InvalidServiceType"]));
    kpx_e2e::wait_for("west's MCS slice to leave east", DEADLINE, || {
        mcs_slice(&c.east, "west").is_none().then_some(())
    });

    // Unexported everywhere: kpx deletes both imports and their slices, and the nodes' rules go.
    c.east.delete("serviceexport", "test", "web");
    c.west.delete("serviceexport", "test", "web");
    kpx_e2e::wait_for("both imports and their slices deleted", DEADLINE, || {
        let imports =
            import_ip(&c.east).is_none() && c.west.get(Kind::ServiceImport, "test", "web").is_none();
        (imports && mcs_slice(&c.east, "east").is_none() && mcs_slice(&c.west, "east").is_none())
            .then_some(())
    });
    kpx_e2e::wait_for("the import's rules to leave the kernel", DEADLINE, || {
        (!clusterset_ip_in_kernel(&c.t)).then_some(())
    });
    mcs_rbac_covers_the_writes(&[&c.east, &c.west]);
}

#[test]
fn where_only_v1alpha1_is_served_kpx_reads_and_writes_it() {
    let Some(c) = real_clusters_with("only_v1alpha1", v1alpha1_only) else { return };
    c.export_web_from_both();
    let _cp = c.start_mcs_controller(CONTROL_PLANE.0, CONTROL_PLANE.1);
    let _dp = c.t.start_dataplane();
    let ip = kpx_e2e::wait_for("east's ServiceImport", DEADLINE, || import_ip(&c.east));
    for (name, api) in [("east", &c.east), ("west", &c.west)] {
        let import = api.get(Kind::ServiceImport, "test", "web").expect("the import");
        assert_eq!(import["apiVersion"], "multicluster.x-k8s.io/v1alpha1", "{import}");
        assert!(import["spec"].get("ipFamilies").is_none(), "no field of v1beta1: {import}");
        wait_condition(api, name, "Valid", |(status, _, _)| status == "True");
        wait_condition(api, name, "Ready", |(status, reason, _)| status == "True" && reason == "Exported");
    }
    c.t.wait_answered_by(&ip, 80, "pod0");
    c.t.wait_answered_by(&ip, 80, "pod1");
    // Settled in v1alpha1 too: what it holds is what kpx planned, so nothing is rewritten.
    let settled = (real_writes(&c.east), real_writes(&c.west));
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!((real_writes(&c.east), real_writes(&c.west)), settled, "writes after settling");
    let paths: Vec<String> =
        c.east.audit().into_iter().filter(|a| a.user == CONTROL_PLANE_USER).map(|a| a.uri).collect();
    assert!(
        paths.iter().all(|p| !p.contains("multicluster.x-k8s.io/v1beta1/namespaces")),
        "no write in a version the API server does not serve: {paths:?}"
    );
}

/// The MCS install (kustomize's overlay and the chart alike), applied to the real API
/// servers, let the control plane make every request it made (none refused), and grants
/// no write it did not make: `group/resource:verb`, from the API servers' audit logs.
fn mcs_rbac_covers_the_writes(apis: &[&KubeApiServer]) {
    let mut asked = std::collections::BTreeSet::new();
    for request in apis.iter().flat_map(|api| api.audit()).filter(|a| a.user == CONTROL_PLANE_USER) {
        assert_ne!(request.code, 403, "refused by the install's RBAC: {request:?}");
        let named_lease = request.resource == "leases" && matches!(request.verb.as_str(), "get" | "update");
        if named_lease {
            asked.insert(format!("{}/{}/{}:{}", request.group, request.resource, request.name, request.verb));
        } else if request.is_write() {
            asked.insert(request.grant());
            // A server-side apply creates what is not there yet: it needs create too.
            if request.verb == "patch" && request.subresource.is_empty() {
                asked.insert(format!("{}/{}:create", request.group, request.resource));
            }
        }
    }
    let installs = [
        ("kubectl kustomize", install::documents(&install::kustomize("overlays/mcs"))),
        ("helm template", install::documents(&install::helm_template(Some("ci/mcs-values.yaml")))),
    ];
    for (how, objects) in installs {
        let mut granted: std::collections::BTreeSet<String> = install::granted_to_control_plane(&objects)
            .into_iter()
            .filter(|g| !g.ends_with(":list") && !g.ends_with(":watch") && !g.contains("tokenreviews"))
            .collect();
        // The Lease's Role, in the control plane's namespace (the lease is kube-system's here).
        granted.extend(
            install::granted_by_roles_to_control_plane(&objects)
                .into_iter()
                .filter_map(|g| g.strip_prefix("kube-system ").map(str::to_owned)),
        );
        assert_eq!(granted, asked, "{how}: exactly the writes the MCS controller makes");
    }
}

#[test]
fn a_writer_killed_with_a_write_left_is_replaced_and_the_next_writes_it() {
    let c = clusters();
    c.east.apply_yaml(&web("", &pod(0), NODE_NAME, true));
    c.east.apply_yaml(EXPORT);
    c.west.set_namespace("test", false);
    let mut first = c.start_mcs_controller(CONTROL_PLANE.0, CONTROL_PLANE.1);
    first.wait_event("the first replica to lead", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("leading"))
    });
    let second = c.start_mcs_controller(REPLICA.0, REPLICA.1);
    let _dp = c.t.start_dataplane();

    // West has no namespace test: the write is refused, tried again, logged once.
    let ip = kpx_e2e::wait_for("east's ServiceImport", DEADLINE, || import_ip(&c.east));
    let tries = || c.west.writes().iter().filter(|w| *w == "APPLY serviceimports test/web").count();
    kpx_e2e::wait_for("three tries of west's import", DEADLINE, || (tries() >= 3).then_some(()));
    let refused: Vec<_> = (first.events().into_iter())
        .filter(|e| e["message"] == "MCS write failed; retrying with backoff")
        .collect();
    assert_eq!(refused.len(), 1, "one cause, logged once: {refused:?}");
    assert_eq!(refused[0]["cluster"], "west");
    assert!(
        refused[0]["error"].as_str().is_some_and(|m| m.contains("namespaces \"test\" not found")),
        "{refused:?}"
    );
    // The export says so, naming the cluster.
    wait_condition(&c.east, "east", "Ready", |(status, reason, message)| {
        status == "False" && reason == "Pending" && message.contains("west")
    });
    c.t.wait_answered_by(&ip, 80, "pod0");

    // The writer killed with west's import unwritten; the namespace comes; the other
    // replica takes the Lease over and writes it, at the same address.
    first.kill();
    let killed = Instant::now();
    c.west.set_namespace("test", true);
    second.wait_event("the second replica to lead", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("leading"))
    });
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "handed over after {took:?}: more than the 15 s lease and a 2 s retry"
    );
    let west_ip = kpx_e2e::wait_for("west's ServiceImport", DEADLINE, || import_ip(&c.west));
    assert_eq!(west_ip, ip, "the address east's import holds");
    wait_condition(&c.east, "east", "Ready", |(status, reason, _)| status == "True" && reason == "Exported");
    println!("handed over {took:?} after the leader was killed");
}

#[test]
fn an_api_server_that_answers_no_write_holds_no_other_clusters_writes() {
    let c = clusters();
    c.west.apply_yaml(&web("", &pod(1), "node-w", true));
    c.west.apply_yaml(EXPORT);
    // East takes connections and answers no write (its Lease still answers: east is the
    // first source, where the writer is elected).
    c.east.set_silent_writes(true);
    let cp = c.start_mcs_controller(CONTROL_PLANE.0, CONTROL_PLANE.1);
    let started = Instant::now();
    kpx_e2e::wait_for("west's ServiceImport, though east is silent", DEADLINE, || import_ip(&c.west));
    println!("west's import written {:?} after the start, east silent", started.elapsed());
    cp.wait_event("east's silence logged", DEADLINE, |e| {
        e["message"] == "MCS write failed; retrying with backoff"
            && e["cluster"] == "east"
            && e["error"].as_str().is_some_and(|m| m.contains("did not answer"))
    });
    // Its failure changes cause (as a cluster that is down alternates between no answer
    // and refused connections): still one WARN for the target until it is written.
    c.east.set_namespace("test", false);
    c.east.set_silent_writes(false);
    let tries = || c.east.writes().iter().filter(|w| *w == "APPLY serviceimports test/web").count();
    kpx_e2e::wait_for("two tries refused for the namespace", DEADLINE, || (tries() >= 2).then_some(()));
    c.east.set_namespace("test", true);
    kpx_e2e::wait_for("east's ServiceImport once it answers", DEADLINE, || import_ip(&c.east));
    cp.wait_event("the write done after failures", DEADLINE, |e| {
        e["message"] == "MCS write done after failures"
            && e["cluster"] == "east"
            && e["kind"] == "ServiceImport"
    });
    let warned: Vec<_> = (cp.events().into_iter())
        .filter(|e| {
            e["message"] == "MCS write failed; retrying with backoff"
                && e["cluster"] == "east"
                && e["kind"] == "ServiceImport"
        })
        .collect();
    assert_eq!(warned.len(), 1, "one WARN while it failed, whatever the cause: {warned:?}");
}
