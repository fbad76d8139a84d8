//! Names of kpx's iptables chains and the comments on its rules.
//!
//! kube-proxy's layout under kpx's own prefix (`KPX-` instead of `KUBE-`), so
//! kpx can run beside a kube-proxy: `KPX-SVC-<hash>` picks among a Service
//! port's endpoints, `KPX-SEP-<hash>` is one endpoint, `KPX-EXT-<hash>` is
//! external traffic, `KPX-FW-<hash>` the source-range firewall, `KPX-SVL-<hash>`
//! the node's own endpoints (externalTrafficPolicy Local), `KPX-SVX-<hash>` the
//! cluster-wide endpoints of an internalTrafficPolicy-Local port's external traffic.
//! The hash is of the Service port (and endpoint), so a chain keeps its name while it
//! means the same.

use kpx_proto::types::{ServicePort, ServiceView};

pub const PREFIX: &str = "KPX-";
/// The canary chains (see [`crate::backend::xtables::CANARY_RULE`]).
pub const CANARY_NAT: &str = "KPX-CANARY-NAT";
pub const CANARY_FILTER: &str = "KPX-CANARY-FILTER";
/// Reached from nat PREROUTING and OUTPUT: `KPX-SERVICES`, then `KPX-NODEPORTS` for local destinations.
pub const PORTALS: &str = "KPX-PORTALS";
/// One rule per Service entry (ClusterIP, external IP, load-balancer IP).
pub const SERVICES: &str = "KPX-SERVICES";
/// One rule per NodePort and node address.
pub const NODEPORTS: &str = "KPX-NODEPORTS";
pub const POSTROUTING: &str = "KPX-POSTROUTING";
pub const MARK_MASQ: &str = "KPX-MARK-MASQ";
pub const MARK_DROP: &str = "KPX-MARK-DROP";
/// Masquerades unless the source is a pod (the local-traffic detector).
pub const MASQ_NONLOCAL: &str = "KPX-MASQ-NONLOCAL";
/// filter: drops what was marked for dropping, then rejects Services without endpoints.
pub const FILTER: &str = "KPX-FILTER";
/// filter: one REJECT rule per entry without endpoints.
pub const REJECT: &str = "KPX-REJECT";
/// filter FORWARD, after `KPX-FILTER`: drops conntrack-INVALID packets, accepts Service
/// traffic marked for masquerade and the replies of tracked connections, so that a FORWARD
/// policy of DROP (Docker sets one) does not break NodePorts (kube-proxy's `KUBE-FORWARD`).
pub const FORWARD: &str = "KPX-FORWARD";

/// The mark bit that asks KPX-POSTROUTING to masquerade.
pub use crate::backend::xtables::MASQ_MARK;
/// The mark bit that asks KPX-FILTER to drop (the nat table cannot drop).
pub const DROP_MARK: &str = "0x1000";

/// 16 characters of base32 over a hash, as kube-proxy names its chains (chain names ≤ 28 bytes).
fn hash16(text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let h = xxhash_rust::xxh3::xxh3_128(text.as_bytes());
    (0..16).map(|i| ALPHABET[((h >> (i * 5)) & 31) as usize] as char).collect()
}

/// What a Service port's chain is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainKind {
    /// The cluster set (ClusterIP traffic).
    Svc,
    /// The node's own endpoints (external traffic of policy Local).
    Svl,
    /// The cluster-wide set of an internal-policy-Local Service, for its external traffic.
    Svx,
    Ext,
    Fw,
}

impl ChainKind {
    fn tag(self) -> &'static str {
        match self {
            ChainKind::Svc => "SVC",
            ChainKind::Svl => "SVL",
            ChainKind::Svx => "SVX",
            ChainKind::Ext => "EXT",
            ChainKind::Fw => "FW",
        }
    }
}

fn port_id(view: &ServiceView, port: &ServicePort) -> String {
    format!("{}:{}/{}", view.resource_name(), port.name, port.protocol)
}

pub fn port_chain(kind: ChainKind, view: &ServiceView, port: &ServicePort) -> String {
    format!("{PREFIX}{}-{}", kind.tag(), hash16(&port_id(view, port)))
}

pub fn endpoint_chain(view: &ServiceView, port: &ServicePort, endpoint: &str) -> String {
    format!("{PREFIX}SEP-{}", hash16(&format!("{}/{endpoint}", port_id(view, port))))
}

/// `-m comment --comment "…"` with kube-proxy's text (`ns/name:port …`), quoted so that
/// iptables-restore reads it back as one word whatever the names contain.
pub fn comment(view: &ServiceView, port: &ServicePort, what: &str) -> String {
    let mut text = format!("{}/{}", view.namespace, view.name);
    if !port.name.is_empty() {
        text.push(':');
        text.push_str(&port.name);
    }
    if !what.is_empty() {
        text.push(' ');
        text.push_str(what);
    }
    quote(&text)
}

/// `-m comment --comment "<text>"` with anything iptables-restore could misread removed:
/// quotes, backslashes and control characters become `_`; at most 255 bytes.
pub fn quote(text: &str) -> String {
    let mut clean: String =
        text.chars().map(|c| if c == '"' || c == '\\' || c.is_control() { '_' } else { c }).collect();
    while clean.len() > 255 {
        clean.pop();
    }
    format!("-m comment --comment \"{clean}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::Protocol;

    #[test]
    fn chain_names_fit_and_comments_stay_one_word() {
        let view = ServiceView::new("c", "ns", "web", vec![], vec![]);
        let port = ServicePort::new("http", Protocol::Tcp, 80, vec![]);
        let name = port_chain(ChainKind::Svc, &view, &port);
        assert!(name.starts_with("KPX-SVC-") && name.len() <= 28, "{name}");
        assert_ne!(
            name,
            port_chain(ChainKind::Svc, &view, &ServicePort::new("dns", Protocol::Udp, 53, vec![]))
        );
        assert!(endpoint_chain(&view, &port, "10.0.0.1:80").len() <= 28);
        assert_eq!(comment(&view, &port, "cluster IP"), "-m comment --comment \"ns/web:http cluster IP\"");
        assert_eq!(quote("a\"b\\c\nd"), "-m comment --comment \"a_b_c_d\"");
    }
}
