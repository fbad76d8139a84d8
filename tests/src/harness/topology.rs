//! A node with a client and backend pods, and kpx running on it.
//!
//! ```text
//!  client (10.0.0.2, 10.0.0.3,   ── veth ── node (10.0.0.1, 10.0.1.1,   ── veth ── podI (10.244.I+1.2,
//!          fd00::2)                             fd00::1; 10.244.I+1.1,               fd00:244:I+1::2)
//!                                               fd00:244:I+1::1)
//! ```
//! The node routes between them (it is the default gateway of every other
//! namespace) and runs the kpx control plane and node agent; kpx's rules live
//! in the node namespace only. The node's Node object (see [`node_yaml`]) says
//! it is `node-a` in zone `zone-a` with pod CIDR 10.244.0.0/16.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::harness::netns::Netns;
use crate::harness::process::KpxProcess;
use crate::harness::traffic::Backend;

pub const CONTROL_PLANE_ADDR: &str = "127.0.0.1:18000";
pub const NODE_NAME: &str = "node-a";
pub const NODE_IP: &str = "10.0.0.1";
/// A second node address (for NodePort address filtering).
pub const NODE_IP_2: &str = "10.0.1.1";
pub const NODE_IP6: &str = "fd00::1";
pub const CLIENT_IP: &str = "10.0.0.2";
/// A second client address (for source-range filtering).
pub const CLIENT_IP_2: &str = "10.0.0.3";
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// Which backend the node agent drives (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyBackend {
    Nftables,
    /// iptables, nf_tables flavour.
    Iptables,
    IptablesLegacy,
    Ipvs,
}

impl ProxyBackend {
    /// The node agent's flags that select this backend.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            ProxyBackend::Nftables => &["--backend=nftables"],
            ProxyBackend::Iptables => &["--backend=iptables", "--iptables-mode=nft"],
            ProxyBackend::IptablesLegacy => &["--backend=iptables", "--iptables-mode=legacy"],
            ProxyBackend::Ipvs => &["--backend=ipvs"],
        }
    }

    /// How long ClientIP affinity may outlast its timeout after a client's last connection.
    /// IPVS keeps a client's persistence template while it still tracks one of the client's
    /// connections, and it tracks a closed TCP connection for its TIME_WAIT (2 minutes, not
    /// settable), re-checking the template every 60 s after the first expiry: the affinity
    /// ends about 2 minutes after the last connection, not after the timeout (kube-proxy's
    /// IPVS mode behaves the same). The netfilter backends keep the timeout exactly.
    pub fn affinity_linger(self) -> std::time::Duration {
        match self {
            ProxyBackend::Ipvs => std::time::Duration::from_secs(185),
            _ => std::time::Duration::ZERO,
        }
    }
}

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
                "net.ipv6.conf.all.forwarding=1",
            ],
        );
        link(&node, "to-client", "10.0.0.1/24", &client, "10.0.0.2/24");
        node.ip(&["addr", "add", "10.0.1.1/24", "dev", "to-client"]);
        node.ip(&["addr", "add", "fd00::1/64", "dev", "to-client", "nodad"]);
        client.ip(&["addr", "add", "10.0.0.3/24", "dev", "eth0"]);
        client.ip(&["addr", "add", "fd00::2/64", "dev", "eth0", "nodad"]);
        client.ip(&["route", "add", "default", "via", "10.0.0.1"]);
        client.ip(&["-6", "route", "add", "default", "via", "fd00::1"]);
        // Unknown destinations leave through the client side, so packets to a
        // Service address without endpoints reach the forward hook (as on a real node).
        node.ip(&["route", "add", "default", "via", "10.0.0.2"]);
        node.ip(&["-6", "route", "add", "default", "via", "fd00::2"]);
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
                node.ip(&[
                    "addr",
                    "add",
                    &format!("fd00:244:{n}::1/64"),
                    "dev",
                    &format!("to-pod{i}"),
                    "nodad",
                ]);
                pod.ip(&["addr", "add", &format!("fd00:244:{n}::2/64"), "dev", "eth0", "nodad"]);
                pod.ip(&["-6", "route", "add", "default", "via", &format!("fd00:244:{n}::1")]);
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

    /// The IPv6 address of pod `i`.
    pub fn pod_ip6(i: usize) -> String {
        format!("fd00:244:{}::2", i + 1)
    }

    /// The node's address on the link to pod `i` (the source of masqueraded traffic to it).
    pub fn node_ip_towards_pod(i: usize) -> String {
        format!("10.244.{}.1", i + 1)
    }

    /// Writes the node's Node object (zone `zone-a`, addresses 10.0.0.1, 10.0.1.1 and fd00::1).
    pub fn write_node(&self) {
        self.write_manifest("node.yaml", &node_yaml(NODE_NAME, "zone-a"));
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
        self.start_control_plane_with(&[])
    }

    /// The control plane with extra flags (e.g. `--cluster-cidr=…`).
    pub fn start_control_plane_with(&self, extra: &[&str]) -> KpxProcess {
        let mut args = vec![
            format!("--source=file:{}", self.manifests().display()),
            format!("--listen={CONTROL_PLANE_ADDR}"),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        KpxProcess::start(&self.node, "kpx-controlplane", &args, self.log_path("controlplane"))
    }

    /// The control plane reading `sources` (`--source` values) instead of the manifest
    /// folder; on the usual address unless `extra` gives a `--listen`.
    pub fn start_control_plane_from(&self, sources: &[String], extra: &[&str]) -> KpxProcess {
        let mut args: Vec<String> = sources.iter().map(|s| format!("--source={s}")).collect();
        if !extra.iter().any(|a| a.starts_with("--listen=")) {
            args.push(format!("--listen={CONTROL_PLANE_ADDR}"));
        }
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        KpxProcess::start(&self.node, "kpx-controlplane", &args, self.log_path("controlplane"))
    }

    /// A further control plane replica over the same manifests, listening on `listen`
    /// (gRPC) and `metrics` (HTTP).
    pub fn start_control_plane_at(&self, listen: &str, metrics: &str) -> KpxProcess {
        let args = [
            format!("--source=file:{}", self.manifests().display()),
            format!("--listen={listen}"),
            format!("--metrics-listen={metrics}"),
        ];
        KpxProcess::start(&self.node, "kpx-controlplane", &args, self.log_path("controlplane"))
    }

    pub fn start_dataplane(&self) -> KpxProcess {
        self.start_dataplane_with(ProxyBackend::Nftables, &[])
    }

    /// The node agent's flags: this node, the control plane, `state`, `backend` and `extra`.
    fn dataplane_args(state: &Path, backend: ProxyBackend, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            format!("--node-name={NODE_NAME}"),
            format!("--control-plane=http://{CONTROL_PLANE_ADDR}"),
            format!("--state-dir={}", state.display()),
        ];
        args.extend(backend.args().iter().chain(extra).map(|a| (*a).to_owned()));
        args
    }

    /// The node agent driving `backend`, with extra flags (e.g. `--masquerade-all`).
    pub fn start_dataplane_with(&self, backend: ProxyBackend, extra: &[&str]) -> KpxProcess {
        let args = Self::dataplane_args(&self.dir.path().join("state"), backend, extra);
        KpxProcess::start(&self.node, "kpx-dataplane", &args, self.log_path("dataplane"))
    }

    /// The node agent driving `backend` under `wrapper` (a profiler: `heaptrack -o FILE`);
    /// without one, as [`Topology::start_dataplane_with`].
    pub fn start_dataplane_under(&self, backend: ProxyBackend, wrapper: &[String]) -> KpxProcess {
        self.start_dataplane_from(&crate::harness::process::binary("kpx-dataplane"), backend, wrapper)
    }

    /// [`Self::start_dataplane_under`], the agent being the binary at `binary` (another
    /// build's, to compare with).
    pub fn start_dataplane_from(
        &self,
        binary: &Path,
        backend: ProxyBackend,
        wrapper: &[String],
    ) -> KpxProcess {
        let args = Self::dataplane_args(&self.dir.path().join("state"), backend, &["--log-format=json"]);
        let log = self.log_path("dataplane");
        let Some((program, wrapper_args)) = wrapper.split_first() else {
            return KpxProcess::start_path(&self.node, binary, "kpx-dataplane", &args, log);
        };
        let mut wrapped = wrapper_args.to_vec();
        wrapped.push(binary.display().to_string());
        wrapped.extend(args);
        KpxProcess::start_path(&self.node, Path::new(program), "kpx-dataplane", &wrapped, log)
    }

    /// The node agent driving `backend`, with extra flags and environment variables.
    pub fn start_dataplane_with_env(
        &self,
        backend: ProxyBackend,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> KpxProcess {
        let args = Self::dataplane_args(&self.dir.path().join("state"), backend, extra);
        KpxProcess::start_with_env(&self.node, "kpx-dataplane", &args, self.log_path("dataplane"), env)
    }

    /// The node agent driving `backend` with its state directory on a tmpfs of `size` of
    /// its own (see [`KpxProcess::start_on_tmpfs`]); returns the directory too.
    pub fn start_dataplane_on_tmpfs(&self, backend: ProxyBackend, size: &str) -> (KpxProcess, PathBuf) {
        let state = self.dir.path().join("state-tmpfs");
        let args = Self::dataplane_args(&state, backend, &[]);
        let dp = KpxProcess::start_on_tmpfs(
            &self.node,
            "kpx-dataplane",
            &args,
            self.log_path("dataplane"),
            &state,
            size,
        );
        (dp, state)
    }

    /// A node agent that says it is `node`, reaching the control plane at `url`, with a
    /// state directory of its own named `state`, and extra flags (TLS, token).
    pub fn start_agent(&self, node: &str, url: &str, state: &str, extra: &[String]) -> KpxProcess {
        let mut args = vec![
            format!("--node-name={node}"),
            format!("--control-plane={url}"),
            format!("--state-dir={}", self.dir.path().join(state).display()),
        ];
        args.extend(extra.iter().cloned());
        KpxProcess::start(&self.node, "kpx-dataplane", &args, self.log_path("dataplane"))
    }

    /// A log file of its own for every process started.
    fn log_path(&self, program: &str) -> PathBuf {
        (0..)
            .map(|n| self.dir.path().join(format!("{program}-{n}.log")))
            .find(|p| !p.exists())
            .unwrap_or_else(|| self.dir.path().join(format!("{program}.log")))
    }

    /// Sends three TCP segments with SYN and FIN set (conntrack calls them INVALID) from the
    /// client to pod `pod`'s port 8080, through the node, and waits until `dropped` (the
    /// packet counter of a kernel rule that drops them) has counted all three.
    pub fn wait_invalid_segments_dropped(&self, pod: usize, rule: &str, dropped: impl Fn() -> u64) {
        const SYN_FIN: u8 = 0x03;
        let before = dropped();
        let client: std::net::Ipv4Addr = CLIENT_IP.parse().expect("client address");
        let to = std::net::SocketAddrV4::new(Self::pod_ip(pod).parse().expect("pod address"), 8080);
        for _ in 0..3 {
            self.client.run_in(move || crate::harness::traffic::send_tcp_segment(client, to, SYN_FIN));
        }
        crate::wait_for(&format!("{rule} to drop the three INVALID segments"), crate::DEADLINE, || {
            (dropped() >= before + 3).then_some(())
        });
    }

    /// Waits until a TCP request from the client to `vip:port` is answered by `backend`.
    pub fn wait_answered_by(&self, vip: &str, port: u16, backend: &str) {
        let to = sock(vip, port);
        let want = crate::harness::traffic::Answer::From(backend.to_owned());
        crate::wait_for(&format!("{to} to be answered by {backend}"), crate::DEADLINE, || {
            (self.client.run_in(move || crate::harness::traffic::tcp_request(to)) == want).then_some(())
        });
    }

    /// `kpxctl ARGS` run on the node (its defaults reach the agent and the control plane there).
    pub fn kpxctl<S: AsRef<str>>(&self, args: &[S]) -> std::process::Output {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        self.node.try_exec(&crate::harness::process::binary("kpxctl").display().to_string(), &args)
    }

    /// kpx's table as the kernel holds it.
    pub fn ruleset(&self) -> String {
        let out = self.node.try_exec("nft", &["list", "table", "inet", "kpx"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The kernel's handles (`nft -a`) of kpx's nftables table, its base chains, and the
    /// endpoint maps: new ones mean they were deleted and made again.
    pub fn nft_kept_object_handles(&self) -> Vec<String> {
        let out = self.node.try_exec("nft", &["-a", "-t", "list", "table", "inet", "kpx"]);
        assert!(out.status.success(), "nft -a list: {}", String::from_utf8_lossy(&out.stderr));
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let kept = ["table ", "chain nat-", "chain filter-", "map endpoints-", "map local-endpoints-"];
        let handles: Vec<String> = listing
            .lines()
            .map(str::trim)
            .filter(|l| kept.iter().any(|k| l.starts_with(k)))
            .map(str::to_owned)
            .collect();
        assert!(handles.len() >= 11 && handles.iter().all(|h| h.contains("# handle")), "{listing}");
        handles
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

/// `addr:port` as a socket address (IPv6 addresses without brackets too).
pub fn sock(addr: &str, port: u16) -> SocketAddr {
    let ip: std::net::IpAddr = addr.parse().expect("IP address");
    SocketAddr::new(ip, port)
}

/// A Node object: its name, zone, addresses (InternalIP) and pod CIDR.
pub fn node_yaml(name: &str, zone: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{topology.kubernetes.io/zone: {zone}}}\nspec: {{podCIDR: 10.244.0.0/16, podCIDRs: [10.244.0.0/16, 'fd00:244::/48']}}\nstatus:\n  addresses:\n  - {{type: InternalIP, address: {NODE_IP}}}\n  - {{type: InternalIP, address: {NODE_IP_2}}}\n  - {{type: InternalIP, address: '{NODE_IP6}'}}\n"
    )
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
