//! The MCS controller's requests, over kube-rs: server-side apply of ServiceImports and
//! of ServiceExports' status (field manager [`FIELD_MANAGER`], forced: kpx owns what it
//! writes), deletion of ServiceImports, and the Lease of leader election.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Map, Value};

use super::plan::SliceObject;
use crate::model::{
    Condition, Family, ImportSpec, ImportType, McsVersion, ObjectKey, TrafficPolicy, MANAGED_BY,
    SLICE_MANAGER,
};
use crate::source::kubernetes::{is_not_found, mcs_resource, ApiClient};
use crate::source::manifest::MCS_GROUP;
use crate::source::manifest::{MANAGED_BY_LABEL, MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL};

/// A request that failed, as the API server or the connection said.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RequestError(#[from] kube::Error);

impl RequestError {
    /// Whether the object's namespace does not exist (a create refused with 404).
    pub fn namespace_missing(&self) -> bool {
        matches!(&self.0, kube::Error::Api(status) if is_not_found(status) && status.message.starts_with("namespaces "))
    }
}

/// The field manager of kpx's server-side applies.
pub const FIELD_MANAGER: &str = "kpx-controlplane";

fn api(client: &ApiClient, kind: &str, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.kube().clone(), namespace, &mcs_resource(kind, client.mcs_version()))
}

fn api_version(version: McsVersion) -> String {
    format!("{MCS_GROUP}/{}", version.name())
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// The ServiceImport `key` as kpx writes it in `version` (its spec; v1alpha1 without the
/// fields v1beta1 added).
pub fn import_manifest(key: &ObjectKey, import: &ImportSpec, version: McsVersion) -> Value {
    let import = import.as_served(version);
    let mut labels: Map<String, Value> =
        import.labels.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    let mut spec = json!({
        "type": match import.import_type {
            ImportType::ClusterSetIp => "ClusterSetIP",
            ImportType::Headless => "Headless",
        },
        "ports": import.ports.iter().map(|p| {
            let mut port = json!({"name": p.name, "protocol": p.protocol.api_name(), "port": p.port});
            if let Some(app) = &p.app_protocol {
                port["appProtocol"] = json!(app);
            }
            port
        }).collect::<Vec<_>>(),
    });
    if !import.ips.is_empty() {
        spec["ips"] = json!(import.ips.iter().map(ToString::to_string).collect::<Vec<_>>());
    }
    if !import.ip_families.is_empty() {
        spec["ipFamilies"] = json!(import.ip_families.iter().map(|f| family_name(*f)).collect::<Vec<_>>());
    }
    if let Some(policy) = import.internal_traffic_policy {
        spec["internalTrafficPolicy"] = json!(match policy {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        });
    }
    if let Some(distribution) = &import.traffic_distribution {
        spec["trafficDistribution"] = json!(distribution);
    }
    match import.session_affinity_timeout {
        Some(timeout) => {
            spec["sessionAffinity"] = json!("ClientIP");
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": timeout}});
        }
        None => spec["sessionAffinity"] = json!("None"),
    }
    json!({
        "apiVersion": api_version(version),
        "kind": "ServiceImport",
        "metadata": {
            "name": key.name, "namespace": key.namespace, "labels": labels,
            "annotations": import.annotations,
        },
        "spec": spec,
    })
}

/// The status of ServiceImport `key` as kpx writes it (v1beta1's `status.clusters`).
pub fn import_status_manifest(key: &ObjectKey, import: &ImportSpec) -> Value {
    json!({
        "apiVersion": api_version(McsVersion::V1Beta1),
        "kind": "ServiceImport",
        "metadata": {"name": key.name, "namespace": key.namespace},
        "status": {"clusters": import.clusters.iter().map(|c| json!({"cluster": c})).collect::<Vec<_>>()},
    })
}

/// Writes the ServiceImport `key`: its spec, and where the API server speaks v1beta1,
/// its status.
pub async fn apply_import(
    client: &ApiClient,
    key: &ObjectKey,
    import: &ImportSpec,
) -> Result<(), RequestError> {
    let version = client.mcs_version();
    let api = api(client, "ServiceImport", &key.namespace);
    let manifest = import_manifest(key, import, version);
    api.patch(&key.name, &apply_params(), &Patch::Apply(&manifest)).await.map_err(RequestError)?;
    if version == McsVersion::V1Beta1 {
        let status = import_status_manifest(key, import);
        api.patch_status(&key.name, &apply_params(), &Patch::Apply(&status)).await.map_err(RequestError)?;
    }
    Ok(())
}

/// Deletes the ServiceImport `key`; one already gone is no error.
pub async fn delete_import(client: &ApiClient, key: &ObjectKey) -> Result<(), RequestError> {
    match api(client, "ServiceImport", &key.namespace).delete(&key.name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if is_not_found(&status) => Ok(()),
        Err(e) => Err(RequestError(e)),
    }
}

pub async fn set_export_conditions(
    client: &ApiClient,
    key: &ObjectKey,
    conditions: &[Condition],
) -> Result<(), RequestError> {
    let conditions: Vec<Value> = (conditions.iter())
        .map(|c| {
            json!({
                "type": c.kind, "status": if c.status { "True" } else { "False" }, "reason": c.reason,
                "message": c.message, "lastTransitionTime": c.last_transition,
            })
        })
        .collect();
    let manifest = json!({
        "apiVersion": api_version(client.mcs_version()),
        "kind": "ServiceExport",
        "metadata": {"name": key.name, "namespace": key.namespace},
        "status": {"conditions": conditions},
    });
    let api = api(client, "ServiceExport", &key.namespace);
    api.patch_status(&key.name, &apply_params(), &Patch::Apply(&manifest))
        .await
        .map(drop)
        .map_err(RequestError)
}

fn slices_api(client: &ApiClient, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<k8s_openapi::api::discovery::v1::EndpointSlice>(&());
    Api::namespaced_with(client.kube().clone(), namespace, &resource)
}

/// The MCS EndpointSlice `key` as kpx writes it, owned by its import of `version`.
pub fn slice_manifest(key: &ObjectKey, slice: &SliceObject, version: McsVersion) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": key.name, "namespace": key.namespace,
            "labels": {
                MCS_SERVICE_NAME_LABEL: slice.spec.service,
                MCS_SOURCE_CLUSTER_LABEL: slice.spec.source_cluster,
                MANAGED_BY_LABEL: SLICE_MANAGER,
            },
            "ownerReferences": [{
                "apiVersion": api_version(version), "kind": "ServiceImport",
                "name": slice.spec.service, "uid": slice.owner_uid,
            }],
        },
        "addressType": if slice.spec.ipv6 { "IPv6" } else { "IPv4" },
        "ports": slice.spec.ports.iter().map(|p| json!({
            "name": p.name, "protocol": p.protocol.api_name(), "port": p.port,
        })).collect::<Vec<_>>(),
        "endpoints": slice.spec.endpoints.iter().map(|e| {
            let mut endpoint = json!({
                "addresses": e.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
            });
            if let Some(hostname) = &e.hostname {
                endpoint["hostname"] = json!(hostname);
            }
            endpoint
        }).collect::<Vec<_>>(),
    })
}

pub async fn apply_slice(
    client: &ApiClient,
    key: &ObjectKey,
    slice: &SliceObject,
) -> Result<(), RequestError> {
    let manifest = slice_manifest(key, slice, client.mcs_version());
    slices_api(client, &key.namespace)
        .patch(&key.name, &apply_params(), &Patch::Apply(&manifest))
        .await
        .map(drop)
        .map_err(RequestError)
}

/// Deletes the MCS EndpointSlice `key`; one already gone is no error.
pub async fn delete_slice(client: &ApiClient, key: &ObjectKey) -> Result<(), RequestError> {
    match slices_api(client, &key.namespace).delete(&key.name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if is_not_found(&status) => Ok(()),
        Err(e) => Err(RequestError(e)),
    }
}

/// A Lease as leader election reads it.
#[derive(Debug, Clone)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    /// `spec.renewTime`, as written (compared for change, not as a clock).
    pub renewed: Option<String>,
    pub duration: Duration,
    pub transitions: i32,
    /// The object, to replace with its resourceVersion (optimistic concurrency).
    object: Lease,
}

fn lease_api(client: &ApiClient, key: &ObjectKey) -> Api<Lease> {
    Api::namespaced(client.kube().clone(), &key.namespace)
}

pub async fn read_lease(client: &ApiClient, key: &ObjectKey) -> Result<Option<LeaseRecord>, RequestError> {
    let Some(object) = lease_api(client, key).get_opt(&key.name).await? else { return Ok(None) };
    let spec = object.spec.clone().unwrap_or_default();
    Ok(Some(LeaseRecord {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        renewed: spec.renew_time.map(|t| t.0.to_string()),
        duration: Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0)),
        transitions: spec.lease_transitions.unwrap_or(0),
        object,
    }))
}

/// Writes the Lease held by `holder`, renewed now: creates it (`known: None`) or
/// replaces `known`. False when another replica wrote it first (409: it already exists,
/// or it changed since `known` was read).
pub async fn write_lease(
    client: &ApiClient,
    key: &ObjectKey,
    known: Option<&LeaseRecord>,
    holder: &str,
    duration: Duration,
) -> Result<bool, RequestError> {
    let now = MicroTime(jiff::Timestamp::now());
    let api = lease_api(client, key);
    let taking = known.is_none_or(|k| k.holder.as_deref() != Some(holder));
    let mut spec = known.and_then(|k| k.object.spec.clone()).unwrap_or_default();
    if taking {
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(known.map_or(0, |k| k.transitions + 1));
    }
    spec = LeaseSpec {
        holder_identity: Some(holder.to_owned()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)),
        renew_time: Some(now),
        ..spec
    };
    let written = match known {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(key.name.clone()),
                    namespace: Some(key.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await.map(drop)
        }
        Some(known) => {
            let lease = Lease { spec: Some(spec), ..known.object.clone() };
            api.replace(&key.name, &PostParams::default(), &lease).await.map(drop)
        }
    };
    match written {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(RequestError(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ImportPort;
    use crate::source::manifest::{parse, Object};
    use kpx_proto::types::Protocol;

    #[test]
    fn an_import_as_written_reads_back_as_it_was_planned() {
        let key = ObjectKey { namespace: "shop".into(), name: "web".into() };
        let port = |name: &str, protocol, port, app: Option<&str>| ImportPort {
            name: name.into(),
            protocol,
            port,
            app_protocol: app.map(Into::into),
        };
        let mut import = ImportSpec {
            import_type: ImportType::ClusterSetIp,
            ips: vec!["10.200.0.5".parse().expect("ip"), "fd00:c5::5".parse().expect("ip")],
            ports: vec![
                port("http", Protocol::Tcp, 80, Some("kubernetes.io/h2c")),
                port("dns", Protocol::Udp, 53, None),
                port("s", Protocol::Sctp, 9, None),
            ],
            session_affinity_timeout: Some(300),
            labels: [("tier".to_owned(), "web".to_owned())].into(),
            annotations: [("owner".to_owned(), "team".to_owned())].into(),
            ip_families: vec![Family::V4, Family::V6],
            internal_traffic_policy: Some(TrafficPolicy::Local),
            traffic_distribution: Some("PreferClose".into()),
            clusters: vec!["east".into(), "west".into()],
        };
        for (headless, version) in
            [(false, McsVersion::V1Beta1), (true, McsVersion::V1Beta1), (false, McsVersion::V1Alpha1)]
        {
            if headless {
                (import.import_type, import.ips, import.session_affinity_timeout) =
                    (ImportType::Headless, vec![], None);
            }
            let mut object = import_manifest(&key, &import, version);
            object["status"] = import_status_manifest(&key, &import)["status"].clone();
            let yaml = serde_yaml::to_string(&object).expect("yaml");
            let Some(Ok(Object::ServiceImport(read))) = parse(&yaml).pop() else {
                panic!("not read back: {yaml}")
            };
            let expected = import.as_served(version);
            let read_spec = ImportSpec { clusters: expected.clusters.clone(), ..read.spec.clone() };
            assert!(read.managed && read.version == version, "{read:?}");
            assert!(read_spec == expected, "{expected:?}\nread back as\n{read:?}");
            if version == McsVersion::V1Beta1 {
                assert_eq!(read.spec.clusters, ["east", "west"]);
            } else {
                assert!(!yaml.contains("ipFamilies") && !yaml.contains("appProtocol"), "{yaml}");
            }
        }
    }

    #[test]
    fn an_mcs_slice_as_written_reads_back_as_it_was_planned() {
        use crate::model::{McsEndpoint, McsSliceSpec, SlicePort};
        let key = ObjectKey { namespace: "shop".into(), name: "web-abc12-west".into() };
        let endpoint = |address: &str, ready: bool| McsEndpoint {
            addresses: vec![address.parse().expect("ip")],
            hostname: ready.then(|| "web-0".to_owned()),
            ready,
            serving: true,
            terminating: !ready,
        };
        for (ipv6, a, b) in [(false, "10.1.0.1", "10.1.0.2"), (true, "fd00::1", "fd00::2")] {
            let slice = SliceObject {
                spec: McsSliceSpec {
                    service: "web".into(),
                    source_cluster: "west".into(),
                    ipv6,
                    ports: vec![SlicePort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
                    endpoints: vec![endpoint(a, true), endpoint(b, false)],
                },
                owner_uid: "uid-7".into(),
            };
            let yaml =
                serde_yaml::to_string(&slice_manifest(&key, &slice, McsVersion::V1Beta1)).expect("yaml");
            let Some(Ok(Object::McsSlice(read))) = parse(&yaml).pop() else {
                panic!("not read back: {yaml}")
            };
            assert!(slice.is(&read), "{slice:?}\nread back as\n{read:?}");
            assert!(
                parse(&yaml).iter().all(|o| !matches!(o, Ok(Object::EndpointSlice(_)))),
                "no Service's slice"
            );
        }
    }
}
