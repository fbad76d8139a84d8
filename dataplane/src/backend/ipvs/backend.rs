//! The IPVS backend: makes the kernel's IPVS table and the addresses of the dummy
//! interface `kpx-ipvs0` match [`desired`](super::desired), changing only what differs
//! (a restart reconciles with what is in the kernel: no flush, no traffic gap).
//! Destinations that go away are drained: weight 0 (no new connections), removed once
//! IPVS counts no connection on them.
//!
//! Not yet: masquerading, source ranges and policy-Local drops (ipset + iptables), and
//! NodePort virtual services left by an earlier run are not recognised as kpx's.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use super::desired::{desired, DesiredIpvs};
use super::netlink::{Destination, IpvsError, IpvsSocket, ServiceKey, PROTO_UDP};
use crate::backend::{Backend, BackendError, ProxyOptions};
use crate::state::{ChangeSet, NodeState};

/// The dummy interface that carries Service addresses.
pub const INTERFACE: &str = "kpx-ipvs0";

pub struct IpvsBackend {
    options: ProxyOptions,
    scheduler: String,
    /// Virtual services programmed by this process.
    programmed: BTreeSet<ServiceKey>,
}

fn refused(e: IpvsError) -> BackendError {
    BackendError::Refused { tool: "ipvs", message: e.to_string() }
}

/// Runs `ip ARGS`, feeding `input` (for `-batch -`).
fn ip(args: &[&str], input: Option<&str>) -> Result<String, BackendError> {
    use std::io::Write;
    let mut command = Command::new("ip");
    command.args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    if input.is_some() {
        command.stdin(std::process::Stdio::piped());
    }
    let mut child = command.spawn().map_err(|source| BackendError::Spawn { tool: "ip", source })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).map_err(|source| BackendError::Spawn { tool: "ip", source })?;
    }
    let out = child.wait_with_output().map_err(|source| BackendError::Spawn { tool: "ip", source })?;
    if !out.status.success() {
        return Err(BackendError::Refused {
            tool: "ip",
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The addresses `kpx-ipvs0` has (none when it does not exist).
fn bound_addresses() -> BTreeSet<IpAddr> {
    let Ok(text) = ip(&["-o", "addr", "show", "dev", INTERFACE], None) else { return BTreeSet::new() };
    text.lines()
        // The kernel's own link-local address is not ours.
        .filter(|line| !line.contains("scope link"))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet" || *w == "inet6")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

fn host_prefix(address: &IpAddr) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

impl IpvsBackend {
    pub fn new(options: ProxyOptions, scheduler: String) -> Self {
        IpvsBackend { options, scheduler, programmed: BTreeSet::new() }
    }

    fn ensure_interface(&self) -> Result<(), BackendError> {
        if ip(&["link", "show", "dev", INTERFACE], None).is_err() {
            ip(&["link", "add", INTERFACE, "type", "dummy"], None)?;
        }
        ip(&["link", "set", INTERFACE, "up"], None).map(drop)
    }

    /// Binds exactly `wanted` to the interface.
    fn bind(&self, wanted: &BTreeSet<IpAddr>) -> Result<BTreeSet<IpAddr>, BackendError> {
        let bound = bound_addresses();
        let mut batch = String::new();
        for a in wanted.difference(&bound) {
            batch.push_str(&format!(
                "addr add {} dev {INTERFACE}{}\n",
                host_prefix(a),
                if a.is_ipv6() { " nodad" } else { "" }
            ));
        }
        for a in bound.difference(wanted) {
            batch.push_str(&format!("addr del {} dev {INTERFACE}\n", host_prefix(a)));
        }
        if !batch.is_empty() {
            ip(&["-batch", "-"], Some(&batch))?;
        }
        Ok(bound)
    }

    fn sync(&mut self, state: &NodeState) -> Result<(), BackendError> {
        let want: DesiredIpvs = desired(state, &self.options, &self.scheduler);
        self.ensure_interface()?;
        let was_bound = self.bind(&want.addresses)?;
        let mut ipvs = IpvsSocket::open().map_err(refused)?;
        set_sysctls()?;
        let current = ipvs.services().map_err(refused)?;
        for (key, (service, destinations)) in &want.services {
            match current.iter().find(|s| s.key == *key) {
                None => ipvs.add_service(service).map_err(refused)?,
                Some(existing) if existing != service => ipvs.edit_service(service).map_err(refused)?,
                Some(_) => {}
            }
            self.programmed.insert(*key);
            sync_destinations(&mut ipvs, key, destinations)?;
        }
        // kpx's: what it programmed, and what sits on its interface's addresses.
        for stale in current.iter().filter(|s| !want.services.contains_key(&s.key)) {
            if self.programmed.contains(&stale.key) || was_bound.contains(&stale.key.address) {
                ipvs.delete_service(&stale.key).map_err(refused)?;
                self.programmed.remove(&stale.key);
            }
        }
        Ok(())
    }
}

/// IPVS settings of the node's namespace (present once ip_vs is loaded, which opening the
/// socket does): a packet of a connection whose destination was removed expires that
/// connection, so it is scheduled again (a UDP client that keeps its socket reaches a
/// live endpoint).
fn set_sysctls() -> Result<(), BackendError> {
    let path = "/proc/sys/net/ipv4/vs/expire_nodest_conn";
    std::fs::write(path, "1")
        .map_err(|source| BackendError::Spawn { tool: "sysctl net.ipv4.vs.expire_nodest_conn", source })
}

/// Adds what is missing, sets weights, and takes away what goes: a TCP or SCTP destination
/// is drained (weight 0) and removed once IPVS counts no connection on it; a UDP one
/// (connectionless: nothing to drain) is removed at once.
fn sync_destinations(
    ipvs: &mut IpvsSocket,
    key: &ServiceKey,
    wanted: &[Destination],
) -> Result<(), BackendError> {
    let current = ipvs.destinations(key).map_err(refused)?;
    for d in wanted {
        match current.iter().find(|c| (c.address, c.port) == (d.address, d.port)) {
            None => ipvs.add_destination(key, d).map_err(refused)?,
            Some(c) if c.weight != d.weight => ipvs.edit_destination(key, d).map_err(refused)?,
            Some(_) => {}
        }
    }
    for c in current.iter().filter(|c| !wanted.iter().any(|d| (d.address, d.port) == (c.address, c.port))) {
        if c.active + c.inactive == 0 || key.protocol == PROTO_UDP {
            ipvs.delete_destination(key, c).map_err(refused)?;
        } else if c.weight != 0 {
            ipvs.edit_destination(key, &Destination { weight: 0, ..c.clone() }).map_err(refused)?;
        }
    }
    Ok(())
}

impl Backend for IpvsBackend {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn apply(&mut self, desired: &NodeState, _changes: &ChangeSet) -> Result<(), BackendError> {
        self.sync(desired)
    }

    fn full_sync(&mut self, desired: &NodeState) -> Result<(), BackendError> {
        self.sync(desired)
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        let bound = bound_addresses();
        if let Ok(mut ipvs) = IpvsSocket::open() {
            for s in ipvs.services().map_err(refused)? {
                if self.programmed.contains(&s.key) || bound.contains(&s.key.address) {
                    ipvs.delete_service(&s.key).map_err(refused)?;
                }
            }
        }
        if ip(&["link", "show", "dev", INTERFACE], None).is_ok() {
            ip(&["link", "del", INTERFACE], None)?;
        }
        self.programmed.clear();
        Ok(())
    }

    /// Like `ipvsadm -Ln`.
    fn dump(&mut self) -> Result<String, BackendError> {
        let mut ipvs = IpvsSocket::open().map_err(refused)?;
        let mut out = String::new();
        for s in ipvs.services().map_err(refused)? {
            let persistent = if s.flags != 0 { format!(" persistent {}", s.timeout) } else { String::new() };
            out.push_str(&format!("{} {}{persistent}\n", s.key, s.scheduler));
            for d in ipvs.destinations(&s.key).map_err(refused)? {
                let at = match d.address {
                    IpAddr::V4(a) => format!("{a}:{}", d.port),
                    IpAddr::V6(a) => format!("[{a}]:{}", d.port),
                };
                out.push_str(&format!(
                    "  -> {at} Masq weight {} active {} inactive {}\n",
                    d.weight, d.active, d.inactive
                ));
            }
        }
        Ok(out)
    }
}
