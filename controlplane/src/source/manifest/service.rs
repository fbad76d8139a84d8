//! `kind: Service`.

use std::net::IpAddr;

use serde::Deserialize;

use super::{cidr, ip, port, protocol, FieldError, Metadata};
use crate::model::ClusterAffinity;

/// Marks a Service global: one Service across the clusters that mark it so.
pub const GLOBAL_ANNOTATION: &str = "service.kpx.io/global";
/// A global Service's preference for its own cluster's endpoints: `local`, `remote`, `none`.
pub const AFFINITY_ANNOTATION: &str = "service.kpx.io/affinity";

fn global(metadata: &Metadata) -> Result<bool, FieldError> {
    match metadata.annotations.get(GLOBAL_ANNOTATION).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err((
            format!("metadata.annotations[{GLOBAL_ANNOTATION}]"),
            format!("{other:?} is not \"true\" or \"false\""),
        )),
    }
}

/// The IPVS scheduler for one Service (nodes running `--backend ipvs`).
pub const IPVS_SCHEDULER_ANNOTATION: &str = "service.kpx.io/ipvs-scheduler";

fn ipvs_scheduler(metadata: &Metadata) -> Result<Option<String>, FieldError> {
    match metadata.annotations.get(IPVS_SCHEDULER_ANNOTATION) {
        None => Ok(None),
        Some(s) if kpx_proto::types::IPVS_SCHEDULERS.contains(&s.as_str()) => Ok(Some(s.clone())),
        Some(other) => Err((
            format!("metadata.annotations[{IPVS_SCHEDULER_ANNOTATION}]"),
            format!("{other:?} is not one of {}", kpx_proto::types::IPVS_SCHEDULERS.join(", ")),
        )),
    }
}

pub(super) fn cluster_affinity(metadata: &Metadata) -> Result<ClusterAffinity, FieldError> {
    match metadata.annotations.get(AFFINITY_ANNOTATION).map(String::as_str) {
        None | Some("none") => Ok(ClusterAffinity::None),
        Some("local") => Ok(ClusterAffinity::Local),
        Some("remote") => Ok(ClusterAffinity::Remote),
        Some(other) => Err((
            format!("metadata.annotations[{AFFINITY_ANNOTATION}]"),
            format!("{other:?} is not local, remote or none"),
        )),
    }
}
use crate::model::{Family, Service, ServicePort, ServiceType, TrafficPolicy};

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when not given (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;
/// The longest session affinity Kubernetes accepts (one day).
const MAX_AFFINITY_TIMEOUT: u32 = 86400;

#[derive(Deserialize)]
pub(super) struct ServiceManifest {
    metadata: Metadata,
    #[serde(default)]
    spec: ServiceSpec,
    #[serde(default)]
    status: ServiceStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ServiceSpec {
    #[serde(rename = "type")]
    service_type: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Option<Vec<String>>,
    #[serde(default)]
    ports: Vec<ServicePortSpec>,
    #[serde(rename = "externalIPs", default)]
    external_ips: Vec<String>,
    #[serde(default)]
    load_balancer_source_ranges: Vec<String>,
    external_traffic_policy: Option<String>,
    internal_traffic_policy: Option<String>,
    health_check_node_port: Option<i64>,
    session_affinity: Option<String>,
    session_affinity_config: Option<SessionAffinityConfig>,
    #[serde(default)]
    ip_families: Vec<String>,
    traffic_distribution: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServicePortSpec {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    port: i64,
    #[serde(default)]
    node_port: Option<i64>,
    #[serde(default)]
    app_protocol: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct SessionAffinityConfig {
    #[serde(rename = "clientIP")]
    client_ip: Option<ClientIpConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ClientIpConfig {
    timeout_seconds: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ServiceStatus {
    #[serde(default)]
    load_balancer: LoadBalancerStatus,
}

#[derive(Deserialize, Default)]
struct LoadBalancerStatus {
    #[serde(default)]
    ingress: Vec<Ingress>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ingress {
    #[serde(default)]
    ip: Option<String>,
    #[serde(default)]
    ip_mode: Option<String>,
}

/// The Service's IP families are those of its ClusterIPs: an external or load-balancer
/// address of another family could never be served, and kube-proxy ignores just that
/// address (a cloud load balancer may add an IPv6 one to a single-stack IPv4 Service).
/// `None` for such an address, logged with the Service and the field.
fn of_service_family(service: &str, field: &str, address: IpAddr, cluster_ips: &[IpAddr]) -> Option<IpAddr> {
    // Headless and ExternalName Services have no ClusterIP and are not proxied: nothing to check.
    if cluster_ips.is_empty() || cluster_ips.iter().any(|c| c.is_ipv4() == address.is_ipv4()) {
        return Some(address);
    }
    tracing::warn!(service, field, %address, "ignoring an address of an IP family the Service does not have");
    None
}

pub(super) fn traffic_policy(field: &str, text: Option<&str>) -> Result<TrafficPolicy, FieldError> {
    match text.unwrap_or_default() {
        "" | "Cluster" => Ok(TrafficPolicy::Cluster),
        "Local" => Ok(TrafficPolicy::Local),
        other => Err((field.into(), format!("unknown traffic policy {other:?} (Cluster or Local)"))),
    }
}

/// A port that Kubernetes leaves out when unset: 0 and absent mean none.
fn optional_port(field: String, value: Option<i64>) -> Result<Option<u16>, FieldError> {
    match value {
        None | Some(0) => Ok(None),
        Some(v) => port(field, v).map(Some),
    }
}

/// `spec.sessionAffinity` and its config (of a Service, or a ServiceImport): the
/// ClientIP timeout in seconds, `None` for no affinity.
pub(super) fn session_affinity(
    affinity: Option<&str>,
    config: Option<&SessionAffinityConfig>,
) -> Result<Option<u32>, FieldError> {
    match affinity.unwrap_or_default() {
        "" | "None" => Ok(None),
        "ClientIP" => {
            let timeout = config.and_then(|c| c.client_ip.as_ref()).and_then(|c| c.timeout_seconds);
            let Some(t) = timeout else { return Ok(Some(DEFAULT_AFFINITY_TIMEOUT)) };
            match u32::try_from(t) {
                Ok(seconds) if (1..=MAX_AFFINITY_TIMEOUT).contains(&seconds) => Ok(Some(seconds)),
                _ => Err((
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds".into(),
                    format!("{t} is not between 1 and {MAX_AFFINITY_TIMEOUT}"),
                )),
            }
        }
        other => Err((
            "spec.sessionAffinity".into(),
            format!("unknown session affinity {other:?} (None or ClientIP)"),
        )),
    }
}

/// `spec.ipFamilies` (`IPv4`, `IPv6`, at most one of each); when absent, the families
/// of the ClusterIPs in their order.
fn ip_families(written: &[String], cluster_ips: &[IpAddr]) -> Result<Vec<Family>, FieldError> {
    if written.is_empty() {
        return Ok(cluster_ips.iter().map(Family::of).collect());
    }
    let mut families = Vec::with_capacity(written.len());
    for (i, text) in written.iter().enumerate() {
        let family = match text.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            other => return Err((format!("spec.ipFamilies[{i}]"), format!("{other:?} is not IPv4 or IPv6"))),
        };
        if families.contains(&family) {
            return Err((format!("spec.ipFamilies[{i}]"), format!("{text} is given twice")));
        }
        families.push(family);
    }
    Ok(families)
}

pub(super) fn service(m: ServiceManifest) -> Result<Service, FieldError> {
    let spec = m.spec;
    let service_type = match spec.service_type.as_deref().unwrap_or("ClusterIP") {
        "ClusterIP" => ServiceType::ClusterIp,
        "NodePort" => ServiceType::NodePort,
        "LoadBalancer" => ServiceType::LoadBalancer,
        "ExternalName" => ServiceType::ExternalName,
        other => return Err(("spec.type".into(), format!("unknown Service type {other:?}"))),
    };
    let mut cluster_ips = Vec::new();
    let headless = |t: &str| t.is_empty() || t == "None";
    match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => {
            for (i, text) in ips.iter().enumerate() {
                if !headless(text) {
                    cluster_ips.push(ip(format!("spec.clusterIPs[{i}]"), text)?);
                }
            }
        }
        (_, Some(text)) if !headless(text) => cluster_ips.push(ip("spec.clusterIP".into(), text)?),
        _ => {}
    }
    if cluster_ips.len() == 2 && cluster_ips[0].is_ipv4() == cluster_ips[1].is_ipv4() {
        return Err(("spec.clusterIPs".into(), "two addresses of the same family".into()));
    }
    let has_node_ports = matches!(service_type, ServiceType::NodePort | ServiceType::LoadBalancer);
    let mut ports = Vec::with_capacity(spec.ports.len());
    for (i, p) in spec.ports.iter().enumerate() {
        let node_port = optional_port(format!("spec.ports[{i}].nodePort"), p.node_port)?;
        if node_port.is_some() && !has_node_ports {
            return Err((
                format!("spec.ports[{i}].nodePort"),
                "only NodePort and LoadBalancer Services have node ports".into(),
            ));
        }
        ports.push(ServicePort {
            name: p.name.clone().unwrap_or_default(),
            protocol: protocol(format!("spec.ports[{i}].protocol"), p.protocol.as_deref())?,
            port: port(format!("spec.ports[{i}].port"), p.port)?,
            node_port,
            app_protocol: p.app_protocol.clone().filter(|a| !a.is_empty()),
        });
    }
    let service_name = m.metadata.key().to_string();
    let mut external_ips = Vec::new();
    for (i, text) in spec.external_ips.iter().enumerate() {
        let field = format!("spec.externalIPs[{i}]");
        let address = ip(field.clone(), text)?;
        external_ips.extend(of_service_family(&service_name, &field, address, &cluster_ips));
    }
    let mut load_balancer_ips = Vec::new();
    for (i, ingress) in m.status.load_balancer.ingress.iter().enumerate() {
        // Hostname-only entries carry no address; `ipMode: Proxy` load balancers
        // send traffic to the nodes' addresses, so kube-proxy leaves their IPs alone.
        match ingress.ip_mode.as_deref().unwrap_or("VIP") {
            "VIP" => {}
            "Proxy" => continue,
            other => {
                return Err((
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    format!("unknown IP mode {other:?} (VIP or Proxy)"),
                ))
            }
        }
        let Some(text) = ingress.ip.as_deref().filter(|t| !t.is_empty()) else { continue };
        let field = format!("status.loadBalancer.ingress[{i}].ip");
        let address = ip(field.clone(), text)?;
        load_balancer_ips.extend(of_service_family(&service_name, &field, address, &cluster_ips));
    }
    let load_balancer_source_ranges = spec
        .load_balancer_source_ranges
        .iter()
        .enumerate()
        .map(|(i, text)| cidr(format!("spec.loadBalancerSourceRanges[{i}]"), text))
        .collect::<Result<Vec<_>, _>>()?;
    let ip_families = ip_families(&spec.ip_families, &cluster_ips)?;
    Ok(Service {
        key: m.metadata.key(),
        service_type,
        ip_families,
        traffic_distribution: spec.traffic_distribution.clone().filter(|t| !t.is_empty()),
        cluster_ips,
        ports,
        proxy_name: m.metadata.labels.get("service.kubernetes.io/service-proxy-name").cloned(),
        headless_label: m.metadata.labels.contains_key(super::HEADLESS_LABEL),
        external_ips,
        load_balancer_ips,
        load_balancer_source_ranges,
        external_traffic_policy: traffic_policy(
            "spec.externalTrafficPolicy",
            spec.external_traffic_policy.as_deref(),
        )?,
        internal_traffic_policy: traffic_policy(
            "spec.internalTrafficPolicy",
            spec.internal_traffic_policy.as_deref(),
        )?,
        health_check_node_port: optional_port(
            "spec.healthCheckNodePort".into(),
            spec.health_check_node_port,
        )?,
        session_affinity_timeout: session_affinity(
            spec.session_affinity.as_deref(),
            spec.session_affinity_config.as_ref(),
        )?,
        global: global(&m.metadata)?,
        cluster_affinity: cluster_affinity(&m.metadata)?,
        ipvs_scheduler: ipvs_scheduler(&m.metadata)?,
    })
}

#[cfg(test)]
mod tests;
