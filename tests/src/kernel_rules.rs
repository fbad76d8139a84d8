//! What the kernel holds for each TCP ClusterIP, read from the kernel's own listings
//! (`nft -j list table`, `iptables-save`), not from kpx: whether a Service is there
//! whole (its entry, the chain or pick it leads to, and every endpoint's DNAT) or only
//! in part, which an atomic apply must never leave.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::netns::Netns;
use crate::topology::ProxyBackend;

/// One ClusterIP (`VIP:port`, TCP) as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Programmed {
    /// Its entry and all it leads to: the endpoints (`IP:port`) it DNATs to.
    Whole(BTreeSet<String>),
    /// Some of its objects but not all, and which are missing.
    Partial(String),
}

/// Every TCP ClusterIP in the kernel's rules of `backend` in `node`, keyed `VIP:port`.
pub fn tcp_cluster_ips(node: &Netns, backend: ProxyBackend) -> BTreeMap<String, Programmed> {
    match backend {
        ProxyBackend::Nftables => nftables(node),
        ProxyBackend::Iptables => iptables(node, "iptables-nft-save"),
        ProxyBackend::IptablesLegacy => iptables(node, "iptables-legacy-save"),
        ProxyBackend::Ipvs => panic!("IPVS holds virtual services, not rules: read them with ipvsadm"),
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
    let mut endpoints: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
    for e in elems("endpoints-v4") {
        let Some(pair) = e.as_array() else { continue };
        let (Some(key), Some(value)) = (pair.first(), pair.get(1)) else { continue };
        let key = parts(key);
        if let (Some(k), Some(index)) = (tcp_key(&key), key.get(3).and_then(|i| i.parse().ok())) {
            endpoints.entry(k).or_default().insert(index, parts(value).join(":"));
        }
    }
    let all: BTreeSet<&String> = picks.keys().chain(&entries).chain(endpoints.keys()).collect();
    all.into_iter()
        .map(|k| {
            let eps = endpoints.get(k).cloned().unwrap_or_default();
            let state = match (picks.get(k), entries.contains(k)) {
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

fn iptables(node: &Netns, save: &str) -> BTreeMap<String, Programmed> {
    let out = node.try_exec(save, &["-t", "nat"]);
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
    let arg = |words: &[String], flag: &str| {
        words.iter().position(|w| w == flag).and_then(|i| words.get(i + 1)).cloned()
    };
    let mut out = BTreeMap::new();
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
