use super::*;
use crate::backend::fixtures::{changed, no_context, state};
use kpx_proto::family::Family;

#[test]
fn a_full_sync_planned_in_parts_holds_what_one_plan_of_all_does() {
    // Three parts' worth of Services; every tenth claims the entry of the one before
    // (the same ClusterIP and port), and endpoints repeat across parts (shared counts).
    let rows: Vec<(String, String, Vec<String>)> = (0..1300)
        .map(|i: usize| {
            let vip_of = if i % 10 == 9 { i - 1 } else { i };
            let vip = format!("10.96.{}.{}", vip_of / 250, vip_of % 250 + 1);
            let endpoints = (0..3).map(|e| format!("10.0.{}.{}", e, i % 100 + 1)).collect();
            (format!("s{i}"), vip, endpoints)
        })
        .collect();
    let refs: Vec<Vec<&str>> = rows.iter().map(|(_, _, e)| e.iter().map(String::as_str).collect()).collect();
    let table: Vec<(&str, &str, &[&str])> =
        rows.iter().zip(&refs).map(|((n, v, _), e)| (n.as_str(), v.as_str(), e.as_slice())).collect();
    let desired = state(&table);
    let context = no_context();
    let (parts, _) = Programmed::full(&desired, &context, None);
    let mut one = Programmed { pick_chains: usize::MAX, context: context.clone(), ..Default::default() };
    let all = ChangeSet { services: desired.services.keys().cloned().collect(), node: false };
    let plan = one.plan(&desired, &context, &all);
    one.commit(plan);
    assert!(parts.updatable_elements().len() > 1300 * 3, "{}", parts.updatable_elements().len());
    assert_eq!(parts.updatable_elements(), one.updatable_elements());
    assert_eq!(parts.fingerprint(0), one.fingerprint(0));
    let owners = |p: &Programmed| -> Vec<(String, usize)> {
        p.services
            .iter()
            .map(|(n, s)| (n.to_string(), s.entries.len()))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect()
    };
    assert_eq!(owners(&parts), owners(&one), "each entry held by the same Service");
}

#[test]
fn one_endpoint_change_touches_only_that_service() {
    let before = state(&[("a", "10.96.0.1", &["10.0.0.1", "10.0.0.2"]), ("b", "10.96.0.2", &["10.0.0.9"])]);
    let (mut programmed, _) = Programmed::full(&before, &no_context(), None);
    let after = state(&[("a", "10.96.0.1", &["10.0.0.1", "10.0.0.3"]), ("b", "10.96.0.2", &["10.0.0.9"])]);
    let plan = programmed.plan(&after, &no_context(), &changed(&["a"]));
    assert_eq!(
        plan.script(),
        "delete element inet kpx endpoints-v4 { 10.96.0.1 . tcp . 80 . 1 }\n\
             delete element inet kpx hairpin-v4 { 10.0.0.2 . 10.0.0.2 }\n\
             add element inet kpx endpoints-v4 { 10.96.0.1 . tcp . 80 . 1 : 10.0.0.3 . 8080 }\n\
             add element inet kpx hairpin-v4 { 10.0.0.3 . 10.0.0.3 }\n"
    );
    programmed.commit(plan);
    assert!(programmed.plan(&after, &no_context(), &changed(&["a"])).is_empty(), "nothing left to do");
}

#[test]
fn shared_hairpin_elements_are_counted_and_pick_chains_made_with_the_table() {
    let (mut programmed, contents) =
        Programmed::full(&state(&[("a", "10.96.0.1", &["10.0.0.1"])]), &no_context(), None);
    let script = contents.whole_script();
    assert!(script.contains("add chain inet kpx pick-v4-1\n"));
    assert!(script.contains("add chain inet kpx pick-v6-32\n"));
    let both = state(&[("a", "10.96.0.1", &["10.0.0.1"]), ("b", "10.96.0.2", &["10.0.0.1"])]);
    let plan = programmed.plan(&both, &no_context(), &changed(&["b"]));
    assert!(!plan.script().contains("hairpin"), "already there: {}", plan.script());
    assert!(!plan.script().contains("add chain"), "pick-v4-1 exists: {}", plan.script());
    programmed.commit(plan);
    let only_b = state(&[("b", "10.96.0.2", &["10.0.0.1"])]);
    let plan = programmed.plan(&only_b, &no_context(), &changed(&["a"]));
    assert!(!plan.script().contains("hairpin"), "still used by b: {}", plan.script());
    programmed.commit(plan);
    let plan = programmed.plan(&NodeState::default(), &no_context(), &changed(&["b"]));
    assert!(plan.script().contains("delete element inet kpx hairpin-v4 { 10.0.0.1 . 10.0.0.1 }"));
}

#[test]
fn an_address_used_twice_is_programmed_once() {
    let both = state(&[("a", "10.96.0.1", &["10.0.0.1"]), ("b", "10.96.0.1", &["10.0.0.2"])]);
    let (mut programmed, mut contents) = Programmed::full(&both, &no_context(), None);
    contents.elements = programmed.updatable_elements();
    let script = contents.whole_script();
    assert_eq!(script.matches("10.96.0.1 . tcp . 80 :").count(), 1, "{script}");
    // When the owner goes, the other Service takes the address over once it changes.
    let only_b = state(&[("b", "10.96.0.1", &["10.0.0.2"])]);
    let plan = programmed.plan(&only_b, &no_context(), &changed(&["a", "b"]));
    assert!(
        plan.script()
            .contains("add element inet kpx endpoints-v4 { 10.96.0.1 . tcp . 80 . 0 : 10.0.0.2 . 8080 }"),
        "{}",
        plan.script()
    );
    programmed.commit(plan);
}

#[test]
fn more_endpoints_than_pick_chains_asks_for_a_full_sync() {
    let (programmed, _) = Programmed::full(&state(&[("a", "10.96.0.1", &["10.0.0.1"])]), &no_context(), None);
    let many: Vec<String> = (1..=40).map(|i| format!("10.0.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let plan = programmed.plan(&state(&[("a", "10.96.0.1", &many)]), &no_context(), &changed(&["a"]));
    assert!(plan.needs_full_sync);
    let (_, contents) = Programmed::full(&state(&[("a", "10.96.0.1", &many)]), &no_context(), None);
    let script = contents.whole_script();
    assert!(script.contains("add chain inet kpx pick-v4-64\n") && !script.contains("pick-v4-65"));
}

#[test]
fn a_full_syncs_elements_are_written_one_by_one_as_a_plan_of_everything_would_add_them() {
    let desired = state(&[
        ("a", "10.96.0.1", &["10.0.0.1", "10.0.0.2"]),
        ("b", "10.96.0.2", &["10.0.0.1"]),
        ("c", "fd00:96::3", &["fd00::7"]),
    ]);
    let mut refill = crate::exec::nft::elements::HeldRefill::default();
    let (programmed, contents, written) =
        Programmed::full_writing(&desired, &no_context(), None, &mut refill).expect("written");
    assert!(contents.elements.is_empty(), "not collected: written apart or asked for");
    let all = ChangeSet { services: desired.services.keys().cloned().collect(), node: false };
    let everything =
        Programmed { pick_chains: usize::MAX, ..Default::default() }.plan(&desired, &no_context(), &all);
    let want: BTreeSet<Element> = everything.adds.into_iter().filter(|e| e.collection.updatable()).collect();
    assert!(want.iter().any(|e| e.collection == Collection::Hairpin(Family::V4)), "shared ones too");
    assert_eq!(programmed.updatable_elements(), want);
    let update = refill.update(vec![]);
    let mut got = BTreeSet::new();
    for set in &update.add {
        for (key, value) in &set.elements {
            got.insert((set.set.clone(), **key, value.cloned()));
        }
    }
    let want: BTreeSet<_> = want.into_iter().map(|e| (e.collection.name(), e.key, e.value)).collect();
    assert_eq!(written, want.len(), "each once");
    assert_eq!(got, want);
    let (_, plain) = Programmed::full(&desired, &no_context(), None);
    assert_eq!(contents.script, plain.script, "the same script, whether or not it writes them");
}
