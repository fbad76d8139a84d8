//! The IPVS backend: programs the virtual services each Service's [`Piece`] asks for, the
//! Service addresses on the dummy interface `kpx-ipvs0`, and the ipset members and few
//! iptables rules for what IPVS cannot do (masquerade, source ranges, policy-Local drops).
//!
//! An apply changes only what the changed Services touch (the [`Table`] says what); a full
//! sync reconciles with the kernel: it reads the IPVS table and changes what differs (a
//! restart neither flushes nor cuts traffic), swaps every set in whole and rewrites kpx's
//! chains. Destinations that go away are drained: weight 0 (no new connections), removed
//! once IPVS counts no connection on them or after the drain grace ([`Backend::housekeeping`]);
//! UDP ones are removed at once (nothing to drain).
//!
//! Kernel order of an apply: new set members and addresses first, then IPVS, then the
//! members and addresses that went away, so no packet meets a virtual service its rules do
//! not cover yet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::chains::{self, ChainInputs};
use super::desired::{piece, Context, Piece};
use super::ipset::{self, IpsetProcess, SetRole};
use super::netlink::{Destination, IpvsError, IpvsSocket, ServiceKey, VirtualService, PROTO_UDP};
use super::table::{Changes, Delta, Table};
use crate::backend::iptables::{ruleset, IptablesMode, IptablesProcess, RestoreRunner};
use crate::backend::{Backend, BackendError, Family, ProxyOptions};
use crate::state::{ChangeSet, NodeState};
use kpx_proto::types::Protocol;

/// The dummy interface that carries Service addresses.
pub const INTERFACE: &str = "kpx-ipvs0";

/// The IPVS backend's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsOptions {
    /// The scheduler of Services that do not choose one.
    pub scheduler: String,
    /// How long a removed destination may keep its connections before it is deleted.
    pub drain_grace: Duration,
    pub iptables_mode: IptablesMode,
}

pub struct IpvsBackend {
    options: ProxyOptions,
    ipvs_options: IpvsOptions,
    iptables: IptablesProcess,
    ipset: IpsetProcess,
    socket: Option<IpvsSocket>,
    /// What is programmed; `None` before the first full sync and after a failure.
    table: Option<Table>,
    context: Context,
    chains: BTreeMap<Family, ChainInputs>,
    /// Destinations at weight 0, waiting for their connections to end: since when.
    draining: BTreeMap<(ServiceKey, IpAddr, u16), Instant>,
}

fn refused(e: IpvsError) -> BackendError {
    BackendError::Refused { tool: "ipvs", message: e.to_string() }
}

/// Runs `ip ARGS`, feeding `input` (for `-batch -`).
fn ip(args: &[&str], input: Option<&str>) -> Result<String, BackendError> {
    crate::backend::tool::run("ip", "ip", args, input)
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

/// Binds `add` to the interface and releases `remove`, in one `ip -batch`.
fn rebind(add: &BTreeSet<IpAddr>, remove: &BTreeSet<IpAddr>) -> Result<(), BackendError> {
    let mut batch = String::new();
    for a in add {
        let nodad = if a.is_ipv6() { " nodad" } else { "" };
        batch.push_str(&format!("addr replace {} dev {INTERFACE}{nodad}\n", host_prefix(a)));
    }
    for a in remove {
        batch.push_str(&format!("addr del {} dev {INTERFACE}\n", host_prefix(a)));
    }
    if batch.is_empty() {
        return Ok(());
    }
    ip(&["-batch", "-"], Some(&batch)).map(drop)
}

fn ensure_interface() -> Result<(), BackendError> {
    if ip(&["link", "show", "dev", INTERFACE], None).is_err() {
        ip(&["link", "add", INTERFACE, "type", "dummy"], None)?;
    }
    ip(&["link", "set", INTERFACE, "up"], None).map(drop)
}

/// IPVS settings of the node's namespace (present once ip_vs is loaded, which opening the
/// socket does): IPVS keeps conntrack entries, so iptables can masquerade what it forwards;
/// a packet of a connection whose destination was removed expires that connection, so it
/// is scheduled again (a UDP client that keeps its socket reaches a live endpoint).
fn set_sysctls() -> Result<(), BackendError> {
    for (name, value) in [("conntrack", "1"), ("expire_nodest_conn", "1")] {
        let path = format!("/proc/sys/net/ipv4/vs/{name}");
        std::fs::write(&path, value)
            .map_err(|source| BackendError::Spawn { tool: "sysctl net.ipv4.vs", source })?;
    }
    Ok(())
}

/// The entry points named in kpx's sets as `ipset save` shows them (what an earlier run
/// programmed, NodePorts on node addresses included).
fn keys_in_sets(saved: &str) -> BTreeSet<ServiceKey> {
    let entry_sets: BTreeSet<String> = Family::ALL
        .into_iter()
        .flat_map(|f| {
            [SetRole::ClusterIp, SetRole::External, SetRole::ExternalLocal]
                .map(|r| ipset::SetName::new(r, f).to_string())
        })
        .collect();
    saved
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "add" && entry_sets.contains(words.next()?)).then_some(())?;
            let (address, rest) = words.next()?.split_once(',')?;
            let (proto, port) = rest.split_once(':')?;
            let protocol = match proto {
                "tcp" => super::netlink::PROTO_TCP,
                "udp" => PROTO_UDP,
                "sctp" => super::netlink::PROTO_SCTP,
                _ => return None,
            };
            Some(ServiceKey { address: address.parse().ok()?, protocol, port: port.parse().ok()? })
        })
        .collect()
}

impl IpvsBackend {
    pub fn new(options: ProxyOptions, ipvs_options: IpvsOptions) -> Self {
        let mode = ipvs_options.iptables_mode.resolve();
        tracing::info!(
            ?mode,
            scheduler = ipvs_options.scheduler,
            "IPVS backend; iptables flavour for its rules"
        );
        IpvsBackend {
            options,
            ipvs_options,
            iptables: IptablesProcess { mode },
            ipset: IpsetProcess,
            socket: None,
            table: None,
            context: Context::default(),
            chains: BTreeMap::new(),
            draining: BTreeMap::new(),
        }
    }

    fn socket(&mut self) -> Result<&mut IpvsSocket, BackendError> {
        if self.socket.is_none() {
            self.socket = Some(IpvsSocket::open().map_err(refused)?);
        }
        self.socket.as_mut().ok_or(BackendError::Refused { tool: "ipvs", message: "no socket".into() })
    }

    fn chain_inputs(&self, state: &NodeState, family: Family) -> ChainInputs {
        let node = state.node.as_ref().map(|n| &n.value);
        ChainInputs {
            masquerade_all: self.options.masquerade_all,
            local_cidrs: self
                .options
                .local_cidrs(node)
                .into_iter()
                .filter(|c| Family::of_net(c) == family)
                .collect(),
        }
    }

    fn piece(&self, state: &NodeState, name: &str) -> Option<Piece> {
        state.services.get(name).map(|v| piece(&v.value, &self.context))
    }

    /// Programs one change; the table already holds its result.
    fn program(&mut self, changes: &Changes) -> Result<(), BackendError> {
        let (adds, _) = ipset::diff_scripts(&Default::default(), &changes.add_members);
        self.ipset.restore(&adds)?;
        rebind(&changes.bind, &BTreeSet::new())?;
        // A new entry point may have flows from before it existed (a SYN the node routed
        // elsewhere): its retransmission would reach IPVS past the masquerade rules. Gone
        // before IPVS takes the address, such a SYN is refused and the client retries.
        for (_, service, _) in changes.upsert.iter().filter(|(existed, _, _)| !existed) {
            let key = service.key;
            let protocol = match key.protocol {
                super::netlink::PROTO_UDP => Protocol::Udp,
                super::netlink::PROTO_SCTP => Protocol::Sctp,
                _ => Protocol::Tcp,
            };
            crate::conntrack::delete_all_to(key.address, protocol, key.port);
        }
        for (existed, service, destinations) in &changes.upsert {
            let ipvs = self.socket()?;
            if *existed {
                ipvs.edit_service(service).map_err(refused)?;
            } else {
                match ipvs.add_service(service) {
                    Err(IpvsError::Kernel { error, .. }) if error.raw_os_error() == Some(libc::EEXIST) => {
                        ipvs.edit_service(service).map_err(refused)?
                    }
                    other => other.map_err(refused)?,
                }
            }
            self.sync_destinations(&service.key, destinations)?;
        }
        for key in &changes.remove {
            self.socket()?.delete_service(key).map_err(refused)?;
            self.draining.retain(|(k, _, _), _| k != key);
        }
        let (_, deletes) = ipset::diff_scripts(&changes.delete_members, &Default::default());
        self.ipset.restore(&deletes)?;
        rebind(&BTreeSet::new(), &changes.unbind)
    }

    /// Adds what is missing, sets weights, and takes away what goes: TCP and SCTP
    /// destinations are drained, UDP ones removed at once.
    fn sync_destinations(&mut self, key: &ServiceKey, wanted: &[Destination]) -> Result<(), BackendError> {
        let ipvs = self.socket()?;
        let current = ipvs.destinations(key).map_err(refused)?;
        for d in wanted {
            match current.iter().find(|c| (c.address, c.port) == (d.address, d.port)) {
                None => ipvs.add_destination(key, d).map_err(refused)?,
                Some(c) if c.weight != d.weight => ipvs.edit_destination(key, d).map_err(refused)?,
                Some(_) => {}
            }
        }
        let mut started = Vec::new();
        for c in current.iter().filter(|c| !wanted.iter().any(|d| (d.address, d.port) == (c.address, c.port)))
        {
            if c.active + c.inactive == 0 || key.protocol == PROTO_UDP {
                ipvs.delete_destination(key, c).map_err(refused)?;
            } else if c.weight != 0 {
                ipvs.edit_destination(key, &Destination { weight: 0, ..c.clone() }).map_err(refused)?;
                started.push((*key, c.address, c.port));
            } else {
                started.push((*key, c.address, c.port));
            }
        }
        self.draining
            .retain(|(k, a, p), _| k != key || !wanted.iter().any(|d| (d.address, d.port) == (*a, *p)));
        for d in started {
            self.draining.entry(d).or_insert_with(Instant::now);
        }
        Ok(())
    }

    fn full(&mut self, desired: &NodeState) -> Result<(), BackendError> {
        let previous = self.table.take();
        self.context = Context::new(desired, &self.options, &self.ipvs_options.scheduler);
        let mut table = Table::default();
        let mut delta = Delta::default();
        for (name, view) in &desired.services {
            table.set(name, Some(piece(&view.value, &self.context)), &mut delta);
        }
        drop(delta);

        ensure_interface()?;
        let was_bound = bound_addresses();
        let wanted = table.addresses();
        rebind(&wanted.difference(&was_bound).copied().collect(), &BTreeSet::new())?;
        let in_sets = keys_in_sets(&self.ipset.save()?);
        self.ipset.restore(&ipset::swap_script(&table.members()))?;
        for family in Family::ALL {
            let inputs = self.chain_inputs(desired, family);
            let saved = self.iptables.save(family)?;
            self.iptables.restore(family, &chains::script(family, &inputs, Some(&saved)))?;
            self.chains.insert(family, inputs);
        }
        self.socket = None;
        let current = self.socket()?.services().map_err(refused)?;
        set_sysctls()?;
        let services: Vec<(VirtualService, Vec<Destination>)> = table.services().cloned().collect();
        for (service, destinations) in &services {
            let ipvs = self.socket()?;
            match current.iter().find(|s| s.key == service.key) {
                None => ipvs.add_service(service).map_err(refused)?,
                Some(existing) if existing != service => ipvs.edit_service(service).map_err(refused)?,
                Some(_) => {}
            }
            self.sync_destinations(&service.key, destinations)?;
        }
        // kpx's: what it programmed, what its sets name, and what sits on its interface.
        let ours = |key: &ServiceKey| {
            previous.as_ref().is_some_and(|t| t.owns(key))
                || in_sets.contains(key)
                || was_bound.contains(&key.address)
        };
        for stale in current.iter().filter(|s| !table.owns(&s.key) && ours(&s.key)) {
            self.socket()?.delete_service(&stale.key).map_err(refused)?;
            self.draining.retain(|(k, _, _), _| *k != stale.key);
        }
        rebind(&BTreeSet::new(), &was_bound.difference(&wanted).copied().collect())?;
        self.table = Some(table);
        Ok(())
    }
}

impl Backend for IpvsBackend {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn apply(&mut self, desired: &NodeState, changes: &ChangeSet) -> Result<(), BackendError> {
        let context = Context::new(desired, &self.options, &self.ipvs_options.scheduler);
        let chains_same =
            Family::ALL.into_iter().all(|f| self.chains.get(&f) == Some(&self.chain_inputs(desired, f)));
        if self.table.is_none() || context != self.context || !chains_same {
            return self.full_sync(desired);
        }
        let pieces: Vec<(&String, Option<Piece>)> =
            changes.services.iter().map(|name| (name, self.piece(desired, name))).collect();
        let Some(table) = self.table.as_mut() else { return self.full_sync(desired) };
        let mut delta = Delta::default();
        for (name, piece) in pieces {
            table.set(name, piece, &mut delta);
        }
        let changes = table.resolve(delta);
        if changes.is_empty() {
            return Ok(());
        }
        self.program(&changes).inspect_err(|_| {
            self.table = None;
            self.socket = None;
        })
    }

    fn full_sync(&mut self, desired: &NodeState) -> Result<(), BackendError> {
        self.full(desired).inspect_err(|_| {
            self.table = None;
            self.socket = None;
        })
    }

    fn housekeeping(&mut self) -> Result<(), BackendError> {
        if self.draining.is_empty() {
            return Ok(());
        }
        let grace = self.ipvs_options.drain_grace;
        let keys: BTreeSet<ServiceKey> = self.draining.keys().map(|(k, _, _)| *k).collect();
        for key in keys {
            let current = match self.socket()?.destinations(&key) {
                Ok(c) => c,
                Err(IpvsError::Kernel { .. }) => Vec::new(), // the virtual service is gone
                Err(e) => return Err(refused(e)),
            };
            let waiting: Vec<((ServiceKey, IpAddr, u16), Instant)> =
                self.draining.iter().filter(|((k, _, _), _)| *k == key).map(|(d, t)| (*d, *t)).collect();
            for (id @ (_, address, port), since) in waiting {
                match current.iter().find(|c| (c.address, c.port) == (address, port)) {
                    Some(c) if c.weight == 0 && (c.active + c.inactive == 0 || since.elapsed() >= grace) => {
                        self.socket()?.delete_destination(&key, c).map_err(refused)?;
                        tracing::debug!(service = %key, destination = %address, "drained destination removed");
                        self.draining.remove(&id);
                    }
                    Some(c) if c.weight == 0 => {}
                    _ => {
                        self.draining.remove(&id);
                    }
                }
            }
        }
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        let bound = bound_addresses();
        let in_sets = keys_in_sets(&self.ipset.save()?);
        let owned = |key: &ServiceKey| {
            self.table.as_ref().is_some_and(|t| t.owns(key))
                || in_sets.contains(key)
                || bound.contains(&key.address)
        };
        if let Ok(mut ipvs) = IpvsSocket::open() {
            for s in ipvs.services().map_err(refused)? {
                if owned(&s.key) {
                    ipvs.delete_service(&s.key).map_err(refused)?;
                }
            }
        }
        for family in Family::ALL {
            let script = ruleset::cleanup_script(&self.iptables.save(family)?, chains::PREFIX);
            if !script.is_empty() {
                self.iptables.restore(family, &script)?;
            }
        }
        self.ipset.restore(&ipset::destroy_script(&self.ipset.names()?))?;
        if ip(&["link", "show", "dev", INTERFACE], None).is_ok() {
            ip(&["link", "del", INTERFACE], None)?;
        }
        self.table = None;
        self.socket = None;
        self.chains.clear();
        self.draining.clear();
        Ok(())
    }

    /// The IPVS table like `ipvsadm -Ln`, then kpx's sets like `ipset save`, then its
    /// chains like `iptables-save`.
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
        out.push_str(&self.ipset.save()?);
        for family in Family::ALL {
            for line in self.iptables.save(family)?.lines() {
                if line.starts_with('*') || line.contains(chains::PREFIX) || line == "COMMIT" {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_entries_are_read_back_from_the_sets() {
        let saved = "create KPX-EXTERNAL-4 hash:ip,port family inet hashsize 1024 maxelem 1048576\n\
                     add KPX-EXTERNAL-4 10.0.0.1,tcp:30080\nadd KPX-CLUSTER-IP-6 fd00::10,udp:53\n\
                     add KPX-LOOP-BACK-4 10.244.0.5,tcp:8080,10.244.0.5\nadd KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n";
        let keys: Vec<String> = keys_in_sets(saved).iter().map(ToString::to_string).collect();
        assert_eq!(keys, ["10.0.0.1:30080/tcp", "[fd00::10]:53/udp"]);
    }
}
