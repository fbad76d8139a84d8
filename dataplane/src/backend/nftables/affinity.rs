//! Session affinity (sessionAffinity: ClientIP): chains and sets of a
//! Service's own, the only per-Service objects in the table.
//!
//! ```text
//! chain sa-ID          ip saddr @sa-ID-EP goto sa-ID-EP      (one rule per endpoint)
//!                      numgen random mod N vmap { 0 : goto sa-ID-EP, … }
//! chain sa-ID-EP       update @sa-ID-EP { ip saddr }
//!                      meta l4proto tcp dnat ip to EP:PORT
//! set   sa-ID-EP       client addresses, each forgotten `timeout` seconds after its last new connection
//! ```
//! ID hashes the Service port, family, endpoint set and timeout; EP hashes the
//! endpoint. Endpoints that stay keep their chain and set, so their clients stay.

use std::fmt::Write as _;

use kpx_proto::types::{Endpoint, ServicePort};

use super::names::{socket_text, Family, NftFamily, FAMILY, TABLE};
use super::skeleton::EndpointSet;

/// A chain or set of a Service's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NftObject {
    pub name: String,
    pub kind: ObjectKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// A regular chain and its rules.
    Chain { rules: Vec<String> },
    /// A set, by its declaration body (what goes inside `{ }`).
    Set { declaration: String },
}

/// The objects of one Service port's affinity, and the chain its entries go to.
pub struct AffinityObjects {
    pub entry_chain: String,
    pub objects: Vec<NftObject>,
}

/// What the names of every affinity chain and set begin with.
pub const PREFIX: &str = "sa-";

fn short_hash(text: &str) -> String {
    format!("{:012x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()) & 0xffff_ffff_ffff)
}

pub fn objects(
    service: &str,
    port: &ServicePort,
    family: Family,
    set: EndpointSet,
    endpoints: &[&Endpoint],
    timeout: u32,
) -> AffinityObjects {
    let nft = family.nft();
    let id = short_hash(&format!(
        "{service}/{}/{}/{}/{family:?}/{set:?}/{timeout}",
        port.name, port.protocol, port.port
    ));
    let entry_chain = format!("{PREFIX}{id}");
    let mut objects = Vec::new();
    let mut entry_rules = Vec::new();
    let mut choices = Vec::new();
    for (index, ep) in endpoints.iter().enumerate() {
        let name = format!("{entry_chain}-{}", short_hash(&socket_text(&ep.address, ep.port)));
        objects.push(NftObject {
            name: name.clone(),
            kind: ObjectKind::Set {
                declaration: format!(
                    "type {} ; flags dynamic,timeout ; timeout {timeout}s ;",
                    family.addr_type()
                ),
            },
        });
        objects.push(NftObject {
            name: name.clone(),
            kind: ObjectKind::Chain {
                rules: vec![
                    format!("update @{name} {{ {nft} saddr }}"),
                    format!(
                        "meta l4proto {} dnat {nft} to {}",
                        port.protocol,
                        socket_text(&ep.address, ep.port)
                    ),
                ],
            },
        });
        entry_rules.push(format!("{nft} saddr @{name} goto {name}"));
        choices.push(format!("{index} : goto {name}"));
    }
    entry_rules.push(format!("numgen random mod {} vmap {{ {} }}", endpoints.len(), choices.join(", ")));
    objects.push(NftObject { name: entry_chain.clone(), kind: ObjectKind::Chain { rules: entry_rules } });
    AffinityObjects { entry_chain, objects }
}

/// Commands that take the table from the objects `old` to `new` (both sorted by name),
/// written around the element updates: `remove` once the elements that referred to
/// removed chains are gone, `create` ahead of element adds.
#[derive(Debug, Default)]
pub struct ObjectCommands {
    pub create: String,
    pub remove: String,
}

impl ObjectCommands {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.remove.is_empty()
    }
}

pub fn object_commands<'a>(
    old: impl IntoIterator<Item = &'a NftObject>,
    new: impl IntoIterator<Item = &'a NftObject>,
) -> ObjectCommands {
    use std::collections::BTreeMap;
    let t = format!("{FAMILY} {TABLE}");
    let key = |o: &'a NftObject| ((matches!(o.kind, ObjectKind::Set { .. }), o.name.as_str()), o);
    let old: BTreeMap<_, _> = old.into_iter().map(key).collect();
    let new: BTreeMap<_, _> = new.into_iter().map(key).collect();
    let mut flush = String::new();
    let mut delete_chains = String::new();
    let mut delete_sets = String::new();
    let mut create = String::new();
    let mut fill = String::new();
    for (k, o) in &old {
        let changed = new.get(k).map(|n| n != o);
        match (&o.kind, changed) {
            (_, Some(false)) => {}
            (ObjectKind::Chain { .. }, Some(true)) => {
                let _ = writeln!(flush, "flush chain {t} {}", o.name);
            }
            (ObjectKind::Chain { .. }, None) => {
                let _ = writeln!(flush, "flush chain {t} {}", o.name);
                let _ = writeln!(delete_chains, "delete chain {t} {}", o.name);
            }
            // A set's declaration never changes under the same name (the timeout is in the name).
            (ObjectKind::Set { .. }, _) => {
                if changed.is_none() {
                    let _ = writeln!(delete_sets, "delete set {t} {}", o.name);
                }
            }
        }
    }
    for (k, o) in &new {
        let existed = old.get(k);
        match &o.kind {
            ObjectKind::Set { declaration } if existed.is_none() => {
                let _ = writeln!(create, "add set {t} {} {{ {declaration} }}", o.name);
            }
            ObjectKind::Chain { rules } if existed != Some(o) => {
                if existed.is_none() {
                    let _ = writeln!(create, "add chain {t} {}", o.name);
                }
                for rule in rules {
                    let _ = writeln!(fill, "add rule {t} {} {rule}", o.name);
                }
            }
            _ => {}
        }
    }
    create.push_str(&fill);
    ObjectCommands { create, remove: flush + &delete_chains + &delete_sets }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::Protocol;

    fn eps(addrs: &[&str]) -> Vec<Endpoint> {
        addrs.iter().map(|a| Endpoint::new(a.parse().expect("ip"), 80, "", "", false)).collect()
    }

    #[test]
    fn an_endpoint_change_keeps_the_chains_and_sets_of_the_endpoints_that_stay() {
        let port = ServicePort::new("http", Protocol::Tcp, 80, vec![]);
        let old = objects(
            "c/ns/web",
            &port,
            Family::V4,
            EndpointSet::Cluster,
            &eps(&["10.0.0.1", "10.0.0.2"]).iter().collect::<Vec<_>>(),
            60,
        );
        let new = objects(
            "c/ns/web",
            &port,
            Family::V4,
            EndpointSet::Cluster,
            &eps(&["10.0.0.1", "10.0.0.3"]).iter().collect::<Vec<_>>(),
            60,
        );
        assert_eq!(old.entry_chain, new.entry_chain);
        let commands = object_commands(&old.objects, &new.objects);
        let kept = &old.objects[0].name;
        // The staying endpoint's set (its clients) and chain are neither recreated nor rewritten;
        // the rewritten entry chain still sends to them.
        for untouched in [
            format!("add set inet kpx {kept} "),
            format!("add chain inet kpx {kept}\n"),
            format!("add rule inet kpx {kept} "),
        ] {
            assert!(!commands.create.contains(&untouched), "{untouched:?} in {}", commands.create);
        }
        assert!(commands.create.contains(&format!("goto {kept}")), "{}", commands.create);
        assert!(!commands.remove.contains(kept.as_str()), "{}", commands.remove);
        assert_eq!(commands.remove.matches("delete set").count(), 1, "{}", commands.remove);
        assert_eq!(commands.remove.matches("delete chain").count(), 1, "{}", commands.remove);
        assert!(commands.remove.contains(&format!("flush chain inet kpx {}\n", old.entry_chain)));
        assert!(commands.create.contains("dnat ip to 10.0.0.3:80"), "{}", commands.create);
        assert!(commands.create.contains("numgen random mod 2 vmap"), "{}", commands.create);
        let none = object_commands(&new.objects, &new.objects);
        assert!(none.create.is_empty() && none.remove.is_empty());
    }
}
