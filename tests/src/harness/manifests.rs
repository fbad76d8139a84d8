//! Kubernetes manifests for tests: Services as YAML written by the test, and
//! EndpointSlices built from a list of endpoints with their conditions,
//! nodes and hints.

use crate::harness::topology::NODE_NAME;

/// A Service in namespace `test` with `spec` given as YAML lines (indented by two spaces);
/// `status` likewise ("" for none).
pub fn service(name: &str, spec: &str, status: &str) -> String {
    let mut s =
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n{spec}");
    if !s.ends_with('\n') {
        s.push('\n');
    }
    if !status.is_empty() {
        s.push_str("status:\n");
        s.push_str(status);
        if !s.ends_with('\n') {
            s.push('\n');
        }
    }
    s
}

/// One endpoint of a slice.
#[derive(Debug, Clone)]
pub struct Ep {
    pub address: String,
    pub node: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub zone_hints: Vec<String>,
    pub node_hints: Vec<String>,
}

/// A ready endpoint on this test's node.
pub fn ep(address: impl Into<String>) -> Ep {
    Ep {
        address: address.into(),
        node: NODE_NAME.into(),
        ready: true,
        serving: true,
        terminating: false,
        zone_hints: vec![],
        node_hints: vec![],
    }
}

impl Ep {
    /// Running on another node.
    pub fn on(mut self, node: &str) -> Ep {
        self.node = node.into();
        self
    }

    /// Terminating but still serving.
    pub fn terminating(mut self) -> Ep {
        self.ready = false;
        self.serving = true;
        self.terminating = true;
        self
    }

    /// Terminating, and called ready all the same: what the EndpointSlice controller
    /// writes for every endpoint of a Service with `publishNotReadyAddresses: true`.
    pub fn published_terminating(mut self) -> Ep {
        self.ready = true;
        self.serving = false;
        self.terminating = true;
        self
    }

    /// Neither ready nor serving.
    pub fn not_ready(mut self) -> Ep {
        self.ready = false;
        self.serving = false;
        self
    }

    pub fn for_zone(mut self, zone: &str) -> Ep {
        self.zone_hints.push(zone.into());
        self
    }

    pub fn for_node(mut self, node: &str) -> Ep {
        self.node_hints.push(node.into());
        self
    }
}

/// An EndpointSlice of Service `service`; `ports` are (name, protocol, port).
pub fn slice(service: &str, name: &str, ipv6: bool, ports: &[(&str, &str, u16)], endpoints: &[Ep]) -> String {
    let family = if ipv6 { "IPv6" } else { "IPv4" };
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports:\n"
    );
    for (pname, proto, port) in ports {
        s.push_str(&format!("- {{name: {pname}, protocol: {proto}, port: {port}}}\n"));
    }
    if endpoints.is_empty() {
        s.push_str("endpoints: []\n");
        return s;
    }
    s.push_str("endpoints:\n");
    for e in endpoints {
        s.push_str(&format!(
            "- addresses: ['{}']\n  nodeName: {}\n  conditions: {{ready: {}, serving: {}, terminating: {}}}\n",
            e.address, e.node, e.ready, e.serving, e.terminating
        ));
        if !e.zone_hints.is_empty() || !e.node_hints.is_empty() {
            let names =
                |v: &[String]| v.iter().map(|n| format!("{{name: {n}}}")).collect::<Vec<_>>().join(", ");
            s.push_str(&format!(
                "  hints: {{forZones: [{}], forNodes: [{}]}}\n",
                names(&e.zone_hints),
                names(&e.node_hints)
            ));
        }
    }
    s
}

/// Service `name` (ClusterIP `vip`, port `http` 80/TCP → 8080) with pod 0 as its endpoint.
pub fn web_on_pod0(name: &str, vip: &str) -> String {
    web_on_pod(0, name, vip)
}

/// [`web_on_pod0`] with pod `pod` as its endpoint.
pub fn web_on_pod(pod: usize, name: &str, vip: &str) -> String {
    let spec = format!("  clusterIP: {vip}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n");
    documents(&[
        service(name, &spec, ""),
        slice(
            name,
            &format!("{name}-1"),
            false,
            &[("http", "TCP", 8080)],
            &[ep(crate::harness::topology::Topology::pod_ip(pod))],
        ),
    ])
}

/// Several documents as one file.
pub fn documents(docs: &[String]) -> String {
    docs.join("---\n")
}

/// Service `web` at `vip` (TCP 80 and UDP 53, both to 8080) over the pods numbered
/// `endpoints` of the topology.
pub fn web_tcp_and_udp(vip: &str, endpoints: &[usize]) -> String {
    let pods: Vec<String> =
        endpoints.iter().map(|i| crate::harness::topology::Topology::pod_ip(*i)).collect();
    crate::harness::topology::service_yaml(
        "web",
        vip,
        &[("http", "TCP", 80, 8080), ("dns", "UDP", 53, 8080)],
        &pods,
    )
}
