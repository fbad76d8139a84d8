//! In-memory links: dummy interfaces and the addresses on them.

use kpx_proto::sync::Locked as _;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::exec::links::Links;
use crate::exec::ExecError;

const TOOL: &str = "ip (fake)";

/// A handle on one fake set of links; clones share it.
#[derive(Clone, Default)]
pub struct FakeLinks {
    inner: Arc<Mutex<BTreeMap<String, BTreeSet<IpAddr>>>>,
}

impl FakeLinks {
    pub fn new() -> Self {
        Self::default()
    }

    fn links(&self) -> MutexGuard<'_, BTreeMap<String, BTreeSet<IpAddr>>> {
        self.inner.locked()
    }

    /// Whether the interface exists.
    pub fn exists(&self, name: &str) -> bool {
        self.links().contains_key(name)
    }
}

impl Links for FakeLinks {
    fn ensure_dummy(&mut self, name: &str) -> Result<(), ExecError> {
        self.links().entry(name.to_owned()).or_default();
        Ok(())
    }

    fn remove(&mut self, name: &str) -> Result<bool, ExecError> {
        Ok(self.links().remove(name).is_some())
    }

    fn addresses(&mut self, name: &str) -> Result<BTreeSet<IpAddr>, ExecError> {
        Ok(self.links().get(name).cloned().unwrap_or_default())
    }

    fn rebind(
        &mut self,
        name: &str,
        add: &BTreeSet<IpAddr>,
        remove: &BTreeSet<IpAddr>,
    ) -> Result<(), ExecError> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        let mut links = self.links();
        let addresses = links
            .get_mut(name)
            .ok_or_else(|| ExecError::refused(TOOL, format!("Cannot find device \"{name}\"")))?;
        if let Some(missing) = remove.iter().find(|a| !addresses.contains(*a)) {
            return Err(ExecError::refused(
                TOOL,
                format!("RTNETLINK answers: Cannot assign requested address ({missing})"),
            ));
        }
        addresses.extend(add.iter().copied());
        for a in remove {
            addresses.remove(a);
        }
        Ok(())
    }
}

impl crate::exec::interfaces::Interfaces for FakeLinks {
    fn addresses(&mut self) -> Result<Vec<crate::exec::interfaces::InterfaceAddress>, ExecError> {
        Ok(self
            .links()
            .iter()
            .flat_map(|(name, addresses)| {
                addresses.iter().map(|&address| crate::exec::interfaces::InterfaceAddress {
                    interface: name.clone(),
                    address,
                })
            })
            .collect())
    }
}
