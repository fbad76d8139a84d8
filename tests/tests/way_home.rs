//! kpx never routes its own way home: a node agent finds its control plane without the
//! rules kpx itself programs. The agent is given the control plane as its Service's name
//! (`kpx-controlplane.kube-system.svc`, which no DNS here resolves, as cluster DNS does
//! not once its own ClusterIP is not routed) and the API server's real address; the
//! control plane runs in a pod's network namespace and is replaced at another pod's
//! address, as a Deployment scaled to zero and back is. Real processes, the fake API
//! server's list/watch protocol, traffic through the node's kernel.

use std::time::Duration;

use kpx_e2e::harness::fake_apiserver::{FakeApiServer, Kind};
use kpx_e2e::harness::manifests::web_on_pod;
use kpx_e2e::harness::process::{binary, KpxProcess};
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::{http_get_path, metric_value, tcp_request_within, Answer};
use kpx_e2e::{wait_for, DEADLINE};
use serde_json::json;

const API_PORT: u16 = 16443;
/// The node's address towards pod 0: the API server's real address, reachable from the
/// node and every pod.
const API_HOST: &str = "10.244.1.1";
const URL: &str = "http://kpx-controlplane.kube-system.svc:18000";

struct Cluster {
    t: Topology,
    api: FakeApiServer,
    kubeconfig: std::path::PathBuf,
    _backends: Vec<kpx_e2e::harness::traffic::Backend>,
}

/// A node, three pods serving :8080, an API server holding the Node and `web` (pod 2).
fn cluster() -> Cluster {
    let t = Topology::new(3);
    let backends = t.start_backends(8080);
    let api = FakeApiServer::start(&t.node, sock(API_HOST, API_PORT));
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    api.apply_yaml(&web_on_pod(2, "web", "10.96.0.10"));
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    Cluster { t, api, kubeconfig, _backends: backends }
}

impl Cluster {
    /// The control plane's Service (install `uid`) and its one endpoint, pod `pod`'s :18000.
    fn control_plane_service(&self, uid: &str, pod: usize) {
        self.api.apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kpx-controlplane", "namespace": "kube-system", "uid": uid},
            "spec": {"clusterIP": "10.96.0.50", "ports": [{"name": "grpc", "port": 18000, "protocol": "TCP", "targetPort": "grpc"}]},
        }));
        self.api.apply(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kpx-controlplane-1", "namespace": "kube-system",
                         "labels": {"kubernetes.io/service-name": "kpx-controlplane"}},
            "addressType": "IPv4",
            "ports": [{"name": "grpc", "port": 18000, "protocol": "TCP"}],
            "endpoints": [{"addresses": [Topology::pod_ip(pod)], "nodeName": NODE_NAME, "conditions": {"ready": true}}],
        }));
    }

    /// A control plane replica in pod `pod`'s network namespace, reading the API server.
    fn start_control_plane_in(&self, pod: usize) -> KpxProcess {
        let ip = Topology::pod_ip(pod);
        let args = [
            format!("--source=kubeconfig:{}", self.kubeconfig.display()),
            format!("--listen={ip}:18000"),
            format!("--metrics-listen={ip}:18002"),
            "--insecure".to_owned(),
        ];
        let log = self.t.dir.path().join(format!("controlplane-pod{pod}-{}.log", std::process::id()));
        let log = (0..).map(|n| log.with_extension(format!("{n}.log"))).find(|p| !p.exists()).unwrap_or(log);
        KpxProcess::start(&self.t.pods[pod], "kpx-controlplane", &args, log)
    }

    /// The node agent: the control plane by its Service's name, the API server by address.
    fn start_agent(&self) -> KpxProcess {
        let extra = [
            "--insecure".to_owned(),
            format!("--api-server=http://{API_HOST}:{API_PORT}"),
            "--control-plane-keepalive=2s".to_owned(),
        ];
        self.t.start_agent(NODE_NAME, URL, "state", &extra)
    }

    /// `kpx-dataplane --probe=KIND [--pod-uid=…]` run on the node: did it pass?
    fn probe(&self, kind: &str, pod_uid: Option<&str>) -> bool {
        let mut args = vec![format!("--probe={kind}")];
        args.extend(pod_uid.map(|u| format!("--pod-uid={u}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.t.node.try_exec(&binary("kpx-dataplane").display().to_string(), &args);
        out.status.success()
    }

    /// The agent's `kpx_xds_seconds_since_contact`.
    fn seconds_since_contact(&self) -> f64 {
        let (_, text) = self
            .t
            .node
            .run_in(|| http_get_path(sock("127.0.0.1", 10249), "/metrics"))
            .expect("the agent's metrics answer");
        metric_value(&text, "kpx_xds_seconds_since_contact").expect("kpx_xds_seconds_since_contact")
    }

    fn events(&self, reason: &str) -> usize {
        self.api
            .events()
            .iter()
            .filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == NODE_NAME)
            .count()
    }
}

/// Whether a request from the client to `vip:80` gets no answer from any pod.
fn unanswered(t: &Topology, vip: &str) -> bool {
    let to = sock(vip, 80);
    !matches!(t.client.run_in(move || tcp_request_within(to, Duration::from_secs(2))), Answer::From(_))
}

#[test]
fn an_agent_with_nothing_stored_finds_the_control_plane_through_the_api_server_and_follows_it() {
    let c = cluster();
    c.control_plane_service("install-1", 0);
    let mut first = c.start_control_plane_in(0);
    // Nothing stored, no DNS, no rule for the control plane's ClusterIP: only the API
    // server's address leads to it.
    let dp = c.start_agent();
    c.t.wait_answered_by("10.96.0.10", 80, "pod2");
    dp.wait_event("the agent to have asked the API server", DEADLINE, |e| {
        e["message"] == "asked the API server where the control plane is"
    });
    assert!(
        c.api.agent_requests().iter().any(|r| r == "LIST endpointslices kube-system kpx-controlplane"),
        "{:?}",
        c.api.agent_requests()
    );
    wait_for("the agent to be ready", DEADLINE, || c.probe("ready", None).then_some(()));
    assert!(c.probe("live", None));
    assert!(!c.probe("ready", Some("another-pod")), "an answer that does not name this pod must not count");

    // The control plane goes away (scaled to zero). The node's rules for its Service still
    // point at the old pod; the agent says it is cut off: a metric, then an Event.
    first.kill();
    wait_for("a Warning Event on the Node", Duration::from_secs(60), || {
        (c.events("ControlPlaneUnreachable") == 1).then_some(())
    });
    assert!(c.seconds_since_contact() >= 6.0, "{}", c.seconds_since_contact());
    let status = c.t.kpxctl(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains("not connected") && status.contains("last contact"), "{status}");

    // It comes back at another pod's address; a Service created meanwhile reaches the node.
    c.control_plane_service("install-1", 1);
    let _second = c.start_control_plane_in(1);
    c.api.apply_yaml(&web_on_pod(0, "web2", "10.96.0.11"));
    c.t.wait_answered_by("10.96.0.11", 80, "pod0");
    wait_for("a Normal Event: reachable again", DEADLINE, || {
        (c.events("ControlPlaneReachable") == 1).then_some(())
    });
    assert!(c.seconds_since_contact() < 6.0, "{}", c.seconds_since_contact());
    assert_eq!(c.events("ControlPlaneUnreachable"), 1, "one Event per outage");
    rbac_covers_what_the_agent_asked(&c.api);
}

/// The RBAC the install renders (kustomize and Helm alike) grants the agent's
/// ServiceAccount every request it made of the API server, and nothing more.
fn rbac_covers_what_the_agent_asked(api: &FakeApiServer) {
    let asked: std::collections::BTreeSet<String> = api
        .agent_requests()
        .iter()
        .map(|r| match r.as_str() {
            "GET service kube-system/kpx-controlplane" => {
                "kube-system /services/kpx-controlplane:get".to_owned()
            }
            "LIST endpointslices kube-system kpx-controlplane" => {
                "kube-system discovery.k8s.io/endpointslices:list".to_owned()
            }
            "POST event" => "default /events:create".to_owned(),
            other => panic!("the agent asked {other}"),
        })
        .collect();
    assert_eq!(asked.len(), 3, "{asked:?}");
    for (how, objects) in kpx_e2e::harness::install::default_installs() {
        assert_eq!(kpx_e2e::harness::install::granted_to_agent(&objects), asked, "{how}");
    }
}

#[test]
fn a_reinstall_is_a_new_install_and_its_earlier_state_is_not_programmed() {
    let c = cluster();
    c.control_plane_service("install-1", 0);
    let mut cp = c.start_control_plane_in(0);
    let mut dp = c.start_agent();
    c.t.wait_answered_by("10.96.0.10", 80, "pod2");
    dp.terminate();
    cp.kill();
    // The node restarts (its rules are gone, its state stays) while kpx is uninstalled and
    // installed again: a new control plane Service, and `web` deleted meanwhile.
    let flushed = c.t.node.try_exec("nft", &["flush", "ruleset"]);
    assert!(flushed.status.success(), "{}", String::from_utf8_lossy(&flushed.stderr));
    assert!(unanswered(&c.t, "10.96.0.10"), "the rules are gone, as after a reboot");
    c.api.delete(Kind::Service, "test", "web");
    c.api.delete(Kind::EndpointSlice, "test", "web-1");
    c.api.delete(Kind::Service, "kube-system", "kpx-controlplane");
    c.control_plane_service("install-2", 1);
    c.api.apply_yaml(&web_on_pod(0, "web2", "10.96.0.11"));

    // The agent starts before the new control plane: it must not program the earlier
    // install's state, and is not ready.
    let dp = c.start_agent();
    dp.wait_event("the agent to set the earlier install's state aside", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("the stored state is an earlier install's"))
    });
    assert!(unanswered(&c.t, "10.96.0.10"), "the earlier install's Service was programmed");
    assert!(!c.probe("ready", None), "ready without ever reaching a control plane");
    let (code, body) =
        c.t.node.run_in(|| http_get_path(sock("127.0.0.1", 10256), "/readyz")).expect("/readyz answers");
    assert!(code == 503 && body.contains("\"controlPlaneReached\":false"), "{code} {body}");

    let _cp = c.start_control_plane_in(1);
    c.t.wait_answered_by("10.96.0.11", 80, "pod0");
    wait_for("the agent to be ready", DEADLINE, || c.probe("ready", None).then_some(()));
    assert!(unanswered(&c.t, "10.96.0.10"));
}
