//! Runs `iptables-restore` / `iptables-save` (and the ip6 ones) of the chosen
//! flavour. Every restore is `--noflush -w`: each table block is one atomic
//! commit, and nothing kpx did not write is flushed.

use std::process::Command;

use crate::backend::{tool, BackendError};

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

impl RestoreRunner for IptablesProcess {
    fn restore(&mut self, family: Family, script: &str) -> Result<(), BackendError> {
        let program = self.mode.tool(family, "restore");
        tool::run("iptables-restore", &program, &["--noflush", "-w"], Some(script)).map(drop)
    }

    fn save(&mut self, family: Family) -> Result<String, BackendError> {
        tool::run("iptables-save", &self.mode.tool(family, "save"), &[], None)
    }
}
