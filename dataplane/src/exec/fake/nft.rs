//! An in-memory nftables: the commands kpx writes (`add`/`delete` of tables, chains, sets,
//! maps and elements, `add rule`, `flush chain`), applied as one transaction to a copy and
//! kept only when every command succeeds, with the kernel's checks that matter to kpx:
//! a rule or element may refer only to chains and sets that exist; a chain or set still
//! referred to cannot be deleted; an element deleted must exist; an element added again
//! with other data is refused. `list table` gives canonical text in nft's layout.

use kpx_proto::sync::Locked as _;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::exec::nft::elements::{self, ElementUpdate, Field, Layout, Value, Values};
use crate::exec::nft::{Nft, Outline, FAMILY, TABLE};
use crate::exec::ExecError;
use kpx_proto::types::Protocol;

const TOOL: &str = "nft (fake)";

/// A handle on one fake nftables; clones share it.
#[derive(Clone, Default)]
pub struct FakeNft {
    inner: Arc<Mutex<NftState>>,
}

#[derive(Default)]
struct NftState {
    tables: BTreeMap<String, Table>,
    transactions: usize,
    /// How many transactions were element updates (netlink's, not scripts).
    element_updates: usize,
    /// How many times a transaction deleted kpx's table (its base chains' hooks with it).
    table_deletions: usize,
    fail_next: std::collections::VecDeque<String>,
}

#[derive(Debug, Clone, Default)]
struct Table {
    comment: Option<String>,
    sets: BTreeMap<String, Set>,
    chains: BTreeMap<String, Chain>,
}

#[derive(Debug, Clone)]
struct Set {
    is_map: bool,
    declaration: String,
    /// key → data (maps) or `None` (sets).
    elements: BTreeMap<String, Option<String>>,
}

#[derive(Debug, Clone, Default)]
struct Chain {
    /// `type … hook … priority … ; policy … ;` of a base chain.
    base: Option<String>,
    rules: Vec<String>,
}

/// Why a command was refused.
type Refusal = String;

impl FakeNft {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, NftState> {
        self.inner.locked()
    }

    /// Refuses the next transaction with `message`, changing nothing (called twice: the next two).
    pub fn fail_next(&self, message: &str) {
        self.state().fail_next.push_back(message.to_owned());
    }

    /// How many applied transactions deleted kpx's table.
    pub fn table_deletions(&self) -> usize {
        self.state().table_deletions
    }

    /// How many transactions were applied.
    pub fn transactions(&self) -> usize {
        self.state().transactions
    }

    fn generation_now(&self) -> u32 {
        u32::try_from(self.state().transactions).unwrap_or(u32::MAX)
    }

    /// How many transactions were element updates (counted among [`Self::transactions`]).
    pub fn element_updates(&self) -> usize {
        self.state().element_updates
    }

    /// Whether kpx's table exists.
    pub fn has_table(&self) -> bool {
        self.state().tables.contains_key(&table_key(FAMILY, TABLE))
    }

    /// The elements of a set or map of kpx's table, as `key` or `key : data`, sorted.
    pub fn elements(&self, set: &str) -> Vec<String> {
        let state = self.state();
        let Some(set) = state.tables.get(&table_key(FAMILY, TABLE)).and_then(|t| t.sets.get(set)) else {
            return Vec::new();
        };
        set.elements.iter().map(|(k, v)| element_text(k, v.as_deref())).collect()
    }

    /// The rules of a chain of kpx's table.
    pub fn rules(&self, chain: &str) -> Vec<String> {
        let state = self.state();
        state
            .tables
            .get(&table_key(FAMILY, TABLE))
            .and_then(|t| t.chains.get(chain))
            .map(|c| c.rules.clone())
            .unwrap_or_default()
    }

    /// The names of the chains of kpx's table.
    pub fn chains(&self) -> Vec<String> {
        let state = self.state();
        state
            .tables
            .get(&table_key(FAMILY, TABLE))
            .map(|t| t.chains.keys().cloned().collect())
            .unwrap_or_default()
    }
}

fn table_key(family: &str, name: &str) -> String {
    format!("{family} {name}")
}

fn element_text(key: &str, data: Option<&str>) -> String {
    match data {
        Some(v) => format!("{key} : {v}"),
        None => key.to_owned(),
    }
}

impl Nft for FakeNft {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let mut state = self.state();
        if let Some(message) = state.fail_next.pop_front() {
            return Err(ExecError::refused(TOOL, message));
        }
        let mut tables = state.tables.clone();
        let mut deleted_table = false;
        for (number, line) in script.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            apply(&mut tables, line).map_err(|reason| {
                ExecError::refused(TOOL, format!("line {}: {reason}: {line}", number + 1))
            })?;
            deleted_table |= line == format!("delete table {FAMILY} {TABLE}");
        }
        state.tables = tables;
        state.transactions += 1;
        state.table_deletions += usize::from(deleted_table);
        Ok(())
    }

    /// Encodes every element as the kernel's writer does (refusing what it would), then
    /// applies the update as the `flush`/`delete element`/`add element` commands it amounts to.
    fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError> {
        elements::check(update).map_err(|e| ExecError::refused(TOOL, e.to_string()))?;
        let script = update.script();
        self.run(&script)?;
        self.state().element_updates += 1;
        Ok(())
    }

    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        let state = self.state();
        let table = state.tables.get(&table_key(FAMILY, TABLE));
        let words: Vec<&str> = what.split_whitespace().collect();
        match words[..] {
            ["table", FAMILY, TABLE] => Ok(table.map(|t| dump(FAMILY, TABLE, t)).unwrap_or_default()),
            ["chain", FAMILY, TABLE, name] => Ok(table
                .and_then(|t| t.chains.get(name))
                .map(|c| {
                    let rules: String = c.rules.iter().map(|r| format!("\t\t{r}\n")).collect();
                    format!("table {FAMILY} {TABLE} {{\n\tchain {name} {{\n{rules}\t}}\n}}\n")
                })
                .unwrap_or_default()),
            _ => Err(ExecError::refused(
                TOOL,
                format!("the fake lists only kpx's table or one of its chains, not {what:?}"),
            )),
        }
    }

    /// The number of transactions applied (each moves it on by one, as the kernel's does).
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        Ok(Some(self.generation_now()))
    }

    fn update_elements_at(&mut self, generation: u32, update: &ElementUpdate) -> Result<bool, ExecError> {
        if generation != self.generation_now() {
            return Ok(false);
        }
        self.update_elements(update).map(|()| true)
    }

    fn set_keys(&mut self, set: &str, layout: &Layout) -> Result<Vec<Vec<u8>>, ExecError> {
        let texts: Vec<String> = {
            let state = self.state();
            let table = state.tables.get(&table_key(FAMILY, TABLE));
            table
                .and_then(|t| t.sets.get(set))
                .map(|s| s.elements.keys().cloned().collect())
                .unwrap_or_default()
        };
        let encoded = |text: &str| {
            let key = parse_values(&layout.key, text)?;
            elements::key(layout, &key).map(|k| k.as_bytes().to_vec())
        };
        texts.iter().map(|k| encoded(k).map_err(|reason| ExecError::refused(TOOL, reason))).collect()
    }

    fn rules_in_chain(&mut self, chain: &str) -> Result<usize, ExecError> {
        Ok(self.rules(chain).len())
    }

    fn outline(&mut self) -> Result<Option<Outline>, ExecError> {
        let state = self.state();
        Ok(state.tables.get(&table_key(FAMILY, TABLE)).map(|t| {
            let named =
                |map: bool| t.sets.iter().filter(|(_, s)| s.is_map == map).map(|(n, _)| n.clone()).collect();
            Outline {
                comment: t.comment.clone(),
                chains: t.chains.keys().cloned().collect(),
                empty_chains: t
                    .chains
                    .iter()
                    .filter(|(_, c)| c.rules.is_empty())
                    .map(|(n, _)| n.clone())
                    .collect(),
                sets: named(false),
                maps: named(true),
            }
        }))
    }
}

/// `NAME { body }` → (NAME, Some(body)); `NAME` → (NAME, None).
fn name_and_block(rest: &str) -> Result<(&str, Option<&str>), Refusal> {
    match rest.split_once('{') {
        Some((name, block)) => {
            let body = block.trim().strip_suffix('}').ok_or("unterminated { }")?;
            Ok((name.trim(), Some(body.trim())))
        }
        None => Ok((rest.trim(), None)),
    }
}

/// Splits `verb object family table rest`.
fn words(line: &str) -> Result<(&str, &str, String, &str), Refusal> {
    let mut parts = line.splitn(5, ' ');
    let verb = parts.next().ok_or("empty command")?;
    let object = parts.next().ok_or("no object")?;
    let family = parts.next().ok_or("no family")?;
    let rest = parts.next().ok_or("no table")?;
    let (table, rest) = match object {
        "table" => (name_and_block(&[rest, parts.next().unwrap_or_default()].join(" "))?.0.to_owned(), ""),
        _ => (rest.to_owned(), parts.next().unwrap_or_default()),
    };
    Ok((verb, object, table_key(family, &table), rest))
}

fn apply(tables: &mut BTreeMap<String, Table>, line: &str) -> Result<(), Refusal> {
    let (verb, object, table_name, rest) = words(line)?;
    if object == "table" {
        return match verb {
            "add" => {
                let comment = line
                    .split_once("comment \"")
                    .and_then(|(_, c)| c.split_once('"'))
                    .map(|(c, _)| c.to_owned());
                // As in the kernel: an existing table keeps its comment.
                tables.entry(table_name).or_insert_with(|| Table { comment, ..Table::default() });
                Ok(())
            }
            "delete" => {
                tables.remove(&table_name).map(drop).ok_or_else(|| "No such file or directory".into())
            }
            _ => Err(format!("unsupported: {verb} table")),
        };
    }
    let table = tables.get_mut(&table_name).ok_or("No such file or directory (no such table)")?;
    match (verb, object) {
        ("add", "chain") => {
            let (name, base) = name_and_block(rest)?;
            let chain = table.chains.entry(name.to_owned()).or_default();
            if base.is_some() {
                chain.base = base.map(str::to_owned);
            }
            Ok(())
        }
        ("flush", "chain") => {
            table
                .chains
                .get_mut(rest.trim())
                .ok_or("No such file or directory (no such chain)")?
                .rules
                .clear();
            Ok(())
        }
        ("delete", "chain") => {
            let name = rest.trim();
            if !table.chains.contains_key(name) {
                return Err("No such file or directory (no such chain)".into());
            }
            if refers_to_chain(table, name, Some(name)) {
                return Err("Device or resource busy (the chain is still referred to)".into());
            }
            table.chains.remove(name);
            Ok(())
        }
        ("add", "rule") => {
            let (chain, rule) = rest.split_once(' ').ok_or("a rule needs a chain and a statement")?;
            check_references(table, rule)?;
            table
                .chains
                .get_mut(chain)
                .ok_or("No such file or directory (no such chain)")?
                .rules
                .push(rule.to_owned());
            Ok(())
        }
        ("add", kind @ ("set" | "map")) => {
            let (name, declaration) = name_and_block(rest)?;
            let declaration = declaration.ok_or("a set needs a declaration")?.to_owned();
            match table.sets.get(name) {
                Some(existing)
                    if existing.declaration != declaration || existing.is_map != (kind == "map") =>
                {
                    Err("File exists (declared otherwise)".into())
                }
                Some(_) => Ok(()),
                None => {
                    let set = Set { is_map: kind == "map", declaration, elements: BTreeMap::new() };
                    table.sets.insert(name.to_owned(), set);
                    Ok(())
                }
            }
        }
        ("flush", kind @ ("set" | "map")) => {
            let set = table
                .sets
                .get_mut(rest.trim())
                .filter(|s| s.is_map == (kind == "map"))
                .ok_or("No such file or directory (no such set)")?;
            set.elements.clear();
            Ok(())
        }
        ("delete", kind @ ("set" | "map")) => {
            let name = rest.trim();
            if table.sets.get(name).is_none_or(|s| s.is_map != (kind == "map")) {
                return Err("No such file or directory (no such set)".into());
            }
            let used =
                table.chains.values().flat_map(|c| &c.rules).any(|r| set_references(r).any(|s| s == name));
            if used {
                return Err("Device or resource busy (the set is still referred to)".into());
            }
            table.sets.remove(name);
            Ok(())
        }
        (verb @ ("add" | "delete"), "element") => {
            let (name, items) = name_and_block(rest)?;
            let items = items.ok_or("elements go inside { }")?;
            let chains: Vec<String> = table.chains.keys().cloned().collect();
            let set = table.sets.get_mut(name).ok_or("No such file or directory (no such set)")?;
            for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let (key, data) = match item.split_once(" : ") {
                    Some((k, v)) => (k.trim(), Some(v.trim())),
                    None => (item, None),
                };
                if verb == "delete" {
                    if set.elements.remove(key).is_none() {
                        return Err(format!("No such file or directory (no element {key})"));
                    }
                    continue;
                }
                if set.is_map != data.is_some() {
                    return Err(format!("element {item:?} does not fit {name}"));
                }
                if let Some(chain) = data.and_then(verdict_chain) {
                    if !chains.iter().any(|c| c == chain) {
                        return Err(format!("No such file or directory (no chain {chain})"));
                    }
                }
                match set.elements.get(key) {
                    Some(existing) if existing.as_deref() != data => {
                        return Err(format!("File exists (element {key} with other data)"))
                    }
                    _ => {
                        set.elements.insert(key.to_owned(), data.map(str::to_owned));
                    }
                }
            }
            Ok(())
        }
        _ => Err(format!("unsupported: {verb} {object}")),
    }
}

/// An element's key or data as nft writes it (`10.96.0.1 . tcp . 80`), read by `fields`:
/// the fake holds elements as text, as nft lists them.
fn parse_values(fields: &[Field], text: &str) -> Result<Values, String> {
    let parts: Vec<&str> = text.split(" . ").collect();
    if parts.len() != fields.len() {
        return Err(format!("{} fields where {} are declared", parts.len(), fields.len()));
    }
    let mut values = Vec::with_capacity(parts.len());
    for (field, part) in fields.iter().zip(parts) {
        let value = match field {
            Field::Address(_) => Value::Address(part.parse().map_err(|_| format!("{part:?} is no address"))?),
            Field::Protocol => Value::Protocol(match part {
                "tcp" => Protocol::Tcp,
                "udp" => Protocol::Udp,
                "sctp" => Protocol::Sctp,
                _ => return Err(format!("{part:?} is no protocol")),
            }),
            Field::Port => Value::Port(part.parse().map_err(|_| format!("{part:?} is no port"))?),
            Field::Index => Value::Index(part.parse().map_err(|_| format!("{part:?} is no index"))?),
        };
        values.push(value);
    }
    Ok(Values::of(&values))
}

/// The chain a verdict (`goto X`, `jump X`) sends to.
fn verdict_chain(data: &str) -> Option<&str> {
    let mut words = data.split_whitespace();
    match words.next()? {
        "goto" | "jump" => words.next(),
        _ => None,
    }
}

/// The chains a rule jumps or goes to.
fn chain_references(rule: &str) -> impl Iterator<Item = &str> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let targets: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "goto" || w[0] == "jump")
        .map(|w| w[1].trim_end_matches([',', '}']))
        .collect();
    targets.into_iter()
}

/// The sets and maps a rule looks up (`@name`).
fn set_references(rule: &str) -> impl Iterator<Item = &str> {
    rule.split_whitespace().filter_map(|w| w.strip_prefix('@')).map(|w| w.trim_end_matches([',', '}', ';']))
}

fn check_references(table: &Table, rule: &str) -> Result<(), Refusal> {
    if let Some(missing) = chain_references(rule).find(|c| !table.chains.contains_key(*c)) {
        return Err(format!("No such file or directory (no chain {missing})"));
    }
    if let Some(missing) = set_references(rule).find(|s| !table.sets.contains_key(*s)) {
        return Err(format!("No such file or directory (no set {missing})"));
    }
    Ok(())
}

/// Whether anything but `except`'s own rules refers to chain `name`.
fn refers_to_chain(table: &Table, name: &str, except: Option<&str>) -> bool {
    let from_rules = table
        .chains
        .iter()
        .filter(|(c, _)| Some(c.as_str()) != except)
        .flat_map(|(_, c)| &c.rules)
        .any(|r| chain_references(r).any(|c| c == name));
    let from_elements = table
        .sets
        .values()
        .flat_map(|s| s.elements.values().flatten())
        .any(|d| verdict_chain(d) == Some(name));
    from_rules || from_elements
}

/// The table in `nft list table` layout: sets and maps, then chains, each by name.
fn dump(family: &str, name: &str, table: &Table) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "table {family} {name} {{");
    if let Some(comment) = &table.comment {
        let _ = writeln!(out, "\tcomment \"{comment}\"");
    }
    for (set_name, set) in &table.sets {
        let _ = writeln!(out, "\t{} {set_name} {{", if set.is_map { "map" } else { "set" });
        for part in set.declaration.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let _ = writeln!(out, "\t\t{part}");
        }
        if !set.elements.is_empty() {
            let items: Vec<String> =
                set.elements.iter().map(|(k, v)| element_text(k, v.as_deref())).collect();
            let _ = writeln!(out, "\t\telements = {{ {} }}", items.join(", "));
        }
        let _ = writeln!(out, "\t}}");
    }
    for (chain_name, chain) in &table.chains {
        let _ = writeln!(out, "\tchain {chain_name} {{");
        if let Some(base) = &chain.base {
            let _ = writeln!(out, "\t\t{}", base.trim().trim_end_matches(';').trim());
        }
        for rule in &chain.rules {
            let _ = writeln!(out, "\t\t{rule}");
        }
        let _ = writeln!(out, "\t}}");
    }
    let _ = writeln!(out, "}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETUP: &str =
        "add table inet kpx\ndelete table inet kpx\nadd table inet kpx { comment \"managed\" ; }\n\
        add map inet kpx vips { type ipv4_addr : verdict ; }\nadd set inet kpx seen { type ipv4_addr ; }\n\
        add chain inet kpx pick\nadd rule inet kpx pick ip daddr @seen accept\n\
        add chain inet kpx entry { type nat hook prerouting priority -100 ; policy accept ; }\n\
        add rule inet kpx entry ip daddr vmap @vips\n";

    #[test]
    fn a_transaction_applies_whole_or_not_at_all() {
        let mut nft = FakeNft::new();
        assert!(nft.run("delete table inet kpx").is_err(), "deleting a table that is not there is refused");
        nft.run(SETUP).expect("adding first makes the delete valid");
        nft.run("add element inet kpx vips { 10.0.0.1 : goto pick, 10.0.0.2 : drop }").expect("valid");
        assert_eq!(nft.elements("vips"), ["10.0.0.1 : goto pick", "10.0.0.2 : drop"]);
        let err = nft
            .run("add element inet kpx seen { 10.0.0.9 }\ndelete element inet kpx vips { 10.0.0.3 }")
            .expect_err("no such element");
        assert!(err.to_string().contains("line 2") && err.to_string().contains("10.0.0.3"), "{err}");
        assert!(nft.elements("seen").is_empty(), "the first command was not kept");
        assert_eq!(nft.transactions(), 2);
        assert!(nft.has_table() && nft.chains() == ["entry", "pick"]);
    }

    #[test]
    fn references_are_checked_like_the_kernel() {
        let mut nft = FakeNft::new();
        nft.run(SETUP).expect("valid");
        nft.run("add element inet kpx vips { 10.0.0.1 : goto pick }").expect("valid");
        for (script, why) in [
            ("delete chain inet kpx pick", "an element goes to it"),
            ("delete set inet kpx seen", "a rule looks it up"),
            ("add rule inet kpx pick goto nowhere", "no such chain"),
            ("add rule inet kpx pick ip saddr @nothing drop", "no such set"),
            ("add element inet kpx vips { 10.0.0.1 : drop }", "other data for an existing key"),
            ("add element inet kpx vips { 10.0.0.5 : goto missing }", "no such chain"),
            ("add element inet kpx seen { 10.0.0.5 : drop }", "data in a set"),
            ("add set inet kpx seen { type ipv6_addr ; }", "declared otherwise"),
        ] {
            assert!(nft.run(script).is_err(), "{script}: {why}");
        }
        nft.run("add element inet kpx vips { 10.0.0.1 : goto pick }")
            .expect("the same data again is no change");
        nft.run("delete element inet kpx vips { 10.0.0.1 }\nflush chain inet kpx entry\ndelete chain inet kpx pick")
            .expect("nothing refers to it any more");
        let text = nft.list_table().expect("list");
        assert!(
            text.contains("\tchain entry {\n\t\ttype nat hook prerouting priority -100 ; policy accept\n\t}"),
            "{text}"
        );
        assert!(text.starts_with("table inet kpx {\n\tcomment \"managed\"\n\tset seen {\n"), "{text}");
        assert!(text.contains("\tmap vips {\n\t\ttype ipv4_addr : verdict\n\t}\n"), "{text}");
        nft.fail_next("boom");
        assert!(nft.run("add set inet kpx other { type ipv4_addr ; }").is_err());
        assert!(!nft.list_table().expect("list").contains("other"));
    }
}
