//! The Kubernetes source: kpx-controlplane reads a cluster through kube-rs and a node
//! agent programs what it serves; traffic proves it.
//!
//! Against the real kube-apiserver (`../shared/k8s`, see harness::kube_apiserver): the
//! control plane runs as the install runs it, with the RBAC the chart and kustomize render
//! and its ServiceAccount's bound token; without the MCS CRDs (a plain-text 404), with a
//! kind it may not list (a real 403), through an API server restart and an outage, with
//! Nodes and ServiceCIDRs as the API server stores them. Against the fake API server
//! (tests/src/harness/fake_apiserver.rs) only what a real one cannot be made to do: a list
//! held back, and history expired under a watch (410 Gone) at a moment the test chooses.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpx_e2e::harness::fake_apiserver::{FakeApiServer, Kind};
use kpx_e2e::harness::install;
use kpx_e2e::harness::kube_apiserver::KubeApiServer;
use kpx_e2e::harness::manifests::{documents, ep, service, slice, web_on_pod, web_on_pod0};
use kpx_e2e::harness::process::KpxProcess;
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::{http_get_path, tcp_request, Answer, Backend};
use kpx_e2e::{wait_for, DEADLINE};

const API_PORT: u16 = 16443;

/// A node with two pods serving :8080, and a real API server in the node's namespace
/// holding its Node object and the install's RBAC.
struct RealCluster {
    t: Topology,
    api: KubeApiServer,
    /// The control plane's kubeconfig: the kpx-controlplane ServiceAccount's token.
    kubeconfig: PathBuf,
    _backends: Vec<Backend>,
}

/// `None` (the test said it skipped) where there is no real kube-apiserver.
fn real_cluster(test: &str) -> Option<RealCluster> {
    let t = Topology::new(2);
    let backends = t.start_backends(8080);
    let api = KubeApiServer::start(&t.node, API_PORT, test)?;
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    api.apply_yaml(&install::rbac());
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, &api.create_token("kube-system", "kpx-controlplane", &[]));
    Some(RealCluster { t, api, kubeconfig, _backends: backends })
}

impl RealCluster {
    fn start_control_plane(&self) -> KpxProcess {
        self.t.start_control_plane_from(&[format!("kubeconfig:{}", self.kubeconfig.display())], &[])
    }

    /// Waits up to `deadline` until `vip:port` is answered by `pod`.
    fn wait_answered_by(&self, vip: &str, port: u16, pod: &str, deadline: Duration) {
        let to = sock(vip, port);
        wait_for(&format!("{to} to be answered by {pod}"), deadline, || {
            (self.t.client.run_in(move || tcp_request(to)) == Answer::From(pod.into())).then_some(())
        });
    }

    /// The control plane's requests that the API server refused with 403 (none, when the
    /// install's RBAC grants all it asks).
    fn refused(&self) -> Vec<(String, String, u64)> {
        self.api.audited("/").into_iter().filter(|(_, _, code)| *code == 403).collect()
    }
}

/// A node, two pods serving :8080, and the fake API server holding the Node object.
struct Cluster {
    t: Topology,
    api: FakeApiServer,
    kubeconfig: PathBuf,
    _backends: Vec<Backend>,
}

fn cluster() -> Cluster {
    let t = Topology::new(2);
    let backends = t.start_backends(8080);
    let api = FakeApiServer::start(&t.node, sock("127.0.0.1", API_PORT));
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    Cluster { t, api, kubeconfig, _backends: backends }
}

impl Cluster {
    fn start_control_plane(&self) -> KpxProcess {
        self.t.start_control_plane_from(&[format!("kubeconfig:{}", self.kubeconfig.display())], &[])
    }
}

/// The control plane's `/readyz` (on its metrics listener).
fn readyz(t: &Topology) -> (u16, String) {
    t.node.run_in(|| http_get_path(sock("127.0.0.1", 18002), "/readyz")).expect("/readyz answers")
}

/// The control plane's overall gRPC health status, as grpcurl reads it.
fn grpc_health(t: &Topology) -> String {
    let grpcurl = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/pyenv/bin/grpcurl");
    let out = t.node.try_exec(
        grpcurl,
        &["-plaintext", kpx_e2e::harness::topology::CONTROL_PLANE_ADDR, "grpc.health.v1.Health/Check"],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    value["status"].as_str().unwrap_or_default().to_owned()
}

/// How many deltas the node agent has applied.
fn applied(dp: &KpxProcess) -> usize {
    dp.events().iter().filter(|e| e["message"] == "delta applied").count()
}

/// How many lists of a kind that is not served a watch may make in `elapsed`: the first,
/// then one after each wait of 1 s doubling to a minute (the control plane's backoff).
fn most_lists_within(elapsed: Duration) -> usize {
    let mut at = Duration::ZERO;
    let mut lists = 1;
    for step in 0.. {
        at += Duration::from_secs(1u64 << step.min(6)).min(Duration::from_secs(60));
        if at > elapsed {
            return lists;
        }
        lists += 1;
    }
    lists
}

/// The default install on a cluster that never installed the MCS CRDs (every cluster that
/// does not use them): the real API server answers their lists with a plain-text
/// `404 page not found`. The control plane is ready and serves Services at once, asks for
/// the two kinds with backoff (not several times a second), and once the CRDs are applied
/// it reads an import written into the cluster with no restart.
#[test]
fn without_the_mcs_crds_the_control_plane_is_ready_and_reads_them_once_installed() {
    let Some(c) = real_cluster("without_the_mcs_crds") else { return };
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let started = Instant::now();
    let cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let (code, body) = readyz(&c.t);
    assert_eq!(code, 200, "/readyz without the MCS CRDs: {body}");
    assert_eq!(grpc_health(&c.t), "SERVING");
    for resource in ["serviceexports", "serviceimports"] {
        let said = cp.wait_event("that the MCS kinds are not served", DEADLINE, |e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&format!("the API server does not serve {resource}")))
        });
        assert_eq!(said["level"], "INFO", "{said}");
    }
    // Let the retries run a while, then count them in the API server's audit log.
    std::thread::sleep(Duration::from_secs(20));
    let elapsed = started.elapsed();
    for resource in ["serviceexports", "serviceimports"] {
        let asked = c.api.audited(&format!("/apis/multicluster.x-k8s.io/v1beta1/{resource}"));
        assert!(asked.iter().all(|(_, _, code)| *code == 404), "{asked:?}");
        let most = most_lists_within(elapsed);
        println!(
            "{resource}: {} lists in {:.0} s while not served (at most {most})",
            asked.len(),
            elapsed.as_secs_f64()
        );
        assert!(!asked.is_empty() && asked.len() <= most, "{} lists in {elapsed:?}: {asked:?}", asked.len());
    }
    let not_served = cp
        .events()
        .iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains("does not serve")))
        .count();
    assert_eq!(not_served, 2, "each kind said once, not at every retry");
    let failed = cp
        .events()
        .iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains("failed; retrying")))
        .count();
    assert_eq!(failed, 0, "a kind that is not served is no failing watch");

    // The CRDs arrive; an import written then (by another MCS controller) reaches the
    // node within the backoff's longest wait, with no restart.
    let crds = std::fs::read_to_string(install::repo_path("deploy/kubernetes/overlays/mcs/crds.yaml"))
        .expect("CRDs");
    c.api.install_crds(
        &crds,
        &["serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"],
    );
    c.api.apply_yaml(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: web, namespace: test}\n---\n\
         apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {name: web, namespace: test}\n\
         spec: {type: ClusterSetIP, ips: [10.200.0.10], ports: [{name: http, protocol: TCP, port: 80}]}\n",
    );
    let written = Instant::now();
    c.wait_answered_by("10.200.0.10", 80, "pod0", Duration::from_secs(90));
    println!("the import answered {:.1} s after it was written", written.elapsed().as_secs_f64());
    cp.wait_event("the MCS kinds to be served", DEADLINE, |e| {
        e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("serviceimports.multicluster.x-k8s.io is served now"))
    });
    assert_eq!(c.refused(), [], "the rendered RBAC grants every request the control plane made");
}

#[test]
fn nothing_is_served_until_every_initial_list_is_complete() {
    let c = cluster();
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    c.api.hold(Kind::EndpointSlice);
    let cp = c.start_control_plane();
    let dp = c.t.start_dataplane();
    wait_for("Services and Nodes listed and watched, EndpointSlices listing", DEADLINE, || {
        let watching = c.api.requests("watch", Kind::Service) > 0 && c.api.requests("watch", Kind::Node) > 0;
        (watching && c.api.requests("list", Kind::EndpointSlice) > 0).then_some(())
    });
    cp.wait_event("the control plane to wait for the lists", DEADLINE, |e| {
        e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("waiting for the initial lists of Services, EndpointSlices"))
    });
    // The Service is known, its endpoints are not: serving it now would program a Service
    // without endpoints (rejecting traffic). Nothing is served at all.
    let out = c.t.kpxctl(&["services"]);
    assert!(
        !out.status.success(),
        "the admin API must have no snapshot yet: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("synced yet"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!c.t.ruleset().contains("10.96.0.10"), "nothing may be programmed before the lists are complete");
    // The control plane accepts the stream (its headers go out) before it has anything to
    // send: the node counts itself connected without a response.
    dp.wait_event("the stream to open with nothing served yet", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("stream open"))
    });
    assert_eq!(applied(&dp), 0);
    // The replica is not ready: its kubelet probe (/readyz) and gRPC health say so.
    let (code, body) = readyz(&c.t);
    assert_eq!(code, 503, "/readyz before the lists are complete: {body}");
    assert!(body.contains("waiting for the first state of default"), "{body}");
    assert_eq!(grpc_health(&c.t), "NOT_SERVING");

    c.api.release(Kind::EndpointSlice);
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let (code, body) = readyz(&c.t);
    assert_eq!(code, 200, "/readyz once every source synced: {body}");
    assert_eq!(grpc_health(&c.t), "SERVING");
    let (code, _) = c.t.node.run_in(|| http_get_path(sock("127.0.0.1", 18002), "/livez")).expect("/livez");
    assert_eq!(code, 200);
    rbac_covers_what_was_asked(&c.api);
}

/// The RBAC the install renders (kustomize and Helm alike) grants the control plane's
/// ServiceAccount every request it made (the fake API server serves nothing else, so
/// anything more would have failed above), and nothing beyond them but the TokenReviews
/// of trust.rs.
fn rbac_covers_what_was_asked(api: &FakeApiServer) {
    for (how, objects) in install::default_installs() {
        let granted = install::granted_to_control_plane(&objects);
        for (kind, resource) in [
            (Kind::Service, "/services"),
            (Kind::EndpointSlice, "discovery.k8s.io/endpointslices"),
            (Kind::Node, "/nodes"),
            (Kind::ServiceCidr, "networking.k8s.io/servicecidrs"),
            (Kind::ServiceExport, "multicluster.x-k8s.io/serviceexports"),
            (Kind::ServiceImport, "multicluster.x-k8s.io/serviceimports"),
        ] {
            for verb in ["list", "watch"] {
                // A kind the API server does not serve (ServiceCIDRs, the MCS CRDs here) is
                // only asked for its list.
                let unserved = matches!(kind, Kind::ServiceCidr | Kind::ServiceExport | Kind::ServiceImport);
                let asked = api.requests(verb, kind) > 0 || (unserved && verb == "watch");
                assert!(asked, "the control plane did {verb} {resource}");
                assert!(
                    granted.contains(&format!("{resource}:{verb}")),
                    "{how} must grant {verb} on {resource}: {granted:?}"
                );
            }
        }
        let beyond: Vec<_> =
            granted.iter().filter(|g| !g.ends_with(":list") && !g.ends_with(":watch")).collect();
        assert_eq!(beyond, ["authentication.k8s.io/tokenreviews:create"], "{how}: nothing else is granted");
        assert_eq!(granted.len(), 13, "{how}: list/watch of the six kinds and TokenReviews: {granted:?}");
    }
}

/// History compacted under every watch (a moment the fake API server lets the test
/// choose): the watches resume from a version that is gone, get 410 Gone, and list
/// everything again; the identical relist sends the node nothing.
#[test]
fn a_relist_after_410_sends_nodes_nothing() {
    let c = cluster();
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let _cp = c.start_control_plane();
    let dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let synced = applied(&dp);
    let lists = c.api.requests("list", Kind::Service);
    c.api.expire_history();
    c.api.drop_watches();
    wait_for("Services listed again after 410", DEADLINE, || {
        (c.api.requests("list", Kind::Service) > lists).then_some(())
    });
    // A change made after the relist reaches the node: the source is live again...
    c.api.apply_yaml(&web_on_pod(1, "web", "10.96.0.10"));
    c.t.wait_answered_by("10.96.0.10", 80, "pod1");
    // ...and the identical relist before it sent the node nothing.
    wait_for("the change to be applied", DEADLINE, || (applied(&dp) > synced).then_some(()));
    assert_eq!(applied(&dp), synced + 1, "one delta for the one change, none for the relist");
}

/// The real API server restarts over the same etcd (its watch cache gone: the watches
/// end and resume); nothing changed meanwhile, so the node receives nothing, and a change
/// made after it reaches the node.
#[test]
fn an_api_server_restart_sends_nodes_nothing() {
    let Some(mut c) = real_cluster("an_api_server_restart") else { return };
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let cp = c.start_control_plane();
    let dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let synced = applied(&dp);
    let asked = |api: &KubeApiServer| api.audited("/apis/discovery.k8s.io/v1/endpointslices").len();
    c.api.stop();
    let before = asked(&c.api);
    c.api.restart();
    wait_for("the EndpointSlice watch to ask again", Duration::from_secs(60), || {
        (asked(&c.api) > before).then_some(())
    });
    c.api.apply_yaml(&web_on_pod(1, "web", "10.96.0.10"));
    c.t.wait_answered_by("10.96.0.10", 80, "pod1");
    wait_for("the change to be applied", DEADLINE, || (applied(&dp) > synced).then_some(()));
    assert_eq!(applied(&dp), synced + 1, "one delta for the change, none for the restart");
    // Each watch said once that it failed, not at every retry.
    let failures = cp
        .events()
        .into_iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains("failed; retrying")))
        .count();
    assert!(failures <= 6, "{failures} failure lines for one restart: {}", cp.log_text());
}

/// The real API server away for 12 s: each watch asks again after 1 s, doubling to at
/// most 5 s, so it is back within about 5 s of the server's return (kube-rs's default
/// waits up to 30 s, longer the longer the outage), and a change made then reaches the
/// node.
#[test]
fn watches_resume_within_seconds_of_an_api_server_outage() {
    let Some(mut c) = real_cluster("watches_resume") else { return };
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let _cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let asked = |api: &KubeApiServer| api.audited("/apis/discovery.k8s.io/v1/endpointslices").len();
    c.api.stop();
    // The outage itself (not a wait for a condition): long enough for the retries to reach
    // their longest wait (1 + 2 + 4 s, then every 5 s).
    std::thread::sleep(Duration::from_secs(12));
    let before = asked(&c.api);
    // restart() returns once the API server answers kubectl.
    c.api.restart();
    let back = Instant::now();
    let resumed = wait_for("the EndpointSlice watch to ask again", DEADLINE, || {
        (asked(&c.api) > before).then(|| back.elapsed())
    });
    println!(
        "the EndpointSlice watch asked again {:.1} s after the API server was ready",
        resumed.as_secs_f64()
    );
    assert!(
        resumed < Duration::from_secs(10),
        "asked again {resumed:?} after the return: the retries wait longer than 5 s"
    );
    c.api.apply_yaml(&web_on_pod(1, "web", "10.96.0.10"));
    c.t.wait_answered_by("10.96.0.10", 80, "pod1");
}

#[test]
fn the_node_objects_zone_feeds_topology_hints() {
    let Some(c) = real_cluster("the_node_objects_zone") else { return };
    let spec = "  clusterIP: 10.96.0.20\n  ports:\n  - {name: http, protocol: TCP, port: 80}\n";
    let hinted = documents(&[
        service("zoned", spec, ""),
        slice(
            "zoned",
            "zoned-1",
            false,
            &[("http", "TCP", 8080)],
            &[
                ep(Topology::pod_ip(0)).for_zone("zone-a"),
                ep(Topology::pod_ip(1)).on("node-b").for_zone("zone-b"),
            ],
        ),
    ]);
    c.api.apply_yaml(&hinted);
    c.api.apply_yaml(
        &node_yaml("node-b", "zone-b")
            .replace("10.0.0.1", "10.0.9.1")
            .replace("10.0.1.1", "10.0.9.2")
            .replace("fd00::1", "fd00:9::1"),
    );
    let _cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.20", 80, "pod0");
    let endpoints_for = |node: &str| -> Vec<String> {
        let out = c.t.kpxctl(&["endpoints", "test/zoned", "--node", node, "-o", "json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        json["views"][0]["view"]["ports"][0]["endpoints"]
            .as_array()
            .map(|a| a.iter().filter_map(|e| e["address"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    assert_eq!(endpoints_for(NODE_NAME), [Topology::pod_ip(0)], "zone-a's node uses zone-a's endpoint");
    assert_eq!(endpoints_for("node-b"), [Topology::pod_ip(1)], "zone-b's node uses zone-b's endpoint");
    // Every connection through node-a stays in zone-a.
    let to = sock("10.96.0.20", 80);
    for _ in 0..20 {
        let answer = c.t.client.run_in(move || tcp_request(to));
        assert_eq!(answer, Answer::From("pod0".into()));
    }
}

/// A control plane whose RBAC predates ServiceCIDRs (a ClusterRole without them, checked
/// by the real API server's authorizer: 403) says so once and serves the rest.
#[test]
fn a_forbidden_service_cidr_list_is_logged_and_everything_else_served() {
    let Some(c) = real_cluster("a_forbidden_service_cidr_list") else { return };
    let role = c.api.kubectl_ok(&["get", "clusterrole", "kpx-controlplane", "-o", "json"]);
    let mut role: serde_json::Value = serde_json::from_str(&role).expect("the ClusterRole");
    let rules = role["rules"].as_array_mut().expect("rules");
    rules.retain(|r| r["apiGroups"][0] != "networking.k8s.io");
    role["metadata"] = serde_json::json!({"name": "kpx-controlplane"});
    c.api.apply_yaml(&serde_yaml::to_string(&role).expect("YAML"));
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let warning = cp.wait_event("the warning about ServiceCIDRs", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("not allowed to list servicecidrs"))
    });
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["resource"], "servicecidrs.networking.k8s.io/v1", "{warning}");
    let refused = c.refused();
    assert!(
        !refused.is_empty() && refused.iter().all(|(_, uri, _)| uri.contains("servicecidrs")),
        "{refused:?}"
    );
}

/// ServiceCIDRs (`networking.k8s.io/v1`) reach every node's config, listed and then
/// watched: the real API server holds the one it made of `--service-cluster-ip-range`
/// (`kubernetes`, 10.96.0.0/12), and with nftables the node holds their ranges (and drops
/// what no Service has in them, see cluster_ip.rs).
#[test]
fn service_cidrs_are_listed_and_watched_into_the_node_config() {
    let Some(c) = real_cluster("service_cidrs_are_listed") else { return };
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let cidr = |name: &str, range: &str| {
        format!("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: {name}}}\nspec: {{cidrs: [{range}]}}\n")
    };
    let _cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    c.t.wait_rules_contain("10.96.0.0/12");
    // Outside --service-cluster-ip-range (10.96.0.0/12), which would hold it.
    c.api.apply_yaml(&cidr("extra", "10.250.0.0/24"));
    c.t.wait_rules_contain("10.250.0.0/24");
    c.api.delete("servicecidr", "", "extra");
    // The API server deletes a ServiceCIDR once its finalizer sees no Service in it.
    wait_for("the deleted ServiceCIDR's range to go", Duration::from_secs(60), || {
        (!c.t.ruleset().contains("10.250.0.0/24")).then_some(())
    });
    assert!(c.t.ruleset().contains("10.96.0.0/12"), "the other one stays");
}
