//! The packet tracer: how a node will treat a packet to `address:port`, and
//! why, from the views it holds. It reads the same decisions the backends
//! render ([`crate::policy`]), so what it says is what the rules do.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::node_context::{LocalDetector, NodeContext};
use crate::policy::{self, Action, EndpointSet, EntryKind, PortFamily};
use crate::types::{Protocol, ServiceView};

/// A packet to trace.
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    pub destination: SocketAddr,
    pub protocol: Protocol,
    /// The client; `None` for "some client outside the cluster".
    pub source: Option<IpAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Dnat,
    Reject,
    Drop,
    NotAService,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Dnat => "dnat",
            Verdict::Reject => "reject",
            Verdict::Drop => "drop",
            Verdict::NotAService => "not a service",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub endpoint: SocketAddr,
    pub probability: f64,
    pub node: String,
    pub terminating: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// `<cluster>/<namespace>/<name>:<port name>`; empty when no Service matches.
    pub service: String,
    /// (what, why) in the order the kernel meets them.
    pub steps: Vec<(String, String)>,
    pub candidates: Vec<Candidate>,
    pub masquerade: bool,
    pub verdict: Verdict,
}

impl Trace {
    fn step(&mut self, what: impl Into<String>, why: impl Into<String>) {
        self.steps.push((what.into(), why.into()));
    }
}

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::ClusterIp => "ClusterIP",
        EntryKind::ExternalIp => "external IP",
        EntryKind::LoadBalancer => "load-balancer IP",
        EntryKind::NodePort => "NodePort",
    }
}

fn list(nets: &[IpNet]) -> String {
    nets.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Traces `packet` through the Services `views` on a node in `context`.
pub fn trace<'a>(
    views: impl IntoIterator<Item = &'a ServiceView>,
    context: &NodeContext,
    packet: Packet,
) -> Trace {
    for view in views {
        for pf in policy::port_families(view, context) {
            if pf.port.protocol != packet.protocol {
                continue;
            }
            let hit = pf
                .entries
                .iter()
                .find(|e| e.address == packet.destination.ip() && e.port == packet.destination.port());
            if let Some(entry) = hit {
                return trace_entry(&pf, entry.kind, context, packet);
            }
        }
    }
    let mut t = Trace {
        service: String::new(),
        steps: vec![],
        candidates: vec![],
        masquerade: false,
        verdict: Verdict::NotAService,
    };
    t.step(
        format!("no Service has {}/{}", packet.destination, packet.protocol),
        "kpx leaves the packet alone: it is routed as addressed",
    );
    t
}

fn trace_entry(pf: &PortFamily, kind: EntryKind, context: &NodeContext, packet: Packet) -> Trace {
    let view = pf.view;
    let port_name = if pf.port.name.is_empty() { pf.port.port.to_string() } else { pf.port.name.clone() };
    let mut t = Trace {
        service: format!("{}:{port_name}", view.resource_name()),
        steps: vec![],
        candidates: vec![],
        masquerade: false,
        verdict: Verdict::Dnat,
    };
    t.step(
        format!("{} {}/{} of {}", kind_name(kind), packet.destination, packet.protocol, t.service),
        "the destination is one of the Service's entry points",
    );
    let node_addresses = &context.node_addresses;
    let detector = &context.local;
    let local = packet.source.map(|s| (s, detector.is_local(&s)));
    let from_pod = matches!(local, Some((_, Some(true))));
    if let Some((s, None)) = local {
        t.step(
            "not from a pod",
            format!("pods are told by the interface a packet comes in on ({}); {s} alone does not say, so the trace takes it as not a pod", detector.describe()),
        );
    }
    let from_node = packet.source.is_some_and(|s| node_addresses.contains(&s));
    let entry = pf.entries.iter().find(|e| e.kind == kind && e.address == packet.destination.ip());
    if let Some(allowed) = entry.and_then(|e| pf.allowed_sources(e, node_addresses)) {
        match packet.source {
            Some(s) if !allowed.iter().any(|r| r.contains(&s)) => {
                t.step("drop", format!("source {s} is not in loadBalancerSourceRanges ({})", list(&allowed)));
                t.verdict = Verdict::Drop;
                return t;
            }
            Some(s) => t.step(
                "source allowed",
                format!("{s} is inside loadBalancerSourceRanges ({})", list(&allowed)),
            ),
            None => t.step(
                "loadBalancerSourceRanges",
                format!("only {} may connect (give a source to check one)", list(&allowed)),
            ),
        }
    }
    let mut use_local = false;
    if kind != EntryKind::ClusterIp {
        if pf.main_set(kind) == EndpointSet::External {
            t.step("all endpoints", "internalTrafficPolicy: Local applies to ClusterIP traffic only");
        }
        if !pf.external_local() {
            t.masquerade = true;
            t.step("masquerade", "externalTrafficPolicy: Cluster masquerades external traffic");
        } else if from_pod {
            t.step(
                "all endpoints",
                "the source is a pod (inside the cluster CIDR): externalTrafficPolicy Local applies to traffic from outside",
            );
        } else if from_node {
            t.masquerade = true;
            t.step("masquerade, all endpoints", "the source is the node itself");
        } else {
            use_local = true;
            t.step("this node's endpoints only", "externalTrafficPolicy: Local keeps the client address");
        }
    }
    // kube-proxy's masqueradeAll is traffic to a ClusterIP: a pod's to a policy-Local
    // external address takes all endpoints and keeps its address.
    if context.masquerade_all && kind == EntryKind::ClusterIp && !t.masquerade {
        t.masquerade = true;
        t.step("masquerade", "masqueradeAll is on");
    }
    if kind == EntryKind::ClusterIp {
        if detector.knows(pf.family) && !from_pod && !t.masquerade {
            t.masquerade = true;
            let who = packet.source.map_or("a client outside the cluster".to_owned(), |s| s.to_string());
            let why = match detector {
                LocalDetector::Cidrs(_) => {
                    format!("is outside the cluster CIDR ({})", list(&detector.of_family(pf.family)))
                }
                LocalDetector::Interface { .. } => format!("is not from a pod ({})", detector.describe()),
            };
            t.step("masquerade", format!("{who} {why}"));
        }
        if view.internal_traffic_local {
            t.step("this node's endpoints only", "internalTrafficPolicy: Local");
        }
    }
    let (action, set) = if use_local {
        (pf.local_action(kind).unwrap_or_else(|| pf.cluster_action(kind)), pf.endpoints(EndpointSet::Local))
    } else {
        (pf.cluster_action(kind), pf.endpoints(pf.main_set(kind)))
    };
    match action {
        Action::Reject => {
            t.verdict = Verdict::Reject;
            t.masquerade = false;
            t.step("reject", "no node has an endpoint for it: connections are refused at once");
        }
        Action::Drop => {
            t.verdict = Verdict::Drop;
            t.masquerade = false;
            let why = if use_local {
                "externalTrafficPolicy: Local and no endpoint on this node"
            } else {
                "internalTrafficPolicy: Local and no endpoint on this node (other nodes have some)"
            };
            t.step("drop", why);
        }
        Action::Pick => {
            let n = set.len() as f64;
            t.candidates = set
                .iter()
                .map(|e| Candidate {
                    endpoint: SocketAddr::new(e.address, e.port),
                    probability: 1.0 / n,
                    node: e.node_name().to_owned(),
                    terminating: e.terminating,
                })
                .collect();
            if set.iter().all(|e| e.terminating) {
                t.step(
                    "terminating endpoints",
                    "no endpoint is ready: serving-and-terminating ones take the traffic",
                );
            }
            if let Some(timeout) = view.session_affinity_timeout {
                t.step(
                    "sessionAffinity: ClientIP",
                    format!("a client keeps its endpoint until {timeout} s after its last new connection"),
                );
            }
            if let Some(s) = packet.source.filter(|s| set.iter().any(|e| e.address == *s)) {
                t.step(
                    "hairpin",
                    format!("if {s} picks itself, the packet is masqueraded so the reply comes back"),
                );
            }
            t.step(
                format!("dnat to one of {} endpoint(s)", set.len()),
                "each new connection picks one at random, evenly",
            );
        }
    }
    t
}

impl Packet {
    /// Reads an admin API trace request: `ADDRESS:PORT` (`[v6]:PORT`), a protocol name, a source.
    pub fn from_request(request: &crate::admin::TraceRequest) -> Result<Packet, String> {
        let destination: SocketAddr = request.destination.parse().map_err(|_| {
            format!("destination: {:?} is not ADDRESS:PORT (use [v6]:PORT for IPv6)", request.destination)
        })?;
        let protocol = match request.protocol.to_ascii_lowercase().as_str() {
            "" | "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            other => return Err(format!("protocol: {other:?} is not tcp, udp or sctp")),
        };
        let source = match request.source.as_str() {
            "" => None,
            text => {
                Some(text.parse::<IpAddr>().map_err(|_| format!("source: {text:?} is not an IP address"))?)
            }
        };
        Ok(Packet { destination, protocol, source })
    }
}

impl Trace {
    /// The trace as the admin API returns it.
    pub fn into_response(self) -> crate::admin::TraceResponse {
        use crate::admin::{Candidate as PbCandidate, TraceResponse, TraceStep};
        TraceResponse {
            service: self.service,
            steps: self.steps.into_iter().map(|(what, why)| TraceStep { what, why }).collect(),
            candidates: self
                .candidates
                .into_iter()
                .map(|c| PbCandidate {
                    endpoint: c.endpoint.to_string(),
                    probability: c.probability,
                    node: c.node,
                    terminating: c.terminating,
                })
                .collect(),
            masquerade: self.masquerade,
            verdict: self.verdict.as_str().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_context::ProxySettings;
    use crate::testing::endpoint_on as ep;
    use crate::types::{NodeConfig, ServicePort};

    fn node() -> NodeContext {
        let config = NodeConfig {
            name: "n1".into(),
            addresses: vec!["10.0.0.1".parse().expect("ip")],
            cluster_cidrs: vec!["10.244.0.0/16".parse().expect("cidr")],
            ..Default::default()
        };
        NodeContext::derive(&ProxySettings::default(), Some(&config))
    }

    fn packet(dst: &str, source: Option<&str>) -> Packet {
        Packet {
            destination: dst.parse().expect("socket"),
            protocol: Protocol::Tcp,
            source: source.map(|s| s.parse().expect("ip")),
        }
    }

    #[test]
    fn explains_a_cluster_ip_a_local_node_port_and_a_miss() {
        let mut port =
            ServicePort::new("http", Protocol::Tcp, 80, vec![ep("10.244.1.2", "n1"), ep("10.244.2.2", "n2")]);
        port.node_port = Some(30080);
        port.local_endpoints = vec![ep("10.244.1.2", "n1")];
        let mut view =
            ServiceView::new("c", "ns", "web", vec!["10.96.0.10".parse().expect("ip")], vec![port]);
        view.external_traffic_local = true;

        let t = trace([&view], &node(), packet("10.96.0.10:80", None));
        assert_eq!(t.service, "c/ns/web:http");
        assert_eq!(t.verdict, Verdict::Dnat);
        assert!(t.masquerade, "from outside the cluster CIDR: {t:?}");
        assert_eq!(t.candidates.len(), 2);
        assert!((t.candidates[0].probability - 0.5).abs() < 1e-9);

        let t = trace([&view], &node(), packet("10.0.0.1:30080", Some("192.0.2.1")));
        assert!(!t.masquerade && t.candidates.len() == 1, "{t:?}");
        assert!(t.steps.iter().any(|(w, _)| w == "this node's endpoints only"), "{t:?}");

        view.ports[0].local_endpoints.clear();
        let t = trace([&view], &node(), packet("10.0.0.1:30080", Some("192.0.2.1")));
        assert_eq!(t.verdict, Verdict::Drop);

        let t = trace([&view], &node(), packet("10.96.0.99:80", None));
        assert_eq!(t.verdict, Verdict::NotAService);
    }
    #[test]
    fn internal_policy_local_narrows_the_cluster_ip_only() {
        let mut port = ServicePort::new("http", Protocol::Tcp, 80, vec![]);
        port.node_port = Some(30080);
        port.external_endpoints = vec![ep("10.244.2.2", "n2"), ep("10.244.3.2", "n3")];
        port.endpoint_families = vec![crate::family::Family::V4];
        let mut view =
            ServiceView::new("c", "ns", "itp", vec!["10.96.0.11".parse().expect("ip")], vec![port]);
        view.internal_traffic_local = true;
        let t = trace([&view], &node(), packet("10.96.0.11:80", None));
        assert_eq!(t.verdict, Verdict::Drop, "none on this node, some elsewhere: {t:?}");
        let t = trace([&view], &node(), packet("10.0.0.1:30080", Some("192.0.2.1")));
        assert_eq!((t.verdict, t.candidates.len(), t.masquerade), (Verdict::Dnat, 2, true), "{t:?}");
        view.ports[0].external_endpoints.clear();
        view.ports[0].endpoint_families.clear();
        let t = trace([&view], &node(), packet("10.96.0.11:80", None));
        assert_eq!(t.verdict, Verdict::Reject, "no endpoint anywhere: {t:?}");
    }
}
