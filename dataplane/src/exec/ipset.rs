//! The `ipset` tool.

use super::{process, ExecError};

/// What kpx asks of ipset.
pub trait Ipset: Send {
    /// Feeds `script` to `ipset -exist restore` (creating what is there, adding a member
    /// that is there or deleting one that is not is no error).
    fn restore(&mut self, script: &str) -> Result<(), ExecError>;
    /// The names of the sets in the kernel.
    fn names(&mut self) -> Result<Vec<String>, ExecError>;
    /// `ipset save` of every set.
    fn save(&mut self) -> Result<String, ExecError>;
}

/// Runs the `ipset` tool, one process per call.
pub struct IpsetProcess;

const TOOL: &str = "ipset";

impl Ipset for IpsetProcess {
    fn restore(&mut self, script: &str) -> Result<(), ExecError> {
        if script.is_empty() {
            return Ok(());
        }
        process::run(TOOL, TOOL, &["-exist", "restore"], Some(script)).map(drop)
    }

    fn names(&mut self) -> Result<Vec<String>, ExecError> {
        Ok(process::run(TOOL, TOOL, &["list", "-n"], None)?.lines().map(str::to_owned).collect())
    }

    fn save(&mut self) -> Result<String, ExecError> {
        process::run(TOOL, TOOL, &["save"], None)
    }
}
