//! The implementations of [`Nft`]: libnftables in-process when it can be opened, else the
//! `nft` process, one per transaction; element updates and listings over netlink either way.

use super::elements::{ElementUpdate, Emptied, Layout};
use super::library::NftLibrary;
pub use super::library::OpenError;
use super::netlink::NftNetlink;
use super::{Nft, Outline, Reconciled, RefillWith};
use crate::exec::{process, ExecError};

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
    NftLibrary::open().map(|library| Box::new(Netlinked::over(library)) as Box<dyn Nft>)
}

/// Where nft scripts run and tables are listed as text: the `nft` process or libnftables.
/// Everything else goes over netlink ([`Netlinked`]).
pub trait Scripts: Send {
    /// Runs `script` as one transaction.
    fn run(&mut self, script: &str) -> Result<(), ExecError>;

    /// `list WHAT` as nft prints it ("" when what it lists does not exist).
    fn list(&mut self, what: &str) -> Result<String, ExecError>;
}

/// [`Nft`] with scripts through `S` and element updates, generations and listings over
/// netlink.
pub struct Netlinked<S> {
    scripts: S,
    netlink: NftNetlink,
}

impl<S: Scripts> Netlinked<S> {
    pub fn over(scripts: S) -> Self {
        Netlinked { scripts, netlink: NftNetlink::new() }
    }
}

/// The `nft` command, one process per transaction (netlink for the rest).
pub type NftProcess = Netlinked<NftCommand>;

impl NftProcess {
    pub fn new() -> Self {
        Netlinked::over(NftCommand)
    }
}

impl Default for NftProcess {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Scripts> Nft for Netlinked<S> {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        self.scripts.run(script)
    }

    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        self.scripts.list(what)
    }

    fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError> {
        self.netlink.update_elements(update)
    }

    fn refill(&mut self, flush: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<bool, ExecError> {
        let scripts = &mut self.scripts;
        self.netlink.refill(flush, fill, |script| scripts.run(script))
    }

    fn reconcile(&mut self, sets: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<Reconciled, ExecError> {
        let scripts = &mut self.scripts;
        self.netlink.reconcile(sets, fill, |script| scripts.run(script))
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

/// What nft prints for a table or set that does not exist.
const ABSENT: &str = "No such file or directory";

/// The `nft` command.
pub struct NftCommand;

const TOOL: &str = "nft";

impl Scripts for NftCommand {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        process::run(TOOL, TOOL, &["-f", "-"], Some(script)).map(drop)
    }

    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        let mut args = vec!["list"];
        args.extend(what.split_whitespace());
        let out = process::output(TOOL, TOOL, &args, None)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let message = String::from_utf8_lossy(&out.stderr);
        if message.contains(ABSENT) {
            return Ok(String::new());
        }
        Err(ExecError::refused(TOOL, message.trim()))
    }
}

const LIBRARY: &str = "libnftables";

impl Scripts for NftLibrary {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let (ok, _, error) = self.command(script)?;
        if ok {
            return Ok(());
        }
        Err(ExecError::refused(LIBRARY, error.trim()))
    }

    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        let (ok, output, error) = self.command(&format!("list {what}"))?;
        if ok {
            return Ok(output);
        }
        if error.contains(ABSENT) {
            return Ok(String::new());
        }
        Err(ExecError::refused(LIBRARY, error.trim()))
    }
}
