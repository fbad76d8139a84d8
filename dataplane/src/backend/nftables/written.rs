//! What kpx's last write to its table left, kept in the table itself: set `written` holds
//! one element, `GENERATION . HIGH . LOW` — the nf_tables generation that write produced
//! and a fingerprint of what the table then held for kpx (every Service's name and
//! version, the node context, the binary that rendered them).
//!
//! After each write the backend reads the generation `g` and writes the element
//! `g+1 . fingerprint` in a batch written against `g`, which the kernel refuses if anyone
//! committed in between: the element then says `g+1` only if the batch that wrote it was
//! the very next transaction. So when an agent starts and nf_tables' generation is still
//! the element's, nothing at all was written since kpx's last write; when the fingerprint
//! also equals that of what it is to program now, the table already holds exactly that and
//! the full sync writes nothing (it only rebuilds its bookkeeping). Anything else — a
//! generation moved by anyone (another program, a flush), a crash between the kernel's
//! commit and the store's, another node context, another binary — makes it compare with
//! the kernel or rewrite, as it did before.
//!
//! A fingerprint is 64 bits of SipHash with fixed keys (the same in every process of one
//! binary); the generation is the kernel's, so the element proves that kpx made the last
//! write, and the fingerprint what kpx believed it wrote.

use std::hash::{DefaultHasher, Hash, Hasher};

use kpx_proto::node_context::NodeContext;

use super::names::{FAMILY, TABLE};
use crate::exec::nft::elements::{
    DataLayout, ElementUpdate, Emptied, Field, Layout, SetElements, Value, Values,
};
use crate::state::NodeState;

/// The set's name.
pub const SET: &str = "written";

/// Its declaration in the table's skeleton: three 32-bit integers.
pub fn declaration() -> String {
    format!("add set {FAMILY} {TABLE} {SET} {{ type mark . mark . mark ; }}\n")
}

/// How its element is laid out (a `mark` is a 32-bit integer in host order).
pub fn layout() -> Layout {
    Layout { key: vec![Field::Index, Field::Index, Field::Index], data: DataLayout::None }
}

/// What a write left: the generation it produced and the fingerprint of the table's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub generation: u32,
    pub fingerprint: u64,
}

impl Written {
    /// The element (`G . HIGH . LOW`).
    pub fn key(&self) -> Values {
        let (high, low) = ((self.fingerprint >> 32) as u32, self.fingerprint as u32);
        Values::of(&[Value::Index(self.generation), Value::Index(high), Value::Index(low)])
    }

    /// The element as the kernel holds it (three 32-bit integers in host order).
    pub fn read(key: &[u8]) -> Option<Written> {
        let word = |i: usize| key.get(i * 4..i * 4 + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        let (generation, high, low) = (word(0)?, word(1)?, word(2)?);
        (key.len() == 12)
            .then_some(Written { generation, fingerprint: u64::from(high) << 32 | u64::from(low) })
    }
}

/// The update that empties the set (nothing certified).
pub fn forget() -> ElementUpdate<'static> {
    ElementUpdate { flush: vec![Emptied { set: SET.into(), map: false }], delete: vec![], add: vec![] }
}

/// [`forget`], then the element `key`.
pub fn replace_with(key: &Values) -> ElementUpdate<'_> {
    let mut update = forget();
    update.add.push(SetElements { set: SET.into(), layout: layout(), elements: vec![(key, None)] });
    update
}

/// One Service's part of a fingerprint: its name and version (the control plane's
/// content version: another view, another version).
pub fn service_part(name: &str, version: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (name, version).hash(&mut h);
    h.finish()
}

/// The fingerprint of a table holding the Services whose parts XOR to `services`,
/// rendered in `context` by the binary `binary`. (The pick chains are not in it: the
/// table may hold more than a full sync would write — changes add them, none removes
/// them —, which is harmless.)
pub fn fingerprint(binary: u64, context: &NodeContext, services: u64) -> u64 {
    let mut h = DefaultHasher::new();
    (binary, super::names::LAYOUT_COMMENT, context).hash(&mut h);
    h.finish() ^ services
}

/// The fingerprint of a table holding `desired` in `context` (see [`fingerprint`]).
pub fn fingerprint_of(binary: u64, context: &NodeContext, desired: &NodeState) -> u64 {
    let services = desired.services.iter().fold(0, |x, (name, s)| x ^ service_part(name, &s.version));
    fingerprint(binary, context, services)
}

/// What identifies the running binary: its version, and the size and modification time
/// of its file (another build renders, perhaps, otherwise). 0 when it cannot be read.
pub fn binary_identity() -> u64 {
    let file = std::env::current_exe().and_then(std::fs::metadata);
    let mut h = DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut h);
    match file {
        Ok(m) => (m.len(), m.modified().ok()).hash(&mut h),
        Err(_) => return 0,
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_element_reads_back_as_it_was_written() {
        let w = Written { generation: 41, fingerprint: 0x0123_4567_89ab_cdef };
        let key = crate::exec::nft::elements::key(&layout(), &w.key()).expect("encoded");
        let key = key.as_bytes();
        assert_eq!(Written::read(key), Some(w));
        assert_eq!(Written::read(&key[..8]), None, "too short");
    }
}
