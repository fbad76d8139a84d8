//! Conversions between [`crate::pb`] messages and [`crate::types`] values.
//!
//! Decoding validates: an invalid resource is an [`InvalidResource`] naming
//! the field path (`ports[0].endpoints[2].address`) and what is wrong with it.

use std::net::IpAddr;

use ipnet::IpNet;
use prost::Message;

use crate::family::Family;
use crate::pb;
use crate::types::{Endpoint, NodeConfig, Protocol, ServicePort, ServiceView};

/// A resource that cannot be used, with the field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidResource {
    pub field: String,
    pub reason: String,
}

impl InvalidResource {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidResource { field: field.into(), reason: reason.into() }
    }
}

type Result<T, E = InvalidResource> = std::result::Result<T, E>;

fn ip(field: &str, text: &str) -> Result<IpAddr> {
    text.parse().map_err(|_| InvalidResource::new(field, format!("{text:?} is not an IP address")))
}

fn port(field: &str, value: u32) -> Result<u16> {
    match u16::try_from(value) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(InvalidResource::new(field, format!("{value} is not a port (1-65535)"))),
    }
}

fn protocol(field: &str, value: i32) -> Result<Protocol> {
    match pb::Protocol::try_from(value) {
        Ok(pb::Protocol::Tcp) => Ok(Protocol::Tcp),
        Ok(pb::Protocol::Udp) => Ok(Protocol::Udp),
        Ok(pb::Protocol::Sctp) => Ok(Protocol::Sctp),
        _ => Err(InvalidResource::new(field, format!("unknown protocol {value}"))),
    }
}

fn ips(field: &str, texts: &[String]) -> Result<Vec<IpAddr>> {
    texts.iter().enumerate().map(|(i, a)| ip(&format!("{field}[{i}]"), a)).collect()
}

fn cidr(field: &str, text: &str) -> Result<IpNet> {
    text.parse::<IpNet>().map_err(|_| InvalidResource::new(field, format!("{text:?} is not a CIDR")))
}

fn optional_port(field: &str, value: u32) -> Result<Option<u16>> {
    if value == 0 {
        return Ok(None);
    }
    port(field, value).map(Some)
}

/// The IP families of a Service (those of its ClusterIPs).
#[derive(Debug, Clone, Copy)]
struct Families {
    v4: bool,
    v6: bool,
}

impl Families {
    fn of(cluster_ips: &[IpAddr]) -> Self {
        Families { v4: cluster_ips.iter().any(IpAddr::is_ipv4), v6: cluster_ips.iter().any(IpAddr::is_ipv6) }
    }

    fn check_one(self, field: &str, address: &IpAddr) -> Result<()> {
        if (address.is_ipv4() && self.v4) || (address.is_ipv6() && self.v6) {
            return Ok(());
        }
        Err(InvalidResource::new(field, format!("{address} is not of the Service's IP family")))
    }

    fn check(self, field: &str, addresses: &[IpAddr]) -> Result<()> {
        addresses.iter().enumerate().try_for_each(|(i, a)| self.check_one(&format!("{field}[{i}]"), a))
    }
}

fn endpoints(field: &str, list: Vec<pb::Endpoint>, families: Families) -> Result<Vec<Endpoint>> {
    let mut out = Vec::with_capacity(list.len());
    for (j, e) in list.into_iter().enumerate() {
        // The field's path is written only for an error (a quarter-million endpoints).
        let at = |leaf: &'static str| {
            move |error: InvalidResource| InvalidResource { field: format!("{field}[{j}].{leaf}"), ..error }
        };
        let address = ip("", &e.address).map_err(at("address"))?;
        families.check_one("", &address).map_err(at("address"))?;
        name("", &e.node_name, true).map_err(at("node_name"))?;
        name("", &e.cluster, true).map_err(at("cluster"))?;
        let port = port("", e.port).map_err(at("port"))?;
        out.push(Endpoint::new(address, port, &e.node_name, &e.cluster, e.terminating));
    }
    Ok(out)
}

/// Kubernetes' names of the IP families (`spec.ipFamilies`).
fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// A list of family names, each once, sorted.
fn endpoint_families(field: &str, names: &[String]) -> Result<Vec<Family>> {
    let mut out = Vec::with_capacity(names.len());
    for (i, text) in names.iter().enumerate() {
        let family = Family::ALL.into_iter().find(|f| family_name(*f) == text).ok_or_else(|| {
            InvalidResource::new(format!("{field}[{i}]"), format!("{text:?} is not IPv4 or IPv6"))
        })?;
        if out.contains(&family) {
            return Err(InvalidResource::new(format!("{field}[{i}]"), format!("{text} is listed twice")));
        }
        out.push(family);
    }
    out.sort();
    Ok(out)
}

/// The longest name kpx takes (a DNS subdomain).
pub const MAX_NAME: usize = 253;

/// A name that is safe in every text kpx writes: letters, digits, `-`, `.` and `_`, at
/// most [`MAX_NAME`] bytes; `""` only where `optional`.
fn name(field: &str, value: &str, optional: bool) -> Result<()> {
    if value.is_empty() {
        return if optional { Ok(()) } else { Err(InvalidResource::new(field, "must not be empty")) };
    }
    if value.len() > MAX_NAME {
        return Err(InvalidResource::new(field, format!("{} bytes: at most {MAX_NAME}", value.len())));
    }
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))) {
        return Err(InvalidResource::new(
            field,
            format!("{bad:?} is not allowed (letters, digits, '-', '.' and '_' only)"),
        ));
    }
    Ok(())
}

impl From<Protocol> for pb::Protocol {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Tcp => pb::Protocol::Tcp,
            Protocol::Udp => pb::Protocol::Udp,
            Protocol::Sctp => pb::Protocol::Sctp,
        }
    }
}

impl ServiceView {
    /// Decodes and validates an encoded `kpx.v1.ServiceView`.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let msg = pb::ServiceView::decode(bytes)
            .map_err(|e| InvalidResource::new("<message>", format!("not a kpx.v1.ServiceView: {e}")))?;
        Self::from_proto(msg)
    }

    /// Validates a `kpx.v1.ServiceView`.
    pub fn from_proto(msg: pb::ServiceView) -> Result<Self> {
        name("cluster", &msg.cluster, false)?;
        name("namespace", &msg.namespace, false)?;
        name("name", &msg.name, false)?;
        let cluster_ips = ips("cluster_ips", &msg.cluster_ips)?;
        if cluster_ips.len() > 2
            || (cluster_ips.len() == 2 && cluster_ips[0].is_ipv4() == cluster_ips[1].is_ipv4())
        {
            return Err(InvalidResource::new("cluster_ips", "at most one address per IP family"));
        }
        let families = Families::of(&cluster_ips);
        let external_ips = ips("external_ips", &msg.external_ips)?;
        families.check("external_ips", &external_ips)?;
        let load_balancer_ips = ips("load_balancer_ips", &msg.load_balancer_ips)?;
        families.check("load_balancer_ips", &load_balancer_ips)?;
        let load_balancer_source_ranges = msg
            .load_balancer_source_ranges
            .iter()
            .enumerate()
            .map(|(i, c)| cidr(&format!("load_balancer_source_ranges[{i}]"), c))
            .collect::<Result<Vec<_>>>()?;
        let health_check_node_port = optional_port("health_check_node_port", msg.health_check_node_port)?;
        let session_affinity_timeout = match msg.session_affinity_timeout_seconds {
            0 => None,
            t @ 1..=86400 => Some(t),
            t => {
                return Err(InvalidResource::new(
                    "session_affinity_timeout_seconds",
                    format!("{t} is not between 1 and 86400"),
                ))
            }
        };
        let ipvs_scheduler = match msg.ipvs_scheduler.as_str() {
            "" => None,
            s if crate::types::IPVS_SCHEDULERS.contains(&s) => Some(msg.ipvs_scheduler.clone()),
            s => {
                return Err(InvalidResource::new(
                    "ipvs_scheduler",
                    format!("{s:?} is not one of {}", crate::types::IPVS_SCHEDULERS.join(", ")),
                ))
            }
        };
        if !msg.service_proxy_name.is_empty() {
            // The rule an agent's --service-proxy-name is checked with.
            crate::check_service_proxy_name(&msg.service_proxy_name)
                .map_err(|reason| InvalidResource::new("service_proxy_name", reason))?;
        }
        let service_proxy_name = Some(msg.service_proxy_name.clone()).filter(|n| !n.is_empty());
        let mut ports = Vec::with_capacity(msg.ports.len());
        for (i, p) in msg.ports.into_iter().enumerate() {
            let at = format!("ports[{i}]");
            name(&format!("{at}.name"), &p.name, true)?;
            ports.push(ServicePort {
                protocol: protocol(&format!("{at}.protocol"), p.protocol)?,
                port: port(&format!("{at}.port"), p.port)?,
                node_port: optional_port(&format!("{at}.node_port"), p.node_port)?,
                endpoints: endpoints(&format!("{at}.endpoints"), p.endpoints, families)?,
                local_endpoints: endpoints(&format!("{at}.local_endpoints"), p.local_endpoints, families)?,
                external_endpoints: endpoints(
                    &format!("{at}.external_endpoints"),
                    p.external_endpoints,
                    families,
                )?,
                endpoint_families: endpoint_families(
                    &format!("{at}.endpoint_families"),
                    &p.endpoint_families,
                )?,
                serving_endpoints: endpoints(
                    &format!("{at}.serving_endpoints"),
                    p.serving_endpoints,
                    families,
                )?,
                name: p.name,
            });
        }
        Ok(ServiceView {
            cluster: msg.cluster,
            namespace: msg.namespace,
            name: msg.name,
            cluster_ips,
            ports,
            external_ips,
            load_balancer_ips,
            load_balancer_source_ranges,
            external_traffic_local: msg.external_traffic_local,
            internal_traffic_local: msg.internal_traffic_local,
            health_check_node_port,
            session_affinity_timeout,
            ipvs_scheduler,
            service_proxy_name,
        })
    }

    pub fn to_proto(&self) -> pb::ServiceView {
        let strings = |ips: &[IpAddr]| ips.iter().map(ToString::to_string).collect();
        let endpoints = |eps: &[Endpoint]| {
            eps.iter()
                .map(|e| pb::Endpoint {
                    address: e.address.to_string(),
                    port: u32::from(e.port),
                    node_name: e.node_name().to_owned(),
                    terminating: e.terminating,
                    cluster: e.cluster().to_owned(),
                })
                .collect()
        };
        pb::ServiceView {
            cluster: self.cluster.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            cluster_ips: strings(&self.cluster_ips),
            ports: self
                .ports
                .iter()
                .map(|p| pb::ServicePort {
                    name: p.name.clone(),
                    protocol: pb::Protocol::from(p.protocol) as i32,
                    port: u32::from(p.port),
                    endpoints: endpoints(&p.endpoints),
                    node_port: p.node_port.map_or(0, u32::from),
                    local_endpoints: endpoints(&p.local_endpoints),
                    external_endpoints: endpoints(&p.external_endpoints),
                    endpoint_families: p
                        .endpoint_families
                        .iter()
                        .map(|f| family_name(*f).to_owned())
                        .collect(),
                    serving_endpoints: endpoints(&p.serving_endpoints),
                })
                .collect(),
            external_ips: strings(&self.external_ips),
            load_balancer_ips: strings(&self.load_balancer_ips),
            load_balancer_source_ranges: self
                .load_balancer_source_ranges
                .iter()
                .map(ToString::to_string)
                .collect(),
            external_traffic_local: self.external_traffic_local,
            internal_traffic_local: self.internal_traffic_local,
            health_check_node_port: self.health_check_node_port.map_or(0, u32::from),
            session_affinity_timeout_seconds: self.session_affinity_timeout.unwrap_or(0),
            ipvs_scheduler: self.ipvs_scheduler.clone().unwrap_or_default(),
            service_proxy_name: self.service_proxy_name.clone().unwrap_or_default(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        self.to_proto().encode_to_vec()
    }
}

impl NodeConfig {
    /// Decodes and validates an encoded `kpx.v1.NodeConfig`.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let msg = pb::NodeConfig::decode(bytes)
            .map_err(|e| InvalidResource::new("<message>", format!("not a kpx.v1.NodeConfig: {e}")))?;
        Self::from_proto(msg)
    }

    pub fn from_proto(msg: pb::NodeConfig) -> Result<Self> {
        name("name", &msg.name, false)?;
        if msg.zone.len() > MAX_NAME || msg.zone.chars().any(|c| c.is_control()) {
            return Err(InvalidResource::new("zone", "at most 253 bytes, no control characters"));
        }
        let addresses = msg
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| ip(&format!("addresses[{i}]"), a))
            .collect::<Result<Vec<_>>>()?;
        let cidrs = |field: &str, texts: &[String]| {
            texts
                .iter()
                .enumerate()
                .map(|(i, c)| cidr(&format!("{field}[{i}]"), c))
                .collect::<Result<Vec<_>>>()
        };
        let pod_cidrs = cidrs("pod_cidrs", &msg.pod_cidrs)?;
        let cluster_cidrs = cidrs("cluster_cidrs", &msg.cluster_cidrs)?;
        let service_cidrs = cidrs("service_cidrs", &msg.service_cidrs)?;
        Ok(NodeConfig {
            name: msg.name,
            addresses,
            pod_cidrs,
            zone: msg.zone,
            cluster_cidrs,
            being_deleted: msg.being_deleted,
            service_cidrs,
        })
    }

    pub fn to_proto(&self) -> pb::NodeConfig {
        pb::NodeConfig {
            name: self.name.clone(),
            addresses: self.addresses.iter().map(ToString::to_string).collect(),
            pod_cidrs: self.pod_cidrs.iter().map(ToString::to_string).collect(),
            zone: self.zone.clone(),
            cluster_cidrs: self.cluster_cidrs.iter().map(ToString::to_string).collect(),
            being_deleted: self.being_deleted,
            service_cidrs: self.service_cidrs.iter().map(ToString::to_string).collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        self.to_proto().encode_to_vec()
    }
}

#[cfg(test)]
mod tests;
