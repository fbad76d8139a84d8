//! A node with a client and backend pods, and kpx running on it.
//!
//! ```text
//!  client (10.0.0.2) ── veth ── node (10.0.0.1; 10.244.I.1) ── veth ── podI (10.244.I.2)
//! ```
//! The node routes between them (it is the default gateway of every other
//! namespace) and runs the kpx control plane and node agent; kpx's rules live
//! in the node namespace only.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::netns::Netns;
use crate::process::KpxProcess;
use crate::traffic::Backend;

pub const CONTROL_PLANE_ADDR: &str = "127.0.0.1:18000";
pub const NODE_NAME: &str = "node-a";

pub struct Topology {
    pub node: Netns,
    pub client: Netns,
    pub pods: Vec<Netns>,
    pub dir: tempfile::TempDir,
}

impl Topology {
    /// A node, a client and `pods` pod namespaces, all wired and routed.
    pub fn new(pods: usize) -> Topology {
        let node = Netns::new("node");
        let client = Netns::new("client");
        // No ICMP redirects: they would use up the per-host ICMP budget that rejects need.
        node.exec(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.send_redirects=0",
                "net.ipv4.conf.default.send_redirects=0",
            ],
        );
        link(&node, "to-client", "10.0.0.1/24", &client, "10.0.0.2/24");
        client.ip(&["route", "add", "default", "via", "10.0.0.1"]);
        // Unknown destinations leave through the client side, so packets to a
        // Service address without endpoints reach the forward hook (as on a real node).
        node.ip(&["route", "add", "default", "via", "10.0.0.2"]);
        let pods = (0..pods)
            .map(|i| {
                let pod = Netns::new(&format!("pod{i}"));
                let n = i + 1;
                link(
                    &node,
                    &format!("to-pod{i}"),
                    &format!("10.244.{n}.1/24"),
                    &pod,
                    &format!("10.244.{n}.2/24"),
                );
                pod.ip(&["route", "add", "default", "via", &format!("10.244.{n}.1")]);
                pod
            })
            .collect();
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("manifests")).expect("manifest dir");
        Topology { node, client, pods, dir }
    }

    /// The address of pod `i`.
    pub fn pod_ip(i: usize) -> String {
        format!("10.244.{}.2", i + 1)
    }

    /// Starts a backend named `pod<i>` in every pod, on `port`.
    pub fn start_backends(&self, port: u16) -> Vec<Backend> {
        self.pods.iter().enumerate().map(|(i, ns)| Backend::start(ns, &format!("pod{i}"), port)).collect()
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Writes a manifest file atomically (write, then rename).
    pub fn write_manifest(&self, file: &str, text: &str) {
        write_atomically(&self.manifests().join(file), text);
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests().join(file)).expect("remove manifest");
    }

    pub fn start_control_plane(&self) -> KpxProcess {
        let args = vec![
            format!("--source=file:{}", self.manifests().display()),
            format!("--listen={CONTROL_PLANE_ADDR}"),
        ];
        KpxProcess::start(&self.node, "kpx-controlplane", &args, self.log_path("controlplane"))
    }

    pub fn start_dataplane(&self) -> KpxProcess {
        let args = vec![
            format!("--node-name={NODE_NAME}"),
            format!("--control-plane=http://{CONTROL_PLANE_ADDR}"),
            "--backend=nftables".to_owned(),
            format!("--state-dir={}", self.dir.path().join("state").display()),
        ];
        KpxProcess::start(&self.node, "kpx-dataplane", &args, self.log_path("dataplane"))
    }

    /// A log file of its own for every process started.
    fn log_path(&self, program: &str) -> PathBuf {
        (0..)
            .map(|n| self.dir.path().join(format!("{program}-{n}.log")))
            .find(|p| !p.exists())
            .unwrap_or_else(|| self.dir.path().join(format!("{program}.log")))
    }

    /// kpx's table as the kernel holds it.
    pub fn ruleset(&self) -> String {
        let out = self.node.try_exec("nft", &["list", "table", "inet", "kpx"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until kpx's table mentions `text`.
    pub fn wait_rules_contain(&self, text: &str) {
        crate::wait_for(&format!("rules to contain {text:?}"), crate::DEADLINE, || {
            self.ruleset().contains(text).then_some(())
        });
    }
}

fn link(a: &Netns, a_if: &str, a_addr: &str, b: &Netns, b_addr: &str) {
    a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", "eth0", "netns", &b.name]);
    a.ip(&["addr", "add", a_addr, "dev", a_if]);
    a.ip(&["link", "set", a_if, "up"]);
    b.ip(&["addr", "add", b_addr, "dev", "eth0"]);
    b.ip(&["link", "set", "eth0", "up"]);
}

pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, path).expect("rename manifest");
}

/// `addr:port` as a socket address.
pub fn sock(addr: &str, port: u16) -> SocketAddr {
    format!("{addr}:{port}").parse().expect("socket address")
}

/// A Service and its EndpointSlice as manifests: `ports` are (name, protocol, port, target port).
pub fn service_yaml(
    name: &str,
    cluster_ip: &str,
    ports: &[(&str, &str, u16, u16)],
    endpoints: &[String],
) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n  clusterIP: {cluster_ip}\n  ports:\n"
    );
    for (pname, proto, port, _) in ports {
        s.push_str(&format!("  - {{name: {pname}, protocol: {proto}, port: {port}}}\n"));
    }
    s.push_str(&format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: test\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports:\n"
    ));
    for (pname, proto, _, target) in ports {
        s.push_str(&format!("- {{name: {pname}, protocol: {proto}, port: {target}}}\n"));
    }
    s.push_str("endpoints:\n");
    if endpoints.is_empty() {
        s.push_str("[]\n");
        s = s.replace("endpoints:\n[]\n", "endpoints: []\n");
    }
    for ep in endpoints {
        s.push_str(&format!("- {{addresses: [{ep}], conditions: {{ready: true}}, nodeName: {NODE_NAME}}}\n"));
    }
    s
}
