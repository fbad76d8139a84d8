//! `kind: Node`.

use serde::Deserialize;

use super::{cidr, ip, FieldError, Metadata};
use crate::model::Node;

#[derive(Deserialize)]
pub(super) struct NodeManifest {
    metadata: Metadata,
    #[serde(default)]
    spec: NodeSpec,
    #[serde(default)]
    status: NodeStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NodeSpec {
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
    #[serde(default)]
    taints: Vec<Taint>,
}

#[derive(Deserialize)]
struct Taint {
    key: String,
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Deserialize, Default)]
struct NodeStatus {
    #[serde(default)]
    addresses: Vec<NodeAddress>,
}

#[derive(Deserialize)]
struct NodeAddress {
    #[serde(rename = "type")]
    address_type: String,
    address: String,
}

pub(super) fn node(m: NodeManifest) -> Result<Node, FieldError> {
    // InternalIPs first, then ExternalIPs: the first of each family is the node's primary
    // address (as kubelet and kube-proxy choose it).
    let mut addresses = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        for (i, a) in m.status.addresses.iter().enumerate() {
            if a.address_type == wanted {
                addresses.push(ip(format!("status.addresses[{i}].address"), &a.address)?);
            }
        }
    }
    let mut pod_cidrs = Vec::new();
    match (&m.spec.pod_cidrs, &m.spec.pod_cidr) {
        (Some(list), _) if !list.is_empty() => {
            for (i, text) in list.iter().enumerate() {
                pod_cidrs.push(cidr(format!("spec.podCIDRs[{i}]"), text)?);
            }
        }
        (_, Some(text)) => pod_cidrs.push(cidr("spec.podCIDR".into(), text)?),
        _ => {}
    }
    Ok(Node {
        name: m.metadata.name,
        addresses,
        pod_cidrs,
        zone: m.metadata.labels.get("topology.kubernetes.io/zone").cloned(),
        being_deleted: m.metadata.deletion_timestamp.is_some()
            || m.spec.taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT),
    })
}

#[cfg(test)]
mod tests {
    use crate::source::manifest::{parse, Object};

    fn being_deleted(metadata: &str, spec: &str) -> bool {
        let text = format!("kind: Node\nmetadata: {{name: n1{metadata}}}\nspec: {{{spec}}}\n");
        match parse(&text).pop() {
            Some(Ok(Object::Node(node))) => node.being_deleted,
            other => panic!("not a Node: {other:?}"),
        }
    }

    #[test]
    fn a_deletion_timestamp_or_the_autoscaler_taint_means_being_deleted() {
        assert!(!being_deleted("", ""));
        assert!(!being_deleted("", "taints: [{key: node.kubernetes.io/unschedulable, effect: NoSchedule}]"));
        assert!(being_deleted(", deletionTimestamp: '2026-12-03T10:00:00Z'", ""));
        assert!(being_deleted(
            "",
            "taints: [{key: ToBeDeletedByClusterAutoscaler, value: '1764756000', effect: NoSchedule}]"
        ));
        assert!(!being_deleted(", deletionTimestamp: null", ""));
    }

    #[test]
    fn internal_addresses_come_before_external_ones() {
        let text = "kind: Node\nmetadata: {name: n1}\nstatus:\n  addresses:\n  - {type: ExternalIP, address: 192.0.2.1}\n  - {type: Hostname, address: n1}\n  - {type: InternalIP, address: 10.0.0.1}\n  - {type: InternalIP, address: 'fd00::1'}\n";
        let Some(Ok(Object::Node(node))) = parse(text).pop() else { panic!("not a Node") };
        let shown: Vec<String> = node.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.1", "fd00::1", "192.0.2.1"]);
    }
}
