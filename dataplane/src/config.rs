//! The node agent's configuration: command-line flags over an optional
//! KubeProxyConfiguration-style file (`--config`), over defaults. Every field
//! of the file is checked: an unknown or unsupported one is an error naming it.
//!
//! ```yaml
//! apiVersion: kubeproxy.config.k8s.io/v1alpha1
//! kind: KubeProxyConfiguration
//! mode: nftables                      # nftables | iptables | ipvs
//! hostnameOverride: node-a            # the node name
//! clusterCIDR: 10.244.0.0/16          # local-traffic detection (overrides the control plane's)
//! nodePortAddresses: [10.0.0.0/24]
//! metricsBindAddress: 127.0.0.1:10249
//! healthzBindAddress: 0.0.0.0:10256
//! nftables: {masqueradeAll: false, syncPeriod: 1h, minSyncPeriod: 0s}   # likewise iptables:, ipvs:
//! ipvs: {scheduler: rr}               # rr, wrr, lc, wlc, sh, dh, mh
//! kpx: {controlPlane: http://cp:18000, stateDir: /var/lib/kpx, adminBindAddress: 127.0.0.1:18001, iptablesMode: auto,
//!       ipvsDrainGrace: 15m}
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use crate::backend::iptables::IptablesMode;
use crate::backend::{BackendKind, ProxyOptions};

/// A configuration that cannot be used; the message names the flag or field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The flags, each `None` when not given (so the file or the default applies).
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub node_name: Option<String>,
    pub control_plane: Option<String>,
    pub backend: Option<BackendKind>,
    pub state_dir: Option<PathBuf>,
    pub masquerade_all: bool,
    pub nodeport_addresses: Option<Vec<IpNet>>,
    pub cluster_cidrs: Option<Vec<IpNet>>,
    pub iptables_mode: Option<IptablesMode>,
    pub full_sync_period: Option<Duration>,
    pub min_sync_period: Option<Duration>,
    pub ipvs_scheduler: Option<String>,
    pub ipvs_drain_grace: Option<Duration>,
    pub admin_listen: Option<SocketAddr>,
    pub healthz_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
}

/// Everything the agent runs with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: Option<String>,
    pub control_plane: Option<String>,
    pub backend: BackendKind,
    pub state_dir: Option<PathBuf>,
    pub options: ProxyOptions,
    pub iptables_mode: IptablesMode,
    /// `None`: never.
    pub full_sync_period: Option<Duration>,
    pub min_sync_period: Duration,
    /// The IPVS scheduler of Services without `service.kpx.io/ipvs-scheduler`.
    pub ipvs_scheduler: String,
    /// How long a removed IPVS destination may keep its connections.
    pub ipvs_drain_grace: Duration,
    pub admin_listen: SocketAddr,
    pub healthz_listen: SocketAddr,
    pub metrics_listen: SocketAddr,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KubeProxyConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    mode: Option<String>,
    hostname_override: Option<String>,
    #[serde(rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    node_port_addresses: Option<Vec<String>>,
    metrics_bind_address: Option<String>,
    healthz_bind_address: Option<String>,
    iptables: Option<ModeSection>,
    nftables: Option<ModeSection>,
    ipvs: Option<ModeSection>,
    kpx: Option<KpxSection>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ModeSection {
    masquerade_all: Option<bool>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    /// ipvs only.
    scheduler: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KpxSection {
    control_plane: Option<String>,
    state_dir: Option<PathBuf>,
    admin_bind_address: Option<String>,
    iptables_mode: Option<String>,
    ipvs_drain_grace: Option<String>,
}

fn field_error(field: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("--config: {field}: {reason}"))
}

/// A Go-style duration: `30s`, `1m30s`, `500ms`, `1h`, `0s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (like 30s, 1m, 500ms, 1h30m)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').ok_or_else(bad)?;
        let (number, tail) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total += Duration::from_secs_f64(value * seconds);
        rest = next;
    }
    Ok(total)
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

fn cidrs(field: &str, texts: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.trim()
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| field_error(&format!("{field}[{i}]"), format!("{t:?} is not a CIDR")))
        })
        .collect()
}

fn address(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| field_error(field, format!("{text:?} is not ADDRESS:PORT")))
}

fn read_file(path: &PathBuf) -> Result<KubeProxyConfiguration, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("--config {}: cannot read: {e}", path.display())))?;
    let de = serde_yaml::Deserializer::from_str(&text);
    let file: KubeProxyConfiguration = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let reason = e.into_inner().to_string();
        ConfigError(format!(
            "--config {}: {field}: {reason} (kpx supports the fields shown in kpx-dataplane --help)",
            path.display()
        ))
    })?;
    if let Some(kind) = file.kind.as_deref().filter(|k| *k != "KubeProxyConfiguration") {
        return Err(field_error("kind", format!("{kind:?}: expected KubeProxyConfiguration")));
    }
    if let Some(v) = file.api_version.as_deref().filter(|v| !v.starts_with("kubeproxy.config.k8s.io/")) {
        return Err(field_error("apiVersion", format!("{v:?}: expected kubeproxy.config.k8s.io/v1alpha1")));
    }
    Ok(file)
}

impl AgentConfig {
    /// Flags over the file over defaults.
    pub fn resolve(flags: Flags) -> Result<AgentConfig, ConfigError> {
        let file = match &flags.config {
            Some(path) => read_file(path)?,
            None => KubeProxyConfiguration::default(),
        };
        let backend = match (flags.backend, file.mode.as_deref()) {
            (Some(b), _) => b,
            (None, None | Some("")) => BackendKind::Nftables,
            (None, Some("nftables")) => BackendKind::Nftables,
            (None, Some("iptables")) => BackendKind::Iptables,
            (None, Some("ipvs")) => BackendKind::Ipvs,
            (None, Some(other)) => {
                return Err(field_error("mode", format!("{other:?}: expected nftables, iptables or ipvs")))
            }
        };
        let section = match backend {
            BackendKind::Nftables => file.nftables.clone(),
            BackendKind::Iptables => file.iptables.clone(),
            BackendKind::Ipvs => file.ipvs.clone(),
        }
        .unwrap_or_default();
        let section_name = match backend {
            BackendKind::Nftables => "nftables",
            BackendKind::Iptables => "iptables",
            BackendKind::Ipvs => "ipvs",
        };
        let duration = |field: &str, text: &Option<String>| -> Result<Option<Duration>, ConfigError> {
            text.as_deref()
                .map(parse_duration)
                .transpose()
                .map_err(|e| field_error(&format!("{section_name}.{field}"), e))
        };
        for (name, other) in [("nftables", &file.nftables), ("iptables", &file.iptables)] {
            if other.as_ref().is_some_and(|s| s.scheduler.is_some()) {
                return Err(field_error(
                    &format!("{name}.scheduler"),
                    "only the ipvs section has a scheduler",
                ));
            }
        }
        let ipvs_scheduler =
            match (flags.ipvs_scheduler, file.ipvs.as_ref().and_then(|s| s.scheduler.clone())) {
                (Some(s), _) => s,
                (None, Some(s)) => {
                    parse_scheduler(&s).map_err(|e| field_error("ipvs.scheduler", e))?;
                    s
                }
                (None, None) => "rr".to_owned(),
            };
        let sync_period = duration("syncPeriod", &section.sync_period)?;
        let min_sync_period = duration("minSyncPeriod", &section.min_sync_period)?;
        let nodeport_cidrs = match (flags.nodeport_addresses, &file.node_port_addresses) {
            (Some(c), _) => c,
            (None, Some(texts)) => cidrs("nodePortAddresses", texts)?,
            (None, None) => Vec::new(),
        };
        let cluster_cidrs = match (flags.cluster_cidrs, &file.cluster_cidr) {
            (Some(c), _) => c,
            (None, Some(text)) => {
                cidrs("clusterCIDR", &text.split(',').map(str::to_owned).collect::<Vec<_>>())?
            }
            (None, None) => Vec::new(),
        };
        let kpx = file.kpx.unwrap_or_default();
        let iptables_mode = match (flags.iptables_mode, kpx.iptables_mode.as_deref()) {
            (Some(m), _) => m,
            (None, None | Some("auto")) => IptablesMode::Auto,
            (None, Some("nft")) => IptablesMode::Nft,
            (None, Some("legacy")) => IptablesMode::Legacy,
            (None, Some(other)) => {
                return Err(field_error(
                    "kpx.iptablesMode",
                    format!("{other:?}: expected auto, nft or legacy"),
                ))
            }
        };
        let admin_listen = match (flags.admin_listen, kpx.admin_bind_address.as_deref()) {
            (Some(a), _) => a,
            (None, Some(text)) => address("kpx.adminBindAddress", text)?,
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 18001)),
        };
        let healthz_listen = match (flags.healthz_listen, file.healthz_bind_address.as_deref()) {
            (Some(a), _) => a,
            (None, Some(text)) => address("healthzBindAddress", text)?,
            (None, None) => SocketAddr::from(([0, 0, 0, 0], 10256)),
        };
        let metrics_listen = match (flags.metrics_listen, file.metrics_bind_address.as_deref()) {
            (Some(a), _) => a,
            (None, Some(text)) => address("metricsBindAddress", text)?,
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 10249)),
        };
        let ipvs_drain_grace = match (flags.ipvs_drain_grace, kpx.ipvs_drain_grace.as_deref()) {
            (Some(d), _) => d,
            (None, Some(text)) => parse_duration(text).map_err(|e| field_error("kpx.ipvsDrainGrace", e))?,
            (None, None) => Duration::from_secs(15 * 60),
        };
        let full_sync_period = flags.full_sync_period.or(sync_period).unwrap_or(Duration::from_secs(3600));
        Ok(AgentConfig {
            node_name: flags.node_name.or(file.hostname_override),
            control_plane: flags.control_plane.or(kpx.control_plane),
            backend,
            state_dir: flags.state_dir.or(kpx.state_dir),
            options: ProxyOptions {
                masquerade_all: flags.masquerade_all || section.masquerade_all.unwrap_or(false),
                nodeport_cidrs,
                cluster_cidrs,
            },
            iptables_mode,
            full_sync_period: (!full_sync_period.is_zero()).then_some(full_sync_period),
            min_sync_period: flags.min_sync_period.or(min_sync_period).unwrap_or(Duration::ZERO),
            ipvs_scheduler,
            ipvs_drain_grace,
            admin_listen,
            healthz_listen,
            metrics_listen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(text: &str, flags: Flags) -> Result<AgentConfig, ConfigError> {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("kube-proxy.yaml");
        std::fs::write(&path, text).expect("write");
        AgentConfig::resolve(Flags { config: Some(path), ..flags })
    }

    #[test]
    fn reads_a_kube_proxy_configuration_and_flags_win() {
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n\
                    hostnameOverride: node-a\nclusterCIDR: 10.244.0.0/16,fd00:10::/56\nnodePortAddresses: [10.0.0.0/24]\n\
                    metricsBindAddress: 127.0.0.1:9100\niptables: {masqueradeAll: true, syncPeriod: 1m30s, minSyncPeriod: 500ms}\n\
                    kpx: {controlPlane: 'http://cp:18000', stateDir: /var/lib/kpx, iptablesMode: legacy}\n";
        let c = with_file(text, Flags::default()).expect("valid");
        assert_eq!(c.backend, BackendKind::Iptables);
        assert_eq!(c.node_name.as_deref(), Some("node-a"));
        assert!(c.options.masquerade_all);
        assert_eq!(c.options.cluster_cidrs.len(), 2);
        assert_eq!(c.full_sync_period, Some(Duration::from_secs(90)));
        assert_eq!(c.min_sync_period, Duration::from_millis(500));
        assert_eq!(c.metrics_listen.port(), 9100);
        assert_eq!(c.iptables_mode, IptablesMode::Legacy);
        let flagged = with_file(
            text,
            Flags { backend: Some(BackendKind::Nftables), node_name: Some("x".into()), ..Flags::default() },
        )
        .expect("valid");
        assert_eq!((flagged.backend, flagged.node_name.as_deref()), (BackendKind::Nftables, Some("x")));
        assert!(!flagged.options.masquerade_all, "the nftables section applies to mode nftables");
    }

    #[test]
    fn unknown_or_bad_fields_are_named() {
        let err =
            with_file("iptables: {localhostNodePorts: true}\n", Flags::default()).expect_err("unsupported");
        assert!(
            err.0.contains("iptables.localhostNodePorts")
                || err.0.contains("iptables: unknown field `localhostNodePorts`"),
            "{err}"
        );
        let err = with_file("conntrack: {maxPerCore: 0}\n", Flags::default()).expect_err("unknown");
        assert!(err.0.contains("unknown field `conntrack`"), "{err}");
        let err = with_file("mode: userspace\n", Flags::default()).expect_err("mode");
        assert!(err.0.contains("mode") && err.0.contains("userspace"), "{err}");
        let err = with_file("nftables: {syncPeriod: soon}\n", Flags::default()).expect_err("duration");
        assert!(err.0.contains("nftables.syncPeriod"), "{err}");
        let err = with_file("nodePortAddresses: [10.0.0.0/33]\n", Flags::default()).expect_err("cidr");
        assert!(err.0.contains("nodePortAddresses[0]"), "{err}");
        let err = with_file("kind: Deployment\n", Flags::default()).expect_err("kind");
        assert!(err.0.contains("kind"), "{err}");
    }

    #[test]
    fn ipvs_scheduler_and_drain_grace() {
        let c =
            with_file("mode: ipvs\nipvs: {scheduler: mh}\nkpx: {ipvsDrainGrace: 30s}\n", Flags::default())
                .expect("valid");
        assert_eq!((c.ipvs_scheduler.as_str(), c.ipvs_drain_grace), ("mh", Duration::from_secs(30)));
        let flags = Flags { ipvs_scheduler: Some("wlc".into()), ..Flags::default() };
        assert_eq!(with_file("ipvs: {scheduler: mh}\n", flags).expect("valid").ipvs_scheduler, "wlc");
        let defaults = AgentConfig::resolve(Flags::default()).expect("defaults");
        assert_eq!(
            (defaults.ipvs_scheduler.as_str(), defaults.ipvs_drain_grace),
            ("rr", Duration::from_secs(900))
        );
        let err = with_file("ipvs: {scheduler: fastest}\n", Flags::default()).expect_err("scheduler");
        assert!(err.0.contains("ipvs.scheduler") && err.0.contains("fastest"), "{err}");
        let err = with_file("nftables: {scheduler: rr}\n", Flags::default()).expect_err("not ipvs");
        assert!(err.0.contains("nftables.scheduler"), "{err}");
        let err = with_file("kpx: {ipvsDrainGrace: later}\n", Flags::default()).expect_err("duration");
        assert!(err.0.contains("kpx.ipvsDrainGrace"), "{err}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("1h30m").expect("ok"), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").expect("ok"), Duration::from_millis(250));
        assert_eq!(parse_duration("0s").expect("ok"), Duration::ZERO);
        assert!(parse_duration("5").is_err() && parse_duration("").is_err() && parse_duration("1d").is_err());
    }
}
