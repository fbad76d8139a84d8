//! nftables: scripts in `nft -f` syntax, each run as one netlink transaction (it applies
//! whole or not at all), through libnftables in-process when it can be opened, else the
//! `nft` process; element updates and the cheap listings written over netlink directly
//! ([`super::nft_netlink`]).

use std::collections::BTreeSet;

use super::libnftables::NftLibrary;
pub use super::libnftables::OpenError;
use super::nft_elements::{ElementUpdate, Emptied, EncodeError, HeldRefill, Layout, Refill};
use super::nft_netlink::NftNetlink;
use super::{process, ExecError};

/// kpx's table: family and name.
pub const FAMILY: &str = "inet";
pub const TABLE: &str = "kpx";

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
        let Some(script) = fill(&mut held).map_err(|e| ExecError::refused(TOOL, e.to_string()))? else {
            return Ok(false);
        };
        self.run(&script)?;
        self.update_elements(&held.update(flush))?;
        Ok(true)
    }
    /// [`Self::refill`] over a table of this layout that may already hold most of the
    /// elements (an agent restarted over its table, a periodic resync): the kernel's
    /// elements of `sets` are read first and only those that differ are written, as one
    /// transaction guarded by nf_tables' generation (see `nft_reconcile`). This default
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

/// libnftables in-process when it can be opened, else the `nft` process.
pub fn system() -> Box<dyn Nft> {
    match library() {
        Ok(library) => {
            tracing::info!("nftables through libnftables, in-process");
            library
        }
        Err(e) => {
            tracing::warn!(reason = %e, "libnftables unavailable: running the nft command per transaction");
            Box::new(NftProcess::new())
        }
    }
}

/// libnftables in-process, if it can be opened (for benchmarks that compare the two).
pub fn library() -> Result<Box<dyn Nft>, OpenError> {
    NftLibrary::open()
        .map(|library| Box::new(NftInProcess { library, netlink: NftNetlink::new() }) as Box<dyn Nft>)
}

/// Runs the `nft` command, one process per transaction (netlink for the rest).
#[derive(Default)]
pub struct NftProcess {
    netlink: NftNetlink,
}

impl NftProcess {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Scripts through libnftables, in-process (netlink for the rest).
struct NftInProcess {
    library: NftLibrary,
    netlink: NftNetlink,
}

const TOOL: &str = "nft";

impl Nft for NftProcess {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        run_process(script)
    }

    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        list_with(&["list"], what)
    }

    fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError> {
        self.netlink.update_elements(update)
    }

    fn refill(&mut self, flush: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<bool, ExecError> {
        self.netlink.refill(flush, fill, run_process)
    }

    fn reconcile(&mut self, sets: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<Reconciled, ExecError> {
        self.netlink.reconcile(sets, fill, run_process)
    }

    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        self.netlink.generation().map(Some)
    }

    fn update_elements_at(&mut self, generation: u32, update: &ElementUpdate) -> Result<bool, ExecError> {
        self.netlink.update_elements_at(generation, update)
    }

    fn set_keys(&mut self, set: &str, _layout: &Layout) -> Result<Vec<Vec<u8>>, ExecError> {
        self.netlink.set_keys(set)
    }

    fn rules_in_chain(&mut self, chain: &str) -> Result<usize, ExecError> {
        self.netlink.rules_in_chain(chain)
    }

    fn outline(&mut self) -> Result<Option<Outline>, ExecError> {
        self.netlink.outline()
    }
}

/// Runs `script` with the `nft` process.
fn run_process(script: &str) -> Result<(), ExecError> {
    process::run(TOOL, TOOL, &["-f", "-"], Some(script)).map(drop)
}

/// `nft ARGS… WHAT…` ("" when what it lists does not exist).
fn list_with(args: &[&str], what: &str) -> Result<String, ExecError> {
    let mut args = args.to_vec();
    args.extend(what.split_whitespace());
    let out = process::output(TOOL, TOOL, &args, None)?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let message = String::from_utf8_lossy(&out.stderr);
    if message.contains("No such file or directory") {
        return Ok(String::new());
    }
    Err(ExecError::refused(TOOL, message.trim()))
}

const LIBRARY: &str = "libnftables";

/// Runs `script` through libnftables.
fn run_library(library: &mut NftLibrary, script: &str) -> Result<(), ExecError> {
    let (ok, _, error) = library.command(script)?;
    if ok {
        return Ok(());
    }
    Err(ExecError::refused(LIBRARY, error.trim()))
}

impl Nft for NftInProcess {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        run_library(&mut self.library, script)
    }

    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        let (ok, output, error) = self.library.command(&format!("list {what}"))?;
        if ok {
            return Ok(output);
        }
        if error.contains("No such file or directory") {
            return Ok(String::new());
        }
        Err(ExecError::refused(LIBRARY, error.trim()))
    }

    fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError> {
        self.netlink.update_elements(update)
    }

    fn refill(&mut self, flush: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<bool, ExecError> {
        let library = &mut self.library;
        self.netlink.refill(flush, fill, |script| run_library(library, script))
    }

    fn reconcile(&mut self, sets: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<Reconciled, ExecError> {
        let library = &mut self.library;
        self.netlink.reconcile(sets, fill, |script| run_library(library, script))
    }

    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        self.netlink.generation().map(Some)
    }

    fn update_elements_at(&mut self, generation: u32, update: &ElementUpdate) -> Result<bool, ExecError> {
        self.netlink.update_elements_at(generation, update)
    }

    fn set_keys(&mut self, set: &str, _layout: &Layout) -> Result<Vec<Vec<u8>>, ExecError> {
        self.netlink.set_keys(set)
    }

    fn rules_in_chain(&mut self, chain: &str) -> Result<usize, ExecError> {
        self.netlink.rules_in_chain(chain)
    }

    fn outline(&mut self) -> Result<Option<Outline>, ExecError> {
        self.netlink.outline()
    }
}
