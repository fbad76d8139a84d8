//! Set and map elements as typed values (`10.96.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080`,
//! `… : goto pick-v4-2`), written as nf_tables stores them by the layout the collection
//! was declared with, or as nft text where text is wanted (scripts, dry runs, logs).
//!
//! A concatenation's fields each take a whole number of 32-bit registers, the value at
//! the start, zeros after: `ipv4_addr . inet_proto . inet_service` is 4 + 4 + 4 bytes,
//! the protocol one byte and the port two (network order). A `numgen` index is a 32-bit
//! integer in host order. A verdict is a code (network order) and, for `goto` and
//! `jump`, a chain's name. The only way an element cannot be written is a value that does
//! not fit the layout (a bug of kpx's, reported as such).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kpx_proto::family::Family;
use kpx_proto::types::Protocol;

/// One field of a key or of a map's data, as the collection declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// An address of the family (`ipv4_addr`, `ipv6_addr`).
    Address(Family),
    /// `inet_proto`, written by name (`tcp`, `udp`, `sctp`).
    Protocol,
    /// `inet_service`: a port.
    Port,
    /// `numgen random mod N`: an endpoint's index (and any 32-bit `mark`).
    Index,
}

/// What a collection's elements map to, as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataLayout {
    /// A set: nothing.
    None,
    /// A concatenation of fields.
    Fields(Vec<Field>),
    /// A verdict map: `drop`, `accept`, `goto CHAIN`, `jump CHAIN`.
    Verdict,
}

/// How a collection's elements are laid out (what it was declared with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub key: Vec<Field>,
    pub data: DataLayout,
}

/// One value of a key or of a map's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Address(IpAddr),
    Protocol(Protocol),
    Port(u16),
    Index(u32),
    /// A prefix: the elements of interval sets, which only nft's text writes.
    Prefix(IpNet),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Address(a) => write!(f, "{a}"),
            Value::Protocol(p) => write!(f, "{p}"),
            Value::Port(p) => write!(f, "{p}"),
            Value::Index(i) => write!(f, "{i}"),
            Value::Prefix(p) => write!(f, "{p}"),
        }
    }
}

/// The most values a concatenation of kpx's holds (`entry . index`, `entry . prefix`).
const MOST_VALUES: usize = 4;

/// A concatenation of values (`10.96.0.1 . tcp . 80`), held inline: no allocation.
#[derive(Clone, Copy)]
pub struct Values {
    items: [Value; MOST_VALUES],
    len: u8,
}

impl Values {
    /// `values`, of which there are at most four (a layout of kpx's has no more).
    pub fn of(values: &[Value]) -> Values {
        let mut items = [Value::Index(0); MOST_VALUES];
        let len = values.len().min(MOST_VALUES);
        items[..len].copy_from_slice(&values[..len]);
        debug_assert_eq!(len, values.len(), "more values than a concatenation holds");
        Values { items, len: len as u8 }
    }

    /// These values and then `more` (as many as fit).
    pub fn then(&self, more: Value) -> Values {
        let mut out = *self;
        if let Some(slot) = out.items.get_mut(usize::from(out.len)) {
            *slot = more;
            out.len += 1;
        }
        out
    }

    pub fn as_slice(&self) -> &[Value] {
        &self.items[..usize::from(self.len)]
    }
}

impl PartialEq for Values {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Values {}

impl PartialOrd for Values {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Values {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl std::hash::Hash for Values {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

impl fmt::Display for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// A verdict map's data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Drop,
    Accept,
    Goto(String),
    Jump(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Drop => f.write_str("drop"),
            Verdict::Accept => f.write_str("accept"),
            Verdict::Goto(chain) => write!(f, "goto {chain}"),
            Verdict::Jump(chain) => write!(f, "jump {chain}"),
        }
    }
}

/// What a map's element maps to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Data {
    Values(Values),
    Verdict(Verdict),
}

impl fmt::Display for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Data::Values(v) => write!(f, "{v}"),
            Data::Verdict(v) => write!(f, "{v}"),
        }
    }
}

/// An element as nft writes it: `KEY` or `KEY : DATA`.
pub struct ElementText<'a>(pub &'a Values, pub Option<&'a Data>);

impl fmt::Display for ElementText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(data) => write!(f, "{} : {data}", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

/// Elements of one set or map: key and, for maps, data.
#[derive(Debug, Clone)]
pub struct SetElements<'a> {
    pub set: String,
    pub layout: Layout,
    pub elements: Vec<(&'a Values, Option<&'a Data>)>,
}

/// One nft command on elements of `set` of kpx's table, as a line:
/// `{verb} element inet kpx {set} { key [: data], … }`.
pub fn element_command<'a>(
    out: &mut String,
    verb: &str,
    set: &str,
    elements: impl IntoIterator<Item = (&'a Values, Option<&'a Data>)>,
) {
    use super::table::{FAMILY, TABLE};
    use std::fmt::Write as _;
    let _ = write!(out, "{verb} element {FAMILY} {TABLE} {set} {{ ");
    for (i, (key, data)) in elements.into_iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        let _ = write!(out, "{separator}{}", ElementText(key, data));
    }
    out.push_str(" }\n");
}

/// A set or map an update empties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emptied {
    pub set: String,
    pub map: bool,
}

/// One transaction: sets and maps emptied, then element deletions, then additions.
#[derive(Debug, Clone, Default)]
pub struct ElementUpdate<'a> {
    /// Sets and maps whose every element goes first (a full sync refilling them).
    pub flush: Vec<Emptied>,
    pub delete: Vec<SetElements<'a>>,
    pub add: Vec<SetElements<'a>>,
}

impl ElementUpdate<'_> {
    pub fn is_empty(&self) -> bool {
        self.flush.is_empty() && self.delete.iter().chain(&self.add).all(|s| s.elements.is_empty())
    }

    /// The same transaction as nft text (`flush set`, `delete element`, `add element`).
    pub fn script(&self) -> String {
        use super::table::{FAMILY, TABLE};
        use std::fmt::Write as _;
        let mut script = String::new();
        for e in &self.flush {
            let kind = if e.map { "map" } else { "set" };
            let _ = writeln!(script, "flush {kind} {FAMILY} {TABLE} {}", e.set);
        }
        for (verb, sets) in [("delete", &self.delete), ("add", &self.add)] {
            for s in sets.iter().filter(|s| !s.elements.is_empty()) {
                let elements = s.elements.iter().map(|(key, data)| (*key, data.filter(|_| verb == "add")));
                element_command(&mut script, verb, &s.set, elements);
            }
        }
        script
    }
}

/// A full sync's elements, written one at a time into a transaction that first empties
/// its sets (see [`super::Nft::refill`]): nothing holds them all at once.
pub trait Refill {
    /// The set or map `set` of `layout`, for the elements that follow: its handle.
    fn set(&mut self, set: String, layout: Layout) -> usize;
    /// One element (key and, for a map, data) of the set `handle` names.
    fn add(&mut self, handle: usize, key: &Values, data: Option<&Data>) -> Result<(), EncodeError>;
}

/// A [`Refill`] that keeps its elements, to be written as an [`ElementUpdate`] (where
/// elements are not encoded one by one: the fake kernel, the nft text of a refill).
#[derive(Debug, Default)]
pub struct HeldRefill {
    sets: Vec<(String, Layout, Vec<HeldElement>)>,
}

/// An element a [`HeldRefill`] keeps: its key and, for a map's, data.
type HeldElement = (Values, Option<Data>);

impl Refill for HeldRefill {
    fn set(&mut self, set: String, layout: Layout) -> usize {
        self.sets.push((set, layout, Vec::new()));
        self.sets.len() - 1
    }

    fn add(&mut self, handle: usize, key: &Values, data: Option<&Data>) -> Result<(), EncodeError> {
        if let Some((_, _, elements)) = self.sets.get_mut(handle) {
            elements.push((*key, data.cloned()));
        }
        Ok(())
    }
}

impl HeldRefill {
    /// The update that empties `flush` and adds what was written.
    pub fn update(&self, flush: Vec<Emptied>) -> ElementUpdate<'_> {
        let add = self
            .sets
            .iter()
            .map(|(set, layout, elements)| SetElements {
                set: set.clone(),
                layout: layout.clone(),
                elements: elements.iter().map(|(k, d)| (k, d.as_ref())).collect(),
            })
            .collect();
        ElementUpdate { flush, delete: vec![], add }
    }
}

/// The bytes of a key or of a map's data, as the kernel holds them (at most four fields
/// of at most 16 bytes each), held inline.
#[derive(Clone, Copy)]
pub struct Encoded {
    bytes: [u8; 64],
    len: usize,
}

impl Encoded {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(slot) = self.bytes.get_mut(self.len..end) {
            slot.copy_from_slice(bytes);
            self.len = end;
        }
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_bytes())
    }
}

impl PartialEq for Encoded {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Encoded {}

/// A map element's data as nf_tables takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodedData<'a> {
    Value(Encoded),
    Verdict { code: i32, chain: Option<&'a str> },
}

/// An element whose values do not fit the layout of its set: kpx built it wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("element {element} of {set} does not fit its layout: {reason}")]
pub struct EncodeError {
    pub set: String,
    pub element: String,
    pub reason: String,
}

impl EncodeError {
    pub fn of(set: &str, key: &Values, data: Option<&Data>, reason: String) -> EncodeError {
        EncodeError { set: set.to_owned(), element: ElementText(key, data).to_string(), reason }
    }
}

/// Verdict codes (`NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_GOTO`).
pub mod verdict {
    pub const DROP: i32 = 0;
    pub const ACCEPT: i32 = 1;
    pub const JUMP: i32 = -3;
    pub const GOTO: i32 = -4;
}

/// The key's bytes.
pub fn key(layout: &Layout, key: &Values) -> Result<Encoded, String> {
    fields(&layout.key, key)
}

/// The data of a map element; `None` for a set's.
pub fn data<'d>(layout: &Layout, data: Option<&'d Data>) -> Result<Option<EncodedData<'d>>, String> {
    match (&layout.data, data) {
        (DataLayout::None, None) => Ok(None),
        (DataLayout::None, Some(_)) => Err("a set's element maps to nothing".into()),
        (_, None) => Err("a map's element needs data".into()),
        (DataLayout::Fields(f), Some(Data::Values(v))) => Ok(Some(EncodedData::Value(fields(f, v)?))),
        (DataLayout::Verdict, Some(Data::Verdict(v))) => Ok(Some(verdict(v)?)),
        (DataLayout::Fields(_), Some(Data::Verdict(v))) => {
            Err(format!("verdict {v} where values are declared"))
        }
        (DataLayout::Verdict, Some(Data::Values(v))) => Err(format!("{v} where a verdict is declared")),
    }
}

fn verdict(v: &Verdict) -> Result<EncodedData<'_>, String> {
    let (code, chain) = match v {
        Verdict::Drop => (verdict::DROP, None),
        Verdict::Accept => (verdict::ACCEPT, None),
        Verdict::Goto(chain) => (verdict::GOTO, Some(chain.as_str())),
        Verdict::Jump(chain) => (verdict::JUMP, Some(chain.as_str())),
    };
    if chain.is_some_and(|c| c.is_empty() || c.contains(char::is_whitespace)) {
        return Err(format!("{v:?} names no chain"));
    }
    Ok(EncodedData::Verdict { code, chain })
}

fn fields(layout: &[Field], values: &Values) -> Result<Encoded, String> {
    let values = values.as_slice();
    if values.len() != layout.len() {
        return Err(format!("{} values where {} fields are declared", values.len(), layout.len()));
    }
    let mut out = Encoded { bytes: [0; 64], len: 0 };
    for (field, value) in layout.iter().zip(values) {
        match (field, value) {
            (Field::Address(family), Value::Address(address)) => {
                if Family::of(address) != *family {
                    return Err(format!("{address} is not of the set's family"));
                }
                match address {
                    IpAddr::V4(a) => out.push(&a.octets()),
                    IpAddr::V6(a) => out.push(&a.octets()),
                }
            }
            (Field::Protocol, Value::Protocol(p)) => {
                let number: u8 = match p {
                    Protocol::Tcp => 6,
                    Protocol::Udp => 17,
                    Protocol::Sctp => 132,
                };
                out.push(&[number, 0, 0, 0]);
            }
            (Field::Port, Value::Port(port)) => {
                out.push(&port.to_be_bytes());
                out.push(&[0, 0]);
            }
            (Field::Index, Value::Index(index)) => out.push(&index.to_ne_bytes()),
            (field, value) => return Err(format!("{value} where {field:?} is declared")),
        }
    }
    Ok(out)
}

/// Whether every element of `update` can be encoded; else the first that cannot.
pub fn check(update: &ElementUpdate) -> Result<(), EncodeError> {
    for s in &update.delete {
        for (k, _) in &s.elements {
            key(&s.layout, k).map_err(|r| EncodeError::of(&s.set, k, None, r))?;
        }
    }
    for s in &update.add {
        for (k, d) in &s.elements {
            key(&s.layout, k).map_err(|r| EncodeError::of(&s.set, k, *d, r))?;
            data(&s.layout, *d).map_err(|r| EncodeError::of(&s.set, k, *d, r))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
