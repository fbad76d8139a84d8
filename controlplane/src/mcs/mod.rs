//! Multi-Cluster Services (KEP-1645, `multicluster.x-k8s.io`): what the clusterset's
//! ServiceImports are, computed from every cluster's ServiceExports and the Services they
//! name ([`resolve`]: the import, each export's validity and conflicts), and the
//! addresses of the ClusterSetIP imports ([`allocate`]).
//!
//! On the nodes, an import is a Service of its own beside the Service of the same
//! namespace and name: its views are named [`import_key`]`(key)`, `name.clusterset`,
//! which no Service can be called (a Service's name is a DNS label, without dots).

pub mod allocate;
pub mod election;
pub mod kube;
pub mod plan;
pub mod report;
pub mod resolve;
pub mod writer;

use crate::model::ObjectKey;

/// What an import's name ends with where it stands beside Services.
pub const IMPORT_SUFFIX: &str = ".clusterset";

/// The key an import's views are kept under: `ns/name.clusterset`.
pub fn import_key(key: &ObjectKey) -> ObjectKey {
    ObjectKey { namespace: key.namespace.clone(), name: format!("{}{IMPORT_SUFFIX}", key.name) }
}

/// The import a key of [`import_key`] stands for; `None` for a Service's key.
pub fn imported(key: &ObjectKey) -> Option<ObjectKey> {
    let name = key.name.strip_suffix(IMPORT_SUFFIX)?;
    Some(ObjectKey { namespace: key.namespace.clone(), name: name.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_key_is_told_from_a_service_key_and_back() {
        let web = ObjectKey { namespace: "shop".into(), name: "web".into() };
        let key = import_key(&web);
        assert_eq!(key.to_string(), "shop/web.clusterset");
        assert_eq!(imported(&key), Some(web.clone()));
        assert_eq!(imported(&web), None, "a Service's key is no import's");
    }
}
