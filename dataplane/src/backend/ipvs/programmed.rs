//! Everything the IPVS backend has programmed, Service by Service, and what one change
//! does to it ([`Delta`]): which virtual services to add, edit or delete, which addresses
//! to bind or release, which set members to add or delete. A virtual service, address or
//! member shared by several Services stays while one still holds it; an entry point that
//! two Services claim belongs to the first (the other is warned about and left out there).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use super::ipset::{Member, SetMembers, SetName};
use super::service::Piece;
use crate::exec::ipvs::{Destination, ServiceKey, VirtualService};

#[derive(Debug, Default)]
pub struct Programmed {
    pieces: HashMap<String, Piece>,
    owners: HashMap<ServiceKey, String>,
    addresses: BTreeMap<IpAddr, usize>,
    members: BTreeMap<(SetName, Member), usize>,
}

/// A virtual service and its destinations, as programmed.
pub type ProgrammedService = (VirtualService, Vec<Destination>);

/// What changes in the kernel; built by [`Programmed::set`] calls, read after the last one.
#[derive(Debug, Default)]
pub struct Delta {
    /// Virtual services touched: each as it was programmed before (`None`: it was not).
    services: BTreeMap<ServiceKey, Option<ProgrammedService>>,
    addresses: BTreeMap<IpAddr, bool>,
    members: BTreeMap<(SetName, Member), bool>,
}

/// A [`Delta`] resolved against the table after the change.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Virtual services to add (`None`) or bring up to date from what was programmed
    /// before, with the destinations they take.
    pub upsert: Vec<(Option<ProgrammedService>, VirtualService, Vec<Destination>)>,
    pub remove: Vec<ServiceKey>,
    pub bind: BTreeSet<IpAddr>,
    pub unbind: BTreeSet<IpAddr>,
    pub add_members: SetMembers,
    pub delete_members: SetMembers,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.upsert.is_empty()
            && self.remove.is_empty()
            && self.bind.is_empty()
            && self.unbind.is_empty()
            && self.add_members.is_empty()
            && self.delete_members.is_empty()
    }
}

fn count<K: Ord + Clone>(
    counts: &mut BTreeMap<K, usize>,
    touched: &mut BTreeMap<K, bool>,
    key: &K,
    up: bool,
) {
    let before = counts.get(key).copied().unwrap_or(0);
    touched.entry(key.clone()).or_insert(before > 0);
    let after = if up { before + 1 } else { before.saturating_sub(1) };
    if after == 0 {
        counts.remove(key);
    } else {
        counts.insert(key.clone(), after);
    }
}

impl Programmed {
    /// Replaces what Service `name` holds by `new` (`None`: the Service is gone).
    pub fn set(&mut self, name: &str, new: Option<Piece>, delta: &mut Delta) {
        if let Some(old) = self.pieces.remove(name) {
            for (key, service) in &old.services {
                delta.services.entry(*key).or_insert_with(|| Some(service.clone()));
                self.owners.remove(key);
            }
            for a in &old.addresses {
                count(&mut self.addresses, &mut delta.addresses, a, false);
            }
            for m in &old.members {
                count(&mut self.members, &mut delta.members, m, false);
            }
        }
        let Some(mut new) = new else { return };
        new.services.retain(|key, _| match self.owners.get(key) {
            Some(owner) => {
                tracing::warn!(service = name, owner, entry = %key, "address and port already used by another Service; not programmed for this one");
                false
            }
            None => true,
        });
        for key in new.services.keys() {
            delta.services.entry(*key).or_insert(None);
            self.owners.insert(*key, name.to_owned());
        }
        for a in &new.addresses {
            count(&mut self.addresses, &mut delta.addresses, a, true);
        }
        for m in &new.members {
            count(&mut self.members, &mut delta.members, m, true);
        }
        self.pieces.insert(name.to_owned(), new);
    }

    /// What `delta` means for the kernel, now that every change is in.
    pub fn resolve(&self, delta: Delta) -> Changes {
        let mut out = Changes::default();
        for (key, before) in delta.services {
            match (self.service(&key), before) {
                (Some((service, destinations)), before) => {
                    out.upsert.push((before, service.clone(), destinations.clone()))
                }
                (None, Some(_)) => out.remove.push(key),
                (None, None) => {}
            }
        }
        for (address, was) in delta.addresses {
            match (was, self.addresses.contains_key(&address)) {
                (false, true) => {
                    out.bind.insert(address);
                }
                (true, false) => {
                    out.unbind.insert(address);
                }
                _ => {}
            }
        }
        for ((set, member), was) in delta.members {
            match (was, self.members.contains_key(&(set, member.clone()))) {
                (false, true) => out.add_members.entry(set).or_default().insert(member),
                (true, false) => out.delete_members.entry(set).or_default().insert(member),
                _ => false,
            };
        }
        out
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&(VirtualService, Vec<Destination>)> {
        let owner = self.owners.get(key)?;
        self.pieces.get(owner)?.services.get(key)
    }

    /// Every virtual service, destinations and all.
    pub fn services(&self) -> impl Iterator<Item = &(VirtualService, Vec<Destination>)> {
        self.pieces.values().flat_map(|p| p.services.values())
    }

    pub fn owns(&self, key: &ServiceKey) -> bool {
        self.owners.contains_key(key)
    }

    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.addresses.keys().copied().collect()
    }

    pub fn members(&self) -> SetMembers {
        let mut out = SetMembers::new();
        for (set, member) in self.members.keys() {
            out.entry(*set).or_default().insert(member.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures;
    use crate::backend::ipvs::service::{piece, Context};

    #[test]
    fn a_change_touches_only_what_differs_and_shared_things_stay() {
        let ctx = Context { scheduler: "rr".into(), ..Default::default() };
        let mut table = Programmed::default();
        let mut delta = Delta::default();
        table.set("a", Some(piece(&fixtures::service("a", "10.96.0.1", &["10.244.0.1"]), &ctx)), &mut delta);
        table.set("b", Some(piece(&fixtures::service("b", "10.96.0.2", &["10.244.0.1"]), &ctx)), &mut delta);
        let first = table.resolve(delta);
        assert_eq!(first.upsert.len(), 2);
        assert_eq!(first.bind.len(), 2);
        assert_eq!(
            first.add_members.values().map(BTreeSet::len).sum::<usize>(),
            3,
            "two ClusterIPs, one shared hairpin member"
        );

        let mut delta = Delta::default();
        table.set("a", Some(piece(&fixtures::service("a", "10.96.0.1", &["10.244.0.2"]), &ctx)), &mut delta);
        let change = table.resolve(delta);
        assert_eq!(change.upsert.len(), 1);
        let before = change.upsert[0].0.as_ref().expect("existed before: edited");
        assert_eq!(before.1[0].address.to_string(), "10.244.0.1", "with what it had");
        assert_eq!(change.upsert[0].2[0].address.to_string(), "10.244.0.2");
        assert!(change.bind.is_empty() && change.unbind.is_empty());
        let added: Vec<String> = change.add_members.values().flatten().map(ToString::to_string).collect();
        assert_eq!(added, ["10.244.0.2,tcp:8080,10.244.0.2"]);
        assert!(change.delete_members.is_empty(), "b still holds 10.244.0.1's hairpin member");

        let mut delta = Delta::default();
        table.set("b", None, &mut delta);
        let gone = table.resolve(delta);
        assert_eq!(gone.remove.len(), 1);
        assert_eq!(gone.unbind.len(), 1);
        assert_eq!(gone.delete_members.values().map(BTreeSet::len).sum::<usize>(), 2);
    }

    #[test]
    fn an_entry_claimed_twice_belongs_to_the_first() {
        let ctx = Context { scheduler: "rr".into(), ..Default::default() };
        let mut table = Programmed::default();
        let mut delta = Delta::default();
        table.set("a", Some(piece(&fixtures::service("a", "10.96.0.1", &["10.244.0.1"]), &ctx)), &mut delta);
        table.set("b", Some(piece(&fixtures::service("b", "10.96.0.1", &["10.244.0.9"]), &ctx)), &mut delta);
        let changes = table.resolve(delta);
        assert_eq!(changes.upsert.len(), 1);
        assert_eq!(changes.upsert[0].2[0].address.to_string(), "10.244.0.1");
    }
}
