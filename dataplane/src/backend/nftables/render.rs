//! What kpx's nftables table looks like, as `nft -f` text.
//!
//! ```text
//! table inet kpx
//!   map service-ips-v4   vip . proto . port            : goto pick-v4-N
//!   map endpoints-v4     vip . proto . port . index    : endpoint . port
//!   set no-endpoints-v4  vip . proto . port             (rejected)
//!   set hairpin-v4       endpoint . endpoint            (masqueraded)
//!   chain pick-v4-N      dnat to (vip . proto . port . numgen random mod N) via endpoints-v4
//! ```
//! and the same with `-v6`. Every packet costs one map lookup to find its
//! Service and one to find its endpoint, whatever the number of Services;
//! an endpoint change rewrites only that Service's elements.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use kpx_proto::types::ServiceView;

pub const FAMILY: &str = "inet";
pub const TABLE: &str = "kpx";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }

    /// The nft payload keyword of this family (`ip` / `ip6`).
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

/// A named set or map of kpx's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collection {
    ServiceIps(Family),
    Endpoints(Family),
    NoEndpoints(Family),
    Hairpin(Family),
}

impl Collection {
    pub fn name(self) -> String {
        let (base, family) = match self {
            Collection::ServiceIps(f) => ("service-ips", f),
            Collection::Endpoints(f) => ("endpoints", f),
            Collection::NoEndpoints(f) => ("no-endpoints", f),
            Collection::Hairpin(f) => ("hairpin", f),
        };
        format!("{base}-{}", family.suffix())
    }
}

/// One element of a set or map, in nft syntax.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub collection: Collection,
    pub key: String,
    /// The mapped value; `None` for set elements.
    pub value: Option<String>,
}

impl Element {
    fn text(&self) -> String {
        match &self.value {
            Some(v) => format!("{} : {v}", self.key),
            None => self.key.clone(),
        }
    }
}

/// Everything one Service needs in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// `vip . proto . port` of each entry point, with its family: the keys this Service owns.
    pub entries: Vec<(Family, String)>,
    /// Elements only this Service uses, grouped under the entry they belong to.
    pub elements: Vec<(String, Element)>,
    /// Elements several Services may share (counted, not owned).
    pub shared: BTreeSet<Element>,
    /// The most endpoints one of its ports picks from (the pick chain it needs).
    pub max_endpoints: usize,
}

pub fn pick_chain_name(family: Family, endpoints: usize) -> String {
    format!("pick-{}-{endpoints}", family.suffix())
}

/// The elements a Service needs.
pub fn service_rules(view: &ServiceView) -> ServiceRules {
    let mut rules = ServiceRules::default();
    for vip in &view.cluster_ips {
        let family = Family::of(vip);
        for port in &view.ports {
            let entry = format!("{vip} . {} . {}", port.protocol, port.port);
            rules.entries.push((family, entry.clone()));
            let endpoints: Vec<_> =
                port.endpoints.iter().filter(|e| Family::of(&e.address) == family).collect();
            if endpoints.is_empty() {
                let element =
                    Element { collection: Collection::NoEndpoints(family), key: entry.clone(), value: None };
                rules.elements.push((entry, element));
                continue;
            }
            rules.max_endpoints = rules.max_endpoints.max(endpoints.len());
            rules.elements.push((
                entry.clone(),
                Element {
                    collection: Collection::ServiceIps(family),
                    key: entry.clone(),
                    value: Some(format!("goto {}", pick_chain_name(family, endpoints.len()))),
                },
            ));
            for (index, ep) in endpoints.iter().enumerate() {
                rules.elements.push((
                    entry.clone(),
                    Element {
                        collection: Collection::Endpoints(family),
                        key: format!("{entry} . {index}"),
                        value: Some(format!("{} . {}", ep.address, ep.port)),
                    },
                ));
                rules.shared.insert(Element {
                    collection: Collection::Hairpin(family),
                    key: format!("{} . {}", ep.address, ep.address),
                    value: None,
                });
            }
        }
    }
    rules
}

/// The least number of pick chains a table is made with.
pub const MIN_PICK_CHAINS: usize = 32;

/// How many pick chains a table needs so that no Service needs more: a power of two, so that
/// growing is rare.
pub fn pick_chains_for(max_endpoints: usize) -> usize {
    max_endpoints.next_power_of_two().max(MIN_PICK_CHAINS)
}

/// Creates the table afresh (replacing any old one) with its sets, maps, base chains and
/// the chains that pick among 1..=`pick_chains` endpoints.
pub fn skeleton(pick_chains: usize) -> String {
    let mut s = String::new();
    let t = format!("{FAMILY} {TABLE}");
    // Adding first makes the delete valid whether or not the table exists; all of it is one transaction.
    let _ = writeln!(
        s,
        "add table {t}\ndelete table {t}\nadd table {t} {{ comment \"managed by kpx-dataplane\" ; }}"
    );
    for f in Family::ALL {
        let (addr, nft) = (f.addr_type(), f.nft());
        let _ = writeln!(
            s,
            "add map {t} {} {{ type {addr} . inet_proto . inet_service : verdict ; }}",
            Collection::ServiceIps(f).name()
        );
        // nft 1.0.6 cannot add a rule that uses this map once the map is in the kernel
        // ("conflicting protocols specified: ip vs. th"), and writing the data as `tcp dport`
        // makes such rules match TCP only. So the pick chains are created with the map, in the
        // same transaction (see `skeleton`), and never later.
        let _ = writeln!(
            s,
            "add map {t} {} {{ typeof {nft} daddr . meta l4proto . th dport . numgen random mod 1 : {nft} daddr . th dport ; }}",
            Collection::Endpoints(f).name()
        );
        let _ = writeln!(
            s,
            "add set {t} {} {{ type {addr} . inet_proto . inet_service ; }}",
            Collection::NoEndpoints(f).name()
        );
        let _ = writeln!(s, "add set {t} {} {{ type {addr} . {addr} ; }}", Collection::Hairpin(f).name());
    }
    let _ = writeln!(s, "add chain {t} services");
    let _ = writeln!(s, "add chain {t} reject-no-endpoints");
    for f in Family::ALL {
        let nft = f.nft();
        let _ = writeln!(
            s,
            "add rule {t} services {nft} daddr . meta l4proto . th dport vmap @{}",
            Collection::ServiceIps(f).name()
        );
        let _ = writeln!(
            s,
            "add rule {t} reject-no-endpoints ct state new {nft} daddr . meta l4proto . th dport @{} reject",
            Collection::NoEndpoints(f).name()
        );
    }
    // Base chains. `priority dstnat` is not accepted on the output hook by nft 1.0.6, hence -100.
    let _ = writeln!(
        s,
        "add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; policy accept ; }}"
    );
    let _ = writeln!(s, "add rule {t} nat-prerouting jump services");
    let _ =
        writeln!(s, "add chain {t} nat-output {{ type nat hook output priority -100 ; policy accept ; }}");
    let _ = writeln!(s, "add rule {t} nat-output jump services");
    let _ = writeln!(
        s,
        "add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; policy accept ; }}"
    );
    for f in Family::ALL {
        let nft = f.nft();
        let _ = writeln!(
            s,
            "add rule {t} nat-postrouting ct status dnat {nft} saddr . {nft} daddr @{} masquerade",
            Collection::Hairpin(f).name()
        );
    }
    for hook in ["input", "forward", "output"] {
        let _ = writeln!(
            s,
            "add chain {t} filter-{hook} {{ type filter hook {hook} priority -110 ; policy accept ; }}"
        );
        let _ = writeln!(s, "add rule {t} filter-{hook} jump reject-no-endpoints");
    }
    for f in Family::ALL {
        for n in 1..=pick_chains {
            s.push_str(&pick_chain(f, n));
        }
    }
    s
}

/// A chain that picks one of `endpoints` endpoints evenly.
fn pick_chain(family: Family, endpoints: usize) -> String {
    let (t, nft, name) = (format!("{FAMILY} {TABLE}"), family.nft(), pick_chain_name(family, endpoints));
    format!(
        "add chain {t} {name}\nadd rule {t} {name} dnat {nft} to {nft} daddr . meta l4proto . th dport . numgen random mod {endpoints} map @{}\n",
        Collection::Endpoints(family).name()
    )
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
            let items: Vec<String> =
                chunk.iter().map(|e| if verb == "delete" { e.key.clone() } else { e.text() }).collect();
            let _ = writeln!(
                out,
                "{verb} element {FAMILY} {TABLE} {} {{ {} }}",
                collection.name(),
                items.join(", ")
            );
        }
    }
}

/// Removes kpx's table, whether or not it exists.
pub fn cleanup_script() -> String {
    format!("add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::{Endpoint, Protocol, ServicePort};

    fn view(endpoints: &[&str]) -> ServiceView {
        ServiceView {
            cluster: "c".into(),
            namespace: "ns".into(),
            name: "web".into(),
            cluster_ips: vec!["10.96.0.10".parse().expect("ip")],
            ports: vec![ServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                endpoints: endpoints
                    .iter()
                    .map(|a| Endpoint {
                        address: a.parse().expect("ip"),
                        port: 8080,
                        node_name: String::new(),
                        terminating: false,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn a_service_with_endpoints_renders_entry_endpoints_and_hairpin() {
        let rules = service_rules(&view(&["10.244.0.1", "10.244.0.2"]));
        let mut text = String::new();
        element_commands(&mut text, "add", rules.elements.iter().map(|(_, e)| e).chain(&rules.shared));
        assert_eq!(
            text,
            "add element inet kpx service-ips-v4 { 10.96.0.10 . tcp . 80 : goto pick-v4-2 }\n\
             add element inet kpx endpoints-v4 { 10.96.0.10 . tcp . 80 . 0 : 10.244.0.1 . 8080, 10.96.0.10 . tcp . 80 . 1 : 10.244.0.2 . 8080 }\n\
             add element inet kpx hairpin-v4 { 10.244.0.1 . 10.244.0.1, 10.244.0.2 . 10.244.0.2 }\n"
        );
        assert_eq!(rules.max_endpoints, 2);
    }

    #[test]
    fn a_service_without_endpoints_is_rejected_not_black_holed() {
        let rules = service_rules(&view(&[]));
        assert_eq!(rules.elements.len(), 1);
        assert_eq!(rules.elements[0].1.collection, Collection::NoEndpoints(Family::V4));
        assert_eq!(rules.max_endpoints, 0);
        let mut text = String::new();
        element_commands(&mut text, "delete", rules.elements.iter().map(|(_, e)| e));
        assert_eq!(text, "delete element inet kpx no-endpoints-v4 { 10.96.0.10 . tcp . 80 }\n");
    }
}
