//! What one Service puts into kpx's table: the elements of its entries
//! (ClusterIPs, external IPs, load-balancer IPs, NodePorts on the node's
//! addresses) and, for session affinity, chains and sets of its own.

use std::collections::BTreeSet;

use kpx_proto::node_context::NodeContext;
use kpx_proto::types::{Endpoint, ServiceView};

use super::affinity::{self, NftObject};
use super::names::{self, drop_verdict, goto, Collection, Element, Family, Shared};
use super::skeleton::{endpoints_map, pick_chain_name, EndpointSet};
use crate::backend::owners::EntryKey;
use crate::exec::nft::elements::{Value, Values};
use kpx_proto::policy::{self, Action, EntryKind, PortFamily};

/// Everything one Service needs in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Each entry point: the keys this Service owns.
    pub entries: Vec<EntryKey>,
    /// Elements only this Service uses, grouped under the entry they belong to.
    pub elements: Vec<(EntryKey, Element)>,
    /// Elements several Services may share (counted, not owned).
    pub shared: BTreeSet<Shared>,
    /// Chains and sets of its own (session affinity).
    pub objects: Vec<NftObject>,
    /// The most endpoints one of its ports picks from (the pick chain it needs).
    pub max_endpoints: usize,
}

/// The elements and objects a Service needs on a node in `ctx`.
pub fn service_rules(view: &ServiceView, ctx: &NodeContext) -> ServiceRules {
    let mut rules = ServiceRules::default();
    for pf in policy::port_families(view, ctx) {
        render_port(&pf, ctx, &mut rules);
    }
    rules
}

/// Where an entry's traffic goes for one endpoint set.
enum Target {
    /// A pick chain over the endpoints map (`count` endpoints).
    Pick { chain: String, count: usize },
    /// A session-affinity chain of the Service's own.
    Affinity(String),
}

fn render_port(pf: &PortFamily, ctx: &NodeContext, rules: &mut ServiceRules) {
    let f = pf.family;
    let cluster_target = target(pf, EndpointSet::Cluster, rules);
    let external_target = target(pf, EndpointSet::External, rules);
    let local_target = target(pf, EndpointSet::Local, rules);
    for ep in pf.all_endpoints() {
        rules.shared.insert(Shared::Hairpin(ep.address));
    }
    for entry in &pf.entries {
        let entry_key = EntryKey { address: entry.address, protocol: pf.port.protocol, port: entry.port };
        let key = names::entry(&entry_key);
        rules.entries.push(entry_key);
        let mut add = |e: Element| rules.elements.push((entry_key, e));
        if entry.kind == EntryKind::ClusterIp {
            add(Element::set(Collection::ClusterEntries(f), key));
            rules.shared.insert(Shared::ClusterIp(entry.address));
        }
        let main = pf.main_set(entry.kind);
        let main_target = if main == EndpointSet::External { &external_target } else { &cluster_target };
        match (pf.cluster_action(entry.kind), main_target) {
            (Action::Pick, Some(target)) => {
                endpoint_elements(&mut add, main, f, &key, target, pf.endpoints(main))
            }
            (Action::Reject, _) => add(Element::set(Collection::NoEndpoints(f), key)),
            _ => add(Element::map(Collection::ServiceIps(f), key, drop_verdict())),
        }
        if pf.local_action(entry.kind).is_some() {
            add(Element::set(Collection::ExternalLocalEntries(f), key));
        }
        match (pf.local_action(entry.kind), &local_target) {
            (Some(Action::Pick), Some(target)) => {
                endpoint_elements(&mut add, EndpointSet::Local, f, &key, target, &pf.local)
            }
            (Some(_), _) => add(Element::map(Collection::ExternalLocal(f), key, drop_verdict())),
            (None, _) => {}
        }
        if pf.masquerade_external(entry.kind) {
            add(Element::set(Collection::Masquerade(f), key));
        }
        if let Some(allowed) = pf.allowed_sources(entry, &ctx.node_addresses) {
            add(Element::set(Collection::LbFiltered(f), key));
            for source in allowed {
                add(Element::set(Collection::LbAllowed(f), key.then(Value::Prefix(source))));
            }
        }
    }
}

fn target(pf: &PortFamily, set: EndpointSet, rules: &mut ServiceRules) -> Option<Target> {
    let endpoints = pf.endpoints(set);
    if endpoints.is_empty() {
        return None;
    }
    Some(match pf.view.session_affinity_timeout {
        Some(timeout) => {
            let objects =
                affinity::objects(&pf.view.resource_name(), pf.port, pf.family, set, endpoints, timeout);
            rules.objects.extend(objects.objects);
            Target::Affinity(objects.entry_chain)
        }
        None => {
            rules.max_endpoints = rules.max_endpoints.max(endpoints.len());
            Target::Pick { chain: pick_chain_name(set, pf.family, endpoints.len()), count: endpoints.len() }
        }
    })
}

/// The vmap element of an entry and, for pick chains, the endpoints it picks from.
fn endpoint_elements(
    add: &mut impl FnMut(Element),
    set: EndpointSet,
    family: Family,
    entry: &Values,
    target: &Target,
    endpoints: &[&Endpoint],
) {
    let vmap = match set {
        EndpointSet::Cluster | EndpointSet::External => Collection::ServiceIps(family),
        EndpointSet::Local => Collection::ExternalLocal(family),
    };
    match target {
        Target::Pick { chain, count } => {
            add(Element::map(vmap, *entry, goto(chain)));
            for (index, ep) in endpoints.iter().take(*count).enumerate() {
                let index = Value::Index(index as u32);
                add(Element::map(
                    endpoints_map(set, family),
                    entry.then(index),
                    names::endpoint(ep.address, ep.port),
                ));
            }
        }
        Target::Affinity(chain) => add(Element::map(vmap, *entry, goto(chain))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::names::element_commands;
    use super::*;
    use crate::backend::fixtures::{endpoint as ep, web as view};

    fn text(rules: &ServiceRules) -> String {
        let mut text = String::new();
        let shared: Vec<Element> = rules.shared.iter().map(|s| s.element()).collect();
        element_commands(&mut text, "add", rules.elements.iter().map(|(_, e)| e).chain(&shared));
        text
    }

    #[test]
    fn a_cluster_ip_renders_entry_endpoints_and_hairpin() {
        let rules = service_rules(&view(&["10.244.0.1", "10.244.0.2"]), &NodeContext::default());
        assert_eq!(
            text(&rules),
            "add element inet kpx service-ips-v4 { 10.96.0.10 . tcp . 80 : goto pick-v4-2 }\n\
             add element inet kpx endpoints-v4 { 10.96.0.10 . tcp . 80 . 0 : 10.244.0.1 . 8080, 10.96.0.10 . tcp . 80 . 1 : 10.244.0.2 . 8080 }\n\
             add element inet kpx cluster-entries-v4 { 10.96.0.10 . tcp . 80 }\n\
             add element inet kpx hairpin-v4 { 10.244.0.1 . 10.244.0.1, 10.244.0.2 . 10.244.0.2 }\n\
             add element inet kpx cluster-ips-v4 { 10.96.0.10 }\n"
        );
        assert_eq!(rules.max_endpoints, 2);
    }

    #[test]
    fn no_endpoints_is_rejected_but_internal_local_is_dropped() {
        let rules = service_rules(&view(&[]), &NodeContext::default());
        assert!(text(&rules).contains("add element inet kpx no-endpoints-v4 { 10.96.0.10 . tcp . 80 }"));
        let mut local = ServiceView { internal_traffic_local: true, ..view(&[]) };
        let t = text(&service_rules(&local, &NodeContext::default()));
        assert!(t.contains("no-endpoints-v4 { 10.96.0.10 . tcp . 80 }"), "none on any node: {t}");
        local.ports[0].endpoint_families = vec![kpx_proto::family::Family::V4];
        let t = text(&service_rules(&local, &NodeContext::default()));
        assert!(
            t.contains("service-ips-v4 { 10.96.0.10 . tcp . 80 : drop }") && !t.contains("no-endpoints"),
            "some on other nodes: {t}"
        );
    }

    #[test]
    fn node_ports_external_and_load_balancer_ips_with_policy_cluster_are_masqueraded() {
        let mut v = view(&["10.244.0.1"]);
        v.ports[0].node_port = Some(30080);
        v.external_ips = vec!["192.0.2.1".parse().expect("ip")];
        v.load_balancer_ips = vec!["192.0.2.2".parse().expect("ip"), "2001:db8::2".parse().expect("ip")];
        v.load_balancer_source_ranges = vec!["198.51.100.0/24".parse().expect("cidr")];
        let ctx = crate::backend::fixtures::node_context();
        let t = text(&service_rules(&v, &ctx));
        assert!(
            t.contains(
                "masquerade-v4 { 192.0.2.1 . tcp . 80, 192.0.2.2 . tcp . 80, 10.0.0.1 . tcp . 30080 }"
            ),
            "{t}"
        );
        assert!(t.contains("10.0.0.1 . tcp . 30080 : goto pick-v4-1"), "{t}");
        assert!(t.contains("lb-filtered-v4 { 192.0.2.2 . tcp . 80 }"), "{t}");
        assert!(t.contains("lb-allowed-v4 { 192.0.2.2 . tcp . 80 . 198.51.100.0/24 }"), "{t}");
        assert!(!t.contains("2001:db8::2"), "no IPv6 ClusterIP, so no IPv6 entries: {t}");
    }

    #[test]
    fn external_policy_local_uses_local_endpoints_and_drops_without_them() {
        let mut v = view(&["10.244.0.1", "10.244.0.2"]);
        v.external_traffic_local = true;
        v.ports[0].node_port = Some(30080);
        v.ports[0].local_endpoints = vec![ep("10.244.0.2", "n1")];
        let ctx =
            NodeContext { nodeport_addresses: vec!["10.0.0.1".parse().expect("ip")], ..Default::default() };
        let t = text(&service_rules(&v, &ctx));
        assert!(t.contains("external-local-v4 { 10.0.0.1 . tcp . 30080 : goto pick-local-v4-1 }"), "{t}");
        assert!(t.contains("external-local-entries-v4 { 10.0.0.1 . tcp . 30080 }"), "{t}");
        assert!(t.contains("local-endpoints-v4 { 10.0.0.1 . tcp . 30080 . 0 : 10.244.0.2 . 8080 }"), "{t}");
        assert!(!t.contains("masquerade-v4"), "policy Local keeps the client address: {t}");
        v.ports[0].local_endpoints.clear();
        let t = text(&service_rules(&v, &ctx));
        assert!(t.contains("external-local-v4 { 10.0.0.1 . tcp . 30080 : drop }"), "{t}");
    }

    #[test]
    fn session_affinity_goes_through_chains_of_its_own() {
        let mut v = view(&["10.244.0.1", "10.244.0.2"]);
        v.session_affinity_timeout = Some(30);
        let rules = service_rules(&v, &NodeContext::default());
        let t = text(&rules);
        assert!(t.contains("service-ips-v4 { 10.96.0.10 . tcp . 80 : goto sa-"), "{t}");
        assert!(!t.contains("endpoints-v4 {"), "no pick elements: {t}");
        assert_eq!(
            rules.objects.len(),
            5,
            "a chain, and a chain and a set per endpoint: {:?}",
            rules.objects
        );
    }
}
