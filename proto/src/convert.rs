//! Conversions between [`crate::pb`] messages and [`crate::types`] values.
//!
//! Decoding validates: an invalid resource is an [`InvalidResource`] naming
//! the field path (`ports[0].endpoints[2].address`) and what is wrong with it.

use std::net::IpAddr;

use ipnet::IpNet;
use prost::Message;

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

fn non_empty(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(InvalidResource::new(field, "must not be empty"));
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
        non_empty("cluster", &msg.cluster)?;
        non_empty("namespace", &msg.namespace)?;
        non_empty("name", &msg.name)?;
        let cluster_ips = msg
            .cluster_ips
            .iter()
            .enumerate()
            .map(|(i, a)| ip(&format!("cluster_ips[{i}]"), a))
            .collect::<Result<Vec<_>>>()?;
        let mut ports = Vec::with_capacity(msg.ports.len());
        for (i, p) in msg.ports.into_iter().enumerate() {
            let at = format!("ports[{i}]");
            let protocol = protocol(&format!("{at}.protocol"), p.protocol)?;
            let number = port(&format!("{at}.port"), p.port)?;
            let endpoints = p
                .endpoints
                .into_iter()
                .enumerate()
                .map(|(j, e)| {
                    let at = format!("{at}.endpoints[{j}]");
                    let address = ip(&format!("{at}.address"), &e.address)?;
                    let single_family = cluster_ips.windows(2).all(|w| w[0].is_ipv4() == w[1].is_ipv4());
                    if single_family && cluster_ips.first().is_some_and(|c| c.is_ipv4() != address.is_ipv4())
                    {
                        return Err(InvalidResource::new(
                            format!("{at}.address"),
                            format!("{address} is not of the Service's IP family"),
                        ));
                    }
                    Ok(Endpoint {
                        address,
                        port: port(&format!("{at}.port"), e.port)?,
                        node_name: e.node_name,
                        terminating: e.terminating,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            ports.push(ServicePort { name: p.name, protocol, port: number, endpoints });
        }
        Ok(ServiceView { cluster: msg.cluster, namespace: msg.namespace, name: msg.name, cluster_ips, ports })
    }

    pub fn to_proto(&self) -> pb::ServiceView {
        pb::ServiceView {
            cluster: self.cluster.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            cluster_ips: self.cluster_ips.iter().map(ToString::to_string).collect(),
            ports: self
                .ports
                .iter()
                .map(|p| pb::ServicePort {
                    name: p.name.clone(),
                    protocol: pb::Protocol::from(p.protocol) as i32,
                    port: u32::from(p.port),
                    endpoints: p
                        .endpoints
                        .iter()
                        .map(|e| pb::Endpoint {
                            address: e.address.to_string(),
                            port: u32::from(e.port),
                            node_name: e.node_name.clone(),
                            terminating: e.terminating,
                        })
                        .collect(),
                })
                .collect(),
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
        non_empty("name", &msg.name)?;
        let addresses = msg
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| ip(&format!("addresses[{i}]"), a))
            .collect::<Result<Vec<_>>>()?;
        let pod_cidrs = msg
            .pod_cidrs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.parse::<IpNet>().map_err(|_| {
                    InvalidResource::new(format!("pod_cidrs[{i}]"), format!("{c:?} is not a CIDR"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(NodeConfig { name: msg.name, addresses, pod_cidrs, zone: msg.zone })
    }

    pub fn to_proto(&self) -> pb::NodeConfig {
        pb::NodeConfig {
            name: self.name.clone(),
            addresses: self.addresses.iter().map(ToString::to_string).collect(),
            pod_cidrs: self.pod_cidrs.iter().map(ToString::to_string).collect(),
            zone: self.zone.clone(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        self.to_proto().encode_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> pb::ServiceView {
        pb::ServiceView {
            cluster: "default".into(),
            namespace: "ns".into(),
            name: "web".into(),
            cluster_ips: vec!["10.96.0.10".into()],
            ports: vec![pb::ServicePort {
                name: "http".into(),
                protocol: pb::Protocol::Tcp as i32,
                port: 80,
                endpoints: vec![pb::Endpoint {
                    address: "10.244.0.5".into(),
                    port: 8080,
                    node_name: "n1".into(),
                    terminating: false,
                }],
            }],
        }
    }

    #[test]
    fn round_trips() {
        let view = ServiceView::from_proto(valid()).expect("valid");
        assert_eq!(ServiceView::decode(&view.encode()).expect("decodes"), view);
        assert_eq!(view.resource_name(), "default/ns/web");
    }

    #[test]
    fn names_the_bad_field() {
        let mut bad = valid();
        bad.ports[0].endpoints[0].address = "10.0.0.300".into();
        let err = ServiceView::from_proto(bad).expect_err("bad address");
        assert_eq!(err.field, "ports[0].endpoints[0].address");

        let mut bad = valid();
        bad.ports[0].port = 0;
        assert_eq!(ServiceView::from_proto(bad).expect_err("port 0").field, "ports[0].port");

        let mut bad = valid();
        bad.ports[0].protocol = 9;
        assert_eq!(ServiceView::from_proto(bad).expect_err("protocol").field, "ports[0].protocol");

        let mut bad = valid();
        bad.ports[0].endpoints[0].port = 70000;
        assert_eq!(ServiceView::from_proto(bad).expect_err("port").field, "ports[0].endpoints[0].port");

        let mut bad = valid();
        bad.ports[0].endpoints[0].address = "fd00::1".into();
        assert_eq!(ServiceView::from_proto(bad).expect_err("family").field, "ports[0].endpoints[0].address");
    }
}
