//! nftables: what kpx asks of it ([`Nft`]) — scripts in `nft -f` syntax, each run as one
//! netlink transaction (it applies whole or not at all), element updates and the cheap
//! listings — and its vocabulary. [`elements`]: typed set and map elements and their
//! encoding; [`netlink`]: element updates and listings over nf_tables netlink;
//! `reconcile`: a full sync that writes only what differs; [`open`]: the implementations
//! (libnftables in-process, `library`, else the `nft` process, netlink for the rest).

use std::collections::BTreeSet;

pub mod elements;
mod library;
pub mod netlink;
pub mod open;
mod reconcile;
mod table;

use super::ExecError;
use elements::{ElementUpdate, Emptied, EncodeError, HeldRefill, Layout, Refill};
pub use table::{FAMILY, TABLE};

/// What kpx asks of nftables.
pub trait Nft: Send {
    /// Runs a script of nft commands as one transaction.
    fn run(&mut self, script: &str) -> Result<(), ExecError>;
    /// Deletes, then adds, set and map elements as one transaction (netlink: no text, no
    /// cache of the ruleset).
    fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError>;
    /// A full sync's rules, then its elements: `fill` writes the elements (over netlink
    /// each is encoded into a batch as it comes, so that no list of them all is held: a
    /// full sync's quarter-million) and answers the script of the rules, which runs
    /// first, as one transaction; then one more empties the sets and maps of `flush` and
    /// adds the elements. `fill` answering `None`: nothing is written (the caller writes
    /// everything as one script instead). Whether it was written. This default collects
    /// the elements and writes them as one [`ElementUpdate`].
    fn refill(&mut self, flush: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<bool, ExecError> {
        let mut held = HeldRefill::default();
        let Some(script) = fill(&mut held).map_err(|e| ExecError::refused("nft", e.to_string()))? else {
            return Ok(false);
        };
        self.run(&script)?;
        self.update_elements(&held.update(flush))?;
        Ok(true)
    }
    /// [`Self::refill`] over a table of this layout that may already hold most of the
    /// elements (an agent restarted over its table, a periodic resync): the kernel's
    /// elements of `sets` are read first and only those that differ are written, as one
    /// transaction guarded by nf_tables' generation (see `reconcile`). This default
    /// cannot read elements: it refills.
    fn reconcile(&mut self, sets: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<Reconciled, ExecError> {
        Ok(match self.refill(sets, fill)? {
            true => Reconciled::Refilled,
            false => Reconciled::NotApart,
        })
    }
    /// nf_tables' generation: every committed transaction moves it on by one. `None`:
    /// this implementation cannot read it (nothing is then certified by it).
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        Ok(None)
    }
    /// [`Self::update_elements`] written against `generation`: `Ok(false)`, nothing
    /// applied, when nf_tables has moved past it (or this implementation cannot tell).
    fn update_elements_at(&mut self, generation: u32, update: &ElementUpdate) -> Result<bool, ExecError> {
        let _ = (generation, update);
        Ok(false)
    }
    /// The keys of the elements of set `set` of kpx's table (declared with `layout`), as
    /// the kernel holds them; none when the set does not exist.
    fn set_keys(&mut self, set: &str, layout: &Layout) -> Result<Vec<Vec<u8>>, ExecError> {
        let _ = (set, layout);
        Ok(Vec::new())
    }
    /// `nft list table inet kpx` ("" when it does not exist).
    fn list_table(&mut self) -> Result<String, ExecError> {
        self.list(&format!("table {FAMILY} {TABLE}"))
    }
    /// How many rules chain `chain` of kpx's table holds (0 when it or the table does not
    /// exist): cheap at any number of elements (netlink, not `nft list chain`, which
    /// fetches every element of the table first).
    fn rules_in_chain(&mut self, chain: &str) -> Result<usize, ExecError>;
    /// `nft list WHAT` ("" when it does not exist).
    fn list(&mut self, what: &str) -> Result<String, ExecError>;
    /// The names of kpx's table's chains, sets and maps, and its comment (`None` when it
    /// does not exist); cheap at any number of elements (netlink again).
    fn outline(&mut self) -> Result<Option<Outline>, ExecError>;
}

/// What writes a refill's elements: called once, with the refill to write them to; answers
/// the script to run before them (`None`: write nothing).
pub type RefillWith<'a> = dyn FnMut(&mut dyn Refill) -> Result<Option<String>, EncodeError> + 'a;

/// What a [`Nft::reconcile`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The rules' script ran, then only the elements that differed were written: of the
    /// kernel's, how many were kept and how many deleted; how many were added.
    Written { kept: usize, deleted: usize, added: usize },
    /// The rules' script ran, then every element was written again (sets emptied first).
    Refilled,
    /// The fill answered no script: nothing was written.
    NotApart,
    /// Someone else wrote to nf_tables between the read and the write: no element was
    /// written (the rules' script may have run); what the sets hold is unknown.
    Moved,
}

/// What kpx's table holds, by name, without what is inside.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outline {
    pub comment: Option<String>,
    pub chains: BTreeSet<String>,
    /// The chains among `chains` that hold no rule (`nft flush table` leaves them so).
    pub empty_chains: BTreeSet<String>,
    pub sets: BTreeSet<String>,
    pub maps: BTreeSet<String>,
}
