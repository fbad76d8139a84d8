//! kpx never routes its own way home: a node agent finds its control plane without the
//! rules kpx itself programs. The agent is given the control plane as its Service's name
//! (`kpx-controlplane.kube-system.svc`, which no DNS here resolves, as cluster DNS does
//! not once its own ClusterIP is not routed) and the API server's real address; the
//! control plane runs in a pod's network namespace and is replaced at another pod's
//! address, as a Deployment scaled to zero and back is. Real processes, the real
//! kube-apiserver (`../shared/k8s`; the agent and the control plane with the install's RBAC
//! and their ServiceAccounts' tokens), traffic through the node's kernel.

use std::time::Duration;

use kpx_e2e::harness::install;
use kpx_e2e::harness::kube_apiserver::KubeApiServer;
use kpx_e2e::harness::manifests::web_on_pod;
use kpx_e2e::harness::process::{binary, KpxProcess};
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, NODE_NAME};
use kpx_e2e::harness::traffic::{http_get_path, metric_value, tcp_request_within, Answer};
use kpx_e2e::{wait_for, DEADLINE};

const API_PORT: u16 = 16443;
const URL: &str = "http://kpx-controlplane.kube-system.svc:18000";
/// Who the agent is to the API server, with its ServiceAccount's token.
const AGENT_USER: &str = "system:serviceaccount:kube-system:kpx-dataplane";

struct Cluster {
    t: Topology,
    api: KubeApiServer,
    /// The control plane's (its ServiceAccount's token, the API server as pods reach it).
    kubeconfig: std::path::PathBuf,
    /// The agent's ServiceAccount token.
    agent_token: std::path::PathBuf,
    _backends: Vec<kpx_e2e::harness::traffic::Backend>,
}

/// A node, three pods serving :8080, the real API server holding the Node, `web` (pod 2)
/// and the install's RBAC; `None` (the test said it skipped) without one.
fn cluster(test: &str) -> Option<Cluster> {
    let t = Topology::new(3);
    let backends = t.start_backends(8080);
    let api = KubeApiServer::start(&t.node, API_PORT, test)?;
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    api.apply_yaml(&web_on_pod(2, "web", "10.96.0.10"));
    api.apply_yaml(&install::rbac());
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_pod_kubeconfig(&kubeconfig, &api.create_token("kube-system", "kpx-controlplane", &[]));
    let agent_token = t.dir.path().join("agent-token");
    std::fs::write(&agent_token, api.create_token("kube-system", "kpx-dataplane", &[])).expect("token");
    Some(Cluster { t, api, kubeconfig, agent_token, _backends: backends })
}

impl Cluster {
    /// The control plane's Service and its one endpoint, pod `pod`'s :18000.
    fn control_plane_service(&self, pod: usize) {
        self.api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: kpx-controlplane, namespace: kube-system}}\n\
             spec: {{clusterIP: 10.96.0.50, ports: [{{name: grpc, port: 18000, protocol: TCP, targetPort: grpc}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: kpx-controlplane-1, namespace: kube-system, labels: {{kubernetes.io/service-name: kpx-controlplane}}}}\n\
             addressType: IPv4\nports: [{{name: grpc, port: 18000, protocol: TCP}}]\n\
             endpoints: [{{addresses: ['{}'], nodeName: {NODE_NAME}, conditions: {{ready: true}}}}]\n",
            Topology::pod_ip(pod)
        ));
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
            format!("--api-server=https://{}", self.api.from_pods()),
            format!("--api-server-ca={}", self.api.ca().display()),
            format!("--api-server-token-file={}", self.agent_token.display()),
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

    /// The Events of `reason` on this node's Node, as the API server holds them.
    fn events(&self, reason: &str) -> usize {
        let out = self.api.kubectl_ok(&["get", "events", "-A", "-o", "json"]);
        let events: serde_json::Value = serde_json::from_str(&out).expect("kubectl's JSON");
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == NODE_NAME)
            .count()
    }

    /// What the agent asked the API server: `NAMESPACE group/resource[/name]:verb`, as RBAC
    /// grants it, and whether each was allowed.
    fn agent_requests(&self) -> Vec<(String, u64)> {
        self.api
            .audit()
            .into_iter()
            .filter(|a| a.user == AGENT_USER)
            .map(|a| {
                let name = if a.verb == "get" { format!("/{}", a.name) } else { String::new() };
                (format!("{} {}/{}{name}:{}", a.namespace, a.group, a.resource, a.verb), a.code)
            })
            .collect()
    }
}

/// Whether a request from the client to `vip:80` gets no answer from any pod.
fn unanswered(t: &Topology, vip: &str) -> bool {
    let to = sock(vip, 80);
    !matches!(t.client.run_in(move || tcp_request_within(to, Duration::from_secs(2))), Answer::From(_))
}

#[test]
fn an_agent_with_nothing_stored_finds_the_control_plane_through_the_api_server_and_follows_it() {
    let Some(c) = cluster("an_agent_with_nothing_stored") else { return };
    c.control_plane_service(0);
    let mut first = c.start_control_plane_in(0);
    // Nothing stored, no DNS, no rule for the control plane's ClusterIP: only the API
    // server's address leads to it.
    let dp = c.start_agent();
    c.t.wait_answered_by("10.96.0.10", 80, "pod2");
    dp.wait_event("the agent to have asked the API server", DEADLINE, |e| {
        e["message"] == "asked the API server where the control plane is"
    });
    let listed = c.api.audit().into_iter().any(|a| {
        a.user == AGENT_USER
            && a.verb == "list"
            && a.resource == "endpointslices"
            && a.uri.contains("labelSelector=kubernetes.io%2Fservice-name%3Dkpx-controlplane")
    });
    assert!(listed, "{:?}", c.agent_requests());
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
    c.control_plane_service(1);
    let _second = c.start_control_plane_in(1);
    c.api.apply_yaml(&web_on_pod(0, "web2", "10.96.0.11"));
    c.t.wait_answered_by("10.96.0.11", 80, "pod0");
    wait_for("a Normal Event: reachable again", DEADLINE, || {
        (c.events("ControlPlaneReachable") == 1).then_some(())
    });
    assert!(c.seconds_since_contact() < 6.0, "{}", c.seconds_since_contact());
    assert_eq!(c.events("ControlPlaneUnreachable"), 1, "one Event per outage");
    rbac_covers_what_the_agent_asked(&c);
}

/// The RBAC the install renders (kustomize and Helm alike), applied to the real API
/// server, allowed the agent's ServiceAccount every request it made, and grants nothing
/// more.
fn rbac_covers_what_the_agent_asked(c: &Cluster) {
    let requests = c.agent_requests();
    assert!(requests.iter().all(|(_, code)| *code != 403), "refused: {requests:?}");
    let asked: std::collections::BTreeSet<String> = requests.into_iter().map(|(r, _)| r).collect();
    assert_eq!(asked.len(), 3, "{asked:?}");
    for (how, objects) in kpx_e2e::harness::install::default_installs() {
        assert_eq!(kpx_e2e::harness::install::granted_to_agent(&objects), asked, "{how}");
    }
}

#[test]
fn a_reinstall_is_a_new_install_and_its_earlier_state_is_not_programmed() {
    let Some(c) = cluster("a_reinstall_is_a_new_install") else { return };
    c.control_plane_service(0);
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
    // The Service made again gets a new uid from the API server: a new install.
    c.api.delete("service", "test", "web");
    c.api.delete("endpointslice", "test", "web-1");
    c.api.delete("service", "kube-system", "kpx-controlplane");
    wait_for("the control plane's Service to be gone", DEADLINE, || {
        c.api.object("services", "kube-system", "kpx-controlplane").is_none().then_some(())
    });
    c.control_plane_service(1);
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
