use super::*;
use crate::backend::fixtures::{node_context, service, state};
use crate::exec::fake::FakeNft;
use crate::state::Versioned;

fn with_affinity(mut s: NodeState, name: &str, timeout: u32) -> NodeState {
    let key = format!("c/ns/{name}");
    let view = &mut s.services_mut().get_mut(&key).expect("the service").value;
    std::sync::Arc::make_mut(view).session_affinity_timeout = Some(timeout);
    s
}

#[test]
fn a_full_sync_refills_the_table_in_place_and_removes_what_is_no_longer_wanted() {
    let nft = FakeNft::new();
    let mut backend = NftablesBackend::new(Box::new(nft.clone()));
    let context = node_context();
    let first = with_affinity(
        state(&[("a", "10.96.0.1", &["10.0.0.1", "10.0.0.2"]), ("b", "10.96.0.2", &["10.0.0.9"])]),
        "a",
        60,
    );
    backend.full_sync(&first, &context).expect("created");
    assert_eq!(
        nft.element_updates(),
        2,
        "a new table: the rules as text, then the elements, then the record of that write"
    );
    let affinity: Vec<String> =
        nft.chains().into_iter().filter(|c| c.starts_with(affinity::PREFIX)).collect();
    assert_eq!(affinity.len(), 3, "an entry chain and one per endpoint: {affinity:?}");
    let created = nft.elements("endpoints-v4");
    let transactions = nft.transactions();
    backend.full_sync(&first, &context).expect("the same again");
    assert_eq!(nft.transactions(), transactions, "as kpx's last write left it: nothing written");
    // Another program's write: the table is no longer known to be kpx's last write.
    let stray = "add element inet kpx no-endpoints-v4 { 10.96.9.9 . tcp . 99 }";
    nft.clone().run(stray).expect("another write");
    backend.full_sync(&first, &context).expect("the same again");
    assert_eq!(nft.element_updates(), 4, "nothing to delete: the elements apart again, then the record");
    assert_eq!(nft.elements("endpoints-v4"), created, "refilled, not added twice");
    assert_eq!(nft.elements("no-endpoints-v4"), Vec::<String>::new(), "what kpx does not want is gone");
    let mut second = state(&[("b", "10.96.0.2", &["10.0.0.8"])]);
    second.services_mut().insert(
        "c/ns/c".into(),
        Versioned { version: "1".into(), value: service("c", "10.96.0.3", &["10.0.0.7"]).into() },
    );
    backend.full_sync(&second, &context).expect("refilled");
    assert_eq!(nft.element_updates(), 5, "chains to delete: one script, then the record");
    assert_eq!(nft.table_deletions(), 0, "the table and its base chains stay");
    assert!(nft.chains().iter().all(|c| !c.starts_with(affinity::PREFIX)), "{:?}", nft.chains());
    assert_eq!(
        nft.elements("endpoints-v4"),
        ["10.96.0.2 . tcp . 80 . 0 : 10.0.0.8 . 8080", "10.96.0.3 . tcp . 80 . 0 : 10.0.0.7 . 8080"]
    );
    assert!(backend.intact().expect("listed"), "the canary is back");
    assert!(nft.rules("nat-prerouting").len() == 1, "{:?}", nft.rules("nat-prerouting"));
}

#[test]
fn a_full_sync_after_the_tables_rules_were_flushed_writes_the_pick_chains_again() {
    let nft = FakeNft::new();
    let mut backend = NftablesBackend::new(Box::new(nft.clone()));
    let desired = state(&[("a", "10.96.0.1", &["10.0.0.1", "10.0.0.2"])]);
    backend.full_sync(&desired, &node_context()).expect("created");
    let pick = "pick-v4-2";
    assert_eq!(nft.rules(pick).len(), 1, "{:?}", nft.chains());
    // `nft flush table inet kpx`: every chain emptied, the sets and maps kept.
    let flush: String = nft.chains().iter().map(|c| format!("flush chain inet kpx {c}\n")).collect();
    nft.clone().run(&flush).expect("flushed");
    assert!(!backend.intact().expect("listed"), "the canary is gone");
    backend.full_sync(&desired, &node_context()).expect("repaired");
    assert_eq!(nft.rules(pick).len(), 1, "the pick chains are written again");
    assert!(backend.intact().expect("listed"));
    assert_eq!(nft.table_deletions(), 0);
}

#[test]
fn a_change_of_elements_only_is_an_element_update_and_affinity_a_script() {
    let nft = FakeNft::new();
    let mut backend = NftablesBackend::new(Box::new(nft.clone()));
    let context = node_context();
    backend.full_sync(&state(&[("a", "10.96.0.1", &["10.0.0.1"])]), &context).expect("created");
    let synced = nft.element_updates();
    let one = crate::backend::fixtures::changed(&["a"]);
    let moved = state(&[("a", "10.96.0.1", &["10.0.0.2"])]);
    backend.apply(&moved, &context, &one).expect("applied");
    assert_eq!(nft.element_updates(), synced + 2, "the change, then the record of it");
    assert_eq!(nft.elements("endpoints-v4"), ["10.96.0.1 . tcp . 80 . 0 : 10.0.0.2 . 8080"]);
    let transactions = nft.transactions();
    backend.apply(&with_affinity(moved, "a", 60), &context, &one).expect("applied");
    assert_eq!(nft.element_updates(), synced + 3, "chains of its own: nft text (and the record)");
    assert_eq!(nft.transactions(), transactions + 2);
    assert!(nft.chains().iter().any(|c| c.starts_with(affinity::PREFIX)));
}

#[test]
fn a_table_of_an_older_layout_is_replaced_whole() {
    let mut nft = FakeNft::new();
    nft.run(
        "add table inet kpx { comment \"managed by kpx-dataplane\" ; }\n\
             add map inet kpx endpoints-v4 { type ipv4_addr : ipv4_addr ; }\n",
    )
    .expect("an older table");
    let mut backend = NftablesBackend::new(Box::new(nft.clone()));
    backend.full_sync(&state(&[("a", "10.96.0.1", &["10.0.0.1"])]), &node_context()).expect("replaced");
    assert_eq!(nft.table_deletions(), 1);
    assert_eq!(nft.elements("endpoints-v4"), ["10.96.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080"]);
    backend.full_sync(&state(&[("a", "10.96.0.1", &["10.0.0.2"])]), &node_context()).expect("refilled");
    assert_eq!(nft.table_deletions(), 1, "of the current layout now");
}
