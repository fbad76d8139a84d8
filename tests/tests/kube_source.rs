//! The Kubernetes source: kpx-controlplane reads a cluster through kube-rs from
//! an API server that speaks the real list/watch protocol (tests/src/harness/fake_apiserver.rs),
//! and a node agent programs what it serves; traffic proves it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpx_e2e::harness::fake_apiserver::{FakeApiServer, Kind};
use kpx_e2e::harness::install;
use kpx_e2e::harness::manifests::{documents, ep, service, slice, web_on_pod, web_on_pod0};
use kpx_e2e::harness::process::KpxProcess;
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::{http_get_path, Backend};
use kpx_e2e::{wait_for, DEADLINE};

const API_PORT: u16 = 16443;

struct Cluster {
    t: Topology,
    api: FakeApiServer,
    kubeconfig: PathBuf,
    _backends: Vec<Backend>,
}

/// A node in zone-a, two pods serving :8080, and an API server holding the Node object.
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
                // An API server without ServiceCIDRs is only asked for their list.
                let asked = api.requests(verb, kind) > 0 || (kind == Kind::ServiceCidr && verb == "watch");
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

#[test]
fn a_relist_after_410_and_an_api_server_restart_send_nodes_nothing() {
    let mut c = cluster();
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let _cp = c.start_control_plane();
    let dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let synced = applied(&dp);

    // History compacted and every watch cut: the watches resume from a version that is
    // gone, get 410 Gone, and list everything again.
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

    // The API server restarts (its watch cache gone: relist); nothing changed meanwhile.
    let lists = c.api.requests("list", Kind::EndpointSlice);
    c.api.stop();
    c.api.expire_history();
    c.api.restart();
    wait_for("EndpointSlices listed again after the restart", DEADLINE, || {
        (c.api.requests("list", Kind::EndpointSlice) > lists).then_some(())
    });
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    wait_for("the change to be applied", DEADLINE, || (applied(&dp) > synced + 1).then_some(()));
    assert_eq!(applied(&dp), synced + 2, "one delta for the second change, none for the restart");
}

/// The API server away for 12 s: each watch asks again after 250 ms, doubling to at most
/// 5 s, so it is back within about 5 s of the server's return (kube-rs's default waits up
/// to 30 s, longer the longer the outage), and a change made then reaches the node.
#[test]
fn watches_resume_within_seconds_of_an_api_server_outage() {
    let mut c = cluster();
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let _cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let asked = |api: &FakeApiServer| {
        api.requests("list", Kind::EndpointSlice) + api.requests("watch", Kind::EndpointSlice)
    };
    c.api.stop();
    // The outage itself (not a wait for a condition): long enough for the retries to reach
    // their longest wait (0.25 + 0.5 + 1 + 2 + 4 s, then every 5 s).
    std::thread::sleep(Duration::from_secs(12));
    let before = asked(&c.api);
    c.api.restart();
    let back = Instant::now();
    let resumed = wait_for("the EndpointSlice watch to ask again", DEADLINE, || {
        (asked(&c.api) > before).then(|| back.elapsed())
    });
    println!(
        "the EndpointSlice watch asked again {:.1} s after the API server returned",
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
    let c = cluster();
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
        let answer = c.t.client.run_in(move || kpx_e2e::harness::traffic::tcp_request(to));
        assert_eq!(answer, kpx_e2e::harness::traffic::Answer::From("pod0".into()));
    }
}

/// A control plane not allowed to list ServiceCIDRs (an install whose RBAC predates them)
/// says so once and serves the rest.
#[test]
fn a_forbidden_service_cidr_list_is_logged_and_everything_else_served() {
    let c = cluster();
    c.api.forbid_service_cidrs();
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    let warning = cp.wait_event("the warning about ServiceCIDRs", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("not allowed to list servicecidrs"))
    });
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["resource"], "servicecidrs.networking.k8s.io/v1", "{warning}");
}

/// ServiceCIDRs (`networking.k8s.io/v1`) reach every node's config, listed and then
/// watched: with nftables the node holds their ranges (and drops what no Service has in
/// them, see cluster_ip.rs). The other tests' API server does not serve ServiceCIDRs (404,
/// as before v1.33): the control plane then has none and serves everything else.
#[test]
fn service_cidrs_are_listed_and_watched_into_the_node_config() {
    let c = cluster();
    c.api.serve_service_cidrs();
    c.api.apply_yaml(&web_on_pod0("web", "10.96.0.10"));
    let cidr = |name: &str, range: &str| {
        format!("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: {name}}}\nspec: {{cidrs: [{range}]}}\n")
    };
    c.api.apply_yaml(&cidr("kubernetes", "10.96.0.0/16"));
    let _cp = c.start_control_plane();
    let _dp = c.t.start_dataplane();
    c.t.wait_answered_by("10.96.0.10", 80, "pod0");
    c.t.wait_rules_contain("10.96.0.0/16");
    c.api.apply_yaml(&cidr("extra", "10.100.0.0/24"));
    c.t.wait_rules_contain("10.100.0.0/24");
    c.api.delete(Kind::ServiceCidr, "", "extra");
    wait_for("the deleted ServiceCIDR's range to go", DEADLINE, || {
        (!c.t.ruleset().contains("10.100.0.0/24")).then_some(())
    });
    assert!(c.t.ruleset().contains("10.96.0.0/16"), "the other one stays");
}
