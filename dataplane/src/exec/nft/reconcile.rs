//! A full sync over a table that already holds most of what it should (an agent
//! restarted, the periodic resync, a repair): the kernel's elements are read back and
//! only those that differ are written, in one transaction guarded by nf_tables'
//! generation.
//!
//! 1. The generation is read, then every element of the updatable sets and maps (a dump
//!    per set, read 64 KiB at a time); each is kept as one 64-bit hash of its set, key
//!    bytes and data bytes (SipHash, keyed anew for every reconcile), sorted: 8 bytes an
//!    element, 4 MB at the envelope's half-million.
//! 2. The full sync renders what is wanted; each element, encoded as it would be written,
//!    is looked up among them: found, it is marked kept; not found, it is added to the
//!    batch.
//! 3. The rules' script runs (one transaction: the generation moves by exactly one; any
//!    other move means someone else wrote since the read, and nothing more is written).
//! 4. The elements are read again and those not kept are deleted; deletions then additions
//!    go as one batch written against the generation of step 3: the kernel refuses it
//!    whole (`ERESTART`) if anything was committed since.
//!
//! A refused reconcile is [`Reconciled::Moved`]: the caller rewrites everything, as a
//! full sync over a table of unknown contents does.
//!
//! What it costs: the kernel answers a set's dump in pieces of at most 32 KiB (about 680
//! elements) and walks the set from its start for every piece, so reading a set of n
//! elements is O(n²): at 5,000 Services × 50 endpoints (515,009 elements) one read of
//! every set takes about 5 s, where writing them all takes about 1.3 s. Step 4 therefore
//! reads again only when some element is to be deleted.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use super::elements::{self as encoding, Data, Emptied, EncodeError, Layout, Refill, Values};
use super::netlink::{elements, msg, start_elements, write_encoded, HeldData, NftNetlink, FACILITY};
use super::{Reconciled, RefillWith};
use crate::exec::netlink::{Message, NLM_F_CREATE};
use crate::exec::ExecError;

/// One element's identity: its set (by position among those read), key and data.
fn identity(hasher: &RandomState, set: usize, key: &[u8], data: HeldData<'_>) -> u64 {
    hasher.hash_one((set, key, data))
}

impl NftNetlink {
    /// See the module's documentation; `sets` are the sets and maps whose elements the
    /// full sync writes, `run` runs the rules' script `fill` answers.
    pub fn reconcile(
        &mut self,
        sets: Vec<Emptied>,
        fill: &mut RefillWith<'_>,
        run: impl FnOnce(&str) -> Result<(), ExecError>,
    ) -> Result<Reconciled, ExecError> {
        let read_at = self.generation()?;
        let hasher = RandomState::new();
        let mut held = Vec::new();
        for (index, s) in sets.iter().enumerate() {
            self.each_element(&s.set, |key, data| held.push(identity(&hasher, index, key, data)))?;
        }
        held.sort_unstable();
        let mut diff = Difference {
            hasher: &hasher,
            held: &held,
            kept: vec![false; held.len()],
            read: &sets,
            sets: Vec::new(),
            adds: Vec::new(),
            added: 0,
        };
        let script = fill(&mut diff).map_err(|e| ExecError::refused(FACILITY, e.to_string()))?;
        let Some(script) = script else { return Ok(Reconciled::NotApart) };
        let (kept, mut adds, added) = diff.finish();
        run(&script)?;
        let written_at = self.generation()?;
        if written_at != read_at.wrapping_add(1) {
            return Ok(Reconciled::Moved);
        }
        let kept_count = kept.iter().filter(|k| **k).count();
        let mut messages = Vec::new();
        let mut deleted = 0;
        // Read again only when some of the kernel's elements are not wanted (a dump of a
        // large set costs more than writing it: see the module's documentation).
        let sets_to_read = if kept_count < held.len() { &sets[..] } else { &[][..] };
        for (index, s) in sets_to_read.iter().enumerate() {
            let mut open: Option<Message> = None;
            self.each_element(&s.set, |key, data| {
                let identity = identity(&hasher, index, key, data);
                if matches!(held.binary_search(&identity), Ok(i) if kept[i]) {
                    return;
                }
                let m = open.get_or_insert_with(|| start_elements(msg::DEL_SET_ELEM, &s.set));
                write_encoded(m, key, None);
                deleted += 1;
                if m.len() > elements::MESSAGE_BYTES {
                    if let Some(mut full) = open.take() {
                        full.end();
                        messages.push((full, 0));
                    }
                }
            })?;
            if let Some(mut m) = open {
                m.end();
                messages.push((m, 0));
            }
        }
        let kept = kept_count;
        messages.append(&mut adds);
        if !self.batch_at(written_at, messages)? {
            return Ok(Reconciled::Moved);
        }
        Ok(Reconciled::Written { kept, deleted, added })
    }
}

/// A full sync's elements compared, as they are written, with the kernel's: those it holds
/// are marked kept, the others written into messages that add them.
struct Difference<'h> {
    hasher: &'h RandomState,
    /// The identities of the kernel's elements, sorted.
    held: &'h [u64],
    /// Which of them the full sync wants.
    kept: Vec<bool>,
    /// The sets read, by position.
    read: &'h [Emptied],
    /// Per set written to: its name, layout, position among those read and open message.
    sets: Vec<(String, Layout, Option<usize>, Option<Message>)>,
    adds: Vec<(Message, u16)>,
    added: usize,
}

impl Refill for Difference<'_> {
    fn set(&mut self, set: String, layout: Layout) -> usize {
        let read = self.read.iter().position(|r| r.set == set);
        self.sets.push((set, layout, read, None));
        self.sets.len() - 1
    }

    fn add(&mut self, handle: usize, key: &Values, data: Option<&Data>) -> Result<(), EncodeError> {
        let Some((set, layout, read, open)) = self.sets.get_mut(handle) else {
            return Err(EncodeError::of(&format!("#{handle}"), key, data, "no such set".into()));
        };
        let refused = |reason| EncodeError::of(set, key, data, reason);
        let key_bytes = encoding::key(layout, key).map_err(refused)?;
        let encoded = encoding::data(layout, data).map_err(refused)?;
        if let Some(read) = *read {
            let identity = identity(self.hasher, read, key_bytes.as_bytes(), HeldData::of(encoded.as_ref()));
            if let Ok(i) = self.held.binary_search(&identity) {
                if let Some(kept) = self.kept.get_mut(i) {
                    *kept = true;
                    return Ok(());
                }
            }
        }
        let m = open.get_or_insert_with(|| start_elements(msg::NEW_SET_ELEM, set));
        write_encoded(m, key_bytes.as_bytes(), encoded.as_ref());
        self.added += 1;
        if m.len() > elements::MESSAGE_BYTES {
            if let Some(mut full) = open.take() {
                full.end();
                self.adds.push((full, NLM_F_CREATE));
            }
        }
        Ok(())
    }
}

impl Difference<'_> {
    /// Which of the kernel's elements are kept, the messages that add the others, how many.
    fn finish(mut self) -> (Vec<bool>, Vec<(Message, u16)>, usize) {
        for (_, _, _, open) in &mut self.sets {
            if let Some(mut m) = open.take() {
                m.end();
                self.adds.push((m, NLM_F_CREATE));
            }
        }
        (self.kept, self.adds, self.added)
    }
}
