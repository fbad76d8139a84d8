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
