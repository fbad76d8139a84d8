//! What the kernel holds for each TCP ClusterIP, read from the kernel's own listings
//! (`nft -j list table`, `iptables-save`, `/proc/net/ip_vs` and the addresses on
//! `kpx-ipvs0`), not from kpx: whether a Service is there whole (its entry, the chain or
//! pick it leads to, and every endpoint's DNAT) or only in part, which an atomic apply
//! must never leave. With IPVS a Service is there once its address is bound (IPVS then
//! takes its traffic): whole if its virtual service has its destinations.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::harness::netns::Netns;
use crate::harness::topology::ProxyBackend;

/// One ClusterIP (`VIP:port`, TCP) as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Programmed {
    /// Its entry and all it leads to: the endpoints (`IP:port`) it DNATs to.
    Whole(BTreeSet<String>),
    /// Some of its objects but not all, and which are missing.
    Partial(String),
    /// Rejected: programmed as a Service without endpoints.
    Rejected,
}

/// Every TCP ClusterIP in the kernel's rules of `backend` in `node`, keyed `VIP:port`.
pub fn tcp_cluster_ips(node: &Netns, backend: ProxyBackend) -> BTreeMap<String, Programmed> {
    match backend {
        ProxyBackend::Nftables => nftables(node),
        ProxyBackend::Iptables => iptables(node, "iptables-nft-save"),
        ProxyBackend::IptablesLegacy => iptables(node, "iptables-legacy-save"),
        ProxyBackend::Ipvs => ipvs(node),
    }
}

/// An element's key or value: a concatenation as strings, or one value.
fn parts(v: &Value) -> Vec<String> {
    let v = v.get("elem").and_then(|e| e.get("val")).unwrap_or(v);
    match v.get("concat").and_then(Value::as_array) {
        Some(items) => items.iter().map(scalar).collect(),
        None => vec![scalar(v)],
    }
}

fn scalar(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// `nft -j list table inet kpx`: the elements of each set and map, by name.
fn nft_collections(node: &Netns) -> BTreeMap<String, Vec<Value>> {
    let out = node.try_exec("nft", &["-j", "list", "table", "inet", "kpx"]);
    if !out.status.success() {
        // No table: nothing is programmed (the caller sees an empty map).
        return BTreeMap::new();
    }
    let doc: Value = serde_json::from_slice(&out.stdout).expect("nft -j prints JSON");
    let mut collections = BTreeMap::new();
    for item in doc["nftables"].as_array().into_iter().flatten() {
        for kind in ["set", "map"] {
            if let Some(obj) = item.get(kind) {
                let name = obj["name"].as_str().unwrap_or_default().to_owned();
                let elems = obj.get("elem").and_then(Value::as_array).cloned().unwrap_or_default();
                collections.insert(name, elems);
            }
        }
    }
    collections
}

fn nftables(node: &Netns) -> BTreeMap<String, Programmed> {
    let c = nft_collections(node);
    let elems = |name: &str| c.get(name).cloned().unwrap_or_default();
    let tcp_key = |p: &[String]| (p.len() >= 3 && p[1] == "tcp").then(|| format!("{}:{}", p[0], p[2]));
    // Entry → the pick chain's endpoint count ("goto pick[-…]-v4-N").
    let mut picks: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for e in elems("service-ips-v4") {
        let Some(pair) = e.as_array() else { continue };
        let (Some(key), Some(value)) = (pair.first(), pair.get(1)) else { continue };
        if let Some(k) = tcp_key(&parts(key)) {
            let target = value["goto"]["target"].as_str().unwrap_or_default();
            picks.insert(k, target.rsplit('-').next().and_then(|n| n.parse().ok()));
        }
    }
    let entries: BTreeSet<String> =
        elems("cluster-entries-v4").iter().filter_map(|e| tcp_key(&parts(e))).collect();
    let rejected: BTreeSet<String> =
        elems("no-endpoints-v4").iter().filter_map(|e| tcp_key(&parts(e))).collect();
    let mut endpoints: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
    for e in elems("endpoints-v4") {
        let Some(pair) = e.as_array() else { continue };
        let (Some(key), Some(value)) = (pair.first(), pair.get(1)) else { continue };
        let key = parts(key);
        if let (Some(k), Some(index)) = (tcp_key(&key), key.get(3).and_then(|i| i.parse().ok())) {
            endpoints.entry(k).or_default().insert(index, parts(value).join(":"));
        }
    }
    let all: BTreeSet<&String> =
        picks.keys().chain(&entries).chain(&rejected).chain(endpoints.keys()).collect();
    all.into_iter()
        .map(|k| {
            let eps = endpoints.get(k).cloned().unwrap_or_default();
            let state = match (picks.get(k), entries.contains(k)) {
                (None, true) if rejected.contains(k) && eps.is_empty() => Programmed::Rejected,
                (None, _) => Programmed::Partial("no service-ips entry".into()),
                (_, false) => Programmed::Partial("not in cluster-entries".into()),
                (Some(None), true) => Programmed::Partial("its entry does not go to a pick chain".into()),
                (Some(Some(n)), true) if eps.keys().copied().eq(0..*n) => {
                    Programmed::Whole(eps.into_values().collect())
                }
                (Some(Some(n)), true) => {
                    Programmed::Partial(format!("picks from {n} endpoints, has {:?}", eps.keys()))
                }
            };
            (k.clone(), state)
        })
        .collect()
}

/// `save -t table`: the chains declared and each chain's rules as words.
type SavedTable = (BTreeSet<String>, BTreeMap<String, Vec<Vec<String>>>);

fn saved_table(node: &Netns, save: &str, table: &str) -> SavedTable {
    let out = node.try_exec(save, &["-t", table]);
    assert!(out.status.success(), "{save}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut declared = BTreeSet::new();
    let mut rules: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(chain) = line.strip_prefix(':') {
            declared.insert(chain.split_whitespace().next().unwrap_or_default().to_owned());
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let words: Vec<String> = rule.split_whitespace().map(str::to_owned).collect();
            if let Some(chain) = words.first() {
                rules.entry(chain.clone()).or_default().push(words);
            }
        }
    }
    (declared, rules)
}

fn iptables(node: &Netns, save: &str) -> BTreeMap<String, Programmed> {
    let (declared, rules) = saved_table(node, save, "nat");
    let arg = |words: &[String], flag: &str| {
        words.iter().position(|w| w == flag).and_then(|i| words.get(i + 1)).cloned()
    };
    let mut out = BTreeMap::new();
    // Services without endpoints: rejected in the filter table.
    let (_, filter) = saved_table(node, save, "filter");
    for words in filter.get("KPX-REJECT").into_iter().flatten() {
        if let (Some(vip), Some(port), Some("tcp"), Some("REJECT")) = (
            arg(words, "-d"),
            arg(words, "--dport"),
            arg(words, "-p").as_deref(),
            arg(words, "-j").as_deref(),
        ) {
            out.insert(format!("{}:{port}", vip.trim_end_matches("/32")), Programmed::Rejected);
        }
    }
    for words in rules.get("KPX-SERVICES").into_iter().flatten() {
        let (Some(vip), Some(port), Some(target)) =
            (arg(words, "-d"), arg(words, "--dport"), arg(words, "-j"))
        else {
            continue;
        };
        if arg(words, "-p").as_deref() != Some("tcp") || !target.starts_with("KPX-SVC-") {
            continue;
        }
        let key = format!("{}:{port}", vip.trim_end_matches("/32"));
        let state = if !declared.contains(&target) {
            Programmed::Partial(format!("{target} is not declared"))
        } else {
            let seps: Vec<String> = rules
                .get(&target)
                .into_iter()
                .flatten()
                .filter_map(|w| arg(w, "-j"))
                .filter(|j| j.starts_with("KPX-SEP-"))
                .collect();
            let dnat =
                |sep: &String| rules.get(sep).into_iter().flatten().find_map(|w| arg(w, "--to-destination"));
            match seps.iter().map(|s| dnat(s).ok_or(s)).collect::<Result<BTreeSet<String>, _>>() {
                Ok(eps) if !eps.is_empty() => Programmed::Whole(eps),
                Ok(_) => Programmed::Partial(format!("{target} has no endpoint")),
                Err(sep) => Programmed::Partial(format!("{sep} has no DNAT")),
            }
        };
        out.insert(key, state);
    }
    out
}

/// IPVS's table and the addresses bound, read as one snapshot: the table is read before
/// and after the addresses, and the reading is taken again while the two differ. Read
/// once each, an agent programming between the two reads (a virtual service added, then
/// its address bound) would look like an address bound without a virtual service.
fn ipvs(node: &Netns) -> BTreeMap<String, Programmed> {
    let read_table = || {
        let table = node.try_exec("cat", &["/proc/net/ip_vs"]);
        assert!(table.status.success(), "/proc/net/ip_vs: {}", String::from_utf8_lossy(&table.stderr));
        String::from_utf8_lossy(&table.stdout).into_owned()
    };
    // The agent may be programming: read until the table is the same before and after
    // the addresses (it binds an address last and unbinds it first).
    let mut attempts = 0;
    loop {
        attempts += 1;
        let before = read_table();
        let links = node.try_exec("ip", &["-o", "-4", "addr", "show", "dev", "kpx-ipvs0"]);
        let after = read_table();
        if before != after && attempts < 20 {
            continue;
        }
        let missing = String::from_utf8_lossy(&links.stderr).contains("does not exist");
        assert!(
            links.status.success() || missing,
            "ip addr show dev kpx-ipvs0: {}",
            String::from_utf8_lossy(&links.stderr)
        );
        // No interface: nothing bound.
        let bound: BTreeSet<String> = String::from_utf8_lossy(&links.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
            .map(|a| a.split('/').next().unwrap_or_default().to_owned())
            .collect();
        if before == after {
            return ipvs_services(&after, &bound);
        }
        // Still programming (a long apply changes the table between any two readings):
        // each address, as bound when the addresses were read, judged by the reading
        // where its services are whole.
        return whole_in_either(ipvs_services(&before, &bound), ipvs_services(&after, &bound));
    }
}

/// The state of each virtual service of the addresses bound between two readings of the
/// table: whole when it is whole in either. The agent adds a Service whole before it binds
/// the address and unbinds before it removes: a Service bound when the addresses were read
/// was whole then, so still whole in the later reading unless removed since, and already
/// whole in the earlier one unless added since. (Added and removed within one reading: it
/// shows as in part.)
fn whole_in_either(
    earlier: BTreeMap<String, Programmed>,
    later: BTreeMap<String, Programmed>,
) -> BTreeMap<String, Programmed> {
    let is_whole = |p: Option<&Programmed>| matches!(p, Some(Programmed::Whole(_)));
    let mut out = later;
    for (key, state) in earlier {
        if is_whole(Some(&state)) && !is_whole(out.get(&key)) {
            out.insert(key, state);
        }
    }
    let address = |key: &str| key.rsplit_once(':').map_or(key, |(a, _)| a).to_owned();
    let whole: BTreeSet<String> =
        out.iter().filter(|(_, p)| is_whole(Some(p))).map(|(k, _)| address(k)).collect();
    out.retain(|key, _| !(key.ends_with(":?") && whole.contains(&address(key))));
    out
}

/// `/proc/net/ip_vs` (IPv4, hex `ADDR:PORT`) against the addresses bound on kpx's
/// interface: every bound address's TCP virtual services, whole when they have
/// destinations of weight > 0.
pub fn ipvs_services(table: &str, bound: &BTreeSet<String>) -> BTreeMap<String, Programmed> {
    let hex = |h: &str| -> Option<String> {
        let (addr, port) = h.split_once(':')?;
        let a = u32::from_str_radix(addr, 16).ok()?;
        let p = u16::from_str_radix(port, 16).ok()?;
        Some(format!("{}:{p}", std::net::Ipv4Addr::from(a)))
    };
    let mut services: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in table.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["TCP", addr, ..] => {
                current = hex(addr);
                if let Some(k) = &current {
                    services.entry(k.clone()).or_default();
                }
            }
            [proto, ..] if ["UDP", "SCTP", "FWM"].contains(proto) => current = None,
            ["->", addr, _forward, weight, ..] => {
                if let (Some(k), Some(dest)) = (&current, hex(addr)) {
                    if weight.parse::<u32>().is_ok_and(|w| w > 0) {
                        services.entry(k.clone()).or_default().insert(dest);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for (key, dests) in &services {
        let address = key.rsplit_once(':').map_or("", |(a, _)| a);
        if !bound.contains(address) {
            continue; // not reachable: IPVS does not take its traffic
        }
        let state = if dests.is_empty() {
            Programmed::Partial("a virtual service without destinations".into())
        } else {
            Programmed::Whole(dests.clone())
        };
        out.insert(key.clone(), state);
    }
    for address in bound {
        if !services.keys().any(|k| k.starts_with(&format!("{address}:"))) {
            out.insert(format!("{address}:?"), Programmed::Partial("bound without a virtual service".into()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_whole_in_either_reading_was_whole_when_its_address_was_read() {
        let whole = |d: &str| Programmed::Whole([d.to_owned()].into());
        let part = || Programmed::Partial("in part".into());
        let earlier: BTreeMap<String, Programmed> = [
            ("10.97.0.1:80", whole("p1")),
            ("10.97.0.2:80", part()),
            ("10.97.0.3:?", part()),
            ("10.97.0.4:80", part()),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
        let later: BTreeMap<String, Programmed> = [
            ("10.97.0.1:80", part()),
            ("10.97.0.2:80", whole("p2")),
            ("10.97.0.3:80", whole("p3")),
            ("10.97.0.4:80", part()),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
        let seen = whole_in_either(earlier, later);
        assert_eq!(seen["10.97.0.1:80"], whole("p1"), "removed after the addresses were read");
        assert_eq!(seen["10.97.0.2:80"], whole("p2"), "completed before the address was bound");
        assert_eq!(seen["10.97.0.3:80"], whole("p3"));
        assert!(!seen.contains_key("10.97.0.3:?"), "its service came before its address");
        assert_eq!(seen["10.97.0.4:80"], part(), "in part in both: in part");
    }

    #[test]
    fn reads_ipvs_services_whole_in_part_and_unbound() {
        let table = "IP Virtual Server version 1.2.1 (size=4096)\n\
Prot LocalAddress:Port Scheduler Flags\n\
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n\
TCP  0A610001:0050 rr\n\
  -> 0AF40102:1F90      Masq    1      0          0\n\
  -> 0AF40202:1F90      Masq    1      0          0\n\
TCP  0A610002:0050 rr\n\
  -> 0AF40102:1F90      Masq    0      3          0\n\
UDP  0A610001:0050 rr\n\
  -> 0AF40302:1F90      Masq    1      0          0\n\
TCP  0A610003:0050 rr\n";
        let bound: BTreeSet<String> = ["10.97.0.1", "10.97.0.2", "10.97.0.4"].map(String::from).into();
        let seen = ipvs_services(table, &bound);
        let both: BTreeSet<String> = ["10.244.1.2:8080", "10.244.2.2:8080"].map(String::from).into();
        assert_eq!(seen["10.97.0.1:80"], Programmed::Whole(both), "UDP destinations are not the TCP one's");
        assert!(matches!(seen["10.97.0.2:80"], Programmed::Partial(_)), "only a draining destination");
        assert!(!seen.contains_key("10.97.0.3:80"), "not bound: IPVS does not take its traffic");
        assert!(matches!(seen["10.97.0.4:?"], Programmed::Partial(_)), "bound, no virtual service");
    }
}
