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

fn cluster_affinity(metadata: &Metadata) -> Result<ClusterAffinity, FieldError> {
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
use crate::model::{Service, ServicePort, ServiceType, TrafficPolicy};

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
}

#[derive(Deserialize, Default)]
struct SessionAffinityConfig {
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

fn traffic_policy(field: &str, text: Option<&str>) -> Result<TrafficPolicy, FieldError> {
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

fn session_affinity(spec: &ServiceSpec) -> Result<Option<u32>, FieldError> {
    match spec.session_affinity.as_deref().unwrap_or_default() {
        "" | "None" => Ok(None),
        "ClientIP" => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
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
    Ok(Service {
        key: m.metadata.key(),
        service_type,
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
        session_affinity_timeout: session_affinity(&spec)?,
        global: global(&m.metadata)?,
        cluster_affinity: cluster_affinity(&m.metadata)?,
        ipvs_scheduler: ipvs_scheduler(&m.metadata)?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Object};
    use super::*;

    fn one(spec: &str) -> Result<Service, (String, String)> {
        let text = format!("kind: Service\nmetadata: {{name: s}}\n{spec}");
        let mut results = parse(&text);
        assert_eq!(results.len(), 1, "{text}");
        match results.remove(0) {
            Ok(Object::Service(s)) => Ok(s),
            Ok(other) => panic!("not a Service: {other:?}"),
            Err(e) => Err((e.field, e.reason)),
        }
    }

    #[test]
    fn the_ipvs_scheduler_annotation_is_one_of_the_known_schedulers() {
        let annotated = |value: &str| {
            let text = format!(
                "kind: Service\nmetadata: {{name: s, annotations: {{service.kpx.io/ipvs-scheduler: {value}}}}}\nspec: {{clusterIP: 10.96.0.1, ports: [{{port: 80}}]}}"
            );
            match parse(&text).remove(0) {
                Ok(Object::Service(s)) => Ok(s.ipvs_scheduler),
                Ok(other) => panic!("not a Service: {other:?}"),
                Err(e) => Err(e.field),
            }
        };
        assert_eq!(annotated("mh"), Ok(Some("mh".to_owned())));
        assert_eq!(
            annotated("fastest"),
            Err("metadata.annotations[service.kpx.io/ipvs-scheduler]".to_owned())
        );
    }

    fn field_of(spec: &str) -> String {
        one(spec).expect_err("invalid").0
    }

    const LB: &str = "spec:\n  type: LoadBalancer\n  clusterIPs: [10.96.0.1, fd00::1]\n";

    #[test]
    fn reads_external_entry_points_policies_and_affinity() {
        let svc = one(&format!(
            "{LB}  ports: [{{name: a, port: 80, nodePort: 30080}}, {{name: b, port: 81, protocol: UDP}}]\n  \
             externalIPs: [192.0.2.1, '2001:db8::1']\n  loadBalancerSourceRanges: [' 198.51.100.7/24 ', '2001:db8::/32']\n  \
             externalTrafficPolicy: Local\n  internalTrafficPolicy: Local\n  healthCheckNodePort: 31000\n  \
             sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 60}}}}\n\
             status:\n  loadBalancer:\n    ingress: [{{ip: 203.0.113.9}}, {{hostname: lb.example}}, {{ip: 203.0.113.10, ipMode: Proxy}}]\n"
        ))
        .expect("valid");
        assert_eq!(svc.ports[0].node_port, Some(30080));
        assert_eq!(svc.ports[1].node_port, None);
        assert_eq!(
            svc.external_ips,
            ["192.0.2.1".parse::<IpAddr>().expect("ip"), "2001:db8::1".parse().expect("ip")]
        );
        assert_eq!(svc.load_balancer_ips, ["203.0.113.9".parse::<IpAddr>().expect("ip")]);
        let ranges: Vec<String> = svc.load_balancer_source_ranges.iter().map(ToString::to_string).collect();
        assert_eq!(ranges, ["198.51.100.0/24", "2001:db8::/32"]);
        assert_eq!(svc.external_traffic_policy, TrafficPolicy::Local);
        assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Local);
        assert!(svc.external_traffic_local());
        assert_eq!(svc.health_check_node_port, Some(31000));
        assert_eq!(svc.session_affinity_timeout, Some(60));
    }

    #[test]
    fn defaults() {
        let svc = one("spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n").expect("valid");
        assert_eq!(svc.external_traffic_policy, TrafficPolicy::Cluster);
        assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Cluster);
        assert_eq!(svc.session_affinity_timeout, None);
        assert!(svc.external_ips.is_empty() && svc.load_balancer_ips.is_empty());
        assert_eq!(svc.ports[0].node_port, None);
        let affinity = one("spec: {clusterIP: 10.96.0.1, sessionAffinity: ClientIP}\n").expect("valid");
        assert_eq!(affinity.session_affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        let none = one("spec: {clusterIP: 10.96.0.1, sessionAffinity: None, \
                        sessionAffinityConfig: {clientIP: {timeoutSeconds: 5}}}\n")
        .expect("valid");
        assert_eq!(none.session_affinity_timeout, None);
    }

    #[test]
    fn local_external_policy_counts_only_with_an_external_entry_point() {
        let plain = one("spec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Local, ports: [{port: 80}]}\n")
            .expect("valid");
        assert_eq!(plain.external_traffic_policy, TrafficPolicy::Local);
        assert!(!plain.external_traffic_local());
        let external =
            one("spec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Local, externalIPs: [192.0.2.1]}\n")
                .expect("valid");
        assert!(external.external_traffic_local());
        let node_port = one("spec: {type: NodePort, clusterIP: 10.96.0.1, externalTrafficPolicy: Local, \
                             ports: [{port: 80, nodePort: 30000}]}\n")
        .expect("valid");
        assert!(node_port.external_traffic_local());
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (format!("{LB}  ports: [{{port: 80}}, {{port: 81, nodePort: 70000}}]\n"), "spec.ports[1].nodePort"),
            (format!("{LB}  ports: [{{port: 80, nodePort: -1}}]\n"), "spec.ports[0].nodePort"),
            ("spec: {clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30080}]}\n".into(), "spec.ports[0].nodePort"),
            (format!("{LB}  externalIPs: [192.0.2.300]\n"), "spec.externalIPs[0]"),
            (format!("{LB}  loadBalancerSourceRanges: [10.0.0.0/33]\n"), "spec.loadBalancerSourceRanges[0]"),
            (format!("{LB}  loadBalancerSourceRanges: [10.0.0.0/8, nonsense]\n"), "spec.loadBalancerSourceRanges[1]"),
            (format!("{LB}  externalTrafficPolicy: Global\n"), "spec.externalTrafficPolicy"),
            (format!("{LB}  internalTrafficPolicy: local\n"), "spec.internalTrafficPolicy"),
            (format!("{LB}  healthCheckNodePort: 65536\n"), "spec.healthCheckNodePort"),
            (format!("{LB}  sessionAffinity: Cookie\n"), "spec.sessionAffinity"),
            (
                format!("{LB}  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 86401}}}}\n"),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
            (
                format!("{LB}  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 0}}}}\n"),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
            (
                format!("{LB}status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.1}}, {{ip: bad}}]}}}}\n"),
                "status.loadBalancer.ingress[1].ip",
            ),
            (
                format!("{LB}status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.1, ipMode: Tunnel}}]}}}}\n"),
                "status.loadBalancer.ingress[0].ipMode",
            ),
        ];
        for (spec, field) in cases {
            assert_eq!(field_of(&spec), field, "{spec}");
        }
    }

    #[test]
    fn addresses_of_another_family_are_left_out_and_the_service_kept() {
        let svc =
            one("spec: {clusterIP: 10.96.0.1, externalIPs: [192.0.2.1, '2001:db8::1']}\n").expect("kept");
        assert_eq!(svc.external_ips, ["192.0.2.1".parse::<IpAddr>().expect("ip")]);
        let svc = one(
            "spec: {type: LoadBalancer, clusterIP: 'fd00::1'}\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.1}, {ip: 'fd00::99'}]}}\n",
        )
        .expect("kept");
        assert_eq!(svc.load_balancer_ips, ["fd00::99".parse::<IpAddr>().expect("ip")]);
    }

    #[test]
    fn the_headless_label_is_read() {
        let text = "kind: Service\nmetadata: {name: h, labels: {service.kubernetes.io/headless: ''}}\nspec: {clusterIP: 10.96.0.1}\n";
        let Ok(Object::Service(svc)) = parse(text).remove(0) else { panic!("a valid Service") };
        assert!(svc.headless_label);
        assert!(!crate::view::is_proxied(&svc), "left alone");
    }

    #[test]
    fn zero_node_ports_mean_none_and_the_rest_of_the_folder_is_still_read() {
        let svc = one(&format!("{LB}  ports: [{{port: 80, nodePort: 0}}]\n  healthCheckNodePort: 0\n"))
            .expect("valid");
        assert_eq!((svc.ports[0].node_port, svc.health_check_node_port), (None, None));
        let text = format!(
            "kind: Service\nmetadata: {{name: bad}}\n{LB}  externalIPs: [nope]\n---\n\
             kind: Service\nmetadata: {{name: good}}\n{LB}  externalIPs: [192.0.2.1]\n"
        );
        let results = parse(&text);
        assert!(results[0].is_err());
        assert!(matches!(&results[1], Ok(Object::Service(s)) if s.key.name == "good"));
    }
}
