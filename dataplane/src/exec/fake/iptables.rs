//! An in-memory iptables of both families with the nat and filter tables, fed
//! `iptables-restore --noflush` input: each `*table` … `COMMIT` block applies whole or
//! not at all (a failing block leaves the blocks before it committed, as the tool does).
//! Per block: `:CHAIN` creates a user chain or flushes it, `-A`, `-I CHAIN N`, `-D` (the
//! rule must exist), `-X` (the chain must be empty and not jumped to); at `COMMIT` every
//! `-j`/`-g` must name a target or an existing chain. `iptables-save` gives the tool's
//! layout: chain declarations, then rules, per table.

use kpx_proto::sync::Locked as _;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use kpx_proto::family::Family;

use crate::exec::iptables::Iptables;
use crate::exec::ExecError;

const TOOL: &str = "iptables-restore (fake)";

/// Targets that are not chains.
const TARGETS: [&str; 11] = [
    "ACCEPT",
    "DROP",
    "RETURN",
    "REJECT",
    "DNAT",
    "SNAT",
    "MASQUERADE",
    "MARK",
    "LOG",
    "CONNMARK",
    "NOTRACK",
];

/// The built-in chains of each table kpx uses.
fn builtins(table: &str) -> &'static [&'static str] {
    match table {
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        _ => &[],
    }
}

/// A handle on one fake iptables; clones share it.
#[derive(Clone, Default)]
pub struct FakeIptables {
    inner: Arc<Mutex<IptablesState>>,
}

#[derive(Default)]
struct IptablesState {
    families: BTreeMap<Family, BTreeMap<String, Table>>,
    restores: usize,
    fail_next: std::collections::VecDeque<String>,
}

/// One table: chains (built-in ones first when listed) and their rules (`-A` specs without
/// the chain).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Table {
    chains: BTreeMap<String, Vec<String>>,
}

impl Table {
    fn new(name: &str) -> Table {
        Table { chains: builtins(name).iter().map(|c| ((*c).to_owned(), Vec::new())).collect() }
    }
}

impl FakeIptables {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, IptablesState> {
        self.inner.locked()
    }

    /// Refuses the next restore with `message`, changing nothing (called twice: the next two).
    pub fn fail_next(&self, message: &str) {
        self.state().fail_next.push_back(message.to_owned());
    }

    /// How many restores were fed.
    pub fn restores(&self) -> usize {
        self.state().restores
    }

    /// The rules of `chain` in `table` of `family` (`-A` specs without the chain).
    pub fn rules(&self, family: Family, table: &str, chain: &str) -> Vec<String> {
        let state = self.state();
        state
            .families
            .get(&family)
            .and_then(|t| t.get(table))
            .and_then(|t| t.chains.get(chain))
            .cloned()
            .unwrap_or_default()
    }

    /// The user chains of `table` in `family`.
    pub fn chains(&self, family: Family, table: &str) -> Vec<String> {
        let state = self.state();
        let Some(t) = state.families.get(&family).and_then(|t| t.get(table)) else { return Vec::new() };
        t.chains.keys().filter(|c| !builtins(table).contains(&c.as_str())).cloned().collect()
    }
}

fn table_of<'a>(tables: &'a mut BTreeMap<String, Table>, name: &str) -> &'a mut Table {
    tables.entry(name.to_owned()).or_insert_with(|| Table::new(name))
}

/// The chain a rule's `-j` or `-g` names.
fn target(spec: &str) -> Option<&str> {
    let words: Vec<&str> = spec.split_whitespace().collect();
    words.windows(2).find(|w| w[0] == "-j" || w[0] == "-g").map(|w| w[1])
}

/// Applies one table block to `table`.
fn apply_block(table_name: &str, table: &mut Table, lines: &[&str]) -> Result<(), String> {
    for line in lines {
        if let Some(rest) = line.strip_prefix(':') {
            let chain = rest.split_whitespace().next().ok_or("a chain declaration needs a name")?;
            if builtins(table_name).contains(&chain) {
                continue;
            }
            table.chains.entry(chain.to_owned()).or_default().clear();
            continue;
        }
        let (option, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
        let no_chain = || format!("No chain/target/match by that name ({chain})");
        match option {
            "-A" => table.chains.get_mut(chain).ok_or_else(no_chain)?.push(spec.to_owned()),
            "-I" => {
                let (position, spec) = spec.split_once(' ').ok_or("-I needs a position")?;
                let position: usize = position.parse().map_err(|_| format!("bad position {position:?}"))?;
                let rules = table.chains.get_mut(chain).ok_or_else(no_chain)?;
                if position == 0 || position > rules.len() + 1 {
                    return Err(format!("Index of insertion too big ({position})"));
                }
                rules.insert(position - 1, spec.to_owned());
            }
            "-D" => {
                let rules = table.chains.get_mut(chain).ok_or_else(no_chain)?;
                let at = rules
                    .iter()
                    .position(|r| r == spec)
                    .ok_or_else(|| format!("Bad rule (does a matching rule exist in that chain?): {spec}"))?;
                rules.remove(at);
            }
            "-X" => {
                if builtins(table_name).contains(&chain) {
                    return Err(format!("cannot delete built-in chain {chain}"));
                }
                let rules = table.chains.get(chain).ok_or_else(no_chain)?;
                if !rules.is_empty() {
                    return Err(format!("Directory not empty ({chain})"));
                }
                if table.chains.values().flatten().any(|r| target(r) == Some(chain)) {
                    return Err(format!("Too many links ({chain} is jumped to)"));
                }
                table.chains.remove(chain);
            }
            other => return Err(format!("unsupported line {other:?}")),
        }
    }
    for spec in table.chains.values().flatten() {
        if let Some(to) = target(spec) {
            if !TARGETS.contains(&to) && !table.chains.contains_key(to) {
                return Err(format!("Couldn't load target `{to}'"));
            }
        }
    }
    Ok(())
}

impl Iptables for FakeIptables {
    fn restore(&mut self, family: Family, script: &str) -> Result<(), ExecError> {
        let mut state = self.state();
        if let Some(message) = state.fail_next.pop_front() {
            return Err(ExecError::refused(TOOL, message));
        }
        state.restores += 1;
        let mut block: Option<(String, Vec<&str>)> = None;
        for line in script.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if let Some(name) = line.strip_prefix('*') {
                if block.is_some() {
                    return Err(ExecError::refused(TOOL, format!("*{name} before COMMIT")));
                }
                block = Some((name.to_owned(), Vec::new()));
            } else if line == "COMMIT" {
                let (name, lines) =
                    block.take().ok_or_else(|| ExecError::refused(TOOL, "COMMIT outside a table"))?;
                let tables = state.families.entry(family).or_default();
                let mut copy = table_of(tables, &name).clone();
                apply_block(&name, &mut copy, &lines)
                    .map_err(|reason| ExecError::refused(TOOL, format!("*{name}: {reason}")))?;
                tables.insert(name, copy);
            } else {
                let (_, lines) = block
                    .as_mut()
                    .ok_or_else(|| ExecError::refused(TOOL, format!("outside a table: {line}")))?;
                lines.push(line);
            }
        }
        match block {
            Some((name, _)) => Err(ExecError::refused(TOOL, format!("*{name}: no COMMIT"))),
            None => Ok(()),
        }
    }

    fn list_chain(&mut self, family: Family, table: &str, chain: &str) -> Result<String, ExecError> {
        let state = self.state();
        let Some(rules) =
            state.families.get(&family).and_then(|t| t.get(table)).and_then(|t| t.chains.get(chain))
        else {
            return Ok(String::new());
        };
        let mut out = format!("-N {chain}\n");
        for rule in rules {
            let _ = writeln!(out, "-A {chain} {rule}");
        }
        Ok(out)
    }

    fn save(&mut self, family: Family) -> Result<String, ExecError> {
        let mut state = self.state();
        let tables = state.families.entry(family).or_default();
        let mut out = String::new();
        for name in ["nat", "filter"] {
            let table = table_of(tables, name);
            let _ = writeln!(out, "*{name}");
            let order: Vec<&String> = builtins(name)
                .iter()
                .filter_map(|b| table.chains.get_key_value(*b).map(|(k, _)| k))
                .chain(table.chains.keys().filter(|c| !builtins(name).contains(&c.as_str())))
                .collect();
            for chain in &order {
                let policy = if builtins(name).contains(&chain.as_str()) { "ACCEPT" } else { "-" };
                let _ = writeln!(out, ":{chain} {policy} [0:0]");
            }
            for chain in &order {
                for rule in &table.chains[*chain] {
                    let _ = writeln!(out, "-A {chain} {rule}");
                }
            }
            let _ = writeln!(out, "COMMIT");
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_commit_whole_and_references_are_checked() {
        let mut ipt = FakeIptables::new();
        ipt.restore(
            Family::V4,
            "*nat\n:KPX-A - [0:0]\n-A KPX-A -j MARK --or-mark 0x2000\n-I PREROUTING 1 -j KPX-A\nCOMMIT\n",
        )
        .expect("valid");
        assert_eq!(ipt.rules(Family::V4, "nat", "PREROUTING"), ["-j KPX-A"]);
        let err = ipt
            .restore(Family::V4, "*filter\n:KPX-F - [0:0]\nCOMMIT\n*nat\n-A KPX-A -j KPX-NOWHERE\nCOMMIT\n")
            .expect_err("unknown target");
        assert!(err.to_string().contains("KPX-NOWHERE"), "{err}");
        assert_eq!(ipt.chains(Family::V4, "filter"), ["KPX-F"], "the block before the failing one stays");
        assert_eq!(ipt.rules(Family::V4, "nat", "KPX-A").len(), 1, "the failing block left nothing");
        for (script, why) in [
            ("*nat\n-X KPX-A\nCOMMIT\n", "not empty"),
            ("*nat\n:KPX-A - [0:0]\n-X KPX-A\nCOMMIT\n", "still jumped to"),
            ("*nat\n-D PREROUTING -j KPX-B\nCOMMIT\n", "no such rule"),
            ("*nat\n-A KPX-B -j ACCEPT\nCOMMIT\n", "no such chain"),
            ("*nat\n-A PREROUTING -j ACCEPT\n", "no COMMIT"),
        ] {
            assert!(ipt.restore(Family::V4, script).is_err(), "{why}");
        }
        ipt.restore(Family::V4, "*nat\n:KPX-A - [0:0]\n-D PREROUTING -j KPX-A\n-X KPX-A\nCOMMIT\n")
            .expect("valid");
        let saved = ipt.save(Family::V4).expect("save");
        assert!(saved.starts_with("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n"), "{saved}");
        assert!(saved.contains("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KPX-F - [0:0]\nCOMMIT\n"), "{saved}");
        assert!(!saved.contains("KPX-A") && ipt.save(Family::V6).expect("save").contains("*filter"));
    }
}
