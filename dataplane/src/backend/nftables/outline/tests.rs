use super::*;
use crate::backend::nftables::names::{Element, Family};

/// A table of this layout, as the kernel lists it.
fn listed() -> Outline {
    let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect();
    Outline {
        comment: Some(COMMENT.to_owned()),
        chains: names(&["nat-prerouting", "pick-v4-64", "sa-0123456789ab", "services"]),
        sets: names(&["hairpin-v4", "sa-0123456789ab-000000000000", "sa-0123456789ab-ba9876543210"]),
        maps: names(&["endpoints-v4", "service-ips-v4"]),
        empty_chains: BTreeSet::new(),
    }
}

#[test]
fn only_a_table_of_this_layout_is_current() {
    assert!(listed().is_current());
    let older = Outline { comment: Some("managed by kpx-dataplane".into()), ..listed() };
    assert!(!older.is_current(), "made by an older kpx");
    assert!(!Outline { comment: None, ..listed() }.is_current());
}

#[test]
fn a_full_sync_keeps_the_table_and_empties_it_first() {
    let existing = listed();
    let script = "add map inet kpx service-ips-v4 { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
            add map inet kpx endpoints-v4 { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport ; }\n\
            add set inet kpx hairpin-v4 { type ipv4_addr . ipv4_addr ; }\n\
            add set inet kpx sa-0123456789ab-ba9876543210 { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }\n\
            add chain inet kpx services\nadd chain inet kpx sa-0123456789ab\n\
            add chain inet kpx nat-prerouting { type nat hook prerouting priority -100 ; policy accept ; }\n";
    let before = |kept: &[&str]| -> Vec<String> {
        let contents = Contents {
            script: script.to_owned(),
            kept_pick_chains: kept.iter().map(|c| (*c).to_owned()).collect(),
            ..Contents::default()
        };
        let refill = refill_script(&existing, &contents);
        refill.strip_suffix(script).expect("the contents come last").lines().map(str::to_owned).collect()
    };
    assert_eq!(
        before(&["pick-v4-64"]),
        [
            "add table inet kpx",
            "flush chain inet kpx nat-prerouting",
            "flush chain inet kpx sa-0123456789ab",
            "flush chain inet kpx services",
        ]
        .iter()
        .chain(&[
            "flush map inet kpx endpoints-v4",
            "flush map inet kpx service-ips-v4",
            "flush set inet kpx hairpin-v4",
            "delete set inet kpx sa-0123456789ab-000000000000",
        ])
        .copied()
        .collect::<Vec<_>>(),
        "never `delete table`: the base chains stay; the pick chains and their map stay; \
             the affinity set that stays keeps its clients"
    );
    assert_eq!(
        before(&[]),
        [
            "add table inet kpx",
            "flush chain inet kpx nat-prerouting",
            "flush chain inet kpx pick-v4-64",
            "flush chain inet kpx sa-0123456789ab",
            "flush chain inet kpx services",
            "flush map inet kpx service-ips-v4",
            "flush set inet kpx hairpin-v4",
            "delete chain inet kpx pick-v4-64",
            "delete map inet kpx endpoints-v4",
            "delete set inet kpx sa-0123456789ab-000000000000",
        ],
        "pick chains written again: their map is declared again with them"
    );
    let contents = Contents { script: script.to_owned(), ..Contents::default() };
    let created = create_script(&contents, Elements::InScript);
    assert!(created.starts_with("add table inet kpx { comment") && !created.contains("delete"), "{created}");
    assert!(replace_script(&contents).contains("delete table inet kpx\n"));
}

#[test]
fn with_the_elements_apart_the_updatable_sets_are_left_and_nothing_is_deleted() {
    let script = "add map inet kpx service-ips-v4 { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
            add map inet kpx endpoints-v4 { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport ; }\n\
            add set inet kpx hairpin-v4 { type ipv4_addr . ipv4_addr ; }\n\
            add set inet kpx local-cidrs-v4 { type ipv4_addr ; flags interval ; }\n\
            add set inet kpx sa-0123456789ab-ba9876543210 { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }\n\
            add chain inet kpx services\nadd chain inet kpx sa-0123456789ab\nadd chain inet kpx pick-v4-64\n\
            add chain inet kpx nat-prerouting { type nat hook prerouting priority -100 ; policy accept ; }\n";
    let contents = Contents {
        script: script.to_owned(),
        kept_pick_chains: ["pick-v4-64".to_owned()].into(),
        ..Contents::default()
    };
    let mut existing = listed();
    assert_eq!(refill_script_apart(&existing, &contents), None, "a set to delete: one script");
    existing.sets.remove("sa-0123456789ab-000000000000");
    existing.sets.insert("local-cidrs-v4".into());
    let refill = refill_script_apart(&existing, &contents).expect("nothing to delete");
    let before: Vec<&str> = refill.strip_suffix(script).expect("the contents last").lines().collect();
    assert_eq!(
        before,
        [
            "add table inet kpx",
            "flush chain inet kpx nat-prerouting",
            "flush chain inet kpx sa-0123456789ab",
            "flush chain inet kpx services",
            "flush set inet kpx local-cidrs-v4",
        ],
        "the rules and the interval sets are written again; the element update refills the rest"
    );
    let entry = crate::backend::owners::EntryKey {
        address: "10.96.0.1".parse().expect("an address"),
        protocol: kpx_proto::types::Protocol::Tcp,
        port: 80,
    };
    let element = Element::map(
        Collection::ServiceIps(Family::V4),
        super::super::names::entry(&entry),
        super::super::names::goto("pick-v4-1"),
    );
    let contents = Contents { elements: [element].into(), ..contents };
    assert!(create_script(&contents, Elements::Apart).ends_with(script), "no element in the script");
    assert!(create_script(&contents, Elements::InScript)
        .ends_with("add element inet kpx service-ips-v4 { 10.96.0.1 . tcp . 80 : goto pick-v4-1 }\n"));
}
