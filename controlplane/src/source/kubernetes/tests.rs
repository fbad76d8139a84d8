use super::*;

/// The batches `arrivals` (each: milliseconds from the start, an item) make, and
/// when each was taken, with `last` the previous batch's time (ms from the start).
async fn batches(arrivals: &[(u64, u32)], last: Option<u64>) -> Vec<(u64, Vec<u32>)> {
    let start = tokio::time::Instant::now();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for &(at, item) in arrivals {
        let tx = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(at)).await;
            let _ = tx.send(item);
        });
    }
    drop(tx);
    let mut stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let mut last = last.map(|ms| start + Duration::from_millis(ms));
    let mut out = Vec::new();
    loop {
        let mut batch = Vec::new();
        if !next_batch(&mut stream, last, |item| batch.push(item)).await {
            return out;
        }
        let now = tokio::time::Instant::now();
        out.push(((now - start).as_millis() as u64, batch));
        last = Some(now);
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_change_goes_at_once_and_a_burst_once_per_batch() {
    // Quiet since the last batch (long ago): the change goes when it arrives.
    assert_eq!(batches(&[(500, 1)], Some(0)).await, [(500, vec![1])]);
    // A burst: its first change at once, the rest gathered until 50 ms after it.
    let burst = [(500, 1), (510, 2), (520, 3), (540, 4), (560, 5), (700, 6)];
    assert_eq!(
        batches(&burst, None).await,
        [(500, vec![1]), (550, vec![2, 3, 4]), (600, vec![5]), (700, vec![6])]
    );
}

fn key(name: &str) -> ObjectKey {
    ObjectKey { namespace: "ns".into(), name: name.into() }
}

/// Feeds `events` (`init`, `+name=value` listed, `done`, `name=value` applied,
/// `-name` deleted, `?name` unusable) and returns what changed.
fn feed(kind: &mut Kind<u32>, events: &[&str]) -> Vec<String> {
    let mut changes = BTreeMap::new();
    for e in events {
        let parse = |s: &str| {
            let (name, value) = s.split_once('=').unwrap_or((s, "0"));
            (key(name), value.parse::<u32>().ok())
        };
        match *e {
            "init" => kind.apply(Event::Init, None, None, &mut changes),
            "done" => kind.apply(Event::InitDone, None, None, &mut changes),
            e if e.starts_with('+') => {
                let (k, v) = parse(&e[1..]);
                kind.apply(Event::InitApply(()), Some(k), v, &mut changes)
            }
            e if e.starts_with('-') => kind.apply(Event::Delete(()), Some(key(&e[1..])), None, &mut changes),
            e if e.starts_with('?') => kind.apply(Event::Apply(()), Some(key(&e[1..])), None, &mut changes),
            e => {
                let (k, v) = parse(e);
                kind.apply(Event::Apply(()), Some(k), v, &mut changes)
            }
        }
    }
    changes
        .into_iter()
        .map(|(k, v)| format!("{}={}", k.name, v.map_or("gone".to_owned(), |v| v.to_string())))
        .collect()
}

#[test]
fn the_first_list_changes_nothing_and_later_events_only_what_differs() {
    let mut kind = Kind::default();
    assert!(feed(&mut kind, &["init", "+a=1", "+b=2"]).is_empty());
    assert!(!kind.synced);
    assert!(feed(&mut kind, &["done"]).is_empty(), "the first list is sent whole, not as changes");
    assert!(kind.synced);
    assert_eq!(feed(&mut kind, &["a=1", "b=3", "c=4", "-d"]), ["b=3", "c=4"], "no-op updates dropped");
    assert_eq!(feed(&mut kind, &["?a", "-c"]), ["a=gone", "c=gone"]);
    assert_eq!(kind.live.keys().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["b"]);
}

#[test]
fn a_relist_is_gathered_aside_and_swapped_in_as_its_differences() {
    let mut kind = Kind::default();
    feed(&mut kind, &["init", "+a=1", "+b=2", "done"]);
    assert!(feed(&mut kind, &["init", "+a=1", "+b=2", "done"]).is_empty(), "identical relist");
    assert_eq!(feed(&mut kind, &["init", "+a=1"]), Vec::<String>::new(), "nothing until complete");
    assert_eq!(kind.live.len(), 2, "the old objects stay live meanwhile");
    assert_eq!(feed(&mut kind, &["+c=5", "done"]), ["b=gone", "c=5"]);
}

#[tokio::test]
async fn a_missing_kubeconfig_names_the_file_and_keeps_kubes_error_as_source() {
    let target = KubeTarget::Kubeconfig { path: "/nonexistent/kubeconfig".into(), context: None };
    let Err(err) = client(&target).await else { panic!("no such file, yet a client") };
    assert_eq!(err.to_string(), "cannot read kubeconfig /nonexistent/kubeconfig");
    let source = std::error::Error::source(&err).expect("kube's error");
    assert!(source.downcast_ref::<kube::config::KubeconfigError>().is_some(), "{source:?}");
}

#[test]
fn a_watch_retries_sooner_than_kube_rs_would_and_starts_over_after_an_event() {
    use kube::runtime::utils::Backoff as _;
    let mut backoff = watch_backoff();
    let waits: Vec<u64> = backoff.by_ref().take(6).map(|d| d.as_millis() as u64).collect();
    assert_eq!(waits, [1000, 2000, 4000, 5000, 5000, 5000]);
    backoff.reset();
    assert_eq!(backoff.next(), Some(Duration::from_secs(1)));
}

/// An API server that never serves a kind is asked for it at most once a second, and
/// after the first minute at most once a minute.
#[test]
fn a_kind_not_served_is_asked_again_at_most_once_a_minute_after_the_first() {
    let mut backoff = optional_backoff();
    let waits: Vec<Duration> = backoff.by_ref().take(40).collect();
    assert!(waits.iter().all(|w| *w >= Duration::from_secs(1)), "{waits:?}");
    let mut at = Duration::ZERO;
    let mut in_first_minute = 0;
    for wait in &waits {
        if at >= Duration::from_secs(60) {
            assert!(*wait >= Duration::from_secs(60), "{wait:?} at {at:?}");
        } else {
            in_first_minute += 1;
        }
        at += *wait;
    }
    assert!(in_first_minute <= 7, "{in_first_minute} lists in the first minute");
    // Ten minutes of an API server without the CRDs: at most 17 lists of each kind.
    let mut at = Duration::ZERO;
    let asked = 1 + optional_backoff()
        .take_while(|w| {
            at += *w;
            at <= Duration::from_secs(600)
        })
        .count();
    assert!(asked <= 17, "{asked} lists in 10 minutes");
}

/// A kind that becomes unavailable (its CRD deleted) loses what was known of it, is
/// logged once, and a later list (the CRD back) brings its objects again.
#[test]
fn an_unserved_kind_is_complete_and_empty_until_it_is_listed_again() {
    let mut objects = Objects::default();
    let mut pending = Pending::default();
    assert!(objects.set_unavailable(Optional::Exports, &mut pending));
    assert!(objects.exports.synced, "an unserved kind holds nothing back");
    assert!(!objects.set_unavailable(Optional::Exports, &mut pending), "logged once");
    assert!(pending.exports.is_empty());
    // Listed with an object, then unserved again: the object goes.
    let mut changes = BTreeMap::new();
    let export = crate::model::ServiceExport::default();
    objects.exports.apply(Event::Init, None, None, &mut changes);
    objects.exports.apply(Event::InitApply(()), Some(key("web")), Some(export), &mut changes);
    objects.exports.apply(Event::InitDone, None, None, &mut changes);
    assert_eq!(changes.len(), 1);
    objects.unavailable.remove(&Optional::Exports);
    let mut pending = Pending::default();
    assert!(objects.set_unavailable(Optional::Exports, &mut pending));
    assert_eq!(pending.exports.into_iter().collect::<Vec<_>>(), [(key("web"), None)]);
    assert!(objects.exports.live.is_empty());
}
