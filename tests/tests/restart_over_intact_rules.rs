//! A full sync over kpx's own rules (an agent restarted over them, the periodic resync, a
//! repair) writes only what differs from what the kernel holds. nftables: the kernel's
//! elements are read back and only those that differ written, in one transaction guarded
//! by nf_tables' generation; someone else's write between the read and the write is
//! caught and the table rewritten whole. iptables (both flavours): chains the kernel holds
//! exactly as wanted are not written. Inside a network namespace of the test's, through
//! the real `nft`, netlink and iptables tools; what the kernel holds is read with the
//! tools. Run as root.

use kpx_proto::sync::Locked as _;
use std::sync::{Arc, Mutex};

use kpx_dataplane::backend::fixtures::{node_context, state};
use kpx_dataplane::backend::iptables::IptablesBackend;
use kpx_dataplane::backend::nftables::NftablesBackend;
use kpx_dataplane::backend::Backend;
use kpx_dataplane::exec::iptables::{Flavour, Iptables, IptablesProcess};
use kpx_dataplane::exec::nft::elements::{ElementUpdate, Emptied, Layout, Refill, Value, Values};
use kpx_dataplane::exec::nft::netlink::NftNetlink;
use kpx_dataplane::exec::nft::open::NftProcess;
use kpx_dataplane::exec::nft::{Nft, Outline, Reconciled, RefillWith};
use kpx_dataplane::exec::ExecError;
use kpx_dataplane::state::NodeState;
use kpx_e2e::harness::netns::Netns;
use kpx_proto::family::Family;

/// The real nftables, recording what each reconcile did, and running `between` (someone
/// else's write) after the elements were read and before anything is written.
struct Recording {
    nft: NftProcess,
    outcomes: Arc<Mutex<Vec<Reconciled>>>,
    between: Option<String>,
}

impl Nft for Recording {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        self.nft.run(script)
    }
    fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError> {
        self.nft.update_elements(update)
    }
    fn refill(&mut self, flush: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<bool, ExecError> {
        self.nft.refill(flush, fill)
    }
    fn reconcile(&mut self, sets: Vec<Emptied>, fill: &mut RefillWith<'_>) -> Result<Reconciled, ExecError> {
        let between = self.between.take();
        let mut wrapped = |refill: &mut dyn Refill| {
            let script = fill(refill);
            if let Some(other) = &between {
                nft(&["-f", "-"], Some(other));
            }
            script
        };
        let outcome = self.nft.reconcile(sets, &mut wrapped)?;
        self.outcomes.locked().push(outcome);
        Ok(outcome)
    }
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        self.nft.generation()
    }
    fn update_elements_at(&mut self, generation: u32, update: &ElementUpdate) -> Result<bool, ExecError> {
        self.nft.update_elements_at(generation, update)
    }
    fn set_keys(&mut self, set: &str, layout: &Layout) -> Result<Vec<Vec<u8>>, ExecError> {
        self.nft.set_keys(set, layout)
    }
    fn rules_in_chain(&mut self, chain: &str) -> Result<usize, ExecError> {
        self.nft.rules_in_chain(chain)
    }
    fn list(&mut self, what: &str) -> Result<String, ExecError> {
        self.nft.list(what)
    }
    fn outline(&mut self) -> Result<Option<Outline>, ExecError> {
        self.nft.outline()
    }
}

/// nf_tables' generation now.
fn generation() -> u32 {
    NftNetlink::new().generation().expect("the generation")
}

/// Runs `nft ARGS` (with `input` on its standard input) in the current namespace; its
/// output, the test failing if nft does.
fn nft(args: &[&str], input: Option<&str>) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("nft")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nft runs");
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).expect("nft's input");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("nft ends");
    assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kpx's table as nft lists it, each set's elements sorted (their order is the kernel's).
fn table() -> String {
    let listed = nft(&["-j", "list", "table", "inet", "kpx"], None);
    let mut v: serde_json::Value = serde_json::from_str(&listed).expect("nft's JSON");
    for item in v["nftables"].as_array_mut().into_iter().flatten() {
        for kind in ["set", "map"] {
            if let Some(elements) = item[kind].get_mut("elem").and_then(|e| e.as_array_mut()) {
                elements.sort_by_key(|e| e.to_string());
            }
        }
        for kind in ["table", "chain", "rule", "set", "map"] {
            if let Some(object) = item.get_mut(kind).and_then(|o| o.as_object_mut()) {
                object.remove("handle");
            }
        }
    }
    v.to_string()
}

/// 300 Services of 4 endpoints each.
fn services() -> NodeState {
    let names: Vec<(String, String, Vec<String>)> = (0..300)
        .map(|i| {
            let endpoints = (0..4).map(|e| format!("10.1.{}.{}", i / 50, (i % 50) * 5 + e)).collect();
            (format!("s{i}"), format!("10.96.{}.{}", i / 200, i % 200 + 1), endpoints)
        })
        .collect();
    let refs: Vec<Vec<&str>> = names.iter().map(|(_, _, e)| e.iter().map(String::as_str).collect()).collect();
    let rows: Vec<(&str, &str, &[&str])> =
        names.iter().zip(&refs).map(|((n, v, _), e)| (n.as_str(), v.as_str(), e.as_slice())).collect();
    state(&rows)
}

fn backend(outcomes: &Arc<Mutex<Vec<Reconciled>>>, between: Option<String>) -> NftablesBackend {
    NftablesBackend::new(Box::new(Recording {
        nft: NftProcess::new(),
        outcomes: Arc::clone(outcomes),
        between,
    }))
}

fn last(outcomes: &Arc<Mutex<Vec<Reconciled>>>) -> Option<Reconciled> {
    outcomes.locked().last().copied()
}

/// kpx's table without the element recording kpx's last write (its generation moves).
fn contents() -> String {
    contents_of(&table())
}

/// `desired` with one endpoint of Service s7 moved to another address.
fn one_endpoint_moved(desired: &NodeState) -> NodeState {
    let mut moved = desired.clone();
    let s7 = moved.services_mut().get_mut("c/ns/s7").expect("s7");
    let view = std::sync::Arc::make_mut(&mut s7.value);
    view.ports[0].endpoints[0].address = "10.2.0.1".parse().expect("address");
    s7.version = "moved".into();
    moved
}

#[test]
fn a_restart_over_its_own_table_writes_nothing_or_only_what_differs() {
    let ns = Netns::new("reconcile");
    ns.run_in(|| {
        let (desired, context) = (services(), node_context());
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        backend(&outcomes, None).full_sync(&desired, &context).expect("the table created");
        assert_eq!(last(&outcomes), None, "no table yet: created, nothing to compare");
        let made = table();

        // Restarted over it, nothing written by anyone since: the generation proves the
        // table is as kpx's last write left it; nothing is read back, nothing written.
        let before = generation();
        backend(&outcomes, None).full_sync(&desired, &context).expect("restarted over it");
        assert_eq!(generation(), before, "not one transaction");
        assert_eq!(last(&outcomes), None, "nothing compared");
        assert_eq!(table(), made);

        // A change applied, then a restart: the record follows every write.
        let moved = one_endpoint_moved(&desired);
        let mut running = backend(&outcomes, None);
        running.full_sync(&desired, &context).expect("started");
        let changed =
            kpx_dataplane::state::ChangeSet { services: ["c/ns/s7".to_owned()].into(), node: false };
        running.apply(&moved, &context, &changed).expect("applied");
        let endpoints = nft(&["list", "map", "inet", "kpx", "endpoints-v4"], None);
        assert!(
            endpoints.contains("10.2.0.1") && !endpoints.contains(": 10.1.0.35 "),
            "the change applied over the bookkeeping rebuilt at start: {endpoints}"
        );
        let after_change = table();
        let before = generation();
        backend(&outcomes, None).full_sync(&moved, &context).expect("restarted after a change");
        assert_eq!(generation(), before, "not one transaction after the change either");
        assert_eq!(table(), after_change);

        // Restarted with another state than the one last written (a store one change
        // behind the kernel): the fingerprint differs, the table is compared.
        backend(&outcomes, None).full_sync(&desired, &context).expect("restarted with the older state");
        let Some(Reconciled::Written { kept, deleted, added }) = last(&outcomes) else {
            panic!("compared: {:?}", last(&outcomes));
        };
        assert!(
            kept >= 300 * 4 && (1..=4).contains(&deleted) && (1..=4).contains(&added),
            "{kept} {deleted} {added}"
        );
        assert_eq!(contents(), contents_of(&made), "the table is what it was made");

        // One element taken away and one put in behind kpx's back: one of each written.
        let endpoint = "10.96.0.7 . tcp . 80 . 2";
        nft(&["delete", "element", "inet", "kpx", "endpoints-v4", &format!("{{ {endpoint} }}")], None);
        nft(&["add", "element", "inet", "kpx", "no-endpoints-v4", "{ 10.96.9.9 . tcp . 99 }"], None);
        backend(&outcomes, None).full_sync(&desired, &context).expect("repaired");
        assert_eq!(
            last(&outcomes),
            Some(Reconciled::Written { kept: kept + deleted - 1, deleted: 1, added: 1 }),
            "the stray deleted and the missing endpoint added, nothing else"
        );
        assert_eq!(contents(), contents_of(&made), "the table is what it was made");

        // Someone else writes between the read and the write: caught, all written again.
        nft(&["flush", "set", "inet", "kpx", "written"], None);
        let stray = "add element inet kpx no-endpoints-v4 { 10.96.9.10 . tcp . 99 }\n".to_owned();
        backend(&outcomes, Some(stray)).full_sync(&desired, &context).expect("rewritten");
        assert_eq!(last(&outcomes), Some(Reconciled::Moved));
        assert_eq!(contents(), contents_of(&made), "rewritten whole: the other write's element is gone");
    });
}

/// [`contents`] of a listing made earlier.
fn contents_of(listed: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(listed).expect("JSON");
    if let Some(items) = v["nftables"].as_array_mut() {
        items.retain(|i| i["set"]["name"] != "written");
    }
    v.to_string()
}

#[test]
fn a_batch_written_against_an_old_generation_is_refused_whole() {
    let ns = Netns::new("generation");
    ns.run_in(|| {
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        backend(&outcomes, None).full_sync(&services(), &node_context()).expect("the table created");
        let made = table();
        let mut netlink = NftNetlink::new();
        let read = netlink.generation().expect("the generation");
        let layout =
            kpx_dataplane::backend::nftables::names::Collection::NoEndpoints(kpx_proto::family::Family::V4)
                .layout()
                .expect("an updatable set");
        let entry = Values::of(&[
            Value::Address("10.96.9.11".parse().expect("an address")),
            Value::Protocol(kpx_proto::types::Protocol::Tcp),
            Value::Port(99),
        ]);
        let add = ElementUpdate {
            flush: vec![],
            delete: vec![],
            add: vec![kpx_dataplane::exec::nft::elements::SetElements {
                set: "no-endpoints-v4".into(),
                layout,
                elements: vec![(&entry, None)],
            }],
        };
        // Someone else's transaction moves the generation on.
        nft(&["add", "chain", "inet", "kpx", "someone-elses"], None);
        let after_other = netlink.generation().expect("the generation");
        assert_eq!(after_other, read.wrapping_add(1), "one transaction, one generation");
        assert!(!netlink.update_elements_at(read, &add).expect("answered"), "refused: it moved");
        let listed = nft(&["list", "set", "inet", "kpx", "no-endpoints-v4"], None);
        assert!(!listed.contains("10.96.9.11"), "nothing of the batch applied: {listed}");
        assert!(netlink.update_elements_at(after_other, &add).expect("answered"), "the generation of now");
        let listed = nft(&["list", "set", "inet", "kpx", "no-endpoints-v4"], None);
        assert!(listed.contains("10.96.9.11"), "{listed}");
        assert_ne!(table(), made);
    });
}

/// The real iptables of a flavour, keeping every restore input it was given.
struct Restores {
    iptables: IptablesProcess,
    given: Arc<Mutex<Vec<String>>>,
}

impl Iptables for Restores {
    fn restore(&mut self, family: Family, script: &str) -> Result<(), ExecError> {
        self.given.locked().push(script.to_owned());
        self.iptables.restore(family, script)
    }
    fn save(&mut self, family: Family) -> Result<String, ExecError> {
        self.iptables.save(family)
    }
    fn list_chain(&mut self, family: Family, table: &str, chain: &str) -> Result<String, ExecError> {
        self.iptables.list_chain(family, table, chain)
    }
}

/// The `KPX-` lines of iptables-save of `flavour` (IPv4), counters left out.
fn kpx_lines(flavour: &str) -> String {
    let out =
        std::process::Command::new(format!("iptables-{flavour}-save")).output().expect("iptables-save runs");
    assert!(out.status.success(), "iptables-save: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("KPX-") && !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_owned() + "\n")
        .collect()
}

fn iptables_restart(flavour: Flavour, name: &'static str) {
    let ns = Netns::new("restart");
    ns.run_in(move || {
        // Beside the 300 Services: one without endpoints (a REJECT rule) and NodePorts on
        // 127.0.0.1 (the localhost drop rule): rules whose saved form differs most.
        let mut desired = services();
        let none = state(&[("empty", "10.96.9.1", &[])]);
        desired.services_mut().extend(Arc::unwrap_or_clone(none.services));
        let mut context = node_context();
        context.nodeport_addresses.push("127.0.0.1".parse().expect("address"));
        let given = Arc::new(Mutex::new(Vec::new()));
        let backend = || {
            let iptables = Restores { iptables: IptablesProcess { flavour }, given: Arc::clone(&given) };
            IptablesBackend::new(Box::new(iptables))
        };
        let taken = || std::mem::take(&mut *given.locked());
        backend().full_sync(&desired, &context).expect("the rules made");
        assert!(!taken().is_empty(), "written");
        let made = kpx_lines(name);
        assert!(made.matches(":KPX-SVC-").count() >= 300, "a chain per Service:\n{made}");

        // Restarted over them: nothing to write, nothing restored.
        backend().full_sync(&desired, &context).expect("restarted over them");
        let again = taken();
        assert!(again.is_empty(), "the kernel holds every chain as wanted: {again:?}");

        // One Service's chain emptied behind kpx's back: that chain alone is written.
        let chain = made
            .lines()
            .find(|l| l.starts_with(":KPX-SVC-"))
            .and_then(|l| l.strip_prefix(':'))
            .and_then(|l| l.split(' ').next())
            .expect("a Service chain")
            .to_owned();
        let out = std::process::Command::new(format!("iptables-{name}"))
            .args(["-t", "nat", "-F", &chain])
            .output()
            .expect("iptables runs");
        assert!(out.status.success(), "iptables -F: {}", String::from_utf8_lossy(&out.stderr));
        assert_ne!(kpx_lines(name), made);
        backend().full_sync(&desired, &context).expect("repaired");
        let written = taken();
        let declared: Vec<&str> =
            written.iter().flat_map(|s| s.lines()).filter(|l| l.starts_with(':')).collect();
        assert_eq!(declared, [format!(":{chain} - [0:0]")], "{written:?}");
        assert_eq!(kpx_lines(name), made, "the rules are what they were made");
    });
}

#[test]
fn iptables_nft_restarted_over_its_rules_writes_only_the_chains_that_differ() {
    iptables_restart(Flavour::Nft, "nft");
}

#[test]
fn iptables_legacy_restarted_over_its_rules_writes_only_the_chains_that_differ() {
    iptables_restart(Flavour::Legacy, "legacy");
}
