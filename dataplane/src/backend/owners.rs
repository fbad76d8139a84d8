//! Which Service owns each entry (`address . proto . port`, per family), for
//! every backend: when two Services claim the same entry, the first keeps it
//! and the other is warned about and not programmed there.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use kpx_proto::types::Protocol;

/// An entry point, `address . proto . port` (24 bytes, no allocation: every Service holds
/// its own and the owners table one more of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

impl fmt::Display for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} . {} . {}", self.address, self.protocol, self.port)
    }
}

/// Each entry's owner, its name shared with the backend's own record of that Service
/// (one copy of each name however many entries the Service holds).
#[derive(Debug, Default)]
pub struct Owners(HashMap<EntryKey, Arc<str>>);

/// Claims made while planning one change, over the owners programmed now.
pub struct Claims<'a> {
    owners: &'a Owners,
    now: HashMap<EntryKey, Option<&'a str>>,
}

impl Owners {
    /// Starts planning a change of the Services in `changed` (name, entries they hold now):
    /// their entries are released first, so a Service can take over a freed address.
    pub fn begin<'a>(&'a self, changed: impl IntoIterator<Item = (&'a str, &'a [EntryKey])>) -> Claims<'a> {
        let mut now = HashMap::new();
        for (name, entries) in changed {
            for entry in entries {
                if self.0.get(entry).map(|owner| &**owner) == Some(name) {
                    now.insert(*entry, None);
                }
            }
        }
        Claims { owners: self, now }
    }

    /// Records what a Service holds after an accepted change (`None`: removed).
    pub fn commit(&mut self, name: &Arc<str>, old: Option<&[EntryKey]>, new: Option<&[EntryKey]>) {
        for entry in old.unwrap_or_default() {
            if self.0.get(entry) == Some(name) {
                self.0.remove(entry);
            }
        }
        for entry in new.unwrap_or_default() {
            self.0.insert(*entry, Arc::clone(name));
        }
    }
}

/// Takes Service `name`'s record out of `services`, with the shared name it was kept
/// under (a new one when there was none), to be kept under again.
pub fn take_named<T>(services: &mut HashMap<Arc<str>, T>, name: String) -> (Arc<str>, Option<T>) {
    match services.remove_entry(name.as_str()) {
        Some((name, old)) => (name, Some(old)),
        None => (Arc::from(name), None),
    }
}

impl<'a> Claims<'a> {
    /// The entries of `wanted` that `service` gets; the others are taken and logged.
    pub fn claim(&mut self, service: &'a str, wanted: &[EntryKey]) -> Vec<EntryKey> {
        let mut taken = Vec::new();
        for entry in wanted {
            let owner = match self.now.get(entry) {
                Some(now) => *now,
                None => self.owners.0.get(entry).map(|owner| &**owner),
            };
            match owner {
                Some(owner) if owner != service => tracing::warn!(
                    service,
                    owner,
                    %entry,
                    "address and port already used by another Service; not programmed for this one"
                ),
                _ => taken.push(*entry),
            }
        }
        for entry in &taken {
            self.now.insert(*entry, Some(service));
        }
        taken
    }
}
