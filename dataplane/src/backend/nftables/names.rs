//! The vocabulary of kpx's nftables table: its families, its named sets and
//! maps, their elements, and how they are written as `nft -f` text.
//!
//! ```text
//! table inet kpx
//!   map service-ips-v4          entry : verdict      goto pick-v4-N | goto sa-… | drop
//!   map endpoints-v4            entry . index : endpoint . port
//!   map external-local-v4       entry : verdict      (externalTrafficPolicy Local, external sources)
//!   set external-local-entries-v4  entry             its keys (the node's own traffic to them is masqueraded)
//!   map local-endpoints-v4      entry . index : endpoint . port
//!   set no-endpoints-v4         entry                rejected in the filter hooks
//!   set masquerade-v4           entry                always masqueraded (external, policy Cluster)
//!   set cluster-entries-v4      entry                masqueraded unless from local-cidrs-v4
//!   set local-cidrs-v4          prefix               the local-traffic detector (pod CIDRs)
//!   set lb-filtered-v4          entry                load-balancer entries with source ranges
//!   set lb-allowed-v4           entry . prefix       the sources they allow
//!   set hairpin-v4              endpoint . endpoint  masqueraded (a pod reaching itself)
//! ```
//! where an *entry* is `address . protocol . port`: a ClusterIP, an external
//! or load-balancer IP, or a node address with a NodePort. The same exists
//! with `-v6`. Every packet costs a few hash lookups whatever the number of
//! Services; an endpoint change rewrites only that Service's elements.
//! The chains are in [`super::skeleton`]; per-Service content in [`super::service`].

use std::fmt;
use std::net::IpAddr;

use crate::backend::owners::EntryKey;
use crate::exec::nft::elements::{
    element_command, Data, DataLayout, ElementText, ElementUpdate, Emptied, Field, Layout, SetElements,
    Value, Values, Verdict,
};

pub use crate::exec::nft::{FAMILY, TABLE};

/// The comment of kpx's table, naming its layout: change the number whenever a set, map
/// or base chain is declared otherwise, so that tables of the old layout are replaced
/// whole (see [`super::outline`]).
pub const LAYOUT_COMMENT: &str = "managed by kpx-dataplane, layout 3";

/// The packet mark bit that asks nat-postrouting to masquerade.
pub const MASQUERADE_MARK: u32 = 0x2000;

pub use crate::backend::Family;

/// How nft spells a family.
pub trait NftFamily {
    /// The payload keyword (`ip` / `ip6`).
    fn nft(self) -> &'static str;
    /// The address type of sets and maps.
    fn addr_type(self) -> &'static str;
}

impl NftFamily for Family {
    fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    fn addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }
}

/// `address:port` as nft writes a NAT target (`[fd00::1]:80` for IPv6).
pub fn socket_text(address: &IpAddr, port: u16) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// A named set or map of kpx's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collection {
    ServiceIps(Family),
    Endpoints(Family),
    ExternalLocal(Family),
    /// The keys of `ExternalLocal`, as a set: older kernels refuse a plain lookup in a map
    /// (Linux 6.1 answers EINVAL), so the rule that only asks "is it there" uses this.
    ExternalLocalEntries(Family),
    LocalEndpoints(Family),
    NoEndpoints(Family),
    Masquerade(Family),
    ClusterEntries(Family),
    LocalCidrs(Family),
    LbFiltered(Family),
    LbAllowed(Family),
    Hairpin(Family),
    /// Every ClusterIP: traffic still addressed to one after DNAT matched no port of it.
    ClusterIps(Family),
    /// The cluster's ServiceCIDR ranges: traffic to an address in them that is no
    /// ClusterIP is dropped.
    ServiceCidrs(Family),
}

impl Collection {
    pub fn family(self) -> Family {
        match self {
            Collection::ServiceIps(f)
            | Collection::Endpoints(f)
            | Collection::ExternalLocal(f)
            | Collection::ExternalLocalEntries(f)
            | Collection::LocalEndpoints(f)
            | Collection::NoEndpoints(f)
            | Collection::Masquerade(f)
            | Collection::ClusterEntries(f)
            | Collection::LocalCidrs(f)
            | Collection::LbFiltered(f)
            | Collection::LbAllowed(f)
            | Collection::Hairpin(f)
            | Collection::ClusterIps(f)
            | Collection::ServiceCidrs(f) => f,
        }
    }

    /// How its elements are laid out, as [`super::skeleton`] declares it; `None` for the
    /// interval sets (their elements are ranges, written by nft only).
    pub fn layout(self) -> Option<Layout> {
        if !self.updatable() {
            return None;
        }
        let f = self.family();
        let entry = || vec![Field::Address(f), Field::Protocol, Field::Port];
        let endpoint = || DataLayout::Fields(vec![Field::Address(f), Field::Port]);
        Some(match self {
            Collection::ServiceIps(_) | Collection::ExternalLocal(_) => {
                Layout { key: entry(), data: DataLayout::Verdict }
            }
            Collection::Endpoints(_) | Collection::LocalEndpoints(_) => {
                Layout { key: [entry(), vec![Field::Index]].concat(), data: endpoint() }
            }
            Collection::ExternalLocalEntries(_)
            | Collection::NoEndpoints(_)
            | Collection::Masquerade(_)
            | Collection::ClusterEntries(_)
            | Collection::LbFiltered(_) => Layout { key: entry(), data: DataLayout::None },
            Collection::Hairpin(_) => {
                Layout { key: vec![Field::Address(f), Field::Address(f)], data: DataLayout::None }
            }
            Collection::ClusterIps(_) => Layout { key: vec![Field::Address(f)], data: DataLayout::None },
            Collection::LocalCidrs(_) | Collection::LbAllowed(_) | Collection::ServiceCidrs(_) => {
                return None
            }
        })
    }

    /// Every collection of the table, both families.
    pub fn all() -> impl Iterator<Item = Collection> {
        Family::ALL.into_iter().flat_map(|f| {
            [
                Collection::ServiceIps(f),
                Collection::Endpoints(f),
                Collection::ExternalLocal(f),
                Collection::ExternalLocalEntries(f),
                Collection::LocalEndpoints(f),
                Collection::NoEndpoints(f),
                Collection::Masquerade(f),
                Collection::ClusterEntries(f),
                Collection::LocalCidrs(f),
                Collection::LbFiltered(f),
                Collection::LbAllowed(f),
                Collection::Hairpin(f),
                Collection::ClusterIps(f),
                Collection::ServiceCidrs(f),
            ]
        })
    }

    /// Whether element updates write its elements (every collection but the interval sets,
    /// whose elements are ranges, written by nft only). Asked per element: allocates nothing.
    pub fn updatable(self) -> bool {
        !matches!(self, Collection::LocalCidrs(_) | Collection::LbAllowed(_) | Collection::ServiceCidrs(_))
    }

    pub fn name(self) -> String {
        let base = match self {
            Collection::ServiceIps(_) => "service-ips",
            Collection::Endpoints(_) => "endpoints",
            Collection::ExternalLocal(_) => "external-local",
            Collection::ExternalLocalEntries(_) => "external-local-entries",
            Collection::LocalEndpoints(_) => "local-endpoints",
            Collection::NoEndpoints(_) => "no-endpoints",
            Collection::Masquerade(_) => "masquerade",
            Collection::ClusterEntries(_) => "cluster-entries",
            Collection::LocalCidrs(_) => "local-cidrs",
            Collection::LbFiltered(_) => "lb-filtered",
            Collection::LbAllowed(_) => "lb-allowed",
            Collection::Hairpin(_) => "hairpin",
            Collection::ClusterIps(_) => "cluster-ips",
            Collection::ServiceCidrs(_) => "service-cidrs",
        };
        format!("{base}-{}", self.family().suffix())
    }
}

/// One element of a set or map: typed values, written to the kernel as they are and
/// as nft text where text is wanted ([`fmt::Display`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub collection: Collection,
    pub key: Values,
    /// The mapped value; `None` for set elements.
    pub value: Option<Data>,
}

impl Element {
    pub fn set(collection: Collection, key: Values) -> Self {
        Element { collection, key, value: None }
    }

    pub fn map(collection: Collection, key: Values, value: Data) -> Self {
        Element { collection, key, value: Some(value) }
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", ElementText(&self.key, self.value.as_ref()))
    }
}

/// An entry's key: `address . protocol . port`.
pub fn entry(key: &EntryKey) -> Values {
    Values::of(&[Value::Address(key.address), Value::Protocol(key.protocol), Value::Port(key.port)])
}

/// An endpoint as a NAT target's map data: `address . port`.
pub fn endpoint(address: IpAddr, port: u16) -> Data {
    Data::Values(Values::of(&[Value::Address(address), Value::Port(port)]))
}

/// The verdict that sends to `chain`.
pub fn goto(chain: &str) -> Data {
    Data::Verdict(Verdict::Goto(chain.to_owned()))
}

/// The verdict that drops.
pub fn drop_verdict() -> Data {
    Data::Verdict(Verdict::Drop)
}

/// An element several Services may need (counted, not owned): an endpoint's hairpin
/// pair or a ClusterIP, kept as its address (compact at 250k endpoints), rendered on
/// demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shared {
    Hairpin(IpAddr),
    ClusterIp(IpAddr),
}

impl Shared {
    pub fn element(self) -> Element {
        match self {
            Shared::Hairpin(a) => Element::set(
                Collection::Hairpin(Family::of(&a)),
                Values::of(&[Value::Address(a), Value::Address(a)]),
            ),
            Shared::ClusterIp(a) => {
                Element::set(Collection::ClusterIps(Family::of(&a)), Values::of(&[Value::Address(a)]))
            }
        }
    }
}

/// At most this many elements per command, to keep lines reasonable for nft's parser.
const ELEMENTS_PER_COMMAND: usize = 1000;

/// `add element` / `delete element` commands for many elements, grouped per collection.
pub fn element_commands<'a>(out: &mut String, verb: &str, elements: impl IntoIterator<Item = &'a Element>) {
    let mut by_collection: std::collections::BTreeMap<Collection, Vec<&Element>> = Default::default();
    for e in elements {
        by_collection.entry(e.collection).or_default().push(e);
    }
    for (collection, elements) in by_collection {
        for chunk in elements.chunks(ELEMENTS_PER_COMMAND) {
            let chunk = chunk.iter().map(|e| (&e.key, e.value.as_ref().filter(|_| verb != "delete")));
            element_command(out, verb, &collection.name(), chunk);
        }
    }
}

/// The deletion of `deletes`, then the addition of `adds`, as one element update; `None`
/// when one of them is of an interval set (nft text only).
pub fn element_update<'a>(
    deletes: impl IntoIterator<Item = &'a Element>,
    adds: impl IntoIterator<Item = &'a Element>,
) -> Option<ElementUpdate<'a>> {
    fn grouped<'a>(elements: impl IntoIterator<Item = &'a Element>) -> Option<Vec<SetElements<'a>>> {
        let mut by_collection: std::collections::BTreeMap<Collection, Vec<(&'a Values, Option<&'a Data>)>> =
            Default::default();
        for e in elements {
            by_collection.entry(e.collection).or_default().push((&e.key, e.value.as_ref()));
        }
        by_collection
            .into_iter()
            .map(|(c, elements)| Some(SetElements { set: c.name(), layout: c.layout()?, elements }))
            .collect()
    }
    Some(ElementUpdate { flush: vec![], delete: grouped(deletes)?, add: grouped(adds)? })
}

/// Every updatable collection, as a refill empties them first (a full sync's elements).
pub fn refill_flush() -> Vec<Emptied> {
    Collection::all()
        .filter_map(|c| Some(Emptied { set: c.name(), map: c.layout()?.data != DataLayout::None }))
        .collect()
}

/// Removes kpx's table, whether or not it exists.
pub fn cleanup_script() -> String {
    format!("add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n")
}
