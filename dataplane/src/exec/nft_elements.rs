//! Set and map elements as nf_tables stores them: the bytes of a key or a map's data,
//! from the text kpx renders (`10.96.0.1 . tcp . 80 . 0`, `10.0.0.1 . 8080`,
//! `goto pick-v4-2`), by the layout the collection was declared with.
//!
//! A concatenation's fields each take a whole number of 32-bit registers, the value at
//! the start, zeros after: `ipv4_addr . inet_proto . inet_service` is 4 + 4 + 4 bytes,
//! the protocol one byte and the port two (network order). A `numgen` index is a 32-bit
//! integer in host order. A verdict is a code (network order) and, for `goto` and
//! `jump`, a chain's name.

use std::net::IpAddr;

use kpx_proto::family::Family;

/// One field of a key or of a map's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// An address of the family (`ipv4_addr`, `ipv6_addr`).
    Address(Family),
    /// `inet_proto`, written by name (`tcp`, `udp`, `sctp`).
    Protocol,
    /// `inet_service`: a port.
    Port,
    /// `numgen random mod N`: an endpoint's index.
    Index,
}

/// What a map's elements map to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
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
    pub data: Data,
}

/// Elements of one set or map, as text: key and, for maps, data.
#[derive(Debug, Clone)]
pub struct SetElements<'a> {
    pub set: String,
    pub layout: Layout,
    pub elements: Vec<(&'a str, Option<&'a str>)>,
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
        use super::nft::{FAMILY, TABLE};
        use std::fmt::Write as _;
        let mut script = String::new();
        for e in &self.flush {
            let kind = if e.map { "map" } else { "set" };
            let _ = writeln!(script, "flush {kind} {FAMILY} {TABLE} {}", e.set);
        }
        for (verb, sets) in [("delete", &self.delete), ("add", &self.add)] {
            for s in sets.iter().filter(|s| !s.elements.is_empty()) {
                let items: Vec<String> = s
                    .elements
                    .iter()
                    .map(|(k, d)| match d {
                        Some(d) if verb == "add" => format!("{k} : {d}"),
                        _ => (*k).to_owned(),
                    })
                    .collect();
                let _ =
                    writeln!(script, "{verb} element {FAMILY} {TABLE} {} {{ {} }}", s.set, items.join(", "));
            }
        }
        script
    }
}

/// A full sync's elements, written one at a time into a transaction that first empties
/// its sets (see [`super::nft::Nft::refill`]): nothing holds them all as text at once.
pub trait Refill {
    /// The set or map `set` of `layout`, for the elements that follow: its handle.
    fn set(&mut self, set: String, layout: Layout) -> usize;
    /// One element (key and, for a map, data, as text) of the set `handle` names.
    fn add(&mut self, handle: usize, key: &str, data: Option<&str>) -> Result<(), EncodeError>;
}

/// A [`Refill`] kept as text, to be written as an [`ElementUpdate`] (where elements are
/// not encoded one by one: the fake kernel, the nft text of a refill).
#[derive(Debug, Default)]
pub struct TextRefill {
    sets: Vec<(String, Layout, Vec<TextElement>)>,
}

/// An element's key and, for a map's, data.
type TextElement = (String, Option<String>);

impl Refill for TextRefill {
    fn set(&mut self, set: String, layout: Layout) -> usize {
        self.sets.push((set, layout, Vec::new()));
        self.sets.len() - 1
    }

    fn add(&mut self, handle: usize, key: &str, data: Option<&str>) -> Result<(), EncodeError> {
        if let Some((_, _, elements)) = self.sets.get_mut(handle) {
            elements.push((key.to_owned(), data.map(str::to_owned)));
        }
        Ok(())
    }
}

impl TextRefill {
    /// The update that empties `flush` and adds what was written.
    pub fn update(&self, flush: Vec<Emptied>) -> ElementUpdate<'_> {
        let add = self
            .sets
            .iter()
            .map(|(set, layout, elements)| SetElements {
                set: set.clone(),
                layout: layout.clone(),
                elements: elements.iter().map(|(k, d)| (k.as_str(), d.as_deref())).collect(),
            })
            .collect();
        ElementUpdate { flush, delete: vec![], add }
    }
}

/// A map element's data as nf_tables takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodedData {
    Value(Vec<u8>),
    Verdict { code: i32, chain: Option<String> },
}

/// Why an element cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("element {text:?} of {set}: {reason}")]
pub struct EncodeError {
    pub set: String,
    pub text: String,
    pub reason: String,
}

/// Verdict codes (`NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_GOTO`).
pub mod verdict {
    pub const DROP: i32 = 0;
    pub const ACCEPT: i32 = 1;
    pub const JUMP: i32 = -3;
    pub const GOTO: i32 = -4;
}

/// The key's bytes.
pub fn key(layout: &Layout, text: &str) -> Result<Vec<u8>, String> {
    fields(&layout.key, text)
}

/// The data of a map element; `None` for a set's.
pub fn data(layout: &Layout, text: Option<&str>) -> Result<Option<EncodedData>, String> {
    match (&layout.data, text) {
        (Data::None, None) => Ok(None),
        (Data::None, Some(_)) => Err("a set's element maps to nothing".into()),
        (_, None) => Err("a map's element needs data".into()),
        (Data::Fields(f), Some(text)) => Ok(Some(EncodedData::Value(fields(f, text)?))),
        (Data::Verdict, Some(text)) => Ok(Some(verdict(text)?)),
    }
}

fn verdict(text: &str) -> Result<EncodedData, String> {
    let (code, chain) = match text.split_once(' ') {
        None if text == "drop" => (verdict::DROP, None),
        None if text == "accept" => (verdict::ACCEPT, None),
        Some(("goto", chain)) => (verdict::GOTO, Some(chain)),
        Some(("jump", chain)) => (verdict::JUMP, Some(chain)),
        _ => return Err(format!("{text:?} is no verdict")),
    };
    if chain.is_some_and(|c| c.is_empty() || c.contains(char::is_whitespace)) {
        return Err(format!("{text:?} names no chain"));
    }
    Ok(EncodedData::Verdict { code, chain: chain.map(str::to_owned) })
}

fn fields(layout: &[Field], text: &str) -> Result<Vec<u8>, String> {
    let parts: Vec<&str> = text.split(" . ").collect();
    if parts.len() != layout.len() {
        return Err(format!("{} fields where {} are declared", parts.len(), layout.len()));
    }
    let mut out = Vec::with_capacity(layout.len() * 8);
    for (field, part) in layout.iter().zip(parts) {
        match field {
            Field::Address(family) => {
                let address: IpAddr = part.parse().map_err(|_| format!("{part:?} is no address"))?;
                if Family::of(&address) != *family {
                    return Err(format!("{address} is not of the set's family"));
                }
                match address {
                    IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
                    IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
                }
            }
            Field::Protocol => {
                let number: u8 = match part {
                    "tcp" => 6,
                    "udp" => 17,
                    "sctp" => 132,
                    _ => return Err(format!("{part:?} is no protocol")),
                };
                out.extend_from_slice(&[number, 0, 0, 0]);
            }
            Field::Port => {
                let port: u16 = part.parse().map_err(|_| format!("{part:?} is no port"))?;
                out.extend_from_slice(&port.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Field::Index => {
                let index: u32 = part.parse().map_err(|_| format!("{part:?} is no index"))?;
                out.extend_from_slice(&index.to_ne_bytes());
            }
        }
    }
    Ok(out)
}

/// Whether every element of `update` can be encoded; else the first that cannot.
pub fn check(update: &ElementUpdate) -> Result<(), EncodeError> {
    let refused = |s: &SetElements, text: &str, reason| EncodeError {
        set: s.set.clone(),
        text: text.to_owned(),
        reason,
    };
    for s in &update.delete {
        for (k, _) in &s.elements {
            key(&s.layout, k).map_err(|r| refused(s, k, r))?;
        }
    }
    for s in &update.add {
        for (k, d) in &s.elements {
            key(&s.layout, k).map_err(|r| refused(s, k, r))?;
            data(&s.layout, *d).map_err(|r| refused(s, k, r))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(family: Family) -> Vec<Field> {
        vec![Field::Address(family), Field::Protocol, Field::Port]
    }

    #[test]
    fn a_concatenation_takes_a_register_per_field() {
        let endpoints = Layout {
            key: [entry(Family::V4), vec![Field::Index]].concat(),
            data: Data::Fields(vec![Field::Address(Family::V4), Field::Port]),
        };
        let mut want = vec![10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0];
        want.extend_from_slice(&3u32.to_ne_bytes());
        assert_eq!(key(&endpoints, "10.96.0.1 . tcp . 80 . 3"), Ok(want));
        assert_eq!(
            data(&endpoints, Some("10.0.0.1 . 8080")),
            Ok(Some(EncodedData::Value(vec![10, 0, 0, 1, 0x1f, 0x90, 0, 0])))
        );
        let v6 = Layout { key: entry(Family::V6), data: Data::None };
        let k = key(&v6, "fd00::1 . udp . 53").expect("encoded");
        assert_eq!(k.len(), 24);
        assert_eq!(&k[16..], &[17, 0, 0, 0, 0, 53, 0, 0]);
    }

    #[test]
    fn verdicts_name_their_chain() {
        let vmap = Layout { key: entry(Family::V4), data: Data::Verdict };
        assert_eq!(
            data(&vmap, Some("goto pick-v4-2")),
            Ok(Some(EncodedData::Verdict { code: verdict::GOTO, chain: Some("pick-v4-2".into()) }))
        );
        assert_eq!(data(&vmap, Some("drop")), Ok(Some(EncodedData::Verdict { code: 0, chain: None })));
        assert!(data(&vmap, Some("goto")).is_err());
        assert!(data(&vmap, Some("reject")).is_err());
    }

    #[test]
    fn text_that_does_not_fit_the_layout_is_refused_by_field() {
        let set = Layout { key: entry(Family::V4), data: Data::None };
        assert!(key(&set, "fd00::1 . tcp . 80").expect_err("v6 in v4").contains("family"));
        assert!(key(&set, "10.0.0.1 . icmp . 80").expect_err("protocol").contains("protocol"));
        assert!(key(&set, "10.0.0.1 . tcp . 70000").expect_err("port").contains("port"));
        assert!(key(&set, "10.0.0.1 . tcp").expect_err("count").contains("2 fields"));
        assert!(data(&set, Some("x")).is_err(), "a set maps to nothing");
        let update = ElementUpdate {
            flush: vec![],
            delete: vec![],
            add: vec![SetElements {
                set: "no-endpoints-v4".into(),
                layout: set,
                elements: vec![("10.0.0.1 . tcp . 80", None), ("10.0.0.300 . tcp . 80", None)],
            }],
        };
        let e = check(&update).expect_err("the second");
        assert_eq!((e.set.as_str(), e.text.as_str()), ("no-endpoints-v4", "10.0.0.300 . tcp . 80"));
    }
}
