//! kube-proxy's feature gates that change what a Service means on a node, with their
//! defaults keyed by the Kubernetes version the agent is configured for
//! (`--kubernetes-version`, `kpx.kubernetesVersion`), as upstream moves them:
//!
//! | gate                      | before 1.40 | 1.40–1.42 | from 1.43 (removed upstream)      |
//! |---------------------------|-------------|-----------|-----------------------------------|
//! | `KubeProxyIPVS`           | on          | off       | off; kpx keeps `true` as an opt-in |
//! | `AllowServiceExternalIPs` | on          | off       | off; kpx keeps `true` as an opt-in |
//!
//! and the `mode` a file leaves empty: iptables before 1.40, nftables from 1.40. Without a
//! configured version, kpx's own defaults hold: both gates on, mode nftables.
//!
//! Gates come from `--feature-gates NAME=BOOL,…` over the file's `featureGates:`; a
//! gate kpx does not know is named in a warning and ignored (kube-proxy has many that
//! concern nothing kpx does).

use std::collections::BTreeMap;
use std::fmt;

use super::ConfigError;

/// A Kubernetes minor version (`1.38`, `v1.38.2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
}

impl KubernetesVersion {
    /// The first version where the two gates are off by default and `mode` defaults to nftables.
    pub const GATES_OFF: KubernetesVersion = KubernetesVersion { major: 1, minor: 40 };
    /// The first version without the gates upstream.
    pub const GATES_REMOVED: KubernetesVersion = KubernetesVersion { major: 1, minor: 43 };

    pub fn parse(text: &str) -> Result<KubernetesVersion, String> {
        let trimmed = text.trim().trim_start_matches('v');
        let mut parts = trimmed.split('.');
        let number = |part: Option<&str>| part.and_then(|p| p.parse::<u32>().ok());
        match (number(parts.next()), number(parts.next())) {
            (Some(major), Some(minor)) if parts.clone().all(|p| !p.is_empty()) && parts.count() <= 1 => {
                Ok(KubernetesVersion { major, minor })
            }
            _ => Err(format!("{text:?} is not a Kubernetes version (1.38, v1.38.2)")),
        }
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The gates kpx acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// `KubeProxyIPVS`: the ipvs mode may be chosen.
    pub kube_proxy_ipvs: bool,
    /// `AllowServiceExternalIPs`: a Service's `spec.externalIPs` are programmed.
    pub allow_service_external_ips: bool,
}

pub const KUBE_PROXY_IPVS: &str = "KubeProxyIPVS";
pub const ALLOW_SERVICE_EXTERNAL_IPS: &str = "AllowServiceExternalIPs";

impl FeatureGates {
    /// The defaults of `version` (`None`: kpx's own, both on).
    pub fn defaults(version: Option<KubernetesVersion>) -> FeatureGates {
        let on = version.is_none_or(|v| v < KubernetesVersion::GATES_OFF);
        FeatureGates { kube_proxy_ipvs: on, allow_service_external_ips: on }
    }

    /// The defaults of `version` with `given` (gate name → value, from `field`) over them.
    pub fn resolve(
        version: Option<KubernetesVersion>,
        given: &BTreeMap<String, bool>,
        field: &str,
    ) -> FeatureGates {
        let mut gates = FeatureGates::defaults(version);
        for (name, &value) in given {
            match name.as_str() {
                KUBE_PROXY_IPVS => gates.kube_proxy_ipvs = value,
                ALLOW_SERVICE_EXTERNAL_IPS => gates.allow_service_external_ips = value,
                _ => {
                    tracing::warn!(gate = %name, %field, "kpx does not act on this feature gate: ignored");
                    continue;
                }
            }
            if value && version.is_some_and(|v| v >= KubernetesVersion::GATES_REMOVED) {
                tracing::warn!(
                    gate = %name,
                    "this feature gate is removed from kube-proxy at this Kubernetes version; kpx keeps it as an opt-in"
                );
            }
        }
        gates
    }
}

/// `NAME=BOOL,NAME=BOOL` (kube-proxy's `--feature-gates`).
pub fn parse_flag(text: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut gates = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) =
            pair.split_once('=').ok_or_else(|| format!("{pair:?}: expected NAME=true or NAME=false"))?;
        let value =
            parse_bool(value.trim()).ok_or_else(|| format!("{name}: {value:?} is not true or false"))?;
        gates.insert(name.trim().to_owned(), value);
    }
    Ok(gates)
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" | "t" | "1" => Some(true),
        "false" | "False" | "FALSE" | "f" | "0" => Some(false),
        _ => None,
    }
}

/// The error kube-proxy gives for `mode: ipvs` with its gate off.
pub fn ipvs_refused(field: &str, version: Option<KubernetesVersion>) -> ConfigError {
    let since = match version {
        Some(v) if v >= KubernetesVersion::GATES_OFF => format!(" (off by default in Kubernetes {v})"),
        _ => String::new(),
    };
    ConfigError::field(
        field,
        format!(
            "the ipvs proxy mode is deprecated and needs the {KUBE_PROXY_IPVS} feature gate, which is off{since}; \
             use nftables, or set --feature-gates={KUBE_PROXY_IPVS}=true"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Option<KubernetesVersion> {
        Some(KubernetesVersion::parse(text).expect("version"))
    }

    #[test]
    fn versions_parse_with_or_without_v_and_patch() {
        assert_eq!(v("1.38"), Some(KubernetesVersion { major: 1, minor: 38 }));
        assert_eq!(v("v1.40.2"), Some(KubernetesVersion { major: 1, minor: 40 }));
        for bad in ["", "1", "1.x", "1.38.2.1", "1.38.", "latest"] {
            assert!(KubernetesVersion::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_defaults_follow_upstreams_timeline_and_opt_ins_win() {
        let none = BTreeMap::new();
        for (version, on) in
            [(None, true), (v("1.38"), true), (v("1.39"), true), (v("1.40"), false), (v("1.43"), false)]
        {
            let gates = FeatureGates::resolve(version, &none, "featureGates");
            assert_eq!((gates.kube_proxy_ipvs, gates.allow_service_external_ips), (on, on), "{version:?}");
        }
        let opt_in =
            parse_flag("KubeProxyIPVS=true, AllowServiceExternalIPs=true,SomethingElse=false").expect("flag");
        let gates = FeatureGates::resolve(v("1.43"), &opt_in, "--feature-gates");
        assert!(gates.kube_proxy_ipvs && gates.allow_service_external_ips);
        let off = parse_flag("AllowServiceExternalIPs=false").expect("flag");
        let gates = FeatureGates::resolve(v("1.38"), &off, "--feature-gates");
        assert!(gates.kube_proxy_ipvs && !gates.allow_service_external_ips);
        assert!(parse_flag("KubeProxyIPVS").is_err());
        assert!(parse_flag("KubeProxyIPVS=maybe").unwrap_err().contains("KubeProxyIPVS"));
    }
}
