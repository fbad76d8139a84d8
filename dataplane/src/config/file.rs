//! The KubeProxyConfiguration-style file of `--config`, read with every field checked: the
//! fields of kube-proxy's that kpx does not act on are taken out first ([`super::unused`]:
//! ignored with a warning, or refused when set to what kpx does not do); then an unknown
//! field is an error naming it.
//!
//! ```yaml
//! apiVersion: kubeproxy.config.k8s.io/v1alpha1
//! kind: KubeProxyConfiguration
//! mode: nftables                      # nftables | iptables | ipvs
//! hostnameOverride: node-a            # the node name
//! clusterCIDR: 10.244.0.0/16          # local-traffic detection (overrides the control plane's)
//! detectLocalMode: ClusterCIDR        # NodeCIDR, BridgeInterface, InterfaceNamePrefix
//! detectLocal: {bridgeInterface: cbr0, interfaceNamePrefix: veth}
//! nodePortAddresses: [10.0.0.0/24]
//! metricsBindAddress: 127.0.0.1:10249
//! healthzBindAddress: 0.0.0.0:10256
//! nftables: {masqueradeAll: false, syncPeriod: 1h, minSyncPeriod: 0s}   # likewise iptables:, ipvs:
//! ipvs: {scheduler: rr}               # rr, wrr, lc, wlc, sh, dh, mh
//! iptables: {localhostNodePorts: true} # NodePorts on 127.0.0.1 too (iptables' default)
//! featureGates: {KubeProxyIPVS: true, AllowServiceExternalIPs: true}   # defaults: see kpx.kubernetesVersion
//! conntrack: {maxPerCore: 32768, min: 131072, tcpEstablishedTimeout: 24h, tcpCloseWaitTimeout: 1h,
//!             tcpBeLiberal: false, udpTimeout: 0s, udpStreamTimeout: 0s}   # kube-proxy's defaults
//! kpx: {controlPlane: https://cp:18000, stateDir: /var/lib/kpx, adminBindAddress: 127.0.0.1:18001, iptablesMode: auto,
//!       ipvsDrainGrace: 15m, tlsCA: /etc/kpx/ca.crt, tlsCert: /etc/kpx/tls.crt, tlsKey: /etc/kpx/tls.key,
//!       nodeTokenFile: /var/run/secrets/kpx/token, insecure: false, serviceProxyName: kpx,
//!       procSysNet: /host/proc/sys/net, kubernetesVersion: "1.38"}
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub mode: Option<String>,
    /// `ClusterCIDR`, `NodeCIDR`, `BridgeInterface` or `InterfaceNamePrefix`.
    pub detect_local_mode: Option<String>,
    /// The interface names of the interface detect-local modes.
    pub detect_local: Option<DetectLocal>,
    pub hostname_override: Option<String>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub metrics_bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub iptables: Option<ModeSection>,
    pub nftables: Option<ModeSection>,
    pub ipvs: Option<ModeSection>,
    pub conntrack: Option<ConntrackSection>,
    /// kube-proxy's feature gates (see [`super::gates`]).
    pub feature_gates: Option<std::collections::BTreeMap<String, bool>>,
    pub kpx: Option<KpxSection>,
}

/// `conntrack:` (kube-proxy's; a field left out takes kube-proxy's default).
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConntrackSection {
    pub max_per_core: Option<u64>,
    pub min: Option<u64>,
    pub tcp_established_timeout: Option<String>,
    pub tcp_close_wait_timeout: Option<String>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<String>,
    pub udp_stream_timeout: Option<String>,
}

/// `iptables:`, `nftables:` or `ipvs:`.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModeSection {
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    /// ipvs only.
    pub scheduler: Option<String>,
    /// ipvs only.
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    /// iptables only.
    pub localhost_node_ports: Option<bool>,
}

/// `detectLocal:`.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
}

/// `kpx:`: what kube-proxy's file has no field for.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KpxSection {
    pub control_plane: Option<String>,
    #[serde(rename = "tlsCA")]
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub node_token_file: Option<PathBuf>,
    pub insecure: Option<bool>,
    pub state_dir: Option<PathBuf>,
    pub admin_bind_address: Option<String>,
    pub iptables_mode: Option<String>,
    pub ipvs_drain_grace: Option<String>,
    pub service_proxy_name: Option<String>,
    pub proc_sys_net: Option<PathBuf>,
    pub api_server: Option<String>,
    pub api_server_token_file: Option<PathBuf>,
    #[serde(rename = "apiServerCA")]
    pub api_server_ca: Option<PathBuf>,
    /// The Kubernetes version whose kube-proxy defaults apply (see [`super::gates`]).
    pub kubernetes_version: Option<String>,
}

/// Reads and checks the file at `path`; also returns the kube-proxy fields it ignored
/// (see [`super::unused::take_out`]).
pub fn read(path: &Path) -> Result<(KubeProxyConfiguration, Vec<String>), ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let unsupported =
        |field: String, reason: String| ConfigError::Unsupported { path: path.to_owned(), field, reason };
    let mut value: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| unsupported("<file>".into(), format!("not YAML: {e}")))?;
    if value.is_null() {
        value = serde_yaml::Value::Mapping(Default::default());
    }
    let ignored = super::unused::take_out(&mut value).map_err(|r| unsupported(r.field, r.reason))?;
    let file: KubeProxyConfiguration = serde_path_to_error::deserialize(value)
        .map_err(|e| unsupported(e.path().to_string(), e.into_inner().to_string()))?;
    if let Some(kind) = file.kind.as_deref().filter(|k| *k != "KubeProxyConfiguration") {
        return Err(ConfigError::field("kind", format!("{kind:?}: expected KubeProxyConfiguration")));
    }
    if let Some(v) = file.api_version.as_deref().filter(|v| !v.starts_with("kubeproxy.config.k8s.io/")) {
        return Err(ConfigError::field(
            "apiVersion",
            format!("{v:?}: expected kubeproxy.config.k8s.io/v1alpha1"),
        ));
    }
    Ok((file, ignored))
}
