//! The fake API server (tests/src/harness/fake_apiserver.rs) holds to the real one: the
//! same requests go to both, and what kpx's clients act on must be the same in each
//! answer — the HTTP status, whether the body is a JSON object or plain text, and the
//! object's `kind`, `reason`, `code` and (for refusals) the start of its `message`. The
//! fake stays only for what a real API server cannot be made to do (a write left
//! unanswered, a namespace missing for one cluster, a list held back, history expired at
//! a chosen moment); everything the tests ask of it besides is asked here of both.

use kpx_e2e::harness::fake_apiserver::FakeApiServer;
use kpx_e2e::harness::install;
use kpx_e2e::harness::kube_apiserver::{KubeApiServer, ADMIN_TOKEN};
use kpx_e2e::harness::netns::Netns;
use kpx_e2e::harness::topology::sock;

/// One request.
struct Request {
    what: &'static str,
    method: &'static str,
    path: String,
    /// (content type, body)
    body: Option<(&'static str, String)>,
}

fn get(what: &'static str, path: &str) -> Request {
    Request { what, method: "GET", path: path.to_owned(), body: None }
}

/// A server-side apply (`PATCH`, `application/apply-patch+yaml`), as kpx's MCS writer sends it.
fn apply(what: &'static str, path: &str, object: serde_json::Value) -> Request {
    let path = format!("{path}?fieldManager=kpx-controlplane&force=true");
    Request { what, method: "PATCH", path, body: Some(("application/apply-patch+yaml", object.to_string())) }
}

fn with_body(what: &'static str, method: &'static str, path: &str, object: serde_json::Value) -> Request {
    Request { what, method, path: path.to_owned(), body: Some(("application/json", object.to_string())) }
}

/// What a client acts on in an answer.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    body: String,
}

/// Sends `request` to `base` from inside `ns` with curl (checking curl's own exit status),
/// and reads what a client acts on.
fn ask(ns: &Netns, base: &str, request: &Request) -> Seen {
    let dir = tempfile::tempdir().expect("temp dir");
    let out_file = dir.path().join("body");
    let mut args = vec![
        "-sk".to_owned(),
        "-X".into(),
        request.method.into(),
        "-H".into(),
        format!("Authorization: Bearer {ADMIN_TOKEN}"),
        "-o".into(),
        out_file.display().to_string(),
        "-w".into(),
        "%{http_code}".into(),
        "--max-time".into(),
        "20".into(),
    ];
    if let Some((content_type, body)) = &request.body {
        let file = dir.path().join("request");
        std::fs::write(&file, body).expect("request body");
        args.extend(["-H".into(), format!("Content-Type: {content_type}")]);
        args.extend(["--data-binary".into(), format!("@{}", file.display())]);
    }
    args.push(format!("{base}{}", request.path));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ns.try_exec("curl", &args);
    assert!(out.status.success(), "curl {}: {}", request.path, String::from_utf8_lossy(&out.stderr));
    let status: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("curl's status code");
    let body = std::fs::read_to_string(&out_file).unwrap_or_default();
    Seen { status, body: what_clients_read(&body) }
}

/// The parts of a body kpx's clients (kube-rs, kpx's own) read: a JSON object's kind,
/// reason, code and the start of its message (a refusal's), a watch event's type and
/// its object's; or that it is plain text, and the text.
fn what_clients_read(body: &str) -> String {
    // A JSON object (pretty-printed by the real API server to curl), or a watch stream's
    // first event on its line.
    let first = body.lines().next().unwrap_or_default();
    let Some(value) = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .or_else(|| serde_json::from_str::<serde_json::Value>(first).ok())
    else {
        return format!("text: {}", body.trim());
    };
    let object = if value.get("type").is_some() { &value["object"] } else { &value };
    let mut seen = Vec::new();
    if let Some(t) = value.get("type").and_then(|t| t.as_str()) {
        seen.push(format!("event {t}"));
    }
    for field in ["kind", "reason", "code"] {
        if let Some(v) = object.get(field) {
            seen.push(format!("{field} {v}"));
        }
    }
    if object["status"] == "Failure" {
        let message = object["message"].as_str().unwrap_or_default();
        seen.push(format!("message {:?}", message.split(':').next().unwrap_or_default()));
    }
    // Discovery: what kpx reads of it, the MCS group's versions (none: not served).
    if object["kind"] == "APIGroupList" {
        let groups = object["groups"].as_array().cloned().unwrap_or_default();
        let mcs = groups.iter().find(|g| g["name"] == "multicluster.x-k8s.io");
        let versions: Vec<&str> = (mcs.and_then(|g| g["versions"].as_array()).into_iter().flatten())
            .filter_map(|v| v["version"].as_str())
            .collect();
        seen.push(format!("multicluster.x-k8s.io versions {versions:?}"));
    }
    seen.join(", ")
}

fn lease(resource_version: Option<&str>) -> serde_json::Value {
    let mut lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "contract", "namespace": "kube-system"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    });
    if let Some(rv) = resource_version {
        lease["metadata"]["resourceVersion"] = rv.into();
    }
    lease
}

fn import(namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"type": "ClusterSetIP", "ips": ["10.200.0.1"], "ports": [{"name": "http", "protocol": "TCP", "port": 80}]},
    })
}

/// Sends `requests` to both and lists where they differ.
fn compare(ns: &Netns, fake: &str, real: &str, requests: &[Request]) -> Vec<String> {
    let mut differ = Vec::new();
    for request in requests {
        let (by_fake, by_real) = (ask(ns, fake, request), ask(ns, real, request));
        println!("{:<48} {} {}", request.what, by_real.status, by_real.body);
        if by_fake != by_real {
            differ.push(format!("{}:\n  real {by_real:?}\n  fake {by_fake:?}", request.what));
        }
    }
    differ
}

#[test]
fn the_fake_api_server_answers_as_the_real_one_does() {
    let ns = Netns::new("contract");
    let Some(real) = KubeApiServer::start(&ns, 16443, "the_fake_api_server_answers_as_the_real_one_does")
    else {
        return;
    };
    let fake = FakeApiServer::start(&ns, sock("127.0.0.1", 16450));
    fake.serve_service_cidrs();
    real.kubectl_ok(&["create", "namespace", "test"]);
    let (fake_url, real_url) = ("http://127.0.0.1:16450".to_owned(), format!("https://{}", real.addr));

    let lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
    let mcs = "/apis/multicluster.x-k8s.io/v1beta1";
    // Before the MCS CRDs: what every cluster that never installed them answers.
    let mut differ = compare(
        &ns,
        &fake_url,
        &real_url,
        &[
            get("discovery, no CRD", "/apis"),
            get("list ServiceExports, no CRD", &format!("{mcs}/serviceexports?limit=500")),
            get("watch ServiceImports, no CRD", &format!("{mcs}/serviceimports?watch=true")),
            get("list of a group nobody serves", "/apis/nothing.example/v1/things"),
            apply(
                "apply a ServiceImport, no CRD",
                &format!("{mcs}/namespaces/test/serviceimports/web"),
                import("test"),
            ),
            get("list Services", "/api/v1/services?limit=500"),
            get("list EndpointSlices", "/apis/discovery.k8s.io/v1/endpointslices?limit=500"),
            get("list Nodes", "/api/v1/nodes?limit=500"),
            get("list ServiceCIDRs", "/apis/networking.k8s.io/v1/servicecidrs?limit=500"),
            get("get a Lease that is not there", &format!("{lease_path}/contract")),
            with_body("create a Lease", "POST", lease_path, lease(None)),
            with_body("create it again", "POST", lease_path, lease(None)),
            with_body(
                "replace it from a version it never had",
                "PUT",
                &format!("{lease_path}/contract"),
                lease(Some("1000000")),
            ),
        ],
    );

    // The CRDs installed: kpx's MCS writes.
    let crds = std::fs::read_to_string(install::repo_path("deploy/kubernetes/overlays/mcs/crds.yaml"))
        .expect("CRDs");
    real.install_crds(
        &crds,
        &["serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"],
    );
    fake.install_mcs_crds();
    // The fake's way to have a namespace missing (every other one is there).
    fake.set_namespace("nowhere", false);
    differ.extend(compare(
        &ns,
        &fake_url,
        &real_url,
        &[
            get("discovery", "/apis"),
            get("list ServiceExports", &format!("{mcs}/serviceexports?limit=500")),
            apply(
                "apply a new ServiceImport",
                &format!("{mcs}/namespaces/test/serviceimports/web"),
                import("test"),
            ),
            apply("apply it unchanged", &format!("{mcs}/namespaces/test/serviceimports/web"), import("test")),
            apply(
                "apply one in a namespace that is not there",
                &format!("{mcs}/namespaces/nowhere/serviceimports/web"),
                import("nowhere"),
            ),
            apply(
                "apply the status of an export that is not there",
                &format!("{mcs}/namespaces/test/serviceexports/web/status"),
                serde_json::json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
                    "metadata": {"name": "web", "namespace": "test"}, "status": {"conditions": []}}),
            ),
            Request {
                what: "delete the ServiceImport",
                method: "DELETE",
                path: format!("{mcs}/namespaces/test/serviceimports/web"),
                body: None,
            },
            Request {
                what: "delete it again",
                method: "DELETE",
                path: format!("{mcs}/namespaces/test/serviceimports/web"),
                body: None,
            },
        ],
    ));
    assert!(
        differ.is_empty(),
        "the fake API server answers otherwise than the real one:\n{}",
        differ.join("\n")
    );
}
