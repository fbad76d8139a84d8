//! What the iptables and IPVS backends share of iptables: its tables, kpx's masquerade
//! mark, jumps from the built-in chains into kpx's, reading `iptables-save` output, and
//! the restore input that removes a prefix's chains.

use std::collections::HashMap;
use std::fmt::Write as _;

use kpx_proto::family::Family;
use kpx_proto::node_context::LocalMatch;

use crate::exec::iptables::Iptables;
use crate::exec::ExecError;

/// The mark bit that asks kpx's postrouting chain to masquerade.
pub const MASQ_MARK: &str = "0x2000";

/// The iptables matches that together say "from a pod" (a packet from a pod matches one
/// of them): one `-s` per prefix, or one `-i` (`NAME+` for a prefix). Empty without a
/// detector.
pub fn from_pods(detector: Option<LocalMatch<'_>>) -> Vec<String> {
    match detector {
        None => Vec::new(),
        Some(LocalMatch::Sources(cidrs)) => cidrs.iter().map(|c| format!("-s {c}")).collect(),
        Some(LocalMatch::Interface { name, prefix }) => {
            vec![format!("-i {name}{}", if prefix { "+" } else { "" })]
        }
    }
}

/// The iptables tables kpx writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Nat,
    Filter,
}

impl Table {
    pub const ALL: [Table; 2] = [Table::Nat, Table::Filter];

    pub fn name(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Filter => "filter",
        }
    }
}

/// The one rule of a canary chain: a chain in each table kpx writes that nothing jumps
/// to. While it holds this rule, nothing flushed or replaced that table behind kpx's back
/// (see [`crate::backend::Backend::intact`]); listing it is cheap.
pub const CANARY_RULE: &str = "-m comment --comment \"kpx canary\" -j RETURN";

/// The canary chain of `table` for a backend whose chains start with `prefix`.
pub fn canary_chain(prefix: &str, table: Table) -> String {
    format!("{prefix}CANARY-{}", table.name().to_uppercase())
}

/// `:CHAIN` and its rule, for a restore block of `table`.
pub fn canary_lines(prefix: &str, table: Table) -> String {
    let chain = canary_chain(prefix, table);
    format!(":{chain} - [0:0]\n-A {chain} {CANARY_RULE}\n")
}

/// Whether every canary chain of `prefix` (each table, each family) still holds its rule.
pub fn canaries_intact(iptables: &mut dyn Iptables, prefix: &str) -> Result<bool, ExecError> {
    for family in Family::ALL {
        for table in Table::ALL {
            let listed = iptables.list_chain(family, table.name(), &canary_chain(prefix, table))?;
            if !listed.lines().any(|l| l.ends_with(CANARY_RULE)) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// A jump from a built-in chain into kpx's.
#[derive(Debug, Clone, Copy)]
pub struct Hook {
    pub table: Table,
    pub builtin: &'static str,
    pub spec: &'static str,
}

/// `-I BUILTIN 1 SPEC` for each of `hooks` in `table` that `saved` (one family's
/// `iptables-save`; `None`: nothing known) does not hold yet.
pub fn missing_hooks(saved: Option<&str>, hooks: &[Hook], table: Table) -> Vec<String> {
    let present = saved.map(|text| saved_rules(text, table)).unwrap_or_default();
    hooks
        .iter()
        .filter(|h| h.table == table)
        .filter(|h| !present.iter().any(|l| *l == format!("-A {} {}", h.builtin, h.spec)))
        .map(|h| format!("-I {} 1 {}", h.builtin, h.spec))
        .collect()
}

/// `(table, chain)` of every user chain in `iptables-save` output.
pub fn saved_chains(text: &str) -> Vec<(Table, String)> {
    let mut table = None;
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Table::ALL.into_iter().find(|t| t.name() == name);
        } else if let (Some(t), Some(rest)) = (table, line.strip_prefix(':')) {
            if let Some(chain) = rest.split_whitespace().next() {
                out.push((t, chain.to_owned()));
            }
        }
    }
    out
}

/// The `-A …` lines of one table in `iptables-save` output.
pub fn saved_rules(text: &str, wanted: Table) -> Vec<&str> {
    let mut table = None;
    text.lines()
        .filter(|line| {
            if let Some(name) = line.strip_prefix('*') {
                table = Table::ALL.into_iter().find(|t| t.name() == name);
            }
            table == Some(wanted) && line.starts_with("-A ")
        })
        .collect()
}

/// Whether the kernel already holds what restore input `script` (one family's) writes,
/// given that family's `iptables-save` output: the input inserts, deletes and removes
/// nothing, and every chain it declares is there holding exactly its `-A` lines, in order
/// (compared as text: the input must be written as iptables-save prints rules). A restore
/// of such input would change nothing but the chains' counters.
pub fn already_held(saved: &str, script: &str) -> bool {
    let mut table = None;
    let mut declared: Vec<(Table, &str)> = Vec::new();
    let mut wanted: Vec<(Table, &str)> = Vec::new();
    for line in script.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Table::ALL.into_iter().find(|t| t.name() == name);
        } else if line == "COMMIT" {
            continue;
        } else if let (Some(t), Some(rest)) = (table, line.strip_prefix(':')) {
            declared.push((t, rest.split_whitespace().next().unwrap_or_default()));
        } else if let (Some(t), true) = (table, line.starts_with("-A ")) {
            wanted.push((t, line));
        } else {
            return false;
        }
    }
    let held = saved_chains(saved);
    Table::ALL.into_iter().all(|t| {
        let have = by_chain(saved_rules(saved, t));
        let want = by_chain(wanted.iter().filter(|(wt, _)| *wt == t).map(|(_, line)| *line));
        declared.iter().filter(|(dt, _)| *dt == t).all(|(_, chain)| {
            held.iter().any(|(ht, hc)| *ht == t && hc == chain)
                && rules_of(&have, chain) == rules_of(&want, chain)
        })
    })
}

/// `-A CHAIN …` lines by the chain they append to, in order.
pub fn by_chain<'a>(lines: impl IntoIterator<Item = &'a str>) -> HashMap<&'a str, Vec<&'a str>> {
    let mut out: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in lines {
        out.entry(chain_of(line)).or_default().push(line);
    }
    out
}

/// The lines of `chain` among `lines` grouped by [`by_chain`] (none: empty).
pub fn rules_of<'m, 'a>(lines: &'m HashMap<&'a str, Vec<&'a str>>, chain: &str) -> &'m [&'a str] {
    lines.get(chain).map_or(&[], Vec::as_slice)
}

/// The chain an `-A CHAIN …` line appends to.
pub fn chain_of(line: &str) -> &str {
    line.strip_prefix("-A ").and_then(|rest| rest.split(' ').next()).unwrap_or("")
}

/// The lines of `iptables-save` output that are kpx's (named `prefix…` or jumping there),
/// with the table headers and commits: what `kpxctl rules` shows.
pub fn owned_lines(saved: &str, prefix: &str) -> String {
    saved
        .lines()
        .filter(|line| line.starts_with('*') || line.contains(prefix) || *line == "COMMIT")
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Restore input that removes every chain named `prefix…` and the hooks into them (hooks
/// first), given `iptables-save` output.
pub fn cleanup_script(saved: &str, prefix: &str) -> String {
    let tables: Vec<&str> = Table::ALL.iter().map(|t| t.name()).collect();
    removal_script(saved, &tables, |chain| chain.starts_with(prefix))
}

/// Restore input that removes, in `tables`, every chain `owned` says is to go and every
/// rule of another chain that jumps (or goes) to one of them, rules first; given
/// `iptables-save` output. Tables with nothing to remove are left out.
pub fn removal_script(saved: &str, tables: &[&str], owned: impl Fn(&str) -> bool) -> String {
    let mut chains: Vec<(&str, &str)> = Vec::new();
    let mut rules: Vec<(&str, &str)> = Vec::new();
    let mut table = None;
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = tables.iter().copied().find(|t| *t == name);
        } else if let Some(t) = table {
            if let Some(chain) = line.strip_prefix(':').and_then(|rest| rest.split_whitespace().next()) {
                chains.push((t, chain));
            } else if let Some(rule) = line.strip_prefix("-A ") {
                rules.push((t, rule));
            }
        }
    }
    let mut s = String::new();
    for table in tables {
        let ours: Vec<&str> =
            chains.iter().filter(|(t, c)| t == table && owned(c)).map(|(_, c)| *c).collect();
        let hooks: Vec<&str> = rules
            .iter()
            .filter(|(t, rule)| {
                let chain = rule.split_whitespace().next().unwrap_or_default();
                t == table && !owned(chain) && jump_target(rule).is_some_and(&owned)
            })
            .map(|(_, rule)| *rule)
            .collect();
        if ours.is_empty() && hooks.is_empty() {
            continue;
        }
        let _ = writeln!(s, "*{table}");
        for chain in &ours {
            let _ = writeln!(s, ":{chain} - [0:0]");
        }
        for hook in hooks {
            let _ = writeln!(s, "-D {hook}");
        }
        for chain in &ours {
            let _ = writeln!(s, "-X {chain}");
        }
        let _ = writeln!(s, "COMMIT");
    }
    s
}

/// The chain a saved rule jumps (`-j`) or goes (`-g`) to.
fn jump_target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(word) = words.next() {
        if word == "-j" || word == "-g" {
            return words.next();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KPX-PORTALS - [0:0]\n\
                         -A PREROUTING -m comment --comment \"kpx service portals\" -j KPX-PORTALS\n\
                         -A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";

    #[test]
    fn cleanup_removes_exactly_the_prefixs_chains_and_hooks() {
        assert_eq!(
            cleanup_script(SAVED, "KPX-"),
            "*nat\n:KPX-PORTALS - [0:0]\n-D PREROUTING -m comment --comment \"kpx service portals\" -j KPX-PORTALS\n-X KPX-PORTALS\nCOMMIT\n"
        );
        assert_eq!(owned_lines(SAVED, "KPX-").lines().count(), 4);
    }

    #[test]
    fn hooks_already_there_are_not_inserted_again() {
        let hooks = [
            Hook {
                table: Table::Nat,
                builtin: "PREROUTING",
                spec: "-m comment --comment \"kpx service portals\" -j KPX-PORTALS",
            },
            Hook { table: Table::Nat, builtin: "OUTPUT", spec: "-j KPX-PORTALS" },
            Hook { table: Table::Filter, builtin: "INPUT", spec: "-j KPX-FILTER" },
        ];
        assert_eq!(missing_hooks(Some(SAVED), &hooks, Table::Nat), ["-I OUTPUT 1 -j KPX-PORTALS"]);
        assert_eq!(missing_hooks(None, &hooks, Table::Filter), ["-I INPUT 1 -j KPX-FILTER"]);
    }
}
