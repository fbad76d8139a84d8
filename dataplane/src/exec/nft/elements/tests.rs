use super::*;
use std::net::Ipv4Addr;

fn entry(family: Family) -> Vec<Field> {
    vec![Field::Address(family), Field::Protocol, Field::Port]
}

fn address(text: &str) -> Value {
    Value::Address(text.parse().expect("an address"))
}

fn vip() -> Values {
    Values::of(&[address("10.96.0.1"), Value::Protocol(Protocol::Tcp), Value::Port(80)])
}

#[test]
fn a_concatenation_takes_a_register_per_field() {
    let endpoints = Layout {
        key: [entry(Family::V4), vec![Field::Index]].concat(),
        data: DataLayout::Fields(vec![Field::Address(Family::V4), Field::Port]),
    };
    let mut want = vec![10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0];
    want.extend_from_slice(&3u32.to_ne_bytes());
    let pick = vip().then(Value::Index(3));
    assert_eq!(pick.to_string(), "10.96.0.1 . tcp . 80 . 3");
    assert_eq!(key(&endpoints, &pick).expect("encoded").as_bytes(), want);
    let endpoint = Data::Values(Values::of(&[address("10.0.0.1"), Value::Port(8080)]));
    let Ok(Some(EncodedData::Value(encoded))) = data(&endpoints, Some(&endpoint)) else {
        panic!("values for values")
    };
    assert_eq!(encoded.as_bytes(), [10, 0, 0, 1, 0x1f, 0x90, 0, 0]);
    let v6 = Layout { key: entry(Family::V6), data: DataLayout::None };
    let k = key(&v6, &Values::of(&[address("fd00::1"), Value::Protocol(Protocol::Udp), Value::Port(53)]))
        .expect("encoded");
    assert_eq!(k.as_bytes().len(), 24);
    assert_eq!(&k.as_bytes()[16..], &[17, 0, 0, 0, 0, 53, 0, 0]);
}

#[test]
fn verdicts_name_their_chain() {
    let vmap = Layout { key: entry(Family::V4), data: DataLayout::Verdict };
    let goto = Data::Verdict(Verdict::Goto("pick-v4-2".into()));
    assert_eq!(goto.to_string(), "goto pick-v4-2");
    assert_eq!(
        data(&vmap, Some(&goto)),
        Ok(Some(EncodedData::Verdict { code: verdict::GOTO, chain: Some("pick-v4-2") }))
    );
    let drop = Data::Verdict(Verdict::Drop);
    assert_eq!(data(&vmap, Some(&drop)), Ok(Some(EncodedData::Verdict { code: 0, chain: None })));
    assert!(data(&vmap, Some(&Data::Verdict(Verdict::Goto(String::new())))).is_err());
    assert!(data(&vmap, Some(&Data::Values(vip()))).is_err(), "values in a verdict map");
}

#[test]
fn values_that_do_not_fit_the_layout_are_refused_by_field() {
    let set = Layout { key: entry(Family::V4), data: DataLayout::None };
    let v6 = Values::of(&[address("fd00::1"), Value::Protocol(Protocol::Tcp), Value::Port(80)]);
    assert!(key(&set, &v6).expect_err("v6 in v4").contains("family"));
    let swapped = Values::of(&[address("10.0.0.1"), Value::Port(80), Value::Protocol(Protocol::Tcp)]);
    assert!(key(&set, &swapped).expect_err("order").contains("where Protocol is declared"));
    let short = Values::of(&[address("10.0.0.1"), Value::Protocol(Protocol::Tcp)]);
    assert!(key(&set, &short).expect_err("count").contains("2 values"));
    let prefix = vip().then(Value::Prefix("10.0.0.0/8".parse().expect("a prefix")));
    assert!(key(&set, &prefix).is_err(), "prefixes are nft text only");
    assert!(data(&set, Some(&Data::Verdict(Verdict::Drop))).is_err(), "a set maps to nothing");
    let bad = Values::of(&[
        Value::Address(Ipv4Addr::new(10, 0, 0, 2).into()),
        Value::Protocol(Protocol::Tcp),
        Value::Index(80),
    ]);
    let good = vip();
    let update = ElementUpdate {
        flush: vec![],
        delete: vec![],
        add: vec![SetElements {
            set: "no-endpoints-v4".into(),
            layout: set,
            elements: vec![(&good, None), (&bad, None)],
        }],
    };
    let e = check(&update).expect_err("the second");
    assert_eq!((e.set.as_str(), e.element.as_str()), ("no-endpoints-v4", "10.0.0.2 . tcp . 80"));
}

#[test]
fn an_update_reads_as_the_nft_commands_it_amounts_to() {
    let (pick, endpoint) =
        (vip().then(Value::Index(0)), Data::Values(Values::of(&[address("10.0.0.1"), Value::Port(8080)])));
    let layout = Layout { key: vec![], data: DataLayout::None };
    let update = ElementUpdate {
        flush: vec![Emptied { set: "hairpin-v4".into(), map: false }],
        delete: vec![SetElements {
            set: "endpoints-v4".into(),
            layout: layout.clone(),
            elements: vec![(&pick, Some(&endpoint))],
        }],
        add: vec![SetElements {
            set: "endpoints-v4".into(),
            layout,
            elements: vec![(&pick, Some(&endpoint)), (&pick, Some(&endpoint))],
        }],
    };
    assert_eq!(
            update.script(),
            "flush set inet kpx hairpin-v4\n\
             delete element inet kpx endpoints-v4 { 10.96.0.1 . tcp . 80 . 0 }\n\
             add element inet kpx endpoints-v4 { 10.96.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080, 10.96.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080 }\n"
        );
}
