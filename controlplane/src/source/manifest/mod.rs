//! Ordinary Kubernetes manifests (YAML or JSON, several documents per file,
//! `kind: List` too) read into the [`crate::model`]. A document that cannot be
//! used is a [`ManifestError`] naming the document and the field; the other
//! documents are still read.

mod node;
mod service;
mod service_cidr;
mod slice;

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::types::Protocol;
use serde::Deserialize;

use crate::model::{EndpointSlice, Node, ObjectKey, Service, ServiceCidr};
use node::{node, NodeManifest};
use service::{service, ServiceManifest};
use service_cidr::{service_cidr, ServiceCidrManifest};
use slice::{endpoint_slice, EndpointSliceManifest};

/// The label that makes kube-proxy leave a Service, or an EndpointSlice, alone.
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// One object read from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Service(Service),
    EndpointSlice(EndpointSlice),
    Node(Node),
    ServiceCidr(ServiceCidr),
}

/// Why a document was skipped: `document` counts from 0 in its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {document}{object}: {field}: {reason}")]
pub struct ManifestError {
    pub document: usize,
    /// ` (Kind ns/name)` when known, for the message.
    pub object: String,
    pub field: String,
    pub reason: String,
}

/// Reads every document of a manifest file. Documents of other kinds
/// (Deployments, ConfigMaps, …) are ignored.
pub fn parse(text: &str) -> Vec<Result<Object, ManifestError>> {
    let mut out = Vec::new();
    for (document, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match serde_yaml::Value::deserialize(de) {
            Ok(v) => v,
            Err(e) => {
                // The parser can count trailing garbage as one more document
                // (`""(` is a scalar, then a second document that fails);
                // the file's own `---` markers say which document the error is in.
                let document =
                    e.location().map_or(document, |at| document.min(document_at(text, at.index())));
                out.push(Err(ManifestError {
                    document,
                    object: String::new(),
                    field: "<document>".into(),
                    reason: format!("not YAML: {e}"),
                }));
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        };
        read_value(document, value, &mut out);
    }
    out
}

/// Which document (from 0) the byte at `index` is in, counting `---` markers:
/// a marker before any content opens document 0, every later one the next.
fn document_at(text: &str, index: usize) -> usize {
    let mut end = index.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let mut document = 0;
    let mut started = false;
    for line in before.lines() {
        if line.starts_with("---") {
            if started {
                document += 1;
            }
            started = true;
        } else if !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            started = true;
        }
    }
    document
}

/// Reads one object as an API server delivers it (a Service, EndpointSlice or Node);
/// `None` for other kinds.
pub fn object(value: serde_yaml::Value) -> Option<Result<Object, ManifestError>> {
    let mut out = Vec::new();
    read_value(0, value, &mut out);
    out.pop()
}

fn read_value(document: usize, value: serde_yaml::Value, out: &mut Vec<Result<Object, ManifestError>>) {
    if value.is_null() {
        return;
    }
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
    let fail =
        |object: String, field: String, reason: String| ManifestError { document, object, field, reason };
    match kind.as_str() {
        "List" | "ServiceList" | "EndpointSliceList" | "NodeList" => {
            if let Some(items) = value.get("items").and_then(|i| i.as_sequence()) {
                for item in items.clone() {
                    read_value(document, item, out);
                }
            }
        }
        "Service" => out.push(
            typed::<ServiceManifest>(value, "Service")
                .and_then(|(m, label)| {
                    service(m).map(Object::Service).map_err(|(field, reason)| fail(label, field, reason))
                })
                .map_err(|e| ManifestError { document, ..e }),
        ),
        "EndpointSlice" => out.push(
            typed::<EndpointSliceManifest>(value, "EndpointSlice")
                .and_then(|(m, label)| {
                    endpoint_slice(m)
                        .map(Object::EndpointSlice)
                        .map_err(|(field, reason)| fail(label, field, reason))
                })
                .map_err(|e| ManifestError { document, ..e }),
        ),
        "Node" => out.push(
            typed::<NodeManifest>(value, "Node")
                .and_then(|(m, label)| {
                    node(m).map(Object::Node).map_err(|(field, reason)| fail(label, field, reason))
                })
                .map_err(|e| ManifestError { document, ..e }),
        ),
        "ServiceCIDR" => out.push(
            typed::<ServiceCidrManifest>(value, "ServiceCIDR")
                .and_then(|(m, label)| {
                    service_cidr(m)
                        .map(Object::ServiceCidr)
                        .map_err(|(field, reason)| fail(label, field, reason))
                })
                .map_err(|e| ManifestError { document, ..e }),
        ),
        _ => {}
    }
}

/// Deserializes a document, naming the field path on error.
fn typed<T: for<'de> Deserialize<'de>>(
    value: serde_yaml::Value,
    kind: &str,
) -> Result<(T, String), ManifestError> {
    let name = value
        .get("metadata")
        .map(|m| {
            let name = m.get("name").and_then(|n| n.as_str()).unwrap_or("?");
            match m.get("namespace").and_then(|n| n.as_str()) {
                Some(ns) => format!("{ns}/{name}"),
                None if kind == "Node" || kind == "ServiceCIDR" => name.to_owned(),
                None => format!("default/{name}"),
            }
        })
        .unwrap_or_else(|| "?".into());
    let label = format!(" ({kind} {name})");
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(m) => Ok((m, label)),
        Err(e) => Err(ManifestError {
            document: 0,
            object: label,
            field: e.path().to_string(),
            reason: e.into_inner().to_string(),
        }),
    }
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default, rename = "deletionTimestamp")]
    deletion_timestamp: Option<String>,
}

impl Metadata {
    fn key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone().unwrap_or_else(|| "default".into()),
            name: self.name.clone(),
        }
    }
}

/// A field path and what is wrong with its value.
type FieldError = (String, String);

fn protocol(field: String, text: Option<&str>) -> Result<Protocol, FieldError> {
    match text.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err((field, format!("unknown protocol {other:?} (TCP, UDP or SCTP)"))),
    }
}

fn port(field: String, value: i64) -> Result<u16, FieldError> {
    match u16::try_from(value) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err((field, format!("{value} is not a port (1-65535)"))),
    }
}

fn ip(field: String, text: &str) -> Result<IpAddr, FieldError> {
    text.parse().map_err(|_| (field, format!("{text:?} is not an IP address")))
}

/// A CIDR; host bits are cleared (`10.0.0.1/8` is `10.0.0.0/8`), as Kubernetes reads them.
fn cidr(field: String, text: &str) -> Result<IpNet, FieldError> {
    text.trim()
        .parse::<IpNet>()
        .map(|net| net.trunc())
        .map_err(|_| (field, format!("{text:?} is not a CIDR")))
}

/// The state of a manifest text whose documents are all valid (for tests).
#[cfg(test)]
pub(crate) fn state_of(text: &str) -> crate::model::ClusterState {
    let mut state = crate::model::ClusterState::default();
    for object in parse(text) {
        match object.expect("valid manifest") {
            Object::Service(s) => {
                state.services.insert(s.key.clone(), s);
            }
            Object::EndpointSlice(s) => {
                state.slices.insert(ObjectKey { namespace: s.namespace.clone(), name: s.name.clone() }, s);
            }
            Object::Node(n) => {
                state.nodes.insert(n.name.clone(), n);
            }
            Object::ServiceCidr(s) => {
                state.service_cidrs.insert(s.name.clone(), s);
            }
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
  nodeName: n1
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
"#;

    #[test]
    fn reads_services_slices_and_skips_other_kinds() {
        let objects: Vec<_> = parse(GOOD).into_iter().collect::<Result<_, _>>().expect("valid");
        assert_eq!(objects.len(), 2);
        let Object::Service(svc) = &objects[0] else { panic!("first is a Service") };
        assert_eq!(svc.key.to_string(), "shop/web");
        assert_eq!(svc.ports[0].port, 80);
        let Object::EndpointSlice(slice) = &objects[1] else { panic!("second is a slice") };
        assert_eq!(slice.service_name, "web");
        assert_eq!(slice.ports[0].port, 8080);
    }

    #[test]
    fn a_bad_document_names_its_field_and_the_rest_is_read() {
        let text = "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 70000}]}\n---\n\
                    kind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n---\n\
                    kind: Service\nmetadata: {name: c}\nspec: {ports: [{port: eighty}]}\n";
        let results = parse(text);
        assert_eq!(results.len(), 3);
        let err = results[0].as_ref().expect_err("port out of range");
        assert_eq!((err.document, err.field.as_str()), (0, "spec.ports[0].port"));
        assert!(err.to_string().contains("Service default/a"), "{err}");
        assert!(results[1].is_ok());
        let err = results[2].as_ref().expect_err("port not a number");
        assert_eq!((err.document, err.field.as_str()), (2, "spec.ports[0].port"));
    }

    #[test]
    fn a_syntax_error_names_the_document_it_is_in() {
        // The parser reads `""` as a document and the `(` after it as another.
        let err = parse("\"\"(").pop().and_then(Result::err).expect("not YAML");
        assert_eq!((err.document, err.field.as_str()), (0, "<document>"), "{err}");
        let text = "---\nkind: ConfigMap\n---\n# a comment\nkind: Service\nmetadata: [\n";
        let err = parse(text).pop().and_then(Result::err).expect("not YAML");
        assert_eq!(err.document, 1, "{err}");
    }
}

#[cfg(test)]
mod properties {
    //! For any text: every document is an object or an error naming its document and
    //! field; an object's ClusterIPs and ports are what was written.

    use super::*;
    use proptest::prelude::*;

    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            "10\\.96\\.[0-9]{1,3}\\.[0-9]{1,3}",
            "fd00:96::[0-9a-f]{1,4}",
            "-?[0-9]{1,6}",
            "[A-Za-z]{0,10}",
            Just("None".to_owned()),
            Just("{".to_owned()),
            Just("\"\\u0000\"".to_owned()),
            Just("[1, 2]".to_owned()),
        ]
    }

    fn service() -> impl Strategy<Value = String> {
        (
            "[a-z0-9-]{0,12}",
            scalar(),
            prop::collection::vec((scalar(), prop_oneof![Just("TCP"), Just("UDP"), Just("SCTP"), Just("ICMP"), Just("")], scalar(), scalar()), 0..3),
            prop_oneof![Just("ClusterIP"), Just("NodePort"), Just("LoadBalancer"), Just("ExternalName"), Just("Nope")],
            prop_oneof![Just("Local"), Just("Cluster"), Just("Sometimes")],
            prop::collection::vec(scalar(), 0..3),
        )
            .prop_map(|(name, ip, ports, ty, policy, ranges)| {
                let ports: Vec<String> = ports
                    .iter()
                    .map(|(port, proto, target, node)| {
                        format!("{{port: {port}, protocol: {proto}, targetPort: {target}, nodePort: {node}}}")
                    })
                    .collect();
                format!(
                    "kind: Service\napiVersion: v1\nmetadata: {{name: '{name}', namespace: ns}}\nspec:\n  type: {ty}\n  clusterIP: {ip}\n  externalTrafficPolicy: {policy}\n  loadBalancerSourceRanges: [{}]\n  ports: [{}]\n",
                    ranges.join(", "),
                    ports.join(", ")
                )
            })
    }

    fn slice() -> impl Strategy<Value = String> {
        ("[a-z0-9-]{0,8}", prop::collection::vec((scalar(), any::<bool>(), scalar()), 0..3), scalar(), prop_oneof![Just("IPv4"), Just("IPv6"), Just("FQDN"), Just("x")])
            .prop_map(|(name, endpoints, port, family)| {
                let eps: Vec<String> = endpoints
                    .iter()
                    .map(|(a, ready, node)| format!("{{addresses: [{a}], conditions: {{ready: {ready}}}, nodeName: {node}}}"))
                    .collect();
                format!(
                    "kind: EndpointSlice\napiVersion: discovery.k8s.io/v1\nmetadata: {{name: '{name}', namespace: ns, labels: {{kubernetes.io/service-name: web}}}}\naddressType: {family}\nports: [{{name: http, port: {port}}}]\nendpoints: [{}]\n",
                    eps.join(", ")
                )
            })
    }

    fn documents() -> impl Strategy<Value = String> {
        prop::collection::vec(prop_oneof![service(), slice(), ".{0,40}"], 1..4)
            .prop_map(|docs| docs.join("---\n"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_document_is_an_object_or_an_error_naming_its_field(text in documents()) {
            // (Counting with serde_yaml's document iterator never ends after a syntax error.)
            let documents = text.split("---\n").count();
            for result in parse(&text) {
                match result {
                    Ok(Object::Service(s)) => {
                        prop_assert!(s.ports.iter().all(|p| p.port > 0));
                        prop_assert!(s.cluster_ips.len() <= 2);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        prop_assert!(!e.field.is_empty() && !e.reason.is_empty(), "{}", e);
                        prop_assert!(e.document < documents.max(1), "{} of {}", e, documents);
                    }
                }
            }
        }
    }
}
