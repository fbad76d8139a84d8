//! The writes an MCS controller makes, served as a kube-apiserver serves them: server-side
//! apply of ServiceImports and EndpointSlices (the patch's fields, the status and the
//! object's identity kept) and of a ServiceExport's status subresource, their deletion,
//! and Leases (get,
//! create, replace refused with 409 Conflict when the resourceVersion is not the newest).
//! An apply that changes nothing changes no resourceVersion and sends no watch event. A
//! namespace a test removed refuses creations in it with 404, as a real one does.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::Router;
use kpx_proto::sync::Locked as _;
use serde_json::{json, Value};

use super::{json_response, key_of, not_found, page_not_found, ApiState, Kind};

type Shared = Arc<Mutex<ApiState>>;

pub(super) fn routes() -> Router<Shared> {
    let mcs = "/apis/multicluster.x-k8s.io/v1beta1/namespaces/{namespace}";
    let leases = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases";
    Router::new()
        .route(
            &format!("{mcs}/serviceimports/{{name}}"),
            patch(|s, p, b| apply(s, p, b, Kind::ServiceImport))
                .delete(|s, p| delete(s, p, Kind::ServiceImport)),
        )
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{name}",
            patch(|s, p, b| apply(s, p, b, Kind::EndpointSlice))
                .delete(|s, p| delete(s, p, Kind::EndpointSlice)),
        )
        .route(
            &format!("{mcs}/serviceexports/{{name}}/status"),
            patch(|s, p, b| apply_status(s, p, b, Kind::ServiceExport)),
        )
        .route(
            &format!("{mcs}/serviceimports/{{name}}/status"),
            patch(|s, p, b| apply_status(s, p, b, Kind::ServiceImport)),
        )
        .route(leases, post(create_lease))
        .route(&format!("{leases}/{{name}}"), get(get_lease).put(replace_lease))
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    (code, body.to_string()).into_response()
}

fn body(bytes: &Bytes) -> Result<Value, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// Waits while the test wants writes unanswered.
async fn while_silent(state: &Shared) {
    while state.locked().silent_writes {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn bad_request(e: serde_json::Error) -> Response {
    status(StatusCode::BAD_REQUEST, "BadRequest", format!("not JSON: {e}"))
}

impl ApiState {
    /// Stores `object` of `kind` as the newest: unchanged (but for its resourceVersion)
    /// it is left as it was; else it gets the next resourceVersion (and, if new, a uid
    /// and creationTimestamp) and a watch event.
    fn put(&mut self, kind: Kind, mut object: Value) -> Value {
        let key = (kind, key_of(&object));
        if let Some(old) = self.objects.get(&key) {
            let mut same = object.clone();
            same["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            if same == *old {
                return old.clone();
            }
        }
        self.revision += 1;
        let revision = self.revision;
        object["metadata"]["resourceVersion"] = json!(revision.to_string());
        let existed = self.objects.contains_key(&key);
        if !existed {
            object["metadata"]["uid"] = json!(format!("uid-{revision}"));
            if object["metadata"].get("creationTimestamp").is_none() {
                object["metadata"]["creationTimestamp"] =
                    json!(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
            }
        }
        self.objects.insert(key, object.clone());
        self.record(kind, if existed { "MODIFIED" } else { "ADDED" }, object.clone());
        object
    }
}

/// The plural a write of `kind` is recorded under.
fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::ServiceImport => "serviceimports",
        Kind::EndpointSlice => "endpointslices",
        _ => "objects",
    }
}

/// The resource as a real API server names it in messages (`serviceimports.multicluster.x-k8s.io`).
fn qualified(kind: Kind) -> &'static str {
    match kind {
        Kind::ServiceImport => "serviceimports.multicluster.x-k8s.io",
        Kind::EndpointSlice => "endpointslices.discovery.k8s.io",
        _ => "objects",
    }
}

/// `PATCH …/NAME` (apply): the patch's fields; the status, uid and creationTimestamp kept.
/// 201 Created for a new object, 200 otherwise, as a real API server answers.
async fn apply(
    State(state): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    bytes: Bytes,
    kind: Kind,
) -> Response {
    while_silent(&state).await;
    if kind == Kind::ServiceImport && !state.locked().mcs_served {
        return page_not_found();
    }
    let mut object = match body(&bytes) {
        Ok(v) => v,
        Err(e) => return bad_request(e),
    };
    let mut s = state.locked();
    s.writes.push(format!("APPLY {} {namespace}/{name}", plural(kind)));
    let old = s.objects.get(&(kind, format!("{namespace}/{name}"))).cloned();
    if old.is_none() && s.missing_namespaces.contains(&namespace) {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("namespaces \"{namespace}\" not found"));
    }
    object["metadata"]["name"] = json!(name);
    object["metadata"]["namespace"] = json!(namespace);
    let created = old.is_none();
    if let Some(old) = old {
        for field in ["uid", "creationTimestamp"] {
            object["metadata"][field] = old["metadata"][field].clone();
        }
        if let Some(status) = old.get("status") {
            object["status"] = status.clone();
        }
    }
    let stored = s.put(kind, object);
    let code = if created { StatusCode::CREATED } else { StatusCode::OK };
    (code, json_response(&stored)).into_response()
}

async fn delete(
    State(state): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    kind: Kind,
) -> Response {
    let mut s = state.locked();
    if kind == Kind::ServiceImport && !s.mcs_served {
        return page_not_found();
    }
    s.writes.push(format!("DELETE {} {namespace}/{name}", plural(kind)));
    let Some(mut object) = s.objects.remove(&(kind, format!("{namespace}/{name}"))) else {
        return not_found(&format!("{} \"{name}\"", qualified(kind)));
    };
    s.revision += 1;
    object["metadata"]["resourceVersion"] = json!(s.revision.to_string());
    let uid = object["metadata"]["uid"].clone();
    s.record(kind, "DELETED", object);
    // An object without finalizers is gone at once: a real API server says so with a Status.
    let (group, resource) = qualified(kind).split_once('.').unwrap_or((qualified(kind), ""));
    json_response(&json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": name, "group": resource, "kind": group, "uid": uid}}))
}

/// `PATCH …/NAME/status` (apply) of a ServiceExport or ServiceImport: the status
/// replaced, nothing else.
async fn apply_status(
    State(state): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    bytes: Bytes,
    kind: Kind,
) -> Response {
    while_silent(&state).await;
    if !state.locked().mcs_served {
        return page_not_found();
    }
    let patch = match body(&bytes) {
        Ok(v) => v,
        Err(e) => return bad_request(e),
    };
    let (plural, qualified) = match kind {
        Kind::ServiceImport => ("serviceimports", "serviceimports.multicluster.x-k8s.io"),
        _ => ("serviceexports", "serviceexports.multicluster.x-k8s.io"),
    };
    let mut s = state.locked();
    s.writes.push(format!("STATUS {plural} {namespace}/{name}"));
    let Some(mut object) = s.objects.get(&(kind, format!("{namespace}/{name}"))).cloned() else {
        return not_found(&format!("{qualified} \"{name}\""));
    };
    object["status"] = patch["status"].clone();
    json_response(&s.put(kind, object))
}

async fn get_lease(State(state): State<Shared>, Path((namespace, name)): Path<(String, String)>) -> Response {
    match state.locked().objects.get(&(Kind::Lease, format!("{namespace}/{name}"))) {
        Some(lease) => json_response(lease),
        None => not_found(&format!("leases.coordination.k8s.io \"{name}\"")),
    }
}

async fn create_lease(State(state): State<Shared>, Path(namespace): Path<String>, bytes: Bytes) -> Response {
    let mut lease = match body(&bytes) {
        Ok(v) => v,
        Err(e) => return bad_request(e),
    };
    lease["metadata"]["namespace"] = json!(namespace);
    let mut s = state.locked();
    if s.objects.contains_key(&(Kind::Lease, key_of(&lease))) {
        let name = lease["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    s.writes.push(format!("CREATE lease {}", key_of(&lease)));
    (StatusCode::CREATED, json_response(&s.put(Kind::Lease, lease))).into_response()
}

async fn replace_lease(
    State(state): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let lease = match body(&bytes) {
        Ok(v) => v,
        Err(e) => return bad_request(e),
    };
    let mut s = state.locked();
    let Some(old) = s.objects.get(&(Kind::Lease, format!("{namespace}/{name}"))) else {
        return not_found(&format!("leases.coordination.k8s.io \"{name}\""));
    };
    if lease["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
        );
    }
    s.writes.push(format!("REPLACE lease {namespace}/{name}"));
    json_response(&s.put(Kind::Lease, lease))
}
