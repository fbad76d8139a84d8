//! The nftables backend: kpx's own `inet kpx` table, where every lookup is a
//! map lookup (O(1) in the number of Services) and one endpoint change is a
//! handful of element updates.
//!
//! [`names`] names the table's sets and maps, [`skeleton`] writes its fixed
//! chains, [`service`] turns a Service into the elements it needs and
//! [`affinity`] into its session-affinity chains (all pure, tested as text);
//! [`programmed`] keeps what is programmed and diffs it into one transaction,
//! which [`crate::exec::nft`] runs; [`outline`] makes a full sync empty and refill the
//! table in place.

pub mod affinity;
pub mod names;
pub mod outline;
pub mod programmed;
pub mod service;
pub mod skeleton;
pub mod written;

use super::incremental::{self, Incremental, Planned};
use crate::backend::{Backend, BackendError, NodeContext};
use crate::exec::nft::elements::{Data, EncodeError, Layout, Refill, Values};
use crate::exec::nft::{Nft, Reconciled};
use crate::exec::ExecError;
use crate::state::{ChangeSet, NodeState};

use outline::Elements;
use programmed::{Plan, Programmed};
use written::Written;

pub struct NftablesBackend {
    nft: Box<dyn Nft>,
    /// What the kernel holds, as far as we know; `None` after a failure or before the first sync.
    programmed: Option<Programmed>,
    /// What identifies this binary in the table's fingerprint ([`written`]).
    binary: u64,
    /// The bookkeeping of a table found as kpx's last write left it, rebuilt on a thread
    /// of its own so that a restart does not wait for it; taken ([`Self::settle`]) before
    /// the table is read or changed again.
    rebuilding: Option<std::thread::JoinHandle<Result<Programmed, EncodeError>>>,
}

impl NftablesBackend {
    pub fn new(nft: Box<dyn Nft>) -> Self {
        NftablesBackend { nft, programmed: None, binary: written::binary_identity(), rebuilding: None }
    }

    /// Takes the bookkeeping being rebuilt, if any (waiting for it): what the table holds.
    fn settle(&mut self) {
        let Some(rebuilding) = self.rebuilding.take() else { return };
        self.programmed = match rebuilding.join() {
            Ok(Ok(programmed)) => Some(programmed),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "kpx's table could not be accounted for: the next change is a full sync");
                None
            }
            Err(_) => {
                tracing::warn!("accounting for kpx's table failed: the next change is a full sync");
                None
            }
        };
    }

    /// Records in the table what kpx's write just left (see [`written`]); when it cannot
    /// be certified (someone else wrote meanwhile), forgets what was recorded. Never fails
    /// a write: at worst the next start compares instead of trusting.
    fn certify(&mut self) {
        let Some(programmed) = &self.programmed else { return };
        let fingerprint = programmed.fingerprint(self.binary);
        let recorded = (|| -> Result<bool, ExecError> {
            let Some(now) = self.nft.generation()? else { return Ok(false) };
            let key = Written { generation: now.wrapping_add(1), fingerprint }.key();
            if self.nft.update_elements_at(now, &written::replace_with(&key))? {
                return Ok(true);
            }
            self.nft.update_elements(&written::forget())?;
            Ok(false)
        })();
        if let Err(e) = recorded {
            tracing::debug!(error = %e, "kpx's last write not recorded in its table");
        }
    }

    /// Whether the table holds exactly what a full sync of `desired` in `context` would
    /// write, as the element kpx's last write left proves: nf_tables' generation is still
    /// the one that write produced, and its fingerprint is that of `desired`. If so nothing
    /// is written, and the bookkeeping (every Service rendered) is rebuilt on a thread of
    /// its own, taken before the next change.
    fn unchanged_since_written(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
    ) -> Result<bool, BackendError> {
        let started = std::time::Instant::now();
        let Some(now) = self.nft.generation()? else { return Ok(false) };
        let keys = self.nft.set_keys(written::SET, &written::layout())?;
        let [key] = &keys[..] else { return Ok(false) };
        let Some(last) = Written::read(key) else { return Ok(false) };
        if last.generation != now {
            tracing::info!(
                recorded = last.generation,
                now,
                "full sync: nf_tables was written since kpx's last write (by another program, or kpx stopped between a write and its record): comparing"
            );
            return Ok(false);
        }
        if written::fingerprint_of(self.binary, context, desired) != last.fingerprint {
            tracing::info!("full sync: kpx's table holds another state, context or binary's rendering than the one to program: comparing");
            return Ok(false);
        }
        let (state, node) = (desired.clone(), context.clone());
        let rebuild = move || {
            let started = std::time::Instant::now();
            let rebuilt = Programmed::full_writing(&state, &node, None, &mut Uncounted);
            if let Ok((_, _, elements)) = &rebuilt {
                let elapsed_ms = started.elapsed().as_millis() as u64;
                tracing::info!(elements, elapsed_ms, "kpx's table accounted for: ready for changes");
            }
            rebuilt.map(|(programmed, _, _)| programmed)
        };
        match std::thread::Builder::new().name("nft-bookkeeping".into()).spawn(rebuild) {
            Ok(handle) => self.rebuilding = Some(handle),
            Err(_) => {
                let (programmed, _, _) = Programmed::full_writing(desired, context, None, &mut Uncounted)
                    .map_err(|e| ExecError::refused("nftables", e.to_string()))?;
                self.programmed = Some(programmed);
            }
        }
        tracing::info!(
            services = desired.services.len(),
            generation = now,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "full sync: kpx's table is as its last write left it, nothing written"
        );
        Ok(true)
    }
}

/// A refill that keeps nothing: the bookkeeping of a full sync that writes nothing.
struct Uncounted;

impl Refill for Uncounted {
    fn set(&mut self, _set: String, _layout: Layout) -> usize {
        0
    }

    fn add(&mut self, _handle: usize, _key: &Values, _data: Option<&Data>) -> Result<(), EncodeError> {
        Ok(())
    }
}

/// The most endpoints a full sync over kpx's own table compares with the kernel's
/// elements before writing; beyond, it rewrites them all. Reading a set back costs the
/// kernel O(n²) (it walks the set from its start for every 32 KiB of its dump): at 5,000
/// Services × 50 endpoints one read takes about 5 s where writing everything takes 1.9 s;
/// at 10,000 × 10 (~110k elements) reading costs about what writing does.
pub const COMPARED_UP_TO: usize = 100_000;

/// How many endpoints `desired` holds, over all its Services' ports: about as many
/// elements as the largest sets hold.
fn endpoint_count(desired: &NodeState) -> usize {
    desired.services.values().flat_map(|s| &s.value.ports).map(|p| p.endpoints.len()).sum()
}

/// How a full sync treats a table of this layout that is already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Its elements are read and only those that differ written ([`Nft::reconcile`]).
    Compared,
    /// Its sets are emptied and every element written again ([`Nft::refill`]).
    Rewritten,
}

impl NftablesBackend {
    /// A full sync: the rules' script, then the elements (see [`outline`]); what was done
    /// with the elements ([`Reconciled::Moved`]: nothing, someone else wrote meanwhile).
    fn write_all(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
        over: Over,
    ) -> Result<Reconciled, BackendError> {
        self.programmed = None;
        let started = std::time::Instant::now();
        let existing = self.nft.outline()?;
        let current = existing.as_ref().filter(|e| e.is_current());
        // One pass over the Services makes the bookkeeping and the rules' script, and writes
        // (or compares) each element as it comes (over netlink: encoded into a batch, none
        // held as text). The script runs, then the elements, where that keeps every
        // packet's rules and sets consistent (see `outline::Elements::Apart`); else all
        // goes as one script.
        let (mut planned, mut rendered, mut elements) = (None, std::time::Duration::ZERO, 0);
        let mut fill = |refill: &mut dyn Refill| {
            let (programmed, contents, written) =
                Programmed::full_writing(desired, context, current, refill)?;
            let apart = match (&existing, current) {
                (None, _) => Some(outline::create_script(&contents, Elements::Apart)),
                (Some(_), Some(current)) => outline::refill_script_apart(current, &contents),
                (Some(_), None) => None,
            };
            (rendered, elements) = (started.elapsed(), written);
            planned = Some((programmed, contents));
            Ok(apart)
        };
        let done = match (current, over) {
            (Some(_), Over::Compared) => self.nft.reconcile(names::refill_flush(), &mut fill)?,
            _ => match self.nft.refill(names::refill_flush(), &mut fill)? {
                true => Reconciled::Refilled,
                false => Reconciled::NotApart,
            },
        };
        if done == Reconciled::Moved {
            return Ok(done);
        }
        let Some((programmed, mut contents)) = planned else {
            return Err(
                ExecError::refused("nftables", "the full sync's elements were never asked for").into()
            );
        };
        let mut written = elements;
        if done == Reconciled::NotApart {
            contents.elements = programmed.updatable_elements();
            (elements, written) = (contents.elements.len(), contents.elements.len());
            let script = match (&existing, current) {
                (Some(_), Some(current)) => outline::refill_script(current, &contents),
                (Some(other), _) => {
                    tracing::warn!(
                        comment = other.comment.as_deref().unwrap_or(""),
                        "kpx's table is of another layout (an older kpx made it): replacing it whole"
                    );
                    outline::replace_script(&contents)
                }
                (None, _) => outline::create_script(&contents, Elements::InScript),
            };
            self.nft.run(&script)?;
        }
        let (kept, deleted) = match done {
            Reconciled::Written { kept, deleted, added } => {
                written = added + deleted;
                (kept, deleted)
            }
            _ => (0, 0),
        };
        tracing::info!(
            elements,
            elements_written = written,
            elements_kept = kept,
            elements_deleted = deleted,
            elements_apart = done != Reconciled::NotApart,
            compared = matches!(done, Reconciled::Written { .. }),
            render_ms = rendered.as_millis() as u64,
            write_ms = (started.elapsed() - rendered).as_millis() as u64,
            "full sync written"
        );
        self.programmed = Some(programmed);
        Ok(done)
    }
}

impl Incremental for NftablesBackend {
    type Plan = Plan;

    fn plan(&mut self, desired: &NodeState, context: &NodeContext, changes: &ChangeSet) -> Planned<Plan> {
        self.settle();
        let Some(programmed) = self.programmed.as_ref() else { return Planned::FullSync };
        let plan = programmed.plan(desired, context, changes);
        let (needs_full_sync, empty) = (plan.needs_full_sync, plan.is_empty());
        Planned::unless(plan, needs_full_sync, empty)
    }

    fn write(&mut self, plan: &mut Plan) -> Result<(), BackendError> {
        match plan.element_update() {
            Some(update) => self.nft.update_elements(&update),
            None => self.nft.run(&plan.script()),
        }
        .map_err(Into::into)
    }

    fn commit(&mut self, plan: Plan) {
        if let Some(programmed) = self.programmed.as_mut() {
            programmed.commit(plan);
        }
        self.certify();
    }

    fn forget(&mut self) {
        self.programmed = None;
    }
}

impl Backend for NftablesBackend {
    fn name(&self) -> &'static str {
        "nftables"
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
        self.settle();
        self.programmed = None;
        if self.unchanged_since_written(desired, context)? {
            return Ok(());
        }
        let over = if endpoint_count(desired) <= COMPARED_UP_TO { Over::Compared } else { Over::Rewritten };
        if self.write_all(desired, context, over)? == Reconciled::Moved {
            tracing::warn!(
                "nf_tables changed while kpx compared its table with what it wants: writing every element again"
            );
            self.write_all(desired, context, Over::Rewritten)?;
        }
        self.certify();
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.settle();
        self.programmed = None;
        Ok(self.nft.run(&names::cleanup_script())?)
    }

    fn dump(&mut self) -> Result<String, BackendError> {
        Ok(self.nft.list_table()?)
    }

    fn holds_rules(&mut self) -> Result<bool, BackendError> {
        Ok(!self.nft.list_table()?.trim().is_empty())
    }

    fn intact(&mut self) -> Result<bool, BackendError> {
        self.settle();
        if self.programmed.is_none() {
            return Ok(true);
        }
        Ok(self.nft.rules_in_chain(skeleton::CANARY)? > 0)
    }
}

#[cfg(test)]
mod tests;
