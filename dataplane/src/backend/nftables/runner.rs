//! Runs nft scripts. Each script is one netlink transaction: it applies whole
//! or not at all.

use std::io::Write;
use std::process::{Command, Stdio};

use super::render::{FAMILY, TABLE};
use crate::backend::BackendError;

pub trait NftRunner {
    /// Runs a script of nft commands as one transaction.
    fn run(&mut self, script: &str) -> Result<(), BackendError>;
    /// `nft list table` of kpx's table ("" when it does not exist).
    fn list_table(&mut self) -> Result<String, BackendError>;
}

impl NftRunner for Box<dyn NftRunner + Send> {
    fn run(&mut self, script: &str) -> Result<(), BackendError> {
        (**self).run(script)
    }

    fn list_table(&mut self) -> Result<String, BackendError> {
        (**self).list_table()
    }
}

/// libnftables in-process when it can be opened, else the `nft` process.
pub fn best_runner() -> Box<dyn NftRunner + Send> {
    match super::library::NftLibrary::open() {
        Ok(library) => {
            tracing::info!("nftables through libnftables, in-process");
            Box::new(library)
        }
        Err(e) => {
            tracing::warn!(reason = %e, "libnftables unavailable: running the nft command per transaction");
            Box::new(NftProcess)
        }
    }
}

/// Runs the `nft` command, one process per transaction.
pub struct NftProcess;

const TOOL: &str = "nft";

fn nft(args: &[&str], stdin: Option<&str>) -> Result<std::process::Output, BackendError> {
    let mut child = Command::new(TOOL)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| BackendError::Spawn { tool: TOOL, source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(|source| BackendError::Spawn { tool: TOOL, source })?;
    }
    child.wait_with_output().map_err(|source| BackendError::Spawn { tool: TOOL, source })
}

impl NftRunner for NftProcess {
    fn run(&mut self, script: &str) -> Result<(), BackendError> {
        let out = nft(&["-f", "-"], Some(script))?;
        if out.status.success() {
            return Ok(());
        }
        Err(BackendError::Refused {
            tool: TOOL,
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }

    fn list_table(&mut self) -> Result<String, BackendError> {
        let out = nft(&["list", "table", FAMILY, TABLE], None)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let message = String::from_utf8_lossy(&out.stderr);
        if message.contains("No such file or directory") {
            return Ok(String::new());
        }
        Err(BackendError::Refused { tool: TOOL, message: message.trim().to_owned() })
    }
}
