//! `kind: EndpointSlice` (discovery.k8s.io/v1).

use serde::Deserialize;

use super::{ip, port, protocol, FieldError, Metadata, HEADLESS_LABEL};
use crate::model::{
    EndpointSlice, McsEndpoint, McsSlice, McsSliceSpec, SliceEndpoint, SlicePort, SLICE_MANAGER,
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EndpointSliceManifest {
    metadata: Metadata,
    address_type: String,
    #[serde(default)]
    endpoints: Vec<EndpointSpec>,
    #[serde(default)]
    ports: Option<Vec<EndpointPortSpec>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EndpointSpec {
    addresses: Vec<String>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    conditions: Conditions,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    hints: Hints,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Hints {
    #[serde(default)]
    for_zones: Vec<Named>,
    #[serde(default)]
    for_nodes: Vec<Named>,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

#[derive(Deserialize, Default)]
struct Conditions {
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
}

#[derive(Deserialize)]
struct EndpointPortSpec {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    port: Option<i64>,
}

/// The label of an MCS EndpointSlice: the endpoints another cluster exports, written in
/// the importing cluster for its ServiceImport (kpx reads those from their own cluster).
pub const MCS_SERVICE_NAME_LABEL: &str = "multicluster.kubernetes.io/service-name";
/// The exporting cluster an MCS EndpointSlice's endpoints are of.
pub const MCS_SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";
/// Who manages a slice (never Kubernetes' own EndpointSlice controller for MCS slices).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The label of a Service's own slices.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Whether a document is an MCS EndpointSlice (labelled for an import, not a Service):
/// no Service's endpoints; read as an [`McsSlice`].
pub(super) fn is_mcs_slice(value: &serde_yaml::Value) -> bool {
    let labels = value.get("metadata").and_then(|m| m.get("labels"));
    let has = |label: &str| labels.and_then(|l| l.get(label)).is_some();
    has(MCS_SERVICE_NAME_LABEL) && !has(SERVICE_NAME_LABEL)
}

pub(super) fn endpoint_slice(m: EndpointSliceManifest) -> Result<EndpointSlice, FieldError> {
    let key = m.metadata.key();
    let service_name = m
        .metadata
        .labels
        .get(SERVICE_NAME_LABEL)
        .cloned()
        .ok_or_else(|| ("metadata.labels".to_owned(), format!("no {SERVICE_NAME_LABEL} label")))?;
    // A slice labelled headless is one kube-proxy does not watch (it lists slices with
    // `!service.kubernetes.io/headless`): its endpoints are used by no rule, but an MCS
    // export carries them (see `Cluster::slices_of`).
    let headless = m.metadata.labels.contains_key(HEADLESS_LABEL);
    let (ports, endpoints) = match contents(&m)? {
        Some((_, ports, endpoints)) => (ports, endpoints),
        None => (Vec::new(), Vec::new()),
    };
    Ok(EndpointSlice { namespace: key.namespace, name: key.name, service_name, headless, ports, endpoints })
}

/// An MCS EndpointSlice (see [`is_mcs_slice`]).
pub(super) fn mcs_slice(m: EndpointSliceManifest) -> Result<McsSlice, FieldError> {
    let label = |name: &str| m.metadata.labels.get(name).cloned().unwrap_or_default();
    let (ipv6, ports, endpoints) = match contents(&m)? {
        Some((v4, ports, endpoints)) => (!v4, ports, endpoints),
        None => (false, Vec::new(), Vec::new()),
    };
    Ok(McsSlice {
        key: m.metadata.key(),
        managed: label(MANAGED_BY_LABEL) == SLICE_MANAGER,
        spec: McsSliceSpec {
            service: label(MCS_SERVICE_NAME_LABEL),
            source_cluster: label(MCS_SOURCE_CLUSTER_LABEL),
            ipv6,
            ports,
            endpoints: (endpoints.into_iter())
                .map(|e| McsEndpoint {
                    addresses: e.addresses,
                    hostname: e.hostname,
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                })
                .collect(),
        },
    })
}

/// A slice's family (true: IPv4), ports and endpoints; `None` for an FQDN slice.
type Contents = (bool, Vec<SlicePort>, Vec<SliceEndpoint>);

fn contents(m: &EndpointSliceManifest) -> Result<Option<Contents>, FieldError> {
    let want_v4 = match m.address_type.as_str() {
        "IPv4" => true,
        "IPv6" => false,
        // FQDN slices carry no addresses a proxy can use.
        "FQDN" => return Ok(None),
        other => return Err(("addressType".into(), format!("unknown address type {other:?}"))),
    };
    let mut ports = Vec::new();
    for (i, p) in m.ports.iter().flatten().enumerate() {
        // A port without a number means "all ports", which a Service proxy cannot use.
        let Some(number) = p.port else { continue };
        ports.push(SlicePort {
            name: p.name.clone().unwrap_or_default(),
            protocol: protocol(format!("ports[{i}].protocol"), p.protocol.as_deref())?,
            port: port(format!("ports[{i}].port"), number)?,
        });
    }
    let mut endpoints = Vec::new();
    for (i, e) in m.endpoints.iter().enumerate() {
        let mut addresses = Vec::new();
        for (j, text) in e.addresses.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            let address = ip(field.clone(), text)?;
            if address.is_ipv4() != want_v4 {
                return Err((field, format!("{address} does not match addressType {}", m.address_type)));
            }
            addresses.push(address);
        }
        let ready = e.conditions.ready.unwrap_or(true);
        endpoints.push(SliceEndpoint {
            addresses,
            hostname: e.hostname.clone(),
            ready,
            serving: e.conditions.serving.unwrap_or(ready),
            terminating: e.conditions.terminating.unwrap_or(false),
            node_name: e.node_name.clone(),
            zone: e.zone.clone(),
            zone_hints: e.hints.for_zones.iter().map(|h| h.name.clone()).collect(),
            node_hints: e.hints.for_nodes.iter().map(|h| h.name.clone()).collect(),
        });
    }
    Ok(Some((want_v4, ports, endpoints)))
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Object};

    #[test]
    fn a_slice_labelled_headless_keeps_its_endpoints_for_mcs_but_no_proxy_uses_them() {
        let text = "kind: EndpointSlice\nmetadata: {name: s-1, labels: {kubernetes.io/service-name: s, service.kubernetes.io/headless: ''}}\n\
                    addressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: [10.0.0.1], hostname: s-0}]\n";
        let results = parse(text);
        let Some(Ok(Object::EndpointSlice(slice))) = results.first() else { panic!("a slice: {results:?}") };
        assert!(slice.headless && slice.endpoints.len() == 1 && slice.ports.len() == 1, "{slice:?}");
        let mut state = crate::model::ClusterState::default();
        state.slices.insert(crate::model::ClusterState::slice_key(slice), slice.clone());
        let cluster = crate::model::Cluster::new(state);
        let key = crate::model::ObjectKey { namespace: slice.namespace.clone(), name: "s".into() };
        assert!(cluster.slices_of(&key).is_empty(), "a proxy leaves it alone");
        assert_eq!(cluster.exported_slices_of(&key).len(), 1, "an export carries it");
    }

    #[test]
    fn an_mcs_slice_is_read_as_one_and_is_no_services() {
        let text = "kind: EndpointSlice\nmetadata: {name: web-east-1, namespace: shop, labels: {multicluster.kubernetes.io/service-name: web,\n\
                    multicluster.kubernetes.io/source-cluster: east, endpointslice.kubernetes.io/managed-by: kpx-controlplane.kpx.io}}\n\
                    addressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: [10.0.0.1]}]\n";
        let Some(Ok(Object::McsSlice(slice))) = parse(text).pop() else { panic!("{:?}", parse(text)) };
        assert_eq!((slice.spec.service.as_str(), slice.spec.source_cluster.as_str()), ("web", "east"));
        assert!(slice.managed && !slice.spec.ipv6 && slice.spec.endpoints.len() == 1, "{slice:?}");
        let theirs = text.replace("kpx-controlplane.kpx.io", "other-controller");
        let Some(Ok(Object::McsSlice(slice))) = parse(&theirs).pop() else { panic!("not an MCS slice") };
        assert!(!slice.managed, "another controller's");
        let unlabelled = text.replace("multicluster.kubernetes.io/service-name: web", "app: web");
        let err = parse(&unlabelled).remove(0).expect_err("a slice of no Service");
        assert_eq!(err.field, "metadata.labels");
    }

    #[test]
    fn reads_zone_and_node_hints() {
        let text = "kind: EndpointSlice\nmetadata: {name: s-1, labels: {kubernetes.io/service-name: s}}\n\
                    addressType: IPv4\nports: [{port: 80}]\nendpoints:\n\
                    - addresses: [10.0.0.1]\n  zone: a\n  hints: {forZones: [{name: a}, {name: b}], forNodes: [{name: n1}]}\n\
                    - addresses: [10.0.0.2]\n";
        let results = parse(text);
        let Some(Ok(Object::EndpointSlice(slice))) = results.first() else { panic!("a slice: {results:?}") };
        assert_eq!(slice.endpoints[0].zone_hints, ["a", "b"]);
        assert_eq!(slice.endpoints[0].node_hints, ["n1"]);
        assert!(slice.endpoints[1].zone_hints.is_empty() && slice.endpoints[1].node_hints.is_empty());
    }

    #[test]
    fn a_hint_without_a_name_is_named() {
        let text = "kind: EndpointSlice\nmetadata: {name: s-1, labels: {kubernetes.io/service-name: s}}\n\
                    addressType: IPv4\nendpoints:\n- addresses: [10.0.0.1]\n  hints: {forNodes: [{}]}\n";
        let err = parse(text).remove(0).expect_err("no name");
        assert_eq!(err.field, "endpoints[0].hints.forNodes[0]");
    }
}
