//! Conntrack and sysctl stand-ins that record what was asked of them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::exec::conntrack::{Conntrack, FlowFilter};
use crate::exec::sysctl::Sysctl;
use crate::exec::ExecError;

/// Records every deletion asked for; clones share the record. Holds the destinations of
/// untranslated TCP attempts that [`FakeConntrack::attempt`] made.
#[derive(Clone, Default)]
pub struct FakeConntrack {
    deleted: Arc<Mutex<Vec<FlowFilter>>>,
    untranslated: Arc<Mutex<BTreeSet<(IpAddr, u16)>>>,
}

impl FakeConntrack {
    pub fn new() -> Self {
        Self::default()
    }

    /// A TCP attempt to `address:port` that no rule translated, as a client sending
    /// before the rules exist leaves one.
    pub fn attempt(&self, address: IpAddr, port: u16) {
        self.untranslated.lock().unwrap_or_else(|p| p.into_inner()).insert((address, port));
    }

    /// The filters deleted so far, oldest first; the record is emptied.
    pub fn take(&self) -> Vec<FlowFilter> {
        std::mem::take(&mut *self.deleted.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Conntrack for FakeConntrack {
    fn delete(&self, filter: &FlowFilter) -> Result<u64, ExecError> {
        if let (true, Some(address)) = (filter.untranslated, filter.destination) {
            self.untranslated.lock().unwrap_or_else(|p| p.into_inner()).remove(&(address, filter.port));
        }
        self.deleted.lock().unwrap_or_else(|p| p.into_inner()).push(filter.clone());
        Ok(1)
    }

    fn untranslated_tcp(&self, ipv6: bool) -> Result<BTreeSet<(IpAddr, u16)>, ExecError> {
        let all = self.untranslated.lock().unwrap_or_else(|p| p.into_inner());
        Ok(all.iter().filter(|(a, _)| a.is_ipv6() == ipv6).copied().collect())
    }
}

/// Keeps the settings written; clones share them.
#[derive(Clone, Default)]
pub struct FakeSysctl {
    values: Arc<Mutex<BTreeMap<String, String>>>,
}

impl FakeSysctl {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<String> {
        self.values.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }
}

impl Sysctl for FakeSysctl {
    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError> {
        self.values.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), value.to_owned());
        Ok(())
    }
}
