//! How a full sync reaches kpx's table: emptied and filled again in place, keeping every
//! kernel object a packet may be using as the transaction commits. Its rules and the
//! interval sets are one nft script; the elements of the other sets and maps are either
//! in that script too or, when the script deletes nothing ([`Elements::Apart`]), one
//! netlink element update right after it that empties and refills those sets: between
//! the two, they hold their old elements, which the old rules were written for (a full
//! sync rewrites the same rules unless the node context changed), never nothing.
//!
//! A packet runs the rules of the generation it entered nf_tables in, but each set lookup
//! sees the generation of the moment it happens. A packet entering just before the commit
//! thus meets old rules and new set contents. Where those are the same objects, that is
//! harmless: a key flushed and added again is found. Where an old rule uses a set the
//! transaction deletes, the lookup misses: the connection gets no NAT (a null binding it
//! keeps for its life). Replacing the table whole (`delete table`, `add table`) does
//! exactly that for every set, and swaps the base chains' hooks as well: it lost 1–2
//! connections in 400 full syncs under a prober (`full_syncs_under_traffic`). So while the
//! table exists, a full sync, before adding everything again:
//! 1. flushes every chain's rules, except the pick chains when the kernel has every pick
//!    chain wanted (their names say all their rules depend on): those stay as they are,
//!    and so do the endpoint maps they use;
//! 2. flushes every set and map, except the session-affinity client sets that stay (their
//!    clients keep their endpoint);
//! 3. deletes the chains, sets and maps that are no longer wanted and, when the pick
//!    chains are written again, the endpoint maps, which nft 1.0.6 needs declared in the
//!    same transaction (see [`super::skeleton`]): only a full sync that grows the pick
//!    chains takes that risk.
//!
//! The table's comment names its layout ([`COMMENT`]); a table of another layout (made by
//! another version of kpx, whose sets may be declared otherwise) is replaced whole, once
//! ([`replace_script`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::affinity;
use super::names::{self, Collection, Element, FAMILY, LAYOUT_COMMENT as COMMENT, TABLE};
use super::skeleton;

pub use crate::exec::nft::Outline;

impl Outline {
    /// Whether the table is of this version's layout, so that it can be refilled in place.
    pub fn is_current(&self) -> bool {
        self.comment.as_deref() == Some(COMMENT)
    }

    /// What `add chain|set|map inet kpx NAME …` commands declare.
    pub fn declared_by(script: &str) -> Outline {
        let prefix = format!(" {FAMILY} {TABLE} ");
        let mut outline = Outline::default();
        for line in script.lines() {
            let Some(rest) = line.strip_prefix("add ") else { continue };
            let Some((kind, rest)) = rest.split_once(&prefix) else { continue };
            if let Some(name) = rest.split_whitespace().next() {
                outline.insert(kind, name);
            }
        }
        outline
    }

    fn insert(&mut self, kind: &str, name: &str) {
        let to = match kind {
            "chain" => &mut self.chains,
            "set" => &mut self.sets,
            "map" => &mut self.maps,
            _ => return,
        };
        to.insert(name.to_owned());
    }
}

/// What a full sync writes into an emptied table: the fixed part and every Service's
/// chains and interval-set elements as `add` commands (`script`), the pick chains it keeps
/// as they are, and, when they go in the script, the other elements (`elements`, empty
/// until [`super::programmed::Programmed::updatable_elements`] fills it: when they are written apart,
/// [`super::programmed::Programmed::full_writing`] streams them instead).
#[derive(Debug, Default)]
pub struct Contents {
    pub script: String,
    pub elements: BTreeSet<Element>,
    pub kept_pick_chains: BTreeSet<String>,
}

impl Contents {
    /// Appends the script to `out`, and the elements too when they go in it (last: their
    /// verdicts name chains of the script).
    pub fn write(&self, out: &mut String, elements: Elements) {
        out.push_str(&self.script);
        if elements == Elements::InScript {
            names::element_commands(out, "add", &self.elements);
        }
    }

    /// Everything as `add` commands.
    #[cfg(test)]
    pub fn whole_script(&self) -> String {
        let mut script = String::new();
        self.write(&mut script, Elements::InScript);
        script
    }
}

/// Where a full sync writes the elements of the updatable sets and maps (every one but
/// the interval sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elements {
    /// In the script, last: the whole full sync is one transaction.
    InScript,
    /// In the element update that follows the script (it
    /// empties those sets and fills them again, one transaction of its own); the script
    /// leaves them as they are, so that in between they hold what they held before.
    Apart,
}

/// The transaction that creates kpx's table (there is none) holding `contents` (the whole
/// table as `add` commands into an empty one).
pub fn create_script(contents: &Contents, elements: Elements) -> String {
    let mut script = format!("add table {FAMILY} {TABLE} {{ comment \"{COMMENT}\" ; }}\n");
    contents.write(&mut script, elements);
    script
}

/// The transaction that empties kpx's table, which holds `existing` and is of the current
/// layout, but for the pick chains `contents` keeps (and their endpoint maps' declarations),
/// and fills it with `contents`.
pub fn refill_script(existing: &Outline, contents: &Contents) -> String {
    refill(existing, contents, Elements::InScript).0
}

/// [`refill_script`] with the elements [`Elements::Apart`]; `None` when the table holds a
/// chain, set or map to delete: a deleted chain may still be the verdict of an element the
/// script leaves, and a map declared again would be empty until the update (the caller
/// then writes everything in one script).
pub fn refill_script_apart(existing: &Outline, contents: &Contents) -> Option<String> {
    let (script, deletes) = refill(existing, contents, Elements::Apart);
    (!deletes).then_some(script)
}

/// The refill, and whether it deletes anything.
fn refill(existing: &Outline, contents: &Contents, elements: Elements) -> (String, bool) {
    let mut script = String::with_capacity(contents.script.len() + 4096);
    let deletes = empty_in_place(
        &mut script,
        existing,
        &Outline::declared_by(&contents.script),
        &contents.kept_pick_chains,
        elements,
    );
    contents.write(&mut script, elements);
    (script, deletes)
}

/// The transaction that replaces kpx's table whole (whether or not it exists) with one
/// holding `contents`.
pub fn replace_script(contents: &Contents) -> String {
    let t = format!("{FAMILY} {TABLE}");
    // Adding first makes the delete valid whether or not the table exists.
    format!("add table {t}\ndelete table {t}\n{}", create_script(contents, Elements::InScript))
}

/// Writes the commands that empty the table; whether they delete anything.
fn empty_in_place(
    s: &mut String,
    existing: &Outline,
    wanted: &Outline,
    kept: &BTreeSet<String>,
    elements: Elements,
) -> bool {
    let t = format!("{FAMILY} {TABLE}");
    let updatable: BTreeSet<String> = match elements {
        Elements::InScript => BTreeSet::new(),
        Elements::Apart => Collection::all().filter(|c| c.updatable()).map(Collection::name).collect(),
    };
    let _ = writeln!(s, "add table {t}");
    // Rules first: nothing then refers to a set or chain but the elements of maps.
    for name in existing.chains.difference(kept) {
        let _ = writeln!(s, "flush chain {t} {name}");
    }
    let replaced: BTreeSet<String> = skeleton::replaced_maps().collect();
    let mut deletes = String::new();
    for (kind, have, want) in [("map", &existing.maps, &wanted.maps), ("set", &existing.sets, &wanted.sets)] {
        for name in have {
            let redeclared = kept.is_empty() && replaced.contains(name);
            if !want.contains(name) || redeclared {
                let _ = writeln!(deletes, "delete {kind} {t} {name}");
            } else if !name.starts_with(affinity::PREFIX) && !updatable.contains(name) {
                let _ = writeln!(s, "flush {kind} {t} {name}");
            }
        }
    }
    // Chains once no map element goes to them; sets once no rule looks them up.
    let mut any = !deletes.is_empty();
    for name in existing.chains.iter().filter(|c| !wanted.chains.contains(*c) && !kept.contains(*c)) {
        let _ = writeln!(s, "delete chain {t} {name}");
        any = true;
    }
    s.push_str(&deletes);
    any
}

#[cfg(test)]
mod tests;
