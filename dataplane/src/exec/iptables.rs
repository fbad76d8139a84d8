//! `iptables-restore` / `iptables-save` (and the ip6 ones) of one flavour. Every restore
//! is `--noflush -w`: each table block is one atomic commit, and nothing kpx did not
//! write is flushed.

use kpx_proto::family::Family;

use super::{process, ExecError};

/// Which iptables the node uses: the nf_tables flavour or the legacy x_tables one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Nft,
    Legacy,
}

impl Flavour {
    /// The flavour holding more rules already (legacy when it holds more, else nft), as
    /// kube-proxy's iptables wrapper decides.
    pub fn detect() -> Flavour {
        let rules = |tool: &'static str| -> usize {
            process::output(tool, tool, &[], None)
                .map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with("-A ")).count())
                .unwrap_or(0)
        };
        let legacy = rules("iptables-legacy-save") + rules("ip6tables-legacy-save");
        let nft = rules("iptables-nft-save") + rules("ip6tables-nft-save");
        if legacy > nft {
            Flavour::Legacy
        } else {
            Flavour::Nft
        }
    }

    fn program(self, family: Family, verb: &str) -> String {
        format!("{}-{verb}", self.command(family))
    }

    /// `iptables-nft`, `ip6tables-legacy`, …
    fn command(self, family: Family) -> String {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        match self {
            Flavour::Legacy => format!("{base}-legacy"),
            Flavour::Nft => format!("{base}-nft"),
        }
    }
}

/// What kpx asks of iptables.
pub trait Iptables: Send {
    /// Feeds `script` to `iptables-restore --noflush -w` of `family`: each table block
    /// commits whole or not at all.
    fn restore(&mut self, family: Family, script: &str) -> Result<(), ExecError>;
    /// `iptables-save` of `family` (all tables).
    fn save(&mut self, family: Family) -> Result<String, ExecError>;
    /// `iptables -w -t TABLE -S CHAIN` of `family`: the chain's `-N`/`-A` lines, "" when
    /// the chain does not exist. Cheap, where saving a whole table is not.
    fn list_chain(&mut self, family: Family, table: &str, chain: &str) -> Result<String, ExecError>;
}

/// How long (seconds) iptables waits for the xtables lock another program holds (the
/// legacy flavour takes it): then the call fails, the change is NACKed and asked for
/// again, and the node reports itself unhealthy meanwhile, as kube-proxy's `-w 5` does;
/// never waiting forever behind a stuck program.
const XTABLES_WAIT: &str = "5";

/// The iptables tools of one flavour, one process per call.
pub struct IptablesProcess {
    pub flavour: Flavour,
}

impl Iptables for IptablesProcess {
    fn restore(&mut self, family: Family, script: &str) -> Result<(), ExecError> {
        let program = self.flavour.program(family, "restore");
        process::run("iptables-restore", &program, &["--noflush", "-w", XTABLES_WAIT], Some(script)).map(drop)
    }

    fn save(&mut self, family: Family) -> Result<String, ExecError> {
        process::run("iptables-save", &self.flavour.program(family, "save"), &[], None)
    }

    fn list_chain(&mut self, family: Family, table: &str, chain: &str) -> Result<String, ExecError> {
        let program = self.flavour.command(family);
        let out =
            process::output("iptables", &program, &["-w", XTABLES_WAIT, "-t", table, "-S", chain], None)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let message = String::from_utf8_lossy(&out.stderr);
        // "No chain/target/match by that name" (legacy), "chain `X' in table `nat' is
        // incompatible" or "does not exist" (nft): the chain is not there.
        if ["No chain", "does not exist", "No such file"].iter().any(|m| message.contains(m)) {
            return Ok(String::new());
        }
        Err(ExecError::refused("iptables", format!("{program}: {}", message.trim())))
    }
}
