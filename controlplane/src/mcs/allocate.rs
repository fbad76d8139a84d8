//! ClusterSetIPs from `--clusterset-cidr`: for each ClusterSetIP import, one address per
//! family, the same in every cluster and for the import's whole life, and never one that
//! another import holds. The API objects are the record (`taken`: every address the
//! clusterset's ServiceImports hold), so a restarted control plane, or another replica,
//! allocates nothing anew for an import that has its address.
//!
//! The first address tried is a hash of the import's namespace/name, so two writers that
//! race for one import choose the same address, and imports made in any order spread
//! over the range instead of piling up at its start.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::ObjectKey;

/// Why no address could be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("--clusterset-cidr {0}: every address is held by an import")]
    Full(IpNet),
    #[error(
        "--clusterset-cidr {0}: too small to hold an address besides its network and broadcast addresses"
    )]
    TooSmall(IpNet),
    #[error("no --clusterset-cidr of {0}: the exported Services have that family, the import gets no address of it")]
    NoRange(&'static str),
}

/// The addresses of `cidr` an import may have: all but the network address (and, for
/// IPv4 ranges of more than two addresses, the broadcast address), as offsets from it.
fn usable(cidr: IpNet) -> (u128, u128) {
    let bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    let size: u128 = if bits >= 128 { u128::MAX } else { 1u128 << bits };
    match cidr {
        IpNet::V4(_) if size > 2 => (1, size - 2),
        _ if size > 1 => (1, size - 1),
        _ => (0, 0),
    }
}

fn at(cidr: IpNet, offset: u128) -> IpAddr {
    match cidr.network() {
        IpAddr::V4(base) => IpAddr::V4((u32::from(base).wrapping_add(offset as u32)).into()),
        IpAddr::V6(base) => IpAddr::V6((u128::from(base).wrapping_add(offset)).into()),
    }
}

/// The address of `cidr` for the import `key`: the one it holds already if it holds one
/// of `cidr` (`held`), else the first free one from where its hash points.
pub fn allocate(
    cidr: IpNet,
    key: &ObjectKey,
    held: &[IpAddr],
    taken: &BTreeSet<IpAddr>,
) -> Result<IpAddr, AllocateError> {
    if let Some(own) = held.iter().find(|ip| cidr.contains(*ip)) {
        return Ok(*own);
    }
    let (first, count) = usable(cidr);
    if count == 0 {
        return Err(AllocateError::TooSmall(cidr));
    }
    let start = u128::from(xxhash_rust::xxh3::xxh3_64(key.to_string().as_bytes())) % count;
    // Among `taken.len() + 1` consecutive addresses one is free, if the range has that many.
    let tries = count.min(taken.len() as u128 + 1);
    (0..tries)
        .map(|i| at(cidr, first + (start + i) % count))
        .find(|ip| !taken.contains(ip))
        .ok_or(AllocateError::Full(cidr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey { namespace: "ns".into(), name: name.into() }
    }

    fn net(text: &str) -> IpNet {
        text.parse().expect("cidr")
    }

    #[test]
    fn an_import_gets_the_same_address_wherever_it_is_computed_and_keeps_the_one_it_holds() {
        let cidr = net("10.200.0.0/16");
        let first = allocate(cidr, &key("web"), &[], &BTreeSet::new()).expect("an address");
        assert!(cidr.contains(&first) && first != cidr.network() && first != cidr.broadcast());
        assert_eq!(
            allocate(cidr, &key("web"), &[], &BTreeSet::new()),
            Ok(first),
            "the same in every cluster"
        );
        let held: IpAddr = "10.200.7.7".parse().expect("ip");
        let taken = BTreeSet::from([held, first]);
        assert_eq!(allocate(cidr, &key("web"), &[held], &taken), Ok(held), "kept for the import's life");
    }

    #[test]
    fn an_address_another_import_holds_is_never_given() {
        let cidr = net("10.200.0.0/29"); // 6 usable addresses
        let mut taken = BTreeSet::new();
        for i in 0..6 {
            let ip = allocate(cidr, &key(&format!("svc-{i}")), &[], &taken).expect("room left");
            assert!(taken.insert(ip), "{ip} given twice");
            assert!(ip != cidr.network() && ip != cidr.broadcast(), "{ip}");
        }
        assert_eq!(allocate(cidr, &key("one-more"), &[], &taken), Err(AllocateError::Full(cidr)));
        assert_eq!(
            allocate(net("10.0.0.0/32"), &key("web"), &[], &taken),
            Err(AllocateError::TooSmall(net("10.0.0.0/32")))
        );
    }

    #[test]
    fn each_family_has_its_own_range() {
        let v6 = net("fd00:c5::/64");
        let ip =
            allocate(v6, &key("web"), &["10.200.0.9".parse().expect("ip")], &BTreeSet::new()).expect("v6");
        assert!(v6.contains(&ip) && ip != v6.network(), "{ip}");
    }
}
