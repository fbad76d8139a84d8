//! The node agent's configuration, parsed once into typed values: command-line flags
//! ([`flags`]) over an optional KubeProxyConfiguration-style file ([`file`]), over
//! defaults. Nothing else reads flags or the file; the agent, its servers and the
//! backends receive what they need from [`AgentConfig`].

mod conntrack;
pub mod file;
pub mod flags;
pub mod gates;
mod unused;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use kpx_proto::cli::parse_duration;
use kpx_proto::node_context::{LocalMode, NodePortAddresses, ProxySettings};

pub use conntrack::ConntrackSettings;
pub use flags::{BackendKind, Flags, IptablesMode, ProbeKind};

use crate::apiserver::{ApiCredentials, ApiServer};
use crate::backend::ipvs::IpvsOptions;
use crate::connection::{ClientIdentity, ClientTls, ControlPlane};
use crate::home::ApiAccess;
use crate::serve::Listen;
use file::{KubeProxyConfiguration, ModeSection};
use gates::{FeatureGates, KubernetesVersion};

/// A configuration that cannot be used; the message names the flag or field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--config {}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("--config {}: {field}: {reason} (kpx supports the fields shown in kpx-dataplane --help)", path.display())]
    Unsupported { path: PathBuf, field: String, reason: String },
    #[error("--config: {field}: {reason}")]
    Field { field: String, reason: String },
    #[error("--control-plane {url:?}: not a URL: {reason}")]
    ControlPlaneUrl { url: String, reason: String },
    #[error("{} required (or {} in --config)", missing.iter().map(|m| m.0).collect::<Vec<_>>().join(", "), missing.iter().map(|m| m.1).collect::<Vec<_>>().join(", "))]
    Missing { missing: Vec<(&'static str, &'static str)> },
    #[error("{flag}: {reason}")]
    Tls { flag: &'static str, reason: String },
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("{flag} {address}: plaintext gRPC on a non-loopback address needs --insecure (or TLS: --tls-ca, --tls-cert, --tls-key)")]
    Plaintext { flag: &'static str, address: String },
}

impl ConfigError {
    pub(crate) fn field(field: &str, reason: impl std::fmt::Display) -> Self {
        ConfigError::Field { field: field.to_owned(), reason: reason.to_string() }
    }
}

/// Where the chart and the systemd unit keep the agent's state; what `--cleanup` clears
/// when no `--state-dir` is given.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kpx";

/// Everything the agent runs with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub backend: BackendConfig,
    pub proxy: ProxySettings,
    /// kube-proxy's `conntrack` settings, made on the node at start (or by `--init-only`).
    pub conntrack: ConntrackSettings,
    /// Where the node's `/proc/sys/net` is.
    pub proc_sys_net: PathBuf,
    pub mode: Mode,
}

/// Which backend, with its own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    Nftables,
    Iptables {
        mode: IptablesMode,
        /// NodePorts on 127.0.0.1 too (kube-proxy's `iptables.localhostNodePorts`, where
        /// `nodePortAddresses` allows loopback).
        localhost_nodeports: bool,
    },
    /// IPVS, with iptables of `mode` for what IPVS cannot do.
    Ipvs {
        mode: IptablesMode,
        options: IpvsOptions,
    },
}

impl BackendConfig {
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendConfig::Nftables => BackendKind::Nftables,
            BackendConfig::Iptables { .. } => BackendKind::Iptables,
            BackendConfig::Ipvs { .. } => BackendKind::Ipvs,
        }
    }
}

/// What the agent is to do.
#[derive(Debug, Clone)]
pub enum Mode {
    /// `--cleanup`: remove what kpx programmed with the backend and its stored state in
    /// `state_dir` (`own`), and what kube-proxy left (`kube_proxy`), then exit.
    Cleanup { own: bool, kube_proxy: bool, state_dir: PathBuf },
    /// `--init-only`: make the node's kernel settings, then exit.
    InitOnly,
    /// `--probe`: ask the agent on `healthz` whether it is ready (or live), then exit.
    Probe { kind: ProbeKind, healthz: SocketAddr, pod_uid: Option<String> },
    /// Follow a control plane and program the kernel.
    Run(Box<RunConfig>),
}

/// What following a control plane needs.
/// How often the kernel is synced.
#[derive(Debug, Clone, Copy)]
pub struct SyncPeriods {
    /// A full resync this often (`None`: never), repairing rules someone else changed;
    /// with or without a control plane (see [`crate::upkeep`]).
    pub full: Option<Duration>,
    /// At least this long between two applies: a delta that comes sooner waits, and the
    /// control plane (which sends nothing new before the ACK) coalesces changes meanwhile.
    pub min: Duration,
}

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub node_name: String,
    /// The control plane's replicas, in the order they are tried (at least one).
    pub control_planes: Vec<ControlPlane>,
    pub state_dir: PathBuf,
    pub sync: SyncPeriods,
    pub listen: Listen,
    /// How the API server is reached (see [`crate::home`]).
    pub api: ApiAccess,
    /// This agent's pod, named by `/readyz`.
    pub pod_uid: Option<String>,
}

fn cidrs(field: &str, texts: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.trim()
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| ConfigError::field(&format!("{field}[{i}]"), format!("{t:?} is not a CIDR")))
        })
        .collect()
}

/// `nodePortAddresses`: CIDRs, or `primary` alone.
fn nodeport_addresses(field: &str, texts: &[String]) -> Result<NodePortAddresses, ConfigError> {
    match texts.iter().position(|t| t.trim() == "primary") {
        Some(_) if texts.len() == 1 => Ok(NodePortAddresses::Primary),
        Some(i) => Err(ConfigError::field(
            &format!("{field}[{i}]"),
            "\"primary\" stands alone: it cannot be combined with CIDRs",
        )),
        None => cidrs(field, texts).map(NodePortAddresses::Cidrs),
    }
}

fn address(field: &str, text: Option<&str>) -> Result<Option<SocketAddr>, ConfigError> {
    text.map(|t| t.parse().map_err(|_| ConfigError::field(field, format!("{t:?} is not ADDRESS:PORT"))))
        .transpose()
}

fn duration(field: &str, text: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    text.map(|t| parse_duration(t).map_err(|e| ConfigError::field(field, e))).transpose()
}

/// `--detect-local-mode` (or `detectLocalMode`) with the interface name its mode needs.
fn local_mode(flags: &Flags, file: &KubeProxyConfiguration) -> Result<LocalMode, ConfigError> {
    let (mode_field, mode) = match (&flags.detect_local_mode, &file.detect_local_mode) {
        (Some(m), _) => ("--detect-local-mode", m.as_str()),
        (None, Some(m)) => ("detectLocalMode", m.as_str()),
        (None, None) => return Ok(LocalMode::default()),
    };
    let names = file.detect_local.clone().unwrap_or_default();
    // The interface modes: the flag, the file field and what it names, and whether it is a prefix.
    let (flag, file_field, what, given, prefix) = match mode {
        "ClusterCIDR" => return Ok(LocalMode::ClusterCidr),
        "NodeCIDR" => return Ok(LocalMode::NodeCidr),
        "BridgeInterface" => (
            "--pod-bridge-interface",
            "detectLocal.bridgeInterface",
            "the bridge's name",
            (&flags.pod_bridge_interface, names.bridge_interface),
            false,
        ),
        "InterfaceNamePrefix" => (
            "--pod-interface-name-prefix",
            "detectLocal.interfaceNamePrefix",
            "the prefix",
            (&flags.pod_interface_name_prefix, names.interface_name_prefix),
            true,
        ),
        other => {
            return Err(ConfigError::field(
                mode_field,
                format!("{other:?}: expected ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix"),
            ))
        }
    };
    let (field, name) = match given {
        (Some(n), _) => (flag, n.clone()),
        (None, Some(n)) => (file_field, n),
        (None, None) => {
            return Err(ConfigError::field(
                flag,
                format!("{mode_field} {mode} needs {what} (or {file_field})"),
            ))
        }
    };
    LocalMode::interface(&name, prefix).map_err(|e| ConfigError::field(field, e.to_string()))
}

impl AgentConfig {
    /// Flags over the file over defaults.
    pub fn resolve(flags: Flags) -> Result<AgentConfig, ConfigError> {
        let file = match &flags.config {
            Some(path) => {
                let (file, ignored) = file::read(path)?;
                if !ignored.is_empty() {
                    tracing::warn!(
                        config = %path.display(),
                        fields = %ignored.join(", "),
                        "kpx does not act on these kube-proxy configuration fields: ignored"
                    );
                }
                file
            }
            None => KubeProxyConfiguration::default(),
        };
        let local_mode = local_mode(&flags, &file)?;
        let kpx = file.kpx.clone().unwrap_or_default();
        let version = match (flags.kubernetes_version, kpx.kubernetes_version.as_deref()) {
            (Some(v), _) => Some(v),
            (None, Some(text)) => Some(
                KubernetesVersion::parse(text).map_err(|e| ConfigError::field("kpx.kubernetesVersion", e))?,
            ),
            (None, None) => None,
        };
        let mut given_gates = file.feature_gates.clone().unwrap_or_default();
        given_gates.extend(flags.feature_gates.clone().unwrap_or_default());
        let gates_field = if flags.feature_gates.is_some() { "--feature-gates" } else { "featureGates" };
        let gates = FeatureGates::resolve(version, &given_gates, gates_field);
        let kind = match (flags.backend, file.mode.as_deref()) {
            (Some(b), _) => b,
            // kube-proxy's default mode, where a version is configured: iptables before 1.40.
            (None, None | Some("")) if version.is_some_and(|v| v < KubernetesVersion::GATES_OFF) => {
                BackendKind::Iptables
            }
            (None, None | Some("") | Some("nftables")) => BackendKind::Nftables,
            (None, Some("iptables")) => BackendKind::Iptables,
            (None, Some("ipvs")) => BackendKind::Ipvs,
            (None, Some(other)) => {
                return Err(ConfigError::field(
                    "mode",
                    format!("{other:?}: expected nftables, iptables or ipvs"),
                ))
            }
        };
        // The gates govern what the agent programs: `--cleanup` (removing an IPVS install
        // after the gate went off) and `--probe` neither refuse nor warn.
        let programs = flags.probe.is_none() && !flags.cleanup;
        if programs && kind == BackendKind::Ipvs {
            if !gates.kube_proxy_ipvs {
                let field = if flags.backend.is_some() { "--backend" } else { "mode" };
                return Err(gates::ipvs_refused(field, version));
            }
            // kube-proxy's own warning, from 1.35 on.
            tracing::warn!(
                "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead."
            );
        }
        if programs && !gates.allow_service_external_ips {
            tracing::warn!(
                gate = gates::ALLOW_SERVICE_EXTERNAL_IPS,
                "Service externalIPs are not programmed (the gate is off); LoadBalancer IPs still are"
            );
        }
        let (section_name, section) = match kind {
            BackendKind::Nftables => ("nftables", file.nftables.clone()),
            BackendKind::Iptables => ("iptables", file.iptables.clone()),
            BackendKind::Ipvs => ("ipvs", file.ipvs.clone()),
        };
        let section: ModeSection = section.unwrap_or_default();
        for (name, other) in [("nftables", &file.nftables), ("ipvs", &file.ipvs)] {
            if other.as_ref().is_some_and(|s| s.localhost_node_ports.is_some()) {
                return Err(ConfigError::field(
                    &format!("{name}.localhostNodePorts"),
                    "only the iptables section has localhostNodePorts",
                ));
            }
        }
        for (name, other) in [("nftables", &file.nftables), ("iptables", &file.iptables)] {
            if other.as_ref().is_some_and(|s| s.scheduler.is_some()) {
                return Err(ConfigError::field(
                    &format!("{name}.scheduler"),
                    "only the ipvs section has a scheduler",
                ));
            }
            if other.as_ref().is_some_and(|s| s.strict_arp.is_some()) {
                return Err(ConfigError::field(
                    &format!("{name}.strictARP"),
                    "only the ipvs section has strictARP",
                ));
            }
        }
        // Zero, as kubeadm writes an unset period, means the default (as in kube-proxy).
        let sync_period = duration(&format!("{section_name}.syncPeriod"), section.sync_period.as_deref())?
            .filter(|d| !d.is_zero());
        let min_sync_period =
            duration(&format!("{section_name}.minSyncPeriod"), section.min_sync_period.as_deref())?
                .filter(|d| !d.is_zero());
        let service_proxy_name = match (&flags.service_proxy_name, &kpx.service_proxy_name) {
            (Some(name), _) => Some(name.clone()),
            (None, Some(name)) => {
                kpx_proto::check_service_proxy_name(name)
                    .map_err(|e| ConfigError::field("kpx.serviceProxyName", e))?;
                Some(name.clone())
            }
            (None, None) => None,
        };
        let proxy = ProxySettings {
            masquerade_all: flags.masquerade_all || section.masquerade_all.unwrap_or(false),
            nodeport_addresses: match (&flags.nodeport_addresses, &file.node_port_addresses) {
                (Some(texts), _) => nodeport_addresses("--nodeport-addresses", texts)?,
                (None, Some(texts)) if !texts.is_empty() => nodeport_addresses("nodePortAddresses", texts)?,
                // kube-proxy's defaults (cmd/kube-proxy: "primary" for nftables only).
                _ if kind == BackendKind::Nftables => NodePortAddresses::Primary,
                _ => NodePortAddresses::All,
            },
            cluster_cidrs: match (&flags.cluster_cidr, &file.cluster_cidr) {
                (Some(c), _) => c.clone(),
                (None, Some(text)) => {
                    cidrs("clusterCIDR", &text.split(',').map(str::to_owned).collect::<Vec<_>>())?
                }
                (None, None) => Vec::new(),
            },
            local_mode,
            service_proxy_name,
            ignore_external_ips: !gates.allow_service_external_ips,
        };
        let backend = Self::backend(&flags, kind, &kpx, &file, &proxy.nodeport_addresses)?;
        let conntrack = conntrack(&flags, file.conntrack.clone().unwrap_or_default())?;
        let proc_sys_net = flags
            .proc_sys_net
            .clone()
            .or(kpx.proc_sys_net.clone())
            .unwrap_or_else(|| PathBuf::from(crate::exec::sysctl::PROC_SYS_NET));
        let listen = Listen {
            admin: flags
                .admin_listen
                .or(address("kpx.adminBindAddress", kpx.admin_bind_address.as_deref())?)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 18001))),
            healthz: flags
                .healthz_listen
                .or(address("healthzBindAddress", file.healthz_bind_address.as_deref())?)
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 10256))),
            metrics: flags
                .metrics_listen
                .or(address("metricsBindAddress", file.metrics_bind_address.as_deref())?)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 10249))),
        };
        if let Some(kind) = flags.probe {
            let mut healthz = listen.healthz;
            if healthz.ip().is_unspecified() {
                healthz.set_ip(if healthz.is_ipv4() {
                    [127, 0, 0, 1].into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                });
            }
            let mode = Mode::Probe { kind, healthz, pod_uid: flags.pod_uid.clone() };
            return Ok(AgentConfig { backend, proxy, conntrack, proc_sys_net, mode });
        }
        if flags.cleanup {
            let mode = Mode::Cleanup {
                own: !flags.kube_proxy_only,
                kube_proxy: flags.kube_proxy || flags.kube_proxy_only,
                state_dir: flags
                    .state_dir
                    .clone()
                    .or(kpx.state_dir.clone())
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            };
            return Ok(AgentConfig { backend, proxy, conntrack, proc_sys_net, mode });
        }
        if flags.init_only {
            return Ok(AgentConfig { backend, proxy, conntrack, proc_sys_net, mode: Mode::InitOnly });
        }
        let full = flags.full_sync_period.or(sync_period).unwrap_or(Duration::from_secs(3600));
        let sync = SyncPeriods {
            full: (!full.is_zero()).then_some(full),
            min: flags.min_sync_period.or(min_sync_period).unwrap_or(Duration::ZERO),
        };
        let node_name = flags.node_name.or(file.hostname_override);
        let control_plane = flags.control_plane.or(kpx.control_plane);
        let state_dir = flags.state_dir.or(kpx.state_dir);
        let (Some(node_name), Some(control_plane), Some(state_dir)) = (node_name, control_plane, state_dir)
        else {
            return Err(ConfigError::Missing {
                missing: vec![
                    ("--node-name", "hostnameOverride"),
                    ("--control-plane", "kpx.controlPlane"),
                    ("--state-dir", "kpx.stateDir"),
                ],
            });
        };
        let insecure = flags.insecure || kpx.insecure.unwrap_or(false);
        let tls = client_tls(
            flags.tls_ca.or(kpx.tls_ca),
            flags.tls_cert.or(kpx.tls_cert),
            flags.tls_key.or(kpx.tls_key),
        )?;
        let token_file = flags.node_token_file.or(kpx.node_token_file);
        let keepalive = match flags.control_plane_keepalive {
            None => crate::connection::DEFAULT_KEEPALIVE,
            Some(d) if d >= Duration::from_secs(1) => d,
            Some(d) => {
                return Err(ConfigError::Invalid {
                    field: "--control-plane-keepalive",
                    reason: format!("{d:?} is too short: at least 1s"),
                })
            }
        };
        let control_planes = control_plane
            .split(',')
            .map(|url| {
                let url = url.trim().to_owned();
                control_plane_of(url, tls.clone(), token_file.clone(), keepalive, insecure)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !insecure && !listen.admin.ip().is_loopback() {
            return Err(ConfigError::Plaintext { flag: "--admin-listen", address: listen.admin.to_string() });
        }
        let credentials = ApiCredentials {
            token_file: flags.api_server_token_file.or(kpx.api_server_token_file),
            ca: flags.api_server_ca.or(kpx.api_server_ca),
        };
        let api_server = match flags.api_server.or(kpx.api_server) {
            None => None,
            Some(url) => {
                let server = ApiServer::from_url(url.trim(), credentials.clone()).map_err(|reason| {
                    ConfigError::Invalid { field: "--api-server", reason: format!("{url:?}: {reason}") }
                })?;
                if server.https && credentials.ca.is_none() {
                    return Err(ConfigError::Invalid {
                        field: "--api-server-ca",
                        reason: format!("needed for {url}: the CA of the API server's certificate"),
                    });
                }
                if !server.https
                    && !insecure
                    && !server.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
                {
                    return Err(ConfigError::Invalid {
                        field: "--api-server",
                        reason: format!("{url}: plaintext HTTP to a non-loopback address needs --insecure"),
                    });
                }
                Some(server)
            }
        };
        let api = ApiAccess { configured: api_server, credentials };
        let run =
            RunConfig { node_name, control_planes, state_dir, sync, listen, api, pod_uid: flags.pod_uid };
        Ok(AgentConfig { backend, proxy, conntrack, proc_sys_net, mode: Mode::Run(Box::new(run)) })
    }

    fn backend(
        flags: &Flags,
        kind: BackendKind,
        kpx: &file::KpxSection,
        file: &KubeProxyConfiguration,
        nodeport_addresses: &NodePortAddresses,
    ) -> Result<BackendConfig, ConfigError> {
        let ipvs = file.ipvs.as_ref();
        let mode = match (flags.iptables_mode, kpx.iptables_mode.as_deref()) {
            (Some(m), _) => m,
            (None, None | Some("auto")) => IptablesMode::Auto,
            (None, Some("nft")) => IptablesMode::Nft,
            (None, Some("legacy")) => IptablesMode::Legacy,
            (None, Some(other)) => {
                return Err(ConfigError::field(
                    "kpx.iptablesMode",
                    format!("{other:?}: expected auto, nft or legacy"),
                ))
            }
        };
        let scheduler = match (&flags.ipvs_scheduler, ipvs.and_then(|s| s.scheduler.clone())) {
            (Some(s), _) => s.clone(),
            (None, Some(s)) => {
                flags::parse_scheduler(&s).map_err(|e| ConfigError::field("ipvs.scheduler", e))?
            }
            (None, None) => "rr".to_owned(),
        };
        let drain_grace = match flags.ipvs_drain_grace {
            Some(d) => d,
            None => duration("kpx.ipvsDrainGrace", kpx.ipvs_drain_grace.as_deref())?
                .unwrap_or(Duration::from_secs(15 * 60)),
        };
        Ok(match kind {
            BackendKind::Nftables => BackendConfig::Nftables,
            BackendKind::Iptables => {
                let asked = flags
                    .iptables_localhost_nodeports
                    .or(file.iptables.as_ref().and_then(|s| s.localhost_node_ports))
                    .unwrap_or(true);
                // As kube-proxy: only where the NodePort addresses may include loopback.
                let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
                let allowed = match nodeport_addresses {
                    NodePortAddresses::All => true,
                    NodePortAddresses::Primary => false,
                    NodePortAddresses::Cidrs(cidrs) => cidrs.iter().any(|c| c.contains(&loopback)),
                };
                if asked && !allowed {
                    tracing::info!(
                        "NodePorts are not opened on 127.0.0.1: the NodePort addresses exclude it"
                    );
                }
                BackendConfig::Iptables { mode, localhost_nodeports: asked && allowed }
            }
            BackendKind::Ipvs => {
                let strict_arp = flags.ipvs_strict_arp || ipvs.and_then(|s| s.strict_arp).unwrap_or(false);
                BackendConfig::Ipvs { mode, options: IpvsOptions { scheduler, drain_grace, strict_arp } }
            }
        })
    }
}

/// kube-proxy's `--conntrack-*` flags over the file's `conntrack:` over kube-proxy's defaults.
fn conntrack(flags: &Flags, file: file::ConntrackSection) -> Result<ConntrackSettings, ConfigError> {
    let defaults = ConntrackSettings::default();
    let timeout = |flag: Option<Duration>, field: &str, text: Option<String>, default: Option<Duration>| {
        let given = match flag {
            Some(d) => Some(d),
            None => duration(&format!("conntrack.{field}"), text.as_deref())?,
        };
        // Zero leaves the kernel's value, as in kube-proxy.
        Ok::<_, ConfigError>(given.or(default).filter(|d| !d.is_zero()))
    };
    Ok(ConntrackSettings {
        max_per_core: flags.conntrack_max_per_core.or(file.max_per_core).unwrap_or(defaults.max_per_core),
        min: flags.conntrack_min.or(file.min).unwrap_or(defaults.min),
        tcp_established_timeout: timeout(
            flags.conntrack_tcp_timeout_established,
            "tcpEstablishedTimeout",
            file.tcp_established_timeout,
            defaults.tcp_established_timeout,
        )?,
        tcp_close_wait_timeout: timeout(
            flags.conntrack_tcp_timeout_close_wait,
            "tcpCloseWaitTimeout",
            file.tcp_close_wait_timeout,
            defaults.tcp_close_wait_timeout,
        )?,
        tcp_be_liberal: flags.conntrack_tcp_be_liberal || file.tcp_be_liberal.unwrap_or(false),
        udp_timeout: timeout(flags.conntrack_udp_timeout, "udpTimeout", file.udp_timeout, None)?,
        udp_stream_timeout: timeout(
            flags.conntrack_udp_timeout_stream,
            "udpStreamTimeout",
            file.udp_stream_timeout,
            None,
        )?,
    })
}

fn client_tls(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<ClientTls>, ConfigError> {
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some(ClientIdentity { cert, key }),
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::Tls { flag: "--tls-key", reason: "needed with --tls-cert".into() })
        }
        (None, Some(_)) => {
            return Err(ConfigError::Tls { flag: "--tls-cert", reason: "needed with --tls-key".into() })
        }
    };
    match ca {
        Some(ca) => {
            for path in std::iter::once(&ca).chain(identity.iter().flat_map(|i| [&i.cert, &i.key])) {
                std::fs::metadata(path).map_err(|e| ConfigError::Tls {
                    flag: "--tls-ca/--tls-cert/--tls-key",
                    reason: format!("{}: {e}", path.display()),
                })?;
            }
            Ok(Some(ClientTls { ca, identity }))
        }
        None if identity.is_some() => Err(ConfigError::Tls {
            flag: "--tls-ca",
            reason: "needed with --tls-cert: the CA that signs the control plane's certificate".into(),
        }),
        None => Ok(None),
    }
}

/// Whether a URL's host is this machine's loopback.
fn loopback_host(uri: &tonic::codegen::http::Uri) -> bool {
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn control_plane_of(
    url: String,
    tls: Option<ClientTls>,
    token_file: Option<PathBuf>,
    keepalive: Duration,
    insecure: bool,
) -> Result<ControlPlane, ConfigError> {
    let uri: tonic::codegen::http::Uri =
        url.parse().map_err(|e: tonic::codegen::http::uri::InvalidUri| ConfigError::ControlPlaneUrl {
            url: url.clone(),
            reason: e.to_string(),
        })?;
    if let Err(e) = tonic::transport::Endpoint::from_shared(url.clone()) {
        return Err(ConfigError::ControlPlaneUrl { url, reason: e.to_string() });
    }
    match (uri.scheme_str(), &tls) {
        (Some("https"), Some(_)) => {}
        (Some("https"), None) => {
            return Err(ConfigError::Tls { flag: "--tls-ca", reason: format!("needed for {url}") })
        }
        (Some("http"), Some(_)) => {
            return Err(ConfigError::ControlPlaneUrl {
                url,
                reason: "TLS is configured: use https://".into(),
            })
        }
        (Some("http"), None) if !insecure && !loopback_host(&uri) => {
            return Err(ConfigError::Plaintext { flag: "--control-plane", address: url })
        }
        (Some("http"), None) => {}
        _ => return Err(ConfigError::ControlPlaneUrl { url, reason: "expected http:// or https://".into() }),
    }
    Ok(ControlPlane { url, tls, token_file, keepalive })
}

#[cfg(test)]
mod tests;
