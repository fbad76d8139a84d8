//! The fields of kube-proxy's `KubeProxyConfiguration` (`kubeproxy.config.k8s.io/v1alpha1`)
//! that kpx does not act on, taken out of the file before the fields kpx reads are checked,
//! so that a kube-proxy ConfigMap (kubeadm's as it writes it, say) is accepted unchanged:
//!
//! - fields that have nothing to do with proxying Services on a Linux node (the API client,
//!   logging, profiling, Windows) are ignored, and named in one warning;
//! - fields that ask for something kpx does not do (IPVS timeouts, a masquerade bit of
//!   one's choosing, …) are ignored at their defaults, and named in the
//!   warning with what kube-proxy would have done; set to anything else they are an error
//!   naming the field, since kpx would behave differently from kube-proxy without saying so.
//!
//! Empty strings and nulls anywhere in the file are taken as absent, as kubeadm writes
//! every field, set or not.

use kpx_proto::cli::parse_duration;
use serde_yaml::Value;

/// What kpx does with a kube-proxy field it does not act on.
#[derive(Debug, Clone, Copy)]
enum Unused {
    /// Nothing to do with proxying on this node: ignored whatever its value.
    Harmless,
    /// kpx does not do it: ignored at its default (kube-proxy then does what the text
    /// says), an error otherwise.
    NotDone(&'static str),
}

const MASQUERADE_BIT: &str = "kpx marks packets for masquerading with its own bit";
const IPVS_TIMEOUTS: &str = "kube-proxy would set IPVS's connection timeouts; kpx leaves them as they are";

/// Every field kpx does not act on, by path.
const FIELDS: &[(&str, Unused)] = &[
    ("bindAddress", Unused::Harmless),
    ("bindAddressHardFail", Unused::Harmless),
    ("clientConnection", Unused::Harmless),
    ("configSyncPeriod", Unused::Harmless),
    ("enableProfiling", Unused::Harmless),
    ("logging", Unused::Harmless),
    ("oomScoreAdj", Unused::Harmless),
    ("portRange", Unused::Harmless),
    ("showHiddenMetricsForVersion", Unused::Harmless),
    ("windowsRunAsService", Unused::Harmless),
    ("winkernel", Unused::Harmless),
    ("iptables.masqueradeBit", Unused::NotDone(MASQUERADE_BIT)),
    ("nftables.masqueradeBit", Unused::NotDone(MASQUERADE_BIT)),
    ("ipvs.excludeCIDRs", Unused::NotDone("kpx's IPVS backend removes only the virtual services it made")),
    ("ipvs.tcpTimeout", Unused::NotDone(IPVS_TIMEOUTS)),
    ("ipvs.tcpFinTimeout", Unused::NotDone(IPVS_TIMEOUTS)),
    ("ipvs.udpTimeout", Unused::NotDone(IPVS_TIMEOUTS)),
];

/// A field kpx refused: its path and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub field: String,
    pub reason: String,
}

/// Takes out of `file` every field kpx does not act on (and every null and empty string).
/// Returns what was ignored, for a warning (`field` or `field (what kube-proxy would
/// have done)`), or the first field whose value kpx cannot honour.
pub fn take_out(file: &mut Value) -> Result<Vec<String>, Refused> {
    let mut ignored = Vec::new();
    for (path, how) in FIELDS {
        let Some(value) = remove(file, path) else { continue };
        let at_default = is_default(&value);
        match how {
            Unused::Harmless => ignored.push((*path).to_owned()),
            Unused::NotDone(note) if at_default => ignored.push(format!("{path} ({note})")),
            Unused::NotDone(note) => {
                return Err(Refused {
                    field: (*path).to_owned(),
                    reason: format!("{} is set: {note}", show(&value)),
                })
            }
        }
    }
    strip_empty(file);
    Ok(ignored)
}

/// Removes `path` (`a.b`) from `file`; a section left empty goes too.
fn remove(file: &mut Value, path: &str) -> Option<Value> {
    let (section, leaf) = match path.split_once('.') {
        Some((section, leaf)) => (Some(section), leaf),
        None => (None, path),
    };
    let Some(section) = section else { return file.as_mapping_mut()?.remove(leaf) };
    let map = file.as_mapping_mut()?;
    let inner = map.get_mut(section)?.as_mapping_mut()?;
    let value = inner.remove(leaf);
    if inner.is_empty() {
        map.remove(section);
    }
    value
}

/// Removes every null and empty string, and the sections that leaves empty.
fn strip_empty(value: &mut Value) {
    if let Value::Mapping(map) = value {
        let keys: Vec<Value> = map.keys().cloned().collect();
        for key in keys {
            let Some(inner) = map.get_mut(&key) else { continue };
            strip_empty(inner);
            let empty = match inner {
                Value::Null => true,
                Value::String(s) => s.is_empty(),
                Value::Mapping(m) => m.is_empty(),
                _ => false,
            };
            if empty {
                map.remove(&key);
            }
        }
    }
}

/// Whether a value leaves kube-proxy's default in place: null, false, zero, "", a zero
/// duration, an empty list or section.
fn is_default(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty() || parse_duration(s).is_ok_and(|d| d.is_zero()),
        Value::Sequence(s) => s.is_empty(),
        Value::Mapping(m) => m.is_empty(),
        Value::Tagged(_) => false,
    }
}

fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => serde_yaml::to_string(other).map(|s| s.trim().to_owned()).unwrap_or_default(),
    }
}
