//! Conntrack and sysctl stand-ins that record what was asked of them.

use kpx_proto::sync::Locked as _;
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
        self.untranslated.locked().insert((address, port));
    }

    /// The filters deleted so far, oldest first; the record is emptied.
    pub fn take(&self) -> Vec<FlowFilter> {
        std::mem::take(&mut *self.deleted.locked())
    }
}

impl Conntrack for FakeConntrack {
    fn delete(&self, filter: &FlowFilter) -> Result<u64, ExecError> {
        if let (true, Some(address)) = (filter.untranslated, filter.destination) {
            self.untranslated.locked().remove(&(address, filter.port));
        }
        self.deleted.locked().push(filter.clone());
        Ok(1)
    }

    fn untranslated_tcp(&self, ipv6: bool) -> Result<BTreeSet<(IpAddr, u16)>, ExecError> {
        let all = self.untranslated.locked();
        Ok(all.iter().filter(|(a, _)| a.is_ipv6() == ipv6).copied().collect())
    }
}

/// Keeps the settings written (an unknown one reads "0"); clones share them. Read-only,
/// it refuses every write of another value, as `/proc/sys` in an unprivileged container.
#[derive(Clone, Default)]
pub struct FakeSysctl {
    values: Arc<Mutex<BTreeMap<String, String>>>,
    read_only: Arc<std::sync::atomic::AtomicBool>,
    writes: Arc<Mutex<Vec<String>>>,
    hidden: Arc<Mutex<Vec<String>>>,
}

impl FakeSysctl {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<String> {
        self.values.locked().get(name).cloned()
    }

    /// Gives `name` a value, as the kernel had it.
    pub fn preset(&self, name: &str, value: &str) {
        self.values.locked().insert(name.to_owned(), value.to_owned());
    }

    /// Makes `name` absent, as a setting of a module not loaded.
    pub fn hide(&self, name: &str) {
        self.hidden.locked().push(name.to_owned());
    }

    pub fn make_read_only(&self) {
        self.read_only.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The names written so far (a value it had already is no write).
    pub fn writes(&self) -> Vec<String> {
        self.writes.locked().clone()
    }
}

impl Sysctl for FakeSysctl {
    fn read(&self, name: &str) -> Result<String, ExecError> {
        if self.hidden.locked().iter().any(|h| h == name) {
            return Err(ExecError::Sysctl {
                name: name.to_owned(),
                action: "read".into(),
                error: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        Ok(self.get(name).unwrap_or_else(|| "0".to_owned()))
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError> {
        let current = self.read(name)?;
        if current == value {
            return Ok(());
        }
        if self.read_only.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ExecError::Sysctl {
                name: name.to_owned(),
                action: format!("set to {value} (it is {current})"),
                error: std::io::Error::from_raw_os_error(libc::EROFS),
            });
        }
        self.writes.locked().push(name.to_owned());
        self.preset(name, value);
        Ok(())
    }
}
