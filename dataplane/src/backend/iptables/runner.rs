//! Runs `iptables-restore` / `iptables-save` (and the ip6 ones) of the chosen
//! flavour. Every restore is `--noflush -w`: each table block is one atomic
//! commit, and nothing kpx did not write is flushed.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::backend::BackendError;

use crate::backend::Family;

/// Which iptables the node uses: the nf_tables flavour or the legacy x_tables one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IptablesMode {
    /// The flavour holding more rules already (legacy when it holds more, else nft), as
    /// kube-proxy's iptables wrapper decides.
    Auto,
    Nft,
    Legacy,
}

impl IptablesMode {
    /// Decides `Auto` by counting the rules each flavour holds now.
    pub fn resolve(self) -> IptablesMode {
        if self != IptablesMode::Auto {
            return self;
        }
        let rules = |tool: &str| -> usize {
            Command::new(tool)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with("-A ")).count())
                .unwrap_or(0)
        };
        let legacy = rules("iptables-legacy-save") + rules("ip6tables-legacy-save");
        let nft = rules("iptables-nft-save") + rules("ip6tables-nft-save");
        if legacy > nft {
            IptablesMode::Legacy
        } else {
            IptablesMode::Nft
        }
    }

    fn tool(self, family: Family, verb: &str) -> String {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        match self {
            IptablesMode::Legacy => format!("{base}-legacy-{verb}"),
            IptablesMode::Nft | IptablesMode::Auto => format!("{base}-nft-{verb}"),
        }
    }
}

pub trait RestoreRunner {
    /// Feeds `script` to `iptables-restore --noflush -w` of `family`.
    fn restore(&mut self, family: Family, script: &str) -> Result<(), BackendError>;
    /// `iptables-save` of `family` (all tables).
    fn save(&mut self, family: Family) -> Result<String, BackendError>;
}

/// The iptables tools of one flavour, one process per call.
pub struct IptablesProcess {
    pub mode: IptablesMode,
}

const TOOL: &str = "iptables-restore";

impl RestoreRunner for IptablesProcess {
    fn restore(&mut self, family: Family, script: &str) -> Result<(), BackendError> {
        let tool = self.mode.tool(family, "restore");
        let mut child = Command::new(&tool)
            .args(["--noflush", "-w"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| BackendError::Spawn { tool: TOOL, source })?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(script.as_bytes()).map_err(|source| BackendError::Spawn { tool: TOOL, source })?;
        }
        let out = child.wait_with_output().map_err(|source| BackendError::Spawn { tool: TOOL, source })?;
        if out.status.success() {
            return Ok(());
        }
        Err(BackendError::Refused {
            tool: TOOL,
            message: format!("{tool}: {}", String::from_utf8_lossy(&out.stderr).trim()),
        })
    }

    fn save(&mut self, family: Family) -> Result<String, BackendError> {
        let tool = self.mode.tool(family, "save");
        let out = Command::new(&tool)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| BackendError::Spawn { tool: "iptables-save", source })?;
        if !out.status.success() {
            return Err(BackendError::Refused {
                tool: "iptables-save",
                message: format!("{tool}: {}", String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
