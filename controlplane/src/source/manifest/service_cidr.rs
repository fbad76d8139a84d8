//! `kind: ServiceCIDR` (`networking.k8s.io/v1`): the ranges ClusterIPs come from.

use serde::Deserialize;

use super::{cidr, FieldError, Metadata};
use crate::model::ServiceCidr;

#[derive(Deserialize)]
pub(super) struct ServiceCidrManifest {
    metadata: Metadata,
    #[serde(default)]
    spec: ServiceCidrSpec,
}

#[derive(Deserialize, Default)]
struct ServiceCidrSpec {
    #[serde(default)]
    cidrs: Vec<String>,
}

pub(super) fn service_cidr(m: ServiceCidrManifest) -> Result<ServiceCidr, FieldError> {
    let cidrs = m
        .spec
        .cidrs
        .iter()
        .enumerate()
        .map(|(i, text)| cidr(format!("spec.cidrs[{i}]"), text))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ServiceCidr { name: m.metadata.name, cidrs })
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Object};

    #[test]
    fn its_ranges_are_read_and_a_bad_one_is_named() {
        let text = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\n\
                    spec: {cidrs: [10.96.0.0/16, 'fd00:10:96::/112']}\n";
        let Some(Ok(Object::ServiceCidr(s))) = parse(text).pop() else { panic!("not a ServiceCIDR") };
        assert_eq!((s.name.as_str(), s.cidrs.len()), ("kubernetes", 2));
        let bad = "kind: ServiceCIDR\nmetadata: {name: extra}\nspec: {cidrs: [10.97.0.0/33]}\n";
        let Some(Err(e)) = parse(bad).pop() else { panic!("not an error") };
        assert_eq!(e.field, "spec.cidrs[0]");
        assert!(e.to_string().contains("ServiceCIDR extra"), "{e}");
    }
}
