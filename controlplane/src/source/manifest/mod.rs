//! Ordinary Kubernetes manifests (YAML or JSON, several documents per file,
//! `kind: List` too) read into the [`crate::model`]. A document that cannot be
//! used is a [`ManifestError`] naming the document and the field; the other
//! documents are still read.

mod mcs;
mod node;
mod service;
mod service_cidr;
mod slice;

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::types::Protocol;
use serde::Deserialize;

use crate::model::{
    EndpointSlice, McsSlice, Node, ObjectKey, Service, ServiceCidr, ServiceExport, ServiceImport,
};
pub use mcs::GROUP as MCS_GROUP;
use mcs::{service_export, service_import};
use node::node;
use service::service;
use service_cidr::service_cidr;
use slice::endpoint_slice;
pub use slice::{MANAGED_BY_LABEL, MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL};

/// The label that makes kube-proxy leave a Service, or an EndpointSlice, alone.
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// One object read from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Service(Service),
    EndpointSlice(EndpointSlice),
    Node(Node),
    ServiceCidr(ServiceCidr),
    ServiceExport(ServiceExport),
    ServiceImport(ServiceImport),
    McsSlice(McsSlice),
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
    match kind.as_str() {
        "List" | "ServiceList" | "EndpointSliceList" | "NodeList" | "ServiceExportList"
        | "ServiceImportList" => {
            if let Some(items) = value.get("items").and_then(|i| i.as_sequence()) {
                for item in items.clone() {
                    read_value(document, item, out);
                }
            }
        }
        "Service" => out.push(read_as(document, value, &kind, service, Object::Service)),
        "EndpointSlice" if slice::is_mcs_slice(&value) => {
            out.push(read_as(document, value, &kind, slice::mcs_slice, Object::McsSlice))
        }
        "EndpointSlice" => out.push(read_as(document, value, &kind, endpoint_slice, Object::EndpointSlice)),
        "Node" => out.push(read_as(document, value, &kind, node, Object::Node)),
        "ServiceCIDR" => out.push(read_as(document, value, &kind, service_cidr, Object::ServiceCidr)),
        "ServiceExport" => out.push(read_as(document, value, &kind, service_export, Object::ServiceExport)),
        "ServiceImport" => out.push(read_as(document, value, &kind, service_import, Object::ServiceImport)),
        _ => {}
    }
}

/// Reads document `document` of `kind` with its manifest type `M` and `reader`; an error
/// names the document, the object and the field.
fn read_as<M: for<'de> Deserialize<'de>, T>(
    document: usize,
    value: serde_yaml::Value,
    kind: &str,
    reader: fn(M) -> Result<T, FieldError>,
    object: fn(T) -> Object,
) -> Result<Object, ManifestError> {
    let (manifest, label) = typed::<M>(value, kind).map_err(|e| ManifestError { document, ..e })?;
    reader(manifest).map(object).map_err(|(field, reason)| ManifestError {
        document,
        object: label,
        field,
        reason,
    })
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
    #[serde(default)]
    uid: Option<String>,
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
            Object::ServiceExport(e) => {
                state.exports.insert(e.key.clone(), e);
            }
            Object::ServiceImport(i) => {
                state.imports.insert(i.key.clone(), i);
            }
            Object::McsSlice(m) => {
                state.mcs_slices.insert(m.key.clone(), m);
            }
        }
    }
    state
}

#[cfg(test)]
mod tests;
