//! The node agent's command line: the one list of its flags. Each is `None` (or `false`)
//! when not given, so that the `--config` file or the default applies.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use kpx_proto::cli::{parse_duration, LogFormat};

#[derive(clap::Parser, Debug, Default, Clone)]
#[command(name = "kpx-dataplane", version, about = "kpx node agent: programs the kernel from delta xDS")]
pub struct Flags {
    /// A KubeProxyConfiguration-style YAML file; flags given on the command line win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This node's name (the xDS node id).
    #[arg(long)]
    pub node_name: Option<String>,
    /// The control plane's gRPC URL, e.g. http://127.0.0.1:18000; several replicas
    /// separated by commas, tried in turn when one fails.
    #[arg(long)]
    pub control_plane: Option<String>,
    /// Which kernel facility to program [default: nftables].
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Where the accepted state is kept (sled).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// kube-proxy's feature gates kpx acts on, `NAME=BOOL,…` over the file's `featureGates`:
    /// `KubeProxyIPVS` (the ipvs mode may be chosen), `AllowServiceExternalIPs` (Services'
    /// externalIPs are programmed); defaults follow `--kubernetes-version`.
    #[arg(long, value_parser = super::gates::parse_flag)]
    pub feature_gates: Option<std::collections::BTreeMap<String, bool>>,
    /// The Kubernetes version whose kube-proxy defaults apply (`1.38`, `v1.40.1`): from
    /// 1.40 the two gates are off and an empty mode is nftables (before: iptables).
    /// Without it: kpx's own defaults (gates on, nftables).
    #[arg(long, value_parser = super::gates::KubernetesVersion::parse)]
    pub kubernetes_version: Option<super::gates::KubernetesVersion>,
    /// Masquerade all Service traffic (kube-proxy's masqueradeAll).
    #[arg(long)]
    pub masquerade_all: bool,
    /// Open NodePorts only on the node's addresses inside these prefixes (comma-separated),
    /// or `primary`: on the node's primary address of each family. Default: `primary` with
    /// nftables, all of the node's addresses with iptables and IPVS (as kube-proxy); never
    /// on loopback.
    #[arg(long, value_delimiter = ',')]
    pub nodeport_addresses: Option<Vec<String>>,
    /// Pod CIDRs for local-traffic detection (comma-separated); default: the control plane's.
    #[arg(long, value_delimiter = ',', value_parser = parse_cidr)]
    pub cluster_cidr: Option<Vec<IpNet>>,
    /// Handle only the Services labelled `service.kubernetes.io/service-proxy-name: NAME`
    /// (without it: only the Services without that label), to run beside another proxy.
    #[arg(long, value_parser = parse_service_proxy_name)]
    pub service_proxy_name: Option<String>,
    /// What tells pod traffic from other traffic (kube-proxy's `--detect-local-mode`):
    /// ClusterCIDR (the cluster CIDR, else the node's pod CIDRs), NodeCIDR (the node's pod
    /// CIDRs), BridgeInterface (`--pod-bridge-interface`), InterfaceNamePrefix
    /// (`--pod-interface-name-prefix`) [default: ClusterCIDR].
    #[arg(long)]
    pub detect_local_mode: Option<String>,
    /// With `--detect-local-mode=BridgeInterface`: the bridge the node's pods hang off.
    #[arg(long)]
    pub pod_bridge_interface: Option<String>,
    /// With `--detect-local-mode=InterfaceNamePrefix`: how the node's pod interfaces are named.
    #[arg(long)]
    pub pod_interface_name_prefix: Option<String>,
    /// With `--backend iptables`: NodePorts also on 127.0.0.1 (`route_localnet` set, and
    /// packets to 127.0.0.0/8 from elsewhere dropped), when `--nodeport-addresses` allows
    /// loopback (kube-proxy's `--iptables-localhost-nodeports`) [default: true].
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub iptables_localhost_nodeports: Option<bool>,
    /// Which iptables flavour `--backend iptables` (and ipvs) drives [default: auto: the one
    /// holding more rules].
    #[arg(long, value_enum)]
    pub iptables_mode: Option<IptablesMode>,
    /// An HTTP/2 PING to the control plane this often, the stream given up when one is not
    /// answered within as long: a dead link is noticed within twice this [default: 10s].
    #[arg(long, value_parser = parse_duration)]
    pub control_plane_keepalive: Option<Duration>,
    /// Reprogram everything this often (0s: never), repairing rules changed behind kpx's back [default: 1h].
    #[arg(long, value_parser = parse_duration)]
    pub full_sync_period: Option<Duration>,
    /// Apply deltas at most this often; the control plane coalesces changes meanwhile [default: 0s].
    #[arg(long, value_parser = parse_duration)]
    pub min_sync_period: Option<Duration>,
    /// The IPVS scheduler (rr, wrr, lc, wlc, sh, dh, mh) of Services without the
    /// `service.kpx.io/ipvs-scheduler` annotation [default: rr].
    #[arg(long, value_parser = parse_scheduler)]
    pub ipvs_scheduler: Option<String>,
    /// How long an IPVS destination that went away may keep its connections before it is
    /// removed (it takes no new ones meanwhile) [default: 15m].
    #[arg(long, value_parser = parse_duration)]
    pub ipvs_drain_grace: Option<Duration>,
    /// With `--backend ipvs`: answer ARP only for addresses of the interface asked on, so the
    /// Service addresses kpx binds are not announced (kube-proxy's `ipvs.strictARP`).
    #[arg(long)]
    pub ipvs_strict_arp: bool,
    /// The admin gRPC API (kpx.admin.v1.NodeAdmin, health, reflection) [default: 127.0.0.1:18001].
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// kube-proxy's /healthz and /livez [default: 0.0.0.0:10256].
    #[arg(long)]
    pub healthz_listen: Option<SocketAddr>,
    /// Prometheus /metrics [default: 127.0.0.1:10249].
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// The CA (PEM) that signs the control plane's certificate; with it the control plane
    /// URL is `https://`.
    #[arg(long = "tls-ca")]
    pub tls_ca: Option<PathBuf>,
    /// This node's client certificate (PEM; Subject CN `system:node:NAME`, as kubelet's, or a
    /// DNS SAN naming the node), for mutual TLS.
    #[arg(long = "tls-cert")]
    pub tls_cert: Option<PathBuf>,
    /// The key of `--tls-cert` (PEM).
    #[arg(long = "tls-key")]
    pub tls_key: Option<PathBuf>,
    /// A projected ServiceAccount token (re-read at every connection) sent to the control
    /// plane, which checks it with a TokenReview.
    #[arg(long)]
    pub node_token_file: Option<PathBuf>,
    /// Allow plaintext gRPC on a non-loopback address (the control plane URL, --admin-listen).
    #[arg(long)]
    pub insecure: bool,
    /// `nf_conntrack_max` is at least this times the CPUs (0: left alone) [default: 32768].
    #[arg(long)]
    pub conntrack_max_per_core: Option<u64>,
    /// `nf_conntrack_max` is at least this [default: 131072].
    #[arg(long)]
    pub conntrack_min: Option<u64>,
    /// conntrack's timeout of established TCP connections (0s: left alone) [default: 24h].
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_tcp_timeout_established: Option<Duration>,
    /// conntrack's timeout of TCP connections in CLOSE_WAIT (0s: left alone) [default: 1h].
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_tcp_timeout_close_wait: Option<Duration>,
    /// conntrack's TCP liberal mode (packets outside the window are not INVALID).
    #[arg(long)]
    pub conntrack_tcp_be_liberal: bool,
    /// conntrack's UDP timeout (0s: left alone) [default: 0s].
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_udp_timeout: Option<Duration>,
    /// conntrack's UDP stream timeout (0s: left alone) [default: 0s].
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_udp_timeout_stream: Option<Duration>,
    /// Where the node's /proc/sys/net is (an unprivileged container's own is read-only:
    /// the node's mounted writable elsewhere lets the agent keep its settings)
    /// [default: /proc/sys/net].
    #[arg(long)]
    pub proc_sys_net: Option<PathBuf>,
    /// Make the node's kernel settings (conntrack's, and what the backend needs), then
    /// exit (kube-proxy's `--init-only`): run privileged, before the agent, which then
    /// needs no write access to /proc/sys.
    #[arg(long, conflicts_with = "cleanup")]
    pub init_only: bool,
    /// Remove everything kpx programmed, then exit.
    #[arg(long)]
    pub cleanup: bool,
    /// With --cleanup: also remove what kube-proxy left behind (its nftables tables, its
    /// KUBE- iptables chains but kubelet's, kube-ipvs0 with its IPVS services and ipsets).
    #[arg(long, requires = "cleanup")]
    pub kube_proxy: bool,
    /// With --cleanup: remove only what kube-proxy left behind, leaving kpx's rules
    /// serving (the step of a migration from kube-proxy to kpx).
    #[arg(long, requires = "cleanup", conflicts_with = "kube_proxy")]
    pub kube_proxy_only: bool,
    /// The API server's real address (`https://HOST:PORT`), never a Service kpx programs:
    /// where the agent asks for the control plane's endpoints when none it knows answers,
    /// and posts Events on its Node. Without it, the API server's addresses the stored
    /// state has (the `kubernetes` Service's endpoints) are used.
    #[arg(long)]
    pub api_server: Option<String>,
    /// A ServiceAccount token for the API server (re-read at every request).
    #[arg(long)]
    pub api_server_token_file: Option<PathBuf>,
    /// The CA (PEM) of the API server's certificate, which must name the URL's host, or
    /// `kubernetes.default.svc` when it is dialled by address.
    #[arg(long = "api-server-ca")]
    pub api_server_ca: Option<PathBuf>,
    /// This agent's pod UID (a pod sets it from the downward API): `/readyz` names it, and
    /// `--probe` takes only an answer that names it.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Probe the agent running on this node (its `--healthz-listen`) and exit 0 when it
    /// answers as it should: `ready` (synced, and a control plane reached since it started)
    /// or `live` (synced); with `--pod-uid`, only an answer from that pod's agent counts.
    #[arg(long, value_enum, conflicts_with_all = ["cleanup", "init_only"])]
    pub probe: Option<ProbeKind>,
    /// Log format: human or json.
    #[arg(long, default_value = "human", value_parser = str::parse::<LogFormat>)]
    pub log_format: LogFormat,
}

/// What `--probe` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeKind {
    Ready,
    Live,
}

/// The backends a node agent can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Nftables,
    Iptables,
    Ipvs,
}

/// Which iptables flavour to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IptablesMode {
    /// The flavour holding more rules already, as kube-proxy's iptables wrapper decides.
    Auto,
    Nft,
    Legacy,
}

fn parse_cidr(text: &str) -> Result<IpNet, String> {
    text.trim()
        .parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("{text:?} is not a CIDR (like 10.0.0.0/8)"))
}

fn parse_service_proxy_name(text: &str) -> Result<String, String> {
    kpx_proto::check_service_proxy_name(text).map(|()| text.to_owned())
}

/// An IPVS scheduler kpx knows (`--ipvs-scheduler`, `ipvs.scheduler`).
pub fn parse_scheduler(text: &str) -> Result<String, String> {
    if kpx_proto::types::IPVS_SCHEDULERS.contains(&text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not an IPVS scheduler (one of {})",
            kpx_proto::types::IPVS_SCHEDULERS.join(", ")
        ))
    }
}
