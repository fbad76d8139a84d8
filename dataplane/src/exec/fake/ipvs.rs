//! An in-memory IPVS table with the kernel's refusals: adding what exists (`EEXIST`),
//! editing or deleting a service that does not (`ESRCH`) or a destination that does not
//! (`ENOENT`). Tests set the connection counters IPVS would count.

use kpx_proto::sync::Locked as _;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::exec::ipvs::{Destination, Ipvs, IpvsError, ServiceKey, VirtualService};

/// A handle on one fake IPVS; clones share it.
#[derive(Clone, Default)]
pub struct FakeIpvs {
    inner: Arc<Mutex<IpvsState>>,
}

#[derive(Default)]
struct IpvsState {
    services: BTreeMap<ServiceKey, (VirtualService, Vec<Destination>)>,
    fail_next: std::collections::VecDeque<i32>,
    /// How many times destinations were listed.
    listings: usize,
}

fn kernel(op: &'static str, errno: i32) -> IpvsError {
    IpvsError::Kernel { op, error: std::io::Error::from_raw_os_error(errno) }
}

impl FakeIpvs {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, IpvsState> {
        self.inner.locked()
    }

    /// Refuses the next change with `errno` (called twice: the next two).
    pub fn fail_next(&self, errno: i32) {
        self.state().fail_next.push_back(errno);
    }

    /// Every virtual service and its destinations.
    pub fn table(&self) -> Vec<(VirtualService, Vec<Destination>)> {
        self.state().services.values().cloned().collect()
    }

    /// How many times a service's destinations were listed.
    pub fn listings(&self) -> usize {
        self.state().listings
    }

    /// Sets the connections IPVS counts on a destination.
    pub fn set_connections(&self, key: &ServiceKey, address: IpAddr, port: u16, active: u32, inactive: u32) {
        let mut state = self.state();
        if let Some(d) = state
            .services
            .get_mut(key)
            .and_then(|(_, ds)| ds.iter_mut().find(|d| (d.address, d.port) == (address, port)))
        {
            d.active = active;
            d.inactive = inactive;
        }
    }

    fn change(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut BTreeMap<ServiceKey, (VirtualService, Vec<Destination>)>) -> Result<(), i32>,
    ) -> Result<(), IpvsError> {
        let mut state = self.state();
        if let Some(errno) = state.fail_next.pop_front() {
            return Err(kernel(op, errno));
        }
        f(&mut state.services).map_err(|errno| kernel(op, errno))
    }
}

impl Ipvs for FakeIpvs {
    fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError> {
        Ok(self.state().services.values().map(|(s, _)| s.clone()).collect())
    }

    fn destinations(&mut self, key: &ServiceKey) -> Result<Vec<Destination>, IpvsError> {
        let mut state = self.state();
        state.listings += 1;
        state
            .services
            .get(key)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| kernel("list destinations", libc::ESRCH))
    }

    fn add_service(&mut self, s: &VirtualService) -> Result<(), IpvsError> {
        self.change("add service", |services| {
            if services.contains_key(&s.key) {
                return Err(libc::EEXIST);
            }
            services.insert(s.key, (s.clone(), Vec::new()));
            Ok(())
        })
    }

    fn edit_service(&mut self, s: &VirtualService) -> Result<(), IpvsError> {
        self.change("edit service", |services| {
            services.get_mut(&s.key).map(|(old, _)| *old = s.clone()).ok_or(libc::ESRCH)
        })
    }

    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), IpvsError> {
        self.change("delete service", |services| services.remove(key).map(drop).ok_or(libc::ESRCH))
    }

    fn add_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.change("add destination", |services| {
            let (_, ds) = services.get_mut(key).ok_or(libc::ESRCH)?;
            if ds.iter().any(|x| (x.address, x.port) == (d.address, d.port)) {
                return Err(libc::EEXIST);
            }
            ds.push(Destination { active: 0, inactive: 0, ..d.clone() });
            Ok(())
        })
    }

    fn edit_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.change("edit destination", |services| {
            let (_, ds) = services.get_mut(key).ok_or(libc::ESRCH)?;
            let x = ds.iter_mut().find(|x| (x.address, x.port) == (d.address, d.port)).ok_or(libc::ENOENT)?;
            x.weight = d.weight;
            Ok(())
        })
    }

    fn delete_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError> {
        self.change("delete destination", |services| {
            let (_, ds) = services.get_mut(key).ok_or(libc::ESRCH)?;
            let at =
                ds.iter().position(|x| (x.address, x.port) == (d.address, d.port)).ok_or(libc::ENOENT)?;
            ds.remove(at);
            Ok(())
        })
    }

    fn reset(&mut self) {}
}
