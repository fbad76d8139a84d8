//! What kpx believes its table holds, and the transaction that takes it to a
//! new desired state. A plan touches only the Services that changed; another node
//! context (node addresses, pod CIDRs, `masqueradeAll`) or more endpoints than the pick
//! chains cover is a full sync.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use kpx_proto::types::ServiceView;

use super::affinity::{self, NftObject, ObjectCommands};
use super::names::{self, Collection, Element, Shared};
use super::outline::{Contents, Outline};
use super::service::{self, ServiceRules};
use super::skeleton::{self, PickChains};
use super::written;
use crate::backend::owners::{EntryKey, Owners};
use crate::backend::NodeContext;
use crate::exec::nft::elements::{ElementUpdate, EncodeError, Refill};
use crate::state::{ChangeSet, NodeState};

#[derive(Debug, Default)]
pub struct Programmed {
    /// What is programmed for each Service.
    services: HashMap<Arc<str>, ProgrammedService>,
    /// Which Service owns each entry.
    owners: Owners,
    /// How many Services use each shared element.
    shared: SharedCounts,
    /// Pick chains exist for 1..=this many endpoints.
    pick_chains: usize,
    /// The node context everything was rendered in.
    context: NodeContext,
    /// The XOR of every Service's part of the fingerprint ([`written::service_part`]).
    contents: u64,
}

/// How many Services use each shared element, kept compact (at 250k endpoints there are
/// as many hairpin pairs): per kind and family, the address as an integer.
#[derive(Debug, Default)]
struct SharedCounts {
    v4: [HashMap<u32, u32>; 2],
    v6: [HashMap<u128, u32>; 2],
}

impl SharedCounts {
    fn slot(shared: Shared) -> (usize, IpAddr) {
        match shared {
            Shared::Hairpin(a) => (0, a),
            Shared::ClusterIp(a) => (1, a),
        }
    }

    fn get(&self, shared: Shared) -> u32 {
        let (kind, address) = Self::slot(shared);
        let count = match address {
            IpAddr::V4(a) => self.v4[kind].get(&u32::from(a)),
            IpAddr::V6(a) => self.v6[kind].get(&u128::from(a)),
        };
        count.copied().unwrap_or(0)
    }

    /// The element of `kind` (a slot of [`Self::slot`]) for `address`.
    fn unslot(kind: usize, address: IpAddr) -> Shared {
        if kind == 0 {
            Shared::Hairpin(address)
        } else {
            Shared::ClusterIp(address)
        }
    }

    /// Every element at least one Service uses.
    fn iter(&self) -> impl Iterator<Item = Shared> + '_ {
        let v4 = self.v4.iter().enumerate().flat_map(|(kind, counts)| {
            counts.keys().map(move |a| Self::unslot(kind, std::net::Ipv4Addr::from(*a).into()))
        });
        let v6 = self.v6.iter().enumerate().flat_map(|(kind, counts)| {
            counts.keys().map(move |a| Self::unslot(kind, std::net::Ipv6Addr::from(*a).into()))
        });
        v4.chain(v6)
    }

    /// Records `count` users (none: forgotten).
    fn set(&mut self, shared: Shared, count: u32) {
        let (kind, address) = Self::slot(shared);
        match (address, count) {
            (IpAddr::V4(a), 0) => drop(self.v4[kind].remove(&u32::from(a))),
            (IpAddr::V4(a), n) => drop(self.v4[kind].insert(u32::from(a), n)),
            (IpAddr::V6(a), 0) => drop(self.v6[kind].remove(&u128::from(a))),
            (IpAddr::V6(a), n) => drop(self.v6[kind].insert(u128::from(a), n)),
        }
    }
}

/// What is programmed for one Service: the view it was rendered from (shared with the
/// node's state) and the entries it holds (those it lost to another Service left out).
/// Its elements are rendered again when a plan needs them, never kept: at 250k endpoints
/// the rendered text would be most of the agent's memory.
#[derive(Debug)]
struct ProgrammedService {
    view: Arc<ServiceView>,
    entries: Vec<EntryKey>,
    /// Its part of the table's fingerprint.
    content: u64,
}

impl ProgrammedService {
    /// Its rules as programmed in `context` (the context everything was programmed in).
    fn rules(&self, context: &NodeContext) -> ServiceRules {
        held(service::service_rules(&self.view, context), self.entries.clone())
    }
}

/// `rules` with only the elements of the entries `held` (the others belong to another Service).
fn held(mut rules: ServiceRules, held: Vec<EntryKey>) -> ServiceRules {
    rules.elements.retain(|(entry, _)| held.contains(entry));
    rules.entries = held;
    rules
}

/// What a plan does with the elements of updatable collections it adds.
enum Updatable<'w, 'r> {
    /// Keeps them in the plan (a change).
    Keep,
    /// Leaves them out (the tests' full sync, whose script is all they read).
    #[cfg(test)]
    Drop,
    /// Writes each into a refill (a full sync's one pass).
    Write(&'w mut ElementWriter<'r>),
}

impl<'r> Updatable<'_, 'r> {
    /// The same, for one more plan.
    fn reborrow(&mut self) -> Updatable<'_, 'r> {
        match self {
            Updatable::Keep => Updatable::Keep,
            #[cfg(test)]
            Updatable::Drop => Updatable::Drop,
            Updatable::Write(writer) => Updatable::Write(writer),
        }
    }
}

/// How many Services a full sync plans at a time.
const FULL_SYNC_PART: usize = 512;

/// Writes elements into a refill, each set named once; the first error stops it.
struct ElementWriter<'r> {
    refill: &'r mut dyn Refill,
    handles: HashMap<Collection, usize>,
    written: usize,
    failed: Option<EncodeError>,
}

impl ElementWriter<'_> {
    fn write(&mut self, e: &Element) {
        if self.failed.is_some() {
            return;
        }
        let handle = match self.handles.get(&e.collection) {
            Some(handle) => *handle,
            None => {
                let Some(layout) = e.collection.layout() else {
                    self.failed = Some(EncodeError::of(
                        &e.collection.name(),
                        &e.key,
                        e.value.as_ref(),
                        "an interval set's elements are written as text".into(),
                    ));
                    return;
                };
                let handle = self.refill.set(e.collection.name(), layout);
                self.handles.insert(e.collection, handle);
                handle
            }
        };
        match self.refill.add(handle, &e.key, e.value.as_ref()) {
            Ok(()) => self.written += 1,
            Err(error) => self.failed = Some(error),
        }
    }
}

/// A transaction and the bookkeeping to record once the kernel accepted it.
#[derive(Debug, Default)]
pub struct Plan {
    deletes: BTreeSet<Element>,
    objects: ObjectCommands,
    adds: BTreeSet<Element>,
    services: Vec<(String, Option<ProgrammedService>)>,
    shared: Vec<(Shared, u32)>,
    /// The most endpoints a Service's entry of the plan picks from.
    max_endpoints: usize,
    /// The fixed part must change (more pick chains, another node context): only a full
    /// sync can do that.
    pub needs_full_sync: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.adds.is_empty() && self.objects.is_empty() && !self.needs_full_sync
    }

    /// The transaction as nft text. Elements that point at chains go before the chains;
    /// new chains exist before elements point at them. A key both deleted and added is a
    /// value change.
    pub fn script(&self) -> String {
        let mut script = String::new();
        names::element_commands(&mut script, "delete", &self.deletes);
        script.push_str(&self.objects.remove);
        script.push_str(&self.objects.create);
        names::element_commands(&mut script, "add", &self.adds);
        script
    }

    /// The transaction as an element update, when it changes elements only: no chain or
    /// set of a Service's own (session affinity), no element of an interval set.
    pub fn element_update(&self) -> Option<ElementUpdate<'_>> {
        if !self.objects.is_empty() {
            return None;
        }
        names::element_update(&self.deletes, &self.adds)
    }
}

impl Programmed {
    /// The fingerprint of what it says the table holds, as rendered by the binary `binary`
    /// (see [`written`]).
    pub fn fingerprint(&self, binary: u64) -> u64 {
        written::fingerprint(binary, &self.context, self.contents)
    }

    /// [`Self::full_writing`] without writing the elements of updatable collections (for
    /// the tests: the script and the bookkeeping).
    #[cfg(test)]
    pub fn full(
        desired: &NodeState,
        context: &NodeContext,
        existing: Option<&Outline>,
    ) -> (Programmed, Contents) {
        Self::full_with(desired, context, existing, Updatable::Drop)
    }

    /// Everything kpx's table holds for `desired`, as `add` commands into an empty table
    /// (what goes before them: [`super::outline`]), but for the elements of updatable
    /// collections: those are written into `refill` as each Service is rendered (one pass:
    /// nothing rendered twice, none held as text; [`Self::updatable_elements`] renders
    /// them again for a script); how many. `existing`, a table of the current layout in
    /// the kernel: when it has every pick chain wanted, each with its rules (`nft flush
    /// table` leaves them empty), they are kept as they are.
    pub fn full_writing(
        desired: &NodeState,
        context: &NodeContext,
        existing: Option<&Outline>,
        refill: &mut dyn Refill,
    ) -> Result<(Programmed, Contents, usize), EncodeError> {
        let mut writer = ElementWriter { refill, handles: HashMap::new(), written: 0, failed: None };
        let (programmed, contents) =
            Self::full_with(desired, context, existing, Updatable::Write(&mut writer));
        match writer.failed {
            Some(e) => Err(e),
            None => Ok((programmed, contents, writer.written)),
        }
    }

    fn full_with(
        desired: &NodeState,
        context: &NodeContext,
        existing: Option<&Outline>,
        mut updatable: Updatable<'_, '_>,
    ) -> (Programmed, Contents) {
        // Planned with pick chains enough for any Service, then made as many as needed; in
        // parts of FULL_SYNC_PART Services, each committed before the next, so that what a
        // plan holds beyond the bookkeeping (its shared elements' counts, its Services'
        // entries) is one part's: at 50,000 Services one plan of all was tens of MB more at
        // the peak. The elements of updatable collections are not collected either: a
        // quarter-million of them as text would be most of the agent's memory.
        let mut programmed =
            Programmed { pick_chains: usize::MAX, context: context.clone(), ..Default::default() };
        let (mut max_endpoints, mut objects, mut in_script) = (0, String::new(), BTreeSet::new());
        let names: Vec<&String> = desired.services.keys().collect();
        for part in names.chunks(FULL_SYNC_PART) {
            let changes = ChangeSet { services: part.iter().map(|n| (*n).clone()).collect(), node: false };
            let mut plan = programmed.plan_with(desired, context, &changes, updatable.reborrow());
            max_endpoints = max_endpoints.max(plan.max_endpoints);
            // The few interval-set elements go in the script, after the objects.
            in_script.append(&mut plan.adds);
            objects.push_str(&plan.script());
            programmed.commit(plan);
        }
        let pick_chains = skeleton::pick_chains_for(max_endpoints);
        let wanted = skeleton::pick_chain_names(pick_chains);
        let kept = match existing {
            Some(existing)
                if wanted.is_subset(&existing.chains) && wanted.is_disjoint(&existing.empty_chains) =>
            {
                wanted
            }
            _ => BTreeSet::new(),
        };
        let picks = if kept.is_empty() { PickChains::Write } else { PickChains::Kept };
        let mut script = skeleton::skeleton(context, pick_chains, picks);
        script.push_str(&objects);
        names::element_commands(&mut script, "add", &in_script);
        programmed.pick_chains = pick_chains;
        (programmed, Contents { script, elements: BTreeSet::new(), kept_pick_chains: kept })
    }

    /// Every element of an updatable collection the table holds, for a script.
    pub fn updatable_elements(&self) -> BTreeSet<Element> {
        let mut out = BTreeSet::new();
        // Collecting fails on nothing: the result is always Ok.
        let _ = self.each_updatable_element(|e| {
            out.insert(e);
            Ok(())
        });
        out
    }

    /// Calls `f` with each element of an updatable collection: each Service's own, then
    /// the shared ones.
    fn each_updatable_element(
        &self,
        mut f: impl FnMut(Element) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        for programmed in self.services.values() {
            for (_, e) in programmed.rules(&self.context).elements {
                if e.collection.updatable() {
                    f(e)?;
                }
            }
        }
        for shared in self.shared.iter() {
            let e = shared.element();
            if e.collection.updatable() {
                f(e)?;
            }
        }
        Ok(())
    }

    /// The transaction for the Services in `changes`, from what is programmed now.
    pub fn plan(&self, desired: &NodeState, context: &NodeContext, changes: &ChangeSet) -> Plan {
        self.plan_with(desired, context, changes, Updatable::Keep)
    }

    /// [`Self::plan`], the elements of updatable collections it adds kept in the plan or
    /// not, as `updatable` says (a full sync writes those apart).
    fn plan_with(
        &self,
        desired: &NodeState,
        context: &NodeContext,
        changes: &ChangeSet,
        mut updatable: Updatable<'_, '_>,
    ) -> Plan {
        let mut keep = |e: &Element| match &mut updatable {
            _ if !e.collection.updatable() => true,
            Updatable::Keep => true,
            #[cfg(test)]
            Updatable::Drop => false,
            Updatable::Write(writer) => {
                writer.write(e);
                false
            }
        };
        let mut plan = Plan::default();
        if *context != self.context {
            plan.needs_full_sync = true;
            return plan;
        }
        let (mut deletes, mut adds) = (BTreeSet::new(), BTreeSet::new());
        let mut old_objects: Vec<NftObject> = Vec::new();
        let mut new_objects: Vec<NftObject> = Vec::new();
        let mut shared_delta: HashMap<Shared, i32> = HashMap::new();
        let mut claims = self.owners.begin(
            changes
                .services
                .iter()
                .filter_map(|n| self.services.get(n.as_str()).map(|r| (n.as_str(), &r.entries[..]))),
        );
        for name in &changes.services {
            let view = desired.services.get(name).map(|s| &s.value);
            let old = self.services.get(name.as_str()).map(|p| p.rules(&self.context)).unwrap_or_default();
            let new = view
                .map(|view| {
                    let rules = service::service_rules(view, &self.context);
                    let taken = claims.claim(name, &rules.entries);
                    held(rules, taken)
                })
                .unwrap_or_default();
            for e in &old.shared {
                *shared_delta.entry(*e).or_default() -= 1;
            }
            for e in &new.shared {
                *shared_delta.entry(*e).or_default() += 1;
            }
            plan.needs_full_sync |= new.max_endpoints > self.pick_chains;
            plan.max_endpoints = plan.max_endpoints.max(new.max_endpoints);
            // Both are this plan's own: their elements move, none is copied.
            let mut old_elements: BTreeSet<Element> = old.elements.into_iter().map(|(_, e)| e).collect();
            let new_elements: BTreeSet<Element> = new.elements.into_iter().map(|(_, e)| e).collect();
            for e in new_elements {
                if !old_elements.remove(&e) && keep(&e) {
                    adds.insert(e);
                }
            }
            deletes.extend(old_elements);
            old_objects.extend(old.objects);
            new_objects.extend(new.objects);
            let programmed = desired.services.get(name).map(|s| ProgrammedService {
                view: Arc::clone(&s.value),
                entries: new.entries,
                content: written::service_part(name, &s.version),
            });
            plan.services.push((name.clone(), programmed));
        }
        for (shared, delta) in shared_delta {
            let before = self.shared.get(shared);
            let after = before.saturating_add_signed(delta);
            if before == 0 && after > 0 {
                let element = shared.element();
                if keep(&element) {
                    adds.insert(element);
                }
            } else if before > 0 && after == 0 {
                deletes.insert(shared.element());
            }
            if before != after {
                plan.shared.push((shared, after));
            }
        }
        plan.objects = affinity::object_commands(&old_objects, &new_objects);
        plan.deletes = deletes;
        plan.adds = adds;
        plan
    }

    /// Records a plan the kernel accepted.
    pub fn commit(&mut self, plan: Plan) {
        for (name, rules) in plan.services {
            let (name, old) = crate::backend::owners::take_named(&mut self.services, name);
            self.contents ^= old.as_ref().map_or(0, |s| s.content) ^ rules.as_ref().map_or(0, |s| s.content);
            self.owners.commit(
                &name,
                old.as_ref().map(|r| &r.entries[..]),
                rules.as_ref().map(|r| &r.entries[..]),
            );
            if let Some(rules) = rules {
                self.services.insert(name, rules);
            }
        }
        for (element, count) in plan.shared {
            self.shared.set(element, count);
        }
    }
}

#[cfg(test)]
mod tests;
