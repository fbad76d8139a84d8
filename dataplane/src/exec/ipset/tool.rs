//! The `ipset` tool, one process per call: whole sets restored, listed and saved.

use super::Ipset;
use crate::exec::{process, ExecError};

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
