//! A Kubernetes API server for tests: it speaks the list/watch protocol kube-rs
//! uses (lists with a resourceVersion, chunked watch streams of JSON events,
//! bookmarks, `410 Gone` for an expired resourceVersion) for Services,
//! EndpointSlices, Nodes, ServiceExports and ServiceImports (`multicluster.x-k8s.io/v1beta1`,
//! once a test installs their CRDs) and ServiceCIDRs (once a test asks); until then, and
//! for any path it does not serve, it answers as a real kube-apiserver does: a plain-text
//! `404 page not found` (tests/tests/fake_contract.rs holds it to the real one), and lets a test
//! hold lists, expire history, drop watch connections and restart the server on the same
//! address.

use kpx_proto::sync::Locked as _;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::harness::netns::{Netns, NetnsPlace};

mod writes;

/// The kinds served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
    ServiceExport,
    ServiceImport,
    /// Written and read by name only (leader election), never listed.
    Lease,
}

impl Kind {
    fn of(object: &Value) -> Option<Kind> {
        match object.get("kind")?.as_str()? {
            "Service" => Some(Kind::Service),
            "EndpointSlice" => Some(Kind::EndpointSlice),
            "Node" => Some(Kind::Node),
            "ServiceCIDR" => Some(Kind::ServiceCidr),
            "ServiceExport" => Some(Kind::ServiceExport),
            "ServiceImport" => Some(Kind::ServiceImport),
            _ => None,
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::ServiceCidr => "networking.k8s.io/v1",
            Kind::ServiceExport | Kind::ServiceImport => "multicluster.x-k8s.io/v1beta1",
            Kind::Lease => "coordination.k8s.io/v1",
            _ => "v1",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
            Kind::ServiceExport => "ServiceExport",
            Kind::ServiceImport => "ServiceImport",
            Kind::Lease => "Lease",
        }
    }
}

fn key_of(object: &Value) -> String {
    let meta = &object["metadata"];
    format!("{}/{}", meta["namespace"].as_str().unwrap_or(""), meta["name"].as_str().unwrap_or(""))
}

#[derive(Default)]
struct ApiState {
    /// The newest resourceVersion.
    revision: u64,
    objects: BTreeMap<(Kind, String), Value>,
    /// Every change: (resourceVersion, kind, event type, object).
    history: Vec<(u64, Kind, &'static str, Value)>,
    /// Watches from a resourceVersion older than this get 410 Gone (lists give at least this).
    oldest: u64,
    watches: Vec<(Kind, mpsc::UnboundedSender<Result<Bytes, std::convert::Infallible>>)>,
    held: BTreeSet<Kind>,
    /// What was asked, in order: ("list" | "watch", kind).
    requests: Vec<(&'static str, Kind)>,
    /// What a ServiceCIDR request gets.
    service_cidrs: ServiceCidrs,
    /// The writes of an MCS controller, in order: "APPLY serviceimports ns/name",
    /// "STATUS serviceexports ns/name", "DELETE serviceimports ns/name", "CREATE lease
    /// ns/name", "REPLACE lease ns/name".
    writes: Vec<String>,
    /// Namespaces a test removed: creating an object in one answers 404.
    missing_namespaces: BTreeSet<String>,
    /// Writes of MCS objects and EndpointSlices get no answer while this is set (as from
    /// an API server that accepts connections and is stuck); Leases still answer.
    silent_writes: bool,
    /// Whether the MCS CRDs are installed (ServiceExports and ServiceImports served).
    pub(super) mcs_served: bool,
}

/// How the fake API server answers for ServiceCIDRs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum ServiceCidrs {
    /// 404, as an API server older than v1.33.
    #[default]
    NotServed,
    /// 403, as for a ServiceAccount without RBAC for them.
    Forbidden,
    Served,
}

impl ApiState {
    fn record(&mut self, kind: Kind, event: &'static str, object: Value) {
        let line = json!({"type": event, "object": object});
        self.watches.retain(|(k, tx)| *k != kind || tx.send(Ok(Bytes::from(format!("{line}\n")))).is_ok());
        self.history.push((self.revision, kind, event, object));
    }
}

pub struct FakeApiServer {
    runtime: tokio::runtime::Runtime,
    state: Arc<Mutex<ApiState>>,
    listener_ns: NetnsPlace,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl FakeApiServer {
    /// Serves on `addr` inside `ns` (the control plane's namespace).
    pub fn start(ns: &Netns, addr: SocketAddr) -> FakeApiServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let mut server =
            FakeApiServer { runtime, state: Arc::default(), listener_ns: ns.place(), addr, stop: None };
        server.listen();
        server
    }

    fn listen(&mut self) {
        let addr = self.addr;
        let listener = self.listener_ns.run_in(move || {
            let l = std::net::TcpListener::bind(addr).expect("bind fake API server");
            l.set_nonblocking(true).expect("nonblocking");
            l
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let app = Router::new()
            .route("/version", get(version))
            .route("/apis", get(api_groups))
            .route("/api/v1/services", get(|s, q| serve(s, q, Kind::Service)))
            .route("/apis/discovery.k8s.io/v1/endpointslices", get(|s, q| serve(s, q, Kind::EndpointSlice)))
            .route("/api/v1/nodes", get(|s, q| serve(s, q, Kind::Node)))
            .route("/apis/networking.k8s.io/v1/servicecidrs", get(|s, q| serve(s, q, Kind::ServiceCidr)))
            .route(
                "/apis/multicluster.x-k8s.io/v1beta1/serviceexports",
                get(|s, q| serve(s, q, Kind::ServiceExport)),
            )
            .route(
                "/apis/multicluster.x-k8s.io/v1beta1/serviceimports",
                get(|s, q| serve(s, q, Kind::ServiceImport)),
            )
            .merge(writes::routes())
            .fallback(|| async { page_not_found() })
            .with_state(Arc::clone(&self.state));
        self.runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let stopped = async {
                let _ = stopped.await;
            };
            let _ = axum::serve(listener, app).with_graceful_shutdown(stopped).await;
        });
        self.stop = Some(stop);
    }

    /// A kubeconfig file that points at this server.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{}\"}}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\n",
            self.addr
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    fn lock(&self) -> MutexGuard<'_, ApiState> {
        self.state.locked()
    }

    /// Creates or replaces the objects of a manifest (YAML documents of the served kinds).
    pub fn apply_yaml(&self, yaml: &str) {
        for document in serde_yaml::Deserializer::from_str(yaml) {
            let value: Value = serde::Deserialize::deserialize(document).expect("a YAML document");
            if !value.is_null() {
                self.apply(value);
            }
        }
    }

    /// Creates or replaces one object; as an API server does, it keeps the
    /// `creationTimestamp` of the object it replaces, and sets one (now, to the second) on
    /// an object it creates without one.
    pub fn apply(&self, mut object: Value) {
        let kind = Kind::of(&object).expect("an object of a served kind");
        let mut state = self.lock();
        state.revision += 1;
        let revision = state.revision.to_string();
        object["metadata"]["resourceVersion"] = json!(revision);
        let key = (kind, key_of(&object));
        let created = match state.objects.get(&key) {
            Some(old) => old["metadata"]["creationTimestamp"].clone(),
            None => object["metadata"]
                .get("creationTimestamp")
                .cloned()
                .unwrap_or_else(|| json!(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string())),
        };
        object["metadata"]["creationTimestamp"] = created;
        let existed = state.objects.insert(key, object.clone()).is_some();
        state.record(kind, if existed { "MODIFIED" } else { "ADDED" }, object);
    }

    /// The object of `kind` named `namespace/name`, as the server holds it.
    pub fn object(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(&(kind, format!("{namespace}/{name}"))).cloned()
    }

    /// The MCS controller's writes so far (see [`ApiState::writes`]).
    pub fn writes(&self) -> Vec<String> {
        self.lock().writes.clone()
    }

    /// Leaves the writes of MCS objects and EndpointSlices unanswered (`true`) until
    /// called with `false`.
    pub fn set_silent_writes(&self, silent: bool) {
        self.lock().silent_writes = silent;
    }

    /// Removes a namespace (creations in it answer 404) or, with `present`, brings it back.
    pub fn set_namespace(&self, namespace: &str, present: bool) {
        let mut state = self.lock();
        if present {
            state.missing_namespaces.remove(namespace);
        } else {
            state.missing_namespaces.insert(namespace.to_owned());
        }
    }

    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut state = self.lock();
        let Some(mut object) = state.objects.remove(&(kind, format!("{namespace}/{name}"))) else { return };
        state.revision += 1;
        object["metadata"]["resourceVersion"] = json!(state.revision.to_string());
        state.record(kind, "DELETED", object);
    }

    /// Serves ServiceExports and ServiceImports from now on (their CRDs installed).
    pub fn install_mcs_crds(&self) {
        self.lock().mcs_served = true;
    }

    /// Serves ServiceCIDRs from now on (as an API server of v1.33 or newer does).
    pub fn serve_service_cidrs(&self) {
        self.lock().service_cidrs = ServiceCidrs::Served;
    }

    /// Refuses ServiceCIDR requests with 403 Forbidden from now on.
    pub fn forbid_service_cidrs(&self) {
        self.lock().service_cidrs = ServiceCidrs::Forbidden;
    }

    /// Lists of `kind` wait until [`FakeApiServer::release`].
    pub fn hold(&self, kind: Kind) {
        self.lock().held.insert(kind);
    }

    pub fn release(&self, kind: Kind) {
        self.lock().held.remove(&kind);
    }

    /// Forgets the history (as etcd compaction does): a watch that resumes from
    /// before now gets 410 Gone and must list again.
    pub fn expire_history(&self) {
        let mut state = self.lock();
        state.revision += 1;
        state.oldest = state.revision;
        state.history.clear();
    }

    /// Ends every watch stream (the connections close; clients resume from their last version).
    pub fn drop_watches(&self) {
        self.lock().watches.clear();
    }

    /// How many lists and watches of `kind` were asked for.
    pub fn requests(&self, what: &str, kind: Kind) -> usize {
        self.lock().requests.iter().filter(|(w, k)| *w == what && *k == kind).count()
    }

    /// Stops serving (the address refuses connections) until [`FakeApiServer::restart`].
    pub fn stop(&mut self) {
        // Shutdown first, then the watches end: a watch ended before the shutdown began was
        // asked again at once on its kept-alive connection, which the shutdown then waited
        // for, so that client never saw the restart (a flaky relist test).
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Until the address is free again, any watch still registered is ended.
        let addr = self.addr;
        crate::wait_for("the fake API server to stop listening", crate::DEADLINE, || {
            self.drop_watches();
            self.listener_ns.run_in(move || std::net::TcpListener::bind(addr).is_ok()).then_some(())
        });
        self.drop_watches();
    }

    /// Serves again on the same address, with the same objects (as a restarted API server
    /// over the same etcd).
    pub fn restart(&mut self) {
        self.listen();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.drop_watches();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What a real kube-apiserver answers for a path it does not serve (a group or version not
/// installed, a wrong path): plain text, not a `Status`.
pub(super) fn page_not_found() -> Response {
    (StatusCode::NOT_FOUND, [("content-type", "text/plain; charset=utf-8")], "404 page not found\n")
        .into_response()
}

fn json_response(value: &Value) -> Response {
    ([("content-type", "application/json")], value.to_string()).into_response()
}

async fn version() -> Response {
    json_response(&json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-kpx-fake", "gitCommit": "0",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64"
    }))
}

/// `GET /apis`: the groups it serves (what kpx's discovery of the MCS version reads), the
/// MCS group (v1beta1, preferred, and v1alpha1) once its CRDs are installed.
async fn api_groups(State(state): State<Arc<Mutex<ApiState>>>) -> Response {
    let group = |name: &str, versions: &[&str]| {
        let versions: Vec<Value> =
            (versions.iter()).map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
        json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
    };
    let mut groups = vec![
        group("discovery.k8s.io", &["v1"]),
        group("networking.k8s.io", &["v1"]),
        group("coordination.k8s.io", &["v1"]),
    ];
    if state.locked().mcs_served {
        groups.push(group("multicluster.x-k8s.io", &["v1beta1", "v1alpha1"]));
    }
    json_response(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

fn param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').filter_map(|p| p.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
}

async fn serve(State(state): State<Arc<Mutex<ApiState>>>, RawQuery(query): RawQuery, kind: Kind) -> Response {
    let query = query.unwrap_or_default();
    let lock = || state.locked();
    let watch = matches!(param(&query, "watch"), Some("true" | "1"));
    lock().requests.push((if watch { "watch" } else { "list" }, kind));
    if matches!(kind, Kind::ServiceExport | Kind::ServiceImport) && !lock().mcs_served {
        return page_not_found();
    }
    let refusal = match lock().service_cidrs {
        _ if kind != Kind::ServiceCidr => None,
        ServiceCidrs::Served => None,
        ServiceCidrs::NotServed => return page_not_found(),
        ServiceCidrs::Forbidden => Some((
            StatusCode::FORBIDDEN,
            "Forbidden",
            "servicecidrs.networking.k8s.io is forbidden: cannot list resource \"servicecidrs\"",
        )),
    };
    if let Some((code, reason, message)) = refusal {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16()});
        return (code, status.to_string()).into_response();
    }
    if !watch {
        while lock().held.contains(&kind) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = lock();
        let items: Vec<Value> =
            s.objects.iter().filter(|((k, _), _)| *k == kind).map(|(_, o)| o.clone()).collect();
        let list = json!({
            "apiVersion": kind.api_version(), "kind": format!("{}List", kind.name()),
            "metadata": {"resourceVersion": s.revision.to_string()}, "items": items,
        });
        return json_response(&list);
    }
    let from: u64 = param(&query, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let bookmarks = param(&query, "allowWatchBookmarks") == Some("true");
    let (tx, rx) = mpsc::unbounded_channel();
    {
        let mut s = lock();
        if from < s.oldest {
            let gone = json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from} ({})", s.oldest), "reason": "Expired", "code": 410
            }});
            return (StatusCode::OK, format!("{gone}\n")).into_response();
        }
        for (revision, k, event, object) in &s.history {
            if *k == kind && *revision > from {
                let line = json!({"type": event, "object": object});
                let _ = tx.send(Ok(Bytes::from(format!("{line}\n"))));
            }
        }
        if bookmarks {
            let line = json!({"type": "BOOKMARK", "object": {
                "kind": kind.name(), "apiVersion": kind.api_version(),
                "metadata": {"resourceVersion": s.revision.to_string()}
            }});
            let _ = tx.send(Ok(Bytes::from(format!("{line}\n"))));
        }
        s.watches.push((kind, tx));
    }
    let body = Body::from_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    Response::builder()
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn not_found(what: &str) -> Response {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{what} not found"), "reason": "NotFound", "code": 404});
    (StatusCode::NOT_FOUND, status.to_string()).into_response()
}
