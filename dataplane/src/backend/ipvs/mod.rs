//! The IPVS backend: [`service`] says what one Service puts into IPVS, [`programmed`]
//! keeps what is programmed and what a change touches, [`ipset`] and [`chains`] cover
//! what IPVS cannot do (masquerade, source ranges, drops), and the backend here makes the
//! kernel match through [`crate::exec`] (IPVS over generic netlink, ipset, iptables, `ip`).
//! Tested over the fakes (`tests.rs`) and inside the VM of `tests/vm/run-in-vm.sh` (this
//! machine's kernel has no IPVS).
//!
//! It programs the virtual services each Service's [`Piece`] asks for, the
//! Service addresses on the dummy interface `kpx-ipvs0`, and the ipset members and few
//! iptables rules for what IPVS cannot do (masquerade, source ranges, policy-Local drops).
//!
//! An apply changes only what the changed Services touch (the [`Programmed`] table says
//! what); a full sync reconciles with the kernel: it reads the IPVS table and changes what
//! differs (a restart neither flushes nor cuts traffic), swaps in whole each set whose
//! members differ from what `ipset save` shows and rewrites kpx's chains when
//! iptables-save does not show them as written: a restart over intact rules writes none. Destinations that go away are drained: weight 0 (no new
//! connections), removed once IPVS counts no connection on them or after the drain grace
//! ([`Backend::housekeeping`]); UDP ones are removed at once (nothing to drain).
//!
//! Kernel order of an apply: new set members and addresses first, then IPVS, then the
//! members and addresses that went away, so no packet meets a virtual service its rules do
//! not cover yet.

pub mod chains;
pub mod ipset;
pub mod programmed;
pub mod service;

#[cfg(test)]
mod tests;

use super::incremental::{self, Incremental, Planned};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kpx_proto::types::Protocol;

use self::ipset::SetRole;
use crate::backend::{xtables, Backend, BackendError, Family, NodeContext};
use crate::exec::conntrack::{FlowFilter, SharedConntrack};
use crate::exec::ipset::netlink::IpsetNetlink;
use crate::exec::ipset::{Edit, Ipset};
use crate::exec::iptables::{Flavour, Iptables, IptablesProcess};
use crate::exec::ipvs::{
    Destination, DestinationEdit, Ipvs, IpvsError, ServiceKey, VirtualService, PROTO_SCTP, PROTO_TCP,
    PROTO_UDP,
};
use crate::exec::links::{IpProcess, Links};
use crate::exec::sysctl::{ProcSys, Sysctl};
use crate::state::{ChangeSet, NodeState};
use chains::ChainInputs;
use programmed::{Changes, Delta, Programmed};
use service::{piece, Context, Piece};

/// The dummy interface that carries Service addresses.
pub const INTERFACE: &str = "kpx-ipvs0";

/// The IPVS backend's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsOptions {
    /// The scheduler of Services that do not choose one.
    pub scheduler: String,
    /// How long a removed destination may keep its connections before it is deleted.
    pub drain_grace: Duration,
    /// kube-proxy's `ipvs.strictARP`: the node answers ARP only for addresses of the
    /// interface asked on, so the Service addresses on kpx's dummy interface are not
    /// announced (what MetalLB's layer-2 mode needs).
    pub strict_arp: bool,
}

/// The kernel facilities the IPVS backend drives.
pub struct IpvsKernel {
    pub ipvs: Box<dyn Ipvs>,
    pub ipset: Box<dyn Ipset>,
    pub iptables: Box<dyn Iptables>,
    pub links: Box<dyn Links>,
    pub sysctl: Box<dyn Sysctl>,
    pub conntrack: SharedConntrack,
}

impl IpvsKernel {
    /// The node's own kernel: IPVS over generic netlink, ipset (members over netlink,
    /// whole sets through the tool), the `iptables` (of `flavour`) and `ip` tools, `/proc/sys`.
    pub fn system(flavour: Flavour, conntrack: SharedConntrack) -> Self {
        IpvsKernel {
            ipvs: Box::new(crate::exec::ipvs::netlink::NetlinkIpvs::default()),
            ipset: Box::new(IpsetNetlink::default()),
            iptables: Box::new(IptablesProcess { flavour }),
            links: Box::new(IpProcess),
            sysctl: Box::new(ProcSys::default()),
            conntrack,
        }
    }
}

pub struct IpvsBackend {
    options: IpvsOptions,
    kernel: IpvsKernel,
    /// What is programmed; `None` before the first full sync and after a failure.
    programmed: Option<Programmed>,
    context: Context,
    chains: BTreeMap<Family, ChainInputs>,
    /// Destinations at weight 0, waiting for their connections to end: since when.
    draining: BTreeMap<(ServiceKey, IpAddr, u16), Instant>,
}

/// IPVS settings of the node's namespace (present once ip_vs is loaded, which talking to
/// IPVS does): IPVS keeps conntrack entries, so iptables can masquerade what it forwards;
/// a packet of a connection whose destination was removed expires that connection, so it
/// is scheduled again (a UDP client that keeps its socket reaches a live endpoint); a
/// persistence template whose destination is quiescent (weight 0, draining) expires, so
/// a client with session affinity moves on (kube-proxy sets the same three).
const SYSCTLS: [(&str, &str); 3] = [
    ("net.ipv4.vs.conntrack", "1"),
    ("net.ipv4.vs.expire_nodest_conn", "1"),
    ("net.ipv4.vs.expire_quiescent_template", "1"),
];

/// `strictARP`: reply to ARP only for addresses of the interface asked on, and announce
/// only such addresses (kube-proxy's values).
const STRICT_ARP: [(&str, &str); 2] =
    [("net.ipv4.conf.all.arp_ignore", "1"), ("net.ipv4.conf.all.arp_announce", "2")];

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
                "tcp" => PROTO_TCP,
                "udp" => PROTO_UDP,
                "sctp" => PROTO_SCTP,
                _ => return None,
            };
            Some(ServiceKey { address: address.parse().ok()?, protocol, port: port.parse().ok()? })
        })
        .collect()
}

fn chain_inputs(context: &NodeContext, family: Family) -> ChainInputs {
    ChainInputs {
        masquerade_all: context.masquerade_all,
        from_pods: xtables::from_pods(context.local.matcher(family)),
    }
}

/// Where the destinations a change starts from were learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Had {
    /// kpx's own table: the kernel holds these, and those draining at weight 0 beside them.
    Programmed,
    /// Read from the kernel, with its connection counts.
    Kernel,
}

impl IpvsBackend {
    pub fn new(options: IpvsOptions, kernel: IpvsKernel) -> Self {
        tracing::info!(scheduler = options.scheduler, "IPVS backend");
        IpvsBackend {
            options,
            kernel,
            programmed: None,
            context: Context::default(),
            chains: BTreeMap::new(),
            draining: BTreeMap::new(),
        }
    }

    fn piece(&self, state: &NodeState, name: &str) -> Option<Piece> {
        state.services.get(name).map(|v| piece(&v.value, &self.context))
    }

    /// Binds `add` to the interface and releases `remove`.
    fn rebind(&mut self, add: &BTreeSet<IpAddr>, remove: &BTreeSet<IpAddr>) -> Result<(), BackendError> {
        Ok(self.kernel.links.rebind(INTERFACE, add, remove)?)
    }

    /// Programs one change; the table already holds its result.
    fn program(&mut self, changes: &Changes) -> Result<(), BackendError> {
        for (set, members) in &changes.add_members {
            self.kernel.ipset.edit(Edit::Add, &set.to_string(), members)?;
        }
        // A new entry point may have flows from before it existed (a SYN the node routed
        // elsewhere): its retransmission would reach IPVS past the masquerade rules. Gone
        // before IPVS takes the address, such a SYN is refused and the client retries.
        for (_, service, _) in changes.upsert.iter().filter(|(before, _, _)| before.is_none()) {
            let key = service.key;
            let protocol = match key.protocol {
                PROTO_UDP => Protocol::Udp,
                PROTO_SCTP => Protocol::Sctp,
                _ => Protocol::Tcp,
            };
            let filter = FlowFilter {
                protocol,
                ipv6: key.address.is_ipv6(),
                destination: Some(key.address),
                port: key.port,
                nat_to: None,
                untranslated: false,
            };
            if let Err(e) = self.kernel.conntrack.delete(&filter) {
                tracing::warn!(service = %key, error = %e, "cannot delete flows made before the entry point existed; they stay until they time out");
            }
        }
        for (before, service, destinations) in &changes.upsert {
            let ipvs = &mut self.kernel.ipvs;
            match before {
                Some((programmed, _)) if programmed == service => {}
                Some(_) => ipvs.edit_service(service)?,
                None => match ipvs.add_service(service) {
                    // Not ours to know (an earlier run's): its destinations read first.
                    Err(e) if e.errno() == Some(libc::EEXIST) => {
                        ipvs.edit_service(service)?;
                        self.sync_destinations(&service.key, destinations)?;
                        continue;
                    }
                    other => other?,
                },
            }
            let had = before.as_ref().map_or(&[][..], |(_, d)| &d[..]);
            self.change_destinations(&service.key, had, destinations)?;
        }
        // An address is bound (IPVS takes its traffic) only once its virtual services
        // and their destinations are all there, and unbound before they go: a change cut
        // short (a crash) never leaves a reachable Service in part.
        self.rebind(&changes.bind, &changes.unbind)?;
        for key in &changes.remove {
            self.kernel.ipvs.delete_service(key)?;
            self.draining.retain(|(k, _, _), _| k != key);
        }
        for (set, members) in &changes.delete_members {
            self.kernel.ipset.edit(Edit::Delete, &set.to_string(), members)?;
        }
        Ok(())
    }

    /// Takes the destinations of `key` from what was programmed (`had`, beside those
    /// draining) to `wanted`, without reading them first: a going TCP or SCTP destination
    /// is drained, since a change does not know whether it is idle.
    fn change_destinations(
        &mut self,
        key: &ServiceKey,
        had: &[Destination],
        wanted: &[Destination],
    ) -> Result<(), BackendError> {
        self.edit_destinations(key, had, Had::Programmed, wanted).map(drop)
    }

    /// Takes the destinations of `key` from what the kernel holds to `wanted`: going ones
    /// that are idle are deleted at once. Returns how many destinations it edited.
    fn sync_destinations(&mut self, key: &ServiceKey, wanted: &[Destination]) -> Result<usize, BackendError> {
        let current = self.kernel.ipvs.destinations(key)?;
        self.edit_destinations(key, &current, Had::Kernel, wanted)
    }

    /// The edits from `had` to `wanted`, in one send: new ones added, weights set, going
    /// UDP ones deleted (nothing to drain), going TCP and SCTP ones deleted when known idle
    /// and otherwise drained (weight 0; housekeeping deletes them once idle, or after the
    /// grace). Returns how many edits it sent (none when nothing differs).
    fn edit_destinations(
        &mut self,
        key: &ServiceKey,
        had: &[Destination],
        from: Had,
        wanted: &[Destination],
    ) -> Result<usize, BackendError> {
        let same = |a: &Destination, b: &Destination| (a.address, a.port) == (b.address, b.port);
        let mut edits = Vec::new();
        for d in wanted {
            match had.iter().find(|h| same(h, d)) {
                Some(h) if h.weight == d.weight => {}
                Some(_) => edits.push((DestinationEdit::Edit, d.clone())),
                // Still in the kernel at weight 0, though not among those programmed.
                None if from == Had::Programmed && self.draining.contains_key(&(*key, d.address, d.port)) => {
                    edits.push((DestinationEdit::Edit, d.clone()))
                }
                None => edits.push((DestinationEdit::Add, d.clone())),
            }
        }
        let mut started = Vec::new();
        for h in had.iter().filter(|h| !wanted.iter().any(|d| same(h, d))) {
            let idle = from == Had::Kernel && h.active + h.inactive == 0;
            if key.protocol == PROTO_UDP || idle {
                edits.push((DestinationEdit::Delete, h.clone()));
            } else {
                if h.weight != 0 {
                    edits.push((DestinationEdit::Edit, Destination { weight: 0, ..h.clone() }));
                }
                started.push((*key, h.address, h.port));
            }
        }
        if !edits.is_empty() {
            self.kernel.ipvs.edit_destinations(key, &edits)?;
        }
        self.draining
            .retain(|(k, a, p), _| k != key || !wanted.iter().any(|d| (d.address, d.port) == (*a, *p)));
        for d in started {
            self.draining.entry(d).or_insert_with(Instant::now);
        }
        Ok(edits.len())
    }

    fn full(&mut self, desired: &NodeState, context: &NodeContext) -> Result<(), BackendError> {
        let previous = self.programmed.take();
        self.context = Context::new(context, &self.options.scheduler);
        let mut table = Programmed::default();
        let mut delta = Delta::default();
        for (name, view) in desired.services.iter() {
            table.set(name, Some(piece(&view.value, &self.context)), &mut delta);
        }
        drop(delta);

        self.kernel.links.ensure_dummy(INTERFACE)?;
        let was_bound = self.kernel.links.addresses(INTERFACE)?;
        let wanted = table.addresses();
        let saved_sets = self.kernel.ipset.save()?;
        let in_sets = keys_in_sets(&saved_sets);
        let (swap, sets_swapped) = ipset::swap_script(&table.members(), &ipset::held_members(&saved_sets));
        drop(saved_sets);
        self.kernel.ipset.restore(&swap)?;
        self.chains.clear();
        let mut chains_written = Vec::new();
        for family in Family::ALL {
            let inputs = chain_inputs(context, family);
            let saved = self.kernel.iptables.save(family)?;
            let script = chains::script(family, &inputs, Some(&saved));
            if !xtables::already_held(&saved, &script) {
                self.kernel.iptables.restore(family, &script)?;
                chains_written.push(format!("ip{}", family.suffix()));
            }
            self.chains.insert(family, inputs);
        }
        self.kernel.ipvs.reset();
        let current = self.kernel.ipvs.services()?;
        let strict_arp: &[(&str, &str)] = if self.options.strict_arp { &STRICT_ARP } else { &[] };
        for (name, value) in SYSCTLS.iter().chain(strict_arp) {
            self.kernel.sysctl.set(name, value)?;
        }
        let services: Vec<(VirtualService, Vec<Destination>)> = table.services().cloned().collect();
        let (mut added, mut edited, mut destinations_edited) = (0, 0, 0);
        for (service, destinations) in &services {
            let ipvs = &mut self.kernel.ipvs;
            match current.iter().find(|s| s.key == service.key) {
                None => {
                    ipvs.add_service(service)?;
                    added += 1;
                }
                Some(existing) if existing != service => {
                    ipvs.edit_service(service)?;
                    edited += 1;
                }
                Some(_) => {}
            }
            destinations_edited += self.sync_destinations(&service.key, destinations)?;
        }
        // kpx's: what it programmed, what its sets name, and what sits on its interface.
        let ours = |key: &ServiceKey| {
            previous.as_ref().is_some_and(|t| t.owns(key))
                || in_sets.contains(key)
                || was_bound.contains(&key.address)
        };
        let stale: Vec<ServiceKey> =
            current.iter().filter(|s| !table.owns(&s.key) && ours(&s.key)).map(|s| s.key).collect();
        // As in a change: addresses bound once their services are whole, unbound first.
        self.rebind(
            &wanted.difference(&was_bound).copied().collect(),
            &was_bound.difference(&wanted).copied().collect(),
        )?;
        for key in &stale {
            self.kernel.ipvs.delete_service(key)?;
            self.draining.retain(|(k, _, _), _| k != key);
        }
        tracing::info!(
            virtual_services = services.len(),
            added,
            edited,
            removed = stale.len(),
            destinations_edited,
            sets_swapped,
            chains_written = chains_written.join(","),
            "full sync: the kernel's IPVS table, kpx's sets and chains made to match, only what differed written"
        );
        self.programmed = Some(table);
        Ok(())
    }
}

impl Incremental for IpvsBackend {
    type Plan = Changes;

    fn plan(&mut self, desired: &NodeState, context: &NodeContext, changes: &ChangeSet) -> Planned<Changes> {
        let chains_same =
            Family::ALL.into_iter().all(|f| self.chains.get(&f) == Some(&chain_inputs(context, f)));
        if Context::new(context, &self.options.scheduler) != self.context || !chains_same {
            return Planned::FullSync;
        }
        let pieces: Vec<(&String, Option<Piece>)> =
            changes.services.iter().map(|name| (name, self.piece(desired, name))).collect();
        // The table changes as it plans; a write that fails forgets it.
        let Some(table) = self.programmed.as_mut() else { return Planned::FullSync };
        let mut delta = Delta::default();
        for (name, piece) in pieces {
            table.set(name, piece, &mut delta);
        }
        let changes = table.resolve(delta);
        let empty = changes.is_empty();
        Planned::unless(changes, false, empty)
    }

    fn write(&mut self, changes: &mut Changes) -> Result<(), BackendError> {
        self.program(changes)
    }

    fn commit(&mut self, _: Changes) {}

    fn forget(&mut self) {
        self.programmed = None;
        self.kernel.ipvs.reset();
    }
}

impl Backend for IpvsBackend {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn apply(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
        changes: &ChangeSet,
    ) -> Result<(), BackendError> {
        incremental::apply(self, desired, context, changes)
    }

    fn full_sync(&mut self, desired: &NodeState, context: &NodeContext) -> Result<(), BackendError> {
        self.full(desired, context).inspect_err(|_| self.forget())
    }

    fn housekeeping(&mut self) -> Result<(), BackendError> {
        if self.draining.is_empty() {
            return Ok(());
        }
        let grace = self.options.drain_grace;
        let keys: BTreeSet<ServiceKey> = self.draining.keys().map(|(k, _, _)| *k).collect();
        for key in keys {
            let current = match self.kernel.ipvs.destinations(&key) {
                Ok(c) => c,
                Err(e) if e.errno().is_some() => Vec::new(), // the virtual service is gone
                Err(e) => return Err(e.into()),
            };
            let waiting: Vec<((ServiceKey, IpAddr, u16), Instant)> =
                self.draining.iter().filter(|((k, _, _), _)| *k == key).map(|(d, t)| (*d, *t)).collect();
            for (id @ (_, address, port), since) in waiting {
                match current.iter().find(|c| (c.address, c.port) == (address, port)) {
                    Some(c) if c.weight == 0 && (c.active + c.inactive == 0 || since.elapsed() >= grace) => {
                        self.kernel.ipvs.delete_destination(&key, c)?;
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
        let bound = self.kernel.links.addresses(INTERFACE)?;
        let in_sets = keys_in_sets(&self.kernel.ipset.save()?);
        let programmed = self.programmed.take();
        let owned = |key: &ServiceKey| {
            programmed.as_ref().is_some_and(|t| t.owns(key))
                || in_sets.contains(key)
                || bound.contains(&key.address)
        };
        match self.kernel.ipvs.services() {
            Ok(services) => {
                for s in services.iter().filter(|s| owned(&s.key)) {
                    self.kernel.ipvs.delete_service(&s.key)?;
                }
            }
            // A kernel without IPVS has no virtual services of kpx's to remove.
            Err(IpvsError::NoIpvs | IpvsError::Socket(_)) => {}
            Err(e) => return Err(e.into()),
        }
        for family in Family::ALL {
            let script = xtables::cleanup_script(&self.kernel.iptables.save(family)?, chains::PREFIX);
            if !script.is_empty() {
                self.kernel.iptables.restore(family, &script)?;
            }
        }
        let sets = self.kernel.ipset.names()?;
        self.kernel.ipset.restore(&ipset::destroy_script(&sets))?;
        self.kernel.links.remove(INTERFACE)?;
        self.forget();
        self.chains.clear();
        self.draining.clear();
        Ok(())
    }

    fn holds_rules(&mut self) -> Result<bool, BackendError> {
        Ok(!self.kernel.links.addresses(INTERFACE)?.is_empty()
            || !keys_in_sets(&self.kernel.ipset.save()?).is_empty())
    }

    /// The canaries of the iptables rules around IPVS (a flush of nat or filter).
    fn intact(&mut self) -> Result<bool, BackendError> {
        if self.programmed.is_none() {
            return Ok(true);
        }
        Ok(xtables::canaries_intact(self.kernel.iptables.as_mut(), chains::PREFIX)?)
    }

    /// The IPVS table like `ipvsadm -Ln`, then kpx's sets like `ipset save`, then its
    /// chains like `iptables-save`.
    fn dump(&mut self) -> Result<String, BackendError> {
        let mut out = String::new();
        for s in self.kernel.ipvs.services()? {
            let persistent = if s.flags != 0 { format!(" persistent {}", s.timeout) } else { String::new() };
            out.push_str(&format!("{} {}{persistent}\n", s.key, s.scheduler));
            for d in self.kernel.ipvs.destinations(&s.key)? {
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
        out.push_str(&ipset::owned_lines(&self.kernel.ipset.save()?));
        for family in Family::ALL {
            out.push_str(&xtables::owned_lines(&self.kernel.iptables.save(family)?, chains::PREFIX));
        }
        Ok(out)
    }
}
