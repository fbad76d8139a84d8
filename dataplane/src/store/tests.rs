use super::*;
use kpx_proto::types::{Endpoint, Protocol, ServicePort};
use std::collections::BTreeSet;
use std::sync::Arc;

fn svc(name: &str) -> Versioned<Arc<ServiceView>> {
    Versioned {
        version: format!("v-{name}"),
        value: Arc::new(ServiceView::new(
            "c",
            "ns",
            name,
            vec!["10.96.0.1".parse().expect("ip")],
            vec![ServicePort::new(
                "",
                Protocol::Udp,
                53,
                vec![Endpoint::new("10.0.0.1".parse().expect("ip"), 5353, "n", "", false)],
            )],
        )),
    }
}

fn stored(names: &[&str]) -> (tempfile::TempDir, NodeState) {
    let dir = tempfile::tempdir().expect("tmp");
    let mut state = NodeState::default();
    for name in names {
        state.services_mut().insert(format!("c/ns/{name}"), svc(name));
    }
    let mut store = Store::open(dir.path()).expect("open");
    store.replace_all(&state).expect("commit");
    (dir, state)
}

#[test]
fn commits_survive_reopen_and_removals_are_removed() {
    let (dir, mut state) = stored(&["a", "b"]);
    {
        let mut store = Store::open(dir.path()).expect("reopen");
        assert_eq!(store.load().expect("read").expect("intact"), state);
        state.services_mut().remove("c/ns/b");
        let changes = ChangeSet { services: ["c/ns/b".to_owned()].into(), node: false };
        store.commit(&state, &changes).expect("commit");
        state.services_mut().insert("c/ns/a".into(), Versioned { version: "v2".into(), ..svc("a") });
        let changes = ChangeSet { services: ["c/ns/a".to_owned()].into(), node: false };
        store.commit(&state, &changes).expect("commit");
    }
    let mut store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.load().expect("read").expect("intact"), state);
}

#[test]
fn every_record_survives_sled_being_let_go_of_between_writes() {
    // Services of 40 endpoints (about 1 KB a record), written 400 at a time: sled is
    // opened again after every second write; later writes change and remove records
    // written before those reopenings (their old checksums come back from the file).
    let wide = |name: &str, version: &str| {
        let endpoints = (0..40)
            .map(|i| {
                Endpoint::new(
                    format!("10.1.{}.{}", i / 200, i % 200).parse().expect("ip"),
                    80,
                    "n",
                    "",
                    false,
                )
            })
            .collect();
        let port = ServicePort::new("", Protocol::Tcp, 80, endpoints);
        let view = ServiceView::new("c", "ns", name, vec!["10.96.0.1".parse().expect("ip")], vec![port]);
        Versioned { version: version.to_owned(), value: Arc::new(view) }
    };
    let dir = tempfile::tempdir().expect("tmp");
    let mut store = Store::open(dir.path()).expect("open");
    store.load().expect("read").expect("empty");
    let mut state = NodeState::default();
    for part in 0..6 {
        let names: Vec<String> = (part * 400..(part + 1) * 400).map(|i| format!("s{i}")).collect();
        for name in &names {
            state.services_mut().insert(format!("c/ns/{name}"), wide(name, "1"));
        }
        let changes =
            ChangeSet { services: names.iter().map(|n| format!("c/ns/{n}")).collect(), node: false };
        store.commit(&state, &changes).expect("commit");
        assert!(store.written_since_open < CACHE_BYTES, "let go of at a cache's worth");
    }
    let changed: BTreeSet<String> = (0..300).map(|i| format!("c/ns/s{}", i * 7)).collect();
    for (i, name) in changed.iter().enumerate() {
        if i % 2 == 0 {
            state.services_mut().remove(name);
        } else {
            let short = name.trim_start_matches("c/ns/");
            state.services_mut().insert(name.clone(), wide(short, "2"));
        }
    }
    store.commit(&state, &ChangeSet { services: changed, node: false }).expect("commit");
    drop(store);
    let mut store = Store::open(dir.path()).expect("reopen");
    let loaded = store.load().expect("read").expect("intact: every record and the manifest");
    assert_eq!(loaded.services.len(), 2400 - 150);
    assert_eq!(loaded, state);
}

#[test]
fn a_version_too_long_for_its_field_is_kept_cut_and_the_manifest_agrees() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut store = Store::open(dir.path()).expect("open");
    let mut state = NodeState::default();
    let long = Versioned { version: "v".repeat(70_000), ..svc("a") };
    state.services_mut().insert("c/ns/a".into(), long);
    store.replace_all(&state).expect("commit");
    drop(store);
    let loaded = Store::open(dir.path()).expect("reopen").load().expect("read").expect("intact");
    assert_eq!(loaded.services["c/ns/a"].version.len(), usize::from(u16::MAX));
}

#[test]
fn a_damaged_record_or_a_lost_one_is_reported_not_trusted() {
    let (dir, _) = stored(&["a", "b"]);
    let mut store = Store::open(dir.path()).expect("open");
    store.load().expect("read").expect("intact");
    let mut good =
        store.opened().expect("open").tree.get(b"svc/c/ns/a").expect("get").expect("there").to_vec();
    let last = good.len() - 1;
    good[last] ^= 0x01;
    store.insert_raw(b"svc/c/ns/a", &good);
    let damaged = store.load().expect("read").expect_err("damaged");
    assert_eq!(damaged.what, "svc/c/ns/a");
    assert!(damaged.reason.contains("checksum"), "{damaged}");

    let (dir, _) = stored(&["a", "b"]);
    let mut store = Store::open(dir.path()).expect("open");
    store.remove_raw(b"svc/c/ns/b");
    let damaged = store.load().expect("read").expect_err("a record went missing");
    assert_eq!(damaged.what, "manifest", "{damaged}");
    store.insert_raw(b"svc/c/ns/b", b"\x00\x02v1");
    assert_eq!(store.load().expect("read").expect_err("truncated").reason, "truncated record");
}

#[test]
fn a_database_sled_cannot_open_is_moved_aside_and_reported() {
    let (dir, _) = stored(&["a"]);
    let conf = dir.path().join(DB).join("conf");
    std::fs::write(&conf, b"garbage that is not sled's config").expect("damage conf");
    let mut store = Store::open(dir.path()).expect("opens a fresh store instead");
    let damaged = store.load().expect("read").expect_err("reported");
    assert_eq!(damaged.what, "database");
    assert!(damaged.reason.contains("moved aside"), "{damaged}");
    assert_eq!(store.load().expect("read").expect("now empty"), NodeState::default());
    let aside = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("state.sled.damaged-"));
    assert!(aside, "the damaged store is kept for a look");
}
