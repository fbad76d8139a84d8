//! `kind: ServiceExport` and `kind: ServiceImport` (`multicluster.x-k8s.io`, v1beta1, and
//! v1alpha1 where an API server serves no other: its ServiceImport lacks v1beta1's
//! `ipFamilies`, `internalTrafficPolicy`, `trafficDistribution`, `appProtocol` and
//! `status.clusters`).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::service::{cluster_affinity, session_affinity, traffic_policy, SessionAffinityConfig};
use super::{ip, port, protocol, FieldError, Metadata};
use crate::model::{
    Condition, Family, ImportPort, ImportSpec, ImportType, McsVersion, ServiceExport, ServiceImport,
    MANAGED_BY,
};

/// The API group of both kinds.
pub const GROUP: &str = "multicluster.x-k8s.io";

#[derive(Deserialize)]
pub(super) struct ServiceExportManifest {
    metadata: ExportMetadata,
    #[serde(default)]
    spec: ExportSpec,
    #[serde(default)]
    status: ExportStatus,
}

#[derive(Deserialize, Default)]
struct ExportStatus {
    #[serde(default)]
    conditions: Vec<ConditionSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConditionSpec {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    last_transition_time: String,
}

#[derive(Deserialize)]
struct ExportMetadata {
    #[serde(flatten)]
    common: Metadata,
    /// RFC 3339, as the API server writes it; a manifest without one counts as the oldest.
    #[serde(default, rename = "creationTimestamp")]
    creation_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ExportSpec {
    #[serde(default)]
    exported_labels: BTreeMap<String, String>,
    #[serde(default)]
    exported_annotations: BTreeMap<String, String>,
}

pub(super) fn service_export(m: ServiceExportManifest) -> Result<ServiceExport, FieldError> {
    let created = match m.metadata.creation_timestamp.as_deref() {
        None | Some("") => 0,
        Some(text) => text.parse::<jiff::Timestamp>().map(|t| t.as_second()).map_err(|e| {
            ("metadata.creationTimestamp".to_owned(), format!("{text:?} is not an RFC 3339 time: {e}"))
        })?,
    };
    Ok(ServiceExport {
        key: m.metadata.common.key(),
        created,
        labels: m.spec.exported_labels,
        annotations: m.spec.exported_annotations,
        cluster_affinity: cluster_affinity(&m.metadata.common)?,
        conditions: (m.status.conditions.into_iter())
            .map(|c| Condition {
                kind: c.kind,
                status: c.status == "True",
                reason: c.reason,
                message: c.message,
                last_transition: c.last_transition_time,
            })
            .collect(),
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ServiceImportManifest {
    /// `multicluster.x-k8s.io/v1beta1` when absent (a manifest written by hand).
    #[serde(default)]
    api_version: Option<String>,
    metadata: Metadata,
    spec: ImportSpecManifest,
    #[serde(default)]
    status: ImportStatus,
}

#[derive(Deserialize, Default)]
struct ImportStatus {
    #[serde(default)]
    clusters: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    cluster: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImportSpecManifest {
    #[serde(rename = "type")]
    import_type: String,
    #[serde(default)]
    ips: Vec<String>,
    #[serde(default)]
    ports: Vec<ImportPortSpec>,
    #[serde(default)]
    session_affinity: Option<String>,
    #[serde(default)]
    session_affinity_config: Option<SessionAffinityConfig>,
    #[serde(default)]
    ip_families: Vec<String>,
    #[serde(default)]
    internal_traffic_policy: Option<String>,
    #[serde(default)]
    traffic_distribution: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImportPortSpec {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    port: i64,
    #[serde(default)]
    app_protocol: Option<String>,
}

pub(super) fn service_import(m: ServiceImportManifest) -> Result<ServiceImport, FieldError> {
    let version = match m.api_version.as_deref() {
        None => McsVersion::default(),
        Some(text) => text
            .strip_prefix(GROUP)
            .and_then(|v| v.strip_prefix('/'))
            .and_then(McsVersion::named)
            .ok_or_else(|| {
                ("apiVersion".to_owned(), format!("{text:?} is not {GROUP}/v1beta1 or v1alpha1"))
            })?,
    };
    let spec = m.spec;
    let mut labels = m.metadata.labels.clone();
    let managed = labels.remove(MANAGED_BY.0).is_some_and(|v| v == MANAGED_BY.1);
    let import_type = match spec.import_type.as_str() {
        "ClusterSetIP" => ImportType::ClusterSetIp,
        "Headless" => ImportType::Headless,
        other => return Err(("spec.type".into(), format!("{other:?} is not ClusterSetIP or Headless"))),
    };
    let ips = (spec.ips.iter().enumerate())
        .map(|(i, text)| ip(format!("spec.ips[{i}]"), text))
        .collect::<Result<Vec<_>, _>>()?;
    if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv4() == ips[1].is_ipv4()) {
        return Err(("spec.ips".into(), "at most one address of each IP family".into()));
    }
    let ports = (spec.ports.iter().enumerate())
        .map(|(i, p)| {
            Ok(ImportPort {
                name: p.name.clone().unwrap_or_default(),
                protocol: protocol(format!("spec.ports[{i}].protocol"), p.protocol.as_deref())?,
                port: port(format!("spec.ports[{i}].port"), p.port)?,
                app_protocol: p.app_protocol.clone().filter(|a| !a.is_empty()),
            })
        })
        .collect::<Result<Vec<_>, FieldError>>()?;
    let ip_families = (spec.ip_families.iter().enumerate())
        .map(|(i, text)| match text.as_str() {
            "IPv4" => Ok(Family::V4),
            "IPv6" => Ok(Family::V6),
            other => Err((format!("spec.ipFamilies[{i}]"), format!("{other:?} is not IPv4 or IPv6"))),
        })
        .collect::<Result<Vec<_>, FieldError>>()?;
    let internal_traffic_policy = match spec.internal_traffic_policy.as_deref() {
        None => None,
        text => Some(traffic_policy("spec.internalTrafficPolicy", text)?),
    };
    Ok(ServiceImport {
        key: m.metadata.key(),
        spec: ImportSpec {
            import_type,
            ips,
            ports,
            session_affinity_timeout: session_affinity(
                spec.session_affinity.as_deref(),
                spec.session_affinity_config.as_ref(),
            )?,
            labels,
            annotations: m.metadata.annotations.clone(),
            ip_families,
            internal_traffic_policy,
            traffic_distribution: spec.traffic_distribution.filter(|t| !t.is_empty()),
            clusters: m.status.clusters.into_iter().map(|c| c.cluster).collect(),
        },
        managed,
        uid: m.metadata.uid.clone().unwrap_or_default(),
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Object};
    use crate::model::{ClusterAffinity, ImportType};

    #[test]
    fn an_export_is_read_with_its_age_and_exported_metadata() {
        let text = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n\
                    metadata: {name: web, namespace: shop, creationTimestamp: '2026-12-07T09:00:00Z',\n\
                    annotations: {service.kpx.io/affinity: local}}\n\
                    spec: {exportedLabels: {tier: web}}\n";
        let Some(Ok(Object::ServiceExport(e))) = parse(text).pop() else { panic!("not an export") };
        assert_eq!(e.key.to_string(), "shop/web");
        assert_eq!(e.created, 1_796_634_000);
        assert_eq!(e.labels.get("tier").map(String::as_str), Some("web"));
        assert_eq!(e.cluster_affinity, ClusterAffinity::Local);
        let bad = text.replace("2026-12-07T09:00:00Z", "yesterday");
        let Some(Err(e)) = parse(&bad).pop() else { panic!("not an error") };
        assert_eq!(e.field, "metadata.creationTimestamp");
        assert!(e.to_string().contains("ServiceExport shop/web"), "{e}");
    }

    #[test]
    fn an_import_is_read_and_a_bad_field_is_named() {
        let text = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\n\
                    metadata: {name: web, namespace: shop}\n\
                    spec: {type: ClusterSetIP, ips: [10.200.0.10], sessionAffinity: ClientIP,\n\
                    ports: [{name: http, protocol: TCP, port: 80}, {name: dns, protocol: UDP, port: 53}]}\n";
        let Some(Ok(Object::ServiceImport(i))) = parse(text).pop() else { panic!("not an import") };
        assert_eq!(i.spec.import_type, ImportType::ClusterSetIp);
        assert_eq!(i.spec.ips, ["10.200.0.10".parse::<std::net::IpAddr>().expect("ip")]);
        assert_eq!(i.spec.ports.len(), 2);
        assert_eq!(i.spec.session_affinity_timeout, Some(10800));
        for (from, to, field) in [
            ("type: ClusterSetIP", "type: NodePort", "spec.type"),
            ("ips: [10.200.0.10]", "ips: [10.200.0.10, 10.200.0.11]", "spec.ips"),
            ("ips: [10.200.0.10]", "ips: [ten]", "spec.ips[0]"),
            ("port: 53", "port: 70000", "spec.ports[1].port"),
            ("protocol: UDP", "protocol: ICMP", "spec.ports[1].protocol"),
        ] {
            let Some(Err(e)) = parse(&text.replace(from, to)).pop() else { panic!("{to}: not an error") };
            assert_eq!(e.field, field, "{to}: {e}");
        }
    }
}
