//! The fixed part of kpx's table: sets, maps and chains that exist whatever
//! the Services are, written as `add` commands into an empty table and only ever
//! rewritten by a full sync (see [`super::outline`]); the endpoint maps are declared
//! in the same transaction as the pick chains that use them (see the note on them).
//!
//! Per family, chain `services` (reached from nat prerouting and output) does,
//! in order:
//! 1. drops load-balancer traffic from sources outside the Service's ranges;
//! 2. marks for masquerade: external traffic of policy Cluster; ClusterIP
//!    traffic from outside the local-traffic CIDRs (only when they are known), or
//!    from anywhere with `masqueradeAll`;
//!    policy-Local external traffic that the node itself sends;
//! 3. sends policy-Local external traffic from outside the node and its pods
//!    to that node's endpoints (`external-local`), or drops it when it has none;
//! 4. picks an endpoint of the Service's cluster set (`service-ips`).
//!
//! Services without endpoints are rejected in the filter hooks, before they
//! could leave the node; so is, after DNAT (`cluster-ips-check`), a new connection
//! still addressed to a ClusterIP: a port or protocol no Service has there
//! (kube-proxy's nftables mode does the same). Forwarded packets conntrack calls
//! invalid are dropped.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kpx_proto::node_context::{LocalMatch, NodeContext};

use super::names::{Collection, Element, Family, NftFamily, FAMILY, MASQUERADE_MARK, TABLE};
use crate::exec::nft::elements::{Value, Values};

/// A chain nothing jumps to, holding one rule: while the rule is there, nothing flushed
/// kpx's table behind its back (see [`crate::backend::Backend::intact`]).
pub const CANARY: &str = "canary";
pub const CANARY_COMMENT: &str = "kpx canary";

/// The least number of pick chains a table is made with.
pub const MIN_PICK_CHAINS: usize = 32;

/// How many pick chains a table needs so that no Service needs more: a power of two, so that
/// growing is rare.
pub fn pick_chains_for(max_endpoints: usize) -> usize {
    max_endpoints.next_power_of_two().max(MIN_PICK_CHAINS)
}

/// Which endpoint set a pick chain draws from (see [`endpoints_map`]).
pub use kpx_proto::policy::EndpointSet;

/// The map a set's pick chains read endpoints from. The external set (an
/// internal-policy-Local Service's external traffic) shares the cluster set's map and pick
/// chains: its elements are under other entries.
pub fn endpoints_map(set: EndpointSet, family: Family) -> Collection {
    match set {
        EndpointSet::Cluster | EndpointSet::External => Collection::Endpoints(family),
        EndpointSet::Local => Collection::LocalEndpoints(family),
    }
}

/// The pick chain for `endpoints` endpoints of a set; its name says all its rule depends
/// on, so that a pick chain in the kernel under this name is the one wanted.
pub fn pick_chain_name(set: EndpointSet, family: Family, endpoints: usize) -> String {
    let set = match set {
        EndpointSet::Cluster | EndpointSet::External => "",
        EndpointSet::Local => "local-",
    };
    format!("pick-{set}{}-{endpoints}", family.suffix())
}

/// Every pick chain a table with `pick_chains` of them has.
pub fn pick_chain_names(pick_chains: usize) -> BTreeSet<String> {
    pick_chain_kinds()
        .flat_map(|(set, f)| (1..=pick_chains).map(move |n| pick_chain_name(set, f, n)))
        .collect()
}

fn pick_chain_kinds() -> impl Iterator<Item = (EndpointSet, Family)> {
    Family::ALL.into_iter().flat_map(|f| [EndpointSet::Cluster, EndpointSet::Local].map(move |set| (set, f)))
}

/// Whether [`skeleton`] writes the pick chains, or the kernel has them already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickChains {
    /// Written, with the endpoint maps they use declared in the same transaction.
    Write,
    /// In the kernel already as they must be: kept as they are, with their maps.
    Kept,
}

/// The statement that marks a packet for masquerading.
fn mark_for_masquerade() -> String {
    format!("meta mark set meta mark | {MASQUERADE_MARK:#x}")
}

/// The match (with a trailing space) of `f`'s packets that do not come from pods, `None`
/// when the family has no detector.
fn not_from_pods(context: &NodeContext, f: Family) -> Option<String> {
    Some(match context.local.matcher(f)? {
        LocalMatch::Sources(_) => format!("{} saddr != @{} ", f.nft(), Collection::LocalCidrs(f).name()),
        LocalMatch::Interface { name, prefix } => {
            format!("iifname != \"{name}{}\" ", if prefix { "*" } else { "" })
        }
    })
}

/// The maps a full sync deletes and declares again rather than flushes: those the pick
/// chains use (see [`declare_collections`]).
pub fn replaced_maps() -> impl Iterator<Item = String> {
    pick_chain_kinds().map(|(set, f)| endpoints_map(set, f).name())
}

/// The table's sets, maps and chains, with pick chains for 1..=`pick_chains` endpoints
/// unless they are kept, as `add` commands into an empty table. What it depends on of the
/// node: the local-traffic detector and `masqueradeAll`.
pub fn skeleton(context: &NodeContext, pick_chains: usize, picks: PickChains) -> String {
    let mut s = String::new();
    let t = format!("{FAMILY} {TABLE}");
    for f in Family::ALL {
        declare_collections(&mut s, f);
    }
    s.push_str(&super::written::declaration());
    let local_cidrs: Vec<Element> = context
        .local
        .cidrs()
        .iter()
        .map(|c| Element::set(Collection::LocalCidrs(Family::of_net(c)), Values::of(&[Value::Prefix(*c)])))
        .collect();
    super::names::element_commands(&mut s, "add", &local_cidrs);
    let service_cidrs: Vec<Element> = context
        .service_cidrs
        .iter()
        .map(|c| Element::set(Collection::ServiceCidrs(Family::of_net(c)), Values::of(&[Value::Prefix(*c)])))
        .collect();
    super::names::element_commands(&mut s, "add", &service_cidrs);
    let _ = writeln!(s, "add chain {t} services");
    let _ = writeln!(s, "add chain {t} reject-no-endpoints");
    let _ = writeln!(s, "add chain {t} cluster-ips-check");
    let _ = writeln!(s, "add chain {t} {CANARY}\nadd rule {t} {CANARY} counter comment \"{CANARY_COMMENT}\"");
    let mark = mark_for_masquerade();
    for f in Family::ALL {
        let nft = f.nft();
        let entry = format!("{nft} daddr . meta l4proto . th dport");
        let not_from_pods = not_from_pods(context, f);
        let name = |c: Collection| c.name();
        let _ = writeln!(
            s,
            "add rule {t} services {entry} @{} {entry} . {nft} saddr != @{} drop",
            name(Collection::LbFiltered(f)),
            name(Collection::LbAllowed(f))
        );
        let _ = writeln!(s, "add rule {t} services {entry} @{} {mark}", name(Collection::Masquerade(f)));
        if context.masquerade_all {
            // kube-proxy's masqueradeAll: traffic to a ClusterIP, whoever sends it; not the
            // pods' traffic to a policy-Local external address that takes the cluster set.
            let _ =
                writeln!(s, "add rule {t} services {entry} @{} {mark}", name(Collection::ClusterEntries(f)));
        } else if let Some(not_from_pods) = &not_from_pods {
            let _ = writeln!(
                s,
                "add rule {t} services {not_from_pods}{entry} @{} {mark}",
                name(Collection::ClusterEntries(f))
            );
        }
        let _ = writeln!(
            s,
            "add rule {t} services fib saddr type local {entry} @{} {mark}",
            name(Collection::ExternalLocalEntries(f))
        );
        // Pods reaching a policy-Local external address are short-circuited to the cluster set.
        let _ = writeln!(
            s,
            "add rule {t} services fib saddr type != local {}{entry} vmap @{}",
            not_from_pods.as_deref().unwrap_or(""),
            name(Collection::ExternalLocal(f))
        );
        let _ = writeln!(s, "add rule {t} services {entry} vmap @{}", name(Collection::ServiceIps(f)));
        let _ = writeln!(
            s,
            "add rule {t} reject-no-endpoints ct state new {entry} @{} reject",
            name(Collection::NoEndpoints(f))
        );
        // After DNAT, a packet still addressed to a ClusterIP matched none of its ports.
        let _ = writeln!(
            s,
            "add rule {t} cluster-ips-check {nft} daddr @{} reject",
            name(Collection::ClusterIps(f))
        );
        // An address of a Service CIDR that is no ClusterIP: unallocated, dropped.
        let _ = writeln!(
            s,
            "add rule {t} cluster-ips-check {nft} daddr @{} drop",
            name(Collection::ServiceCidrs(f))
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
    let _ = writeln!(
        s,
        "add rule {t} nat-postrouting meta mark & {MASQUERADE_MARK:#x} == {MASQUERADE_MARK:#x} masquerade fully-random"
    );
    for f in Family::ALL {
        let nft = f.nft();
        let _ = writeln!(
            s,
            "add rule {t} nat-postrouting ct status dnat {nft} saddr . {nft} daddr @{} masquerade fully-random",
            Collection::Hairpin(f).name()
        );
    }
    for hook in ["input", "forward", "output"] {
        let _ = writeln!(
            s,
            "add chain {t} filter-{hook} {{ type filter hook {hook} priority -110 ; policy accept ; }}"
        );
        if hook == "forward" {
            // Packets conntrack cannot place (out of window) would reach a pod or a client
            // untranslated and be answered with a reset (kube-proxy drops them too).
            let _ = writeln!(s, "add rule {t} filter-forward ct state invalid counter drop");
        }
        let _ = writeln!(s, "add rule {t} filter-{hook} jump reject-no-endpoints");
        if hook != "output" {
            // Input and forward run after prerouting's DNAT.
            let _ = writeln!(s, "add rule {t} filter-{hook} ct state new jump cluster-ips-check");
        }
    }
    // Output's DNAT is at priority -100: the check comes after it.
    let _ = writeln!(
        s,
        "add chain {t} filter-output-post-dnat {{ type filter hook output priority 0 ; policy accept ; }}"
    );
    let _ = writeln!(s, "add rule {t} filter-output-post-dnat ct state new jump cluster-ips-check");
    if picks == PickChains::Write {
        for (set, f) in pick_chain_kinds() {
            for n in 1..=pick_chains {
                s.push_str(&pick_chain(set, f, n));
            }
        }
    }
    s
}

fn declare_collections(s: &mut String, f: Family) {
    let t = format!("{FAMILY} {TABLE}");
    let (addr, nft) = (f.addr_type(), f.nft());
    let entry = format!("{addr} . inet_proto . inet_service");
    for vmap in [Collection::ServiceIps(f), Collection::ExternalLocal(f)] {
        let _ = writeln!(s, "add map {t} {} {{ type {entry} : verdict ; }}", vmap.name());
    }
    // nft 1.0.6 cannot add a rule that uses these maps once they are in the kernel
    // ("conflicting protocols specified: ip vs. th"), and writing the data as `tcp dport`
    // makes the first such rule match TCP only. So the pick chains' rules are only ever
    // added in the transaction that declares the maps: a full sync keeps both when the
    // kernel has every pick chain wanted ([`PickChains::Kept`]), else deletes and declares
    // them again ([`replaced_maps`]).
    for map in [Collection::Endpoints(f), Collection::LocalEndpoints(f)] {
        let _ = writeln!(
            s,
            "add map {t} {} {{ typeof {nft} daddr . meta l4proto . th dport . numgen random mod 1 : {nft} daddr . th dport ; }}",
            map.name()
        );
    }
    for set in [
        Collection::NoEndpoints(f),
        Collection::Masquerade(f),
        Collection::ClusterEntries(f),
        Collection::LbFiltered(f),
        Collection::ExternalLocalEntries(f),
    ] {
        let _ = writeln!(s, "add set {t} {} {{ type {entry} ; }}", set.name());
    }
    let _ = writeln!(
        s,
        "add set {t} {} {{ type {entry} . {addr} ; flags interval ; }}",
        Collection::LbAllowed(f).name()
    );
    let _ =
        writeln!(s, "add set {t} {} {{ type {addr} ; flags interval ; }}", Collection::LocalCidrs(f).name());
    let _ = writeln!(s, "add set {t} {} {{ type {addr} . {addr} ; }}", Collection::Hairpin(f).name());
    let _ = writeln!(s, "add set {t} {} {{ type {addr} ; }}", Collection::ClusterIps(f).name());
    let _ = writeln!(
        s,
        "add set {t} {} {{ type {addr} ; flags interval ; }}",
        Collection::ServiceCidrs(f).name()
    );
}

/// A chain that picks one of `endpoints` endpoints of a set evenly.
fn pick_chain(set: EndpointSet, family: Family, endpoints: usize) -> String {
    let (t, nft) = (format!("{FAMILY} {TABLE}"), family.nft());
    let name = pick_chain_name(set, family, endpoints);
    format!(
        "add chain {t} {name}\nadd rule {t} {name} dnat {nft} to {nft} daddr . meta l4proto . th dport . numgen random mod {endpoints} map @{}\n",
        endpoints_map(set, family).name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_traffic_detection_only_where_cidrs_are_known() {
        let context = crate::backend::fixtures::node_context();
        let s = skeleton(&context, 1, PickChains::Write);
        assert!(s.contains("add element inet kpx local-cidrs-v4 { 10.244.0.0/16 }"), "{s}");
        assert!(s.contains(
            "add rule inet kpx services ip saddr != @local-cidrs-v4 ip daddr . meta l4proto . th dport @cluster-entries-v4 meta mark set meta mark | 0x2000"
        ));
        assert!(!s.contains("@cluster-entries-v6"), "no IPv6 detector: no IPv6 ClusterIP masquerade");
        assert!(s.contains(
            "add rule inet kpx services fib saddr type != local ip6 daddr . meta l4proto . th dport vmap @external-local-v6"
        ));
        assert!(s.contains("add chain inet kpx pick-local-v6-1\n") && !s.contains("pick-v4-2"));
        let all = skeleton(&NodeContext { masquerade_all: true, ..context.clone() }, 1, PickChains::Write);
        assert!(all.contains(
            "add rule inet kpx services ip daddr . meta l4proto . th dport @cluster-entries-v4 meta mark set meta mark | 0x2000"
        ), "masqueradeAll: every ClusterIP source: {all}");
        assert!(
            !all.contains("saddr != @local-cidrs-v4 ip daddr . meta l4proto . th dport @cluster-entries-v4"),
            "masqueradeAll: the detector does not matter"
        );
        assert!(
            all.contains("add chain inet kpx pick-v4-1\n") && !all.contains("| 0x2000 dnat"),
            "masqueradeAll changes no pick chain: {all}"
        );
        assert!(!skeleton(&context, 1, PickChains::Kept).contains("pick-"), "kept: not written");
    }
}
