//! The apply pipeline (validate → state → backend → store → ACK, or NACK with undo) over
//! the fake kernel: no root, no processes.

use std::sync::Arc;

use kpx_proto::node_context::ProxySettings;
use kpx_proto::types::{NodeConfig, Protocol, ServicePort, ServiceView};
use kpx_proto::version::content_version;
use kpx_proto::ResourceType;

use super::{Agent, ApplyError};
use crate::backend::fixtures::{endpoint, service};
use crate::backend::nftables::NftablesBackend;
use crate::exec::fake::{FakeConntrack, FakeNft};
use crate::exec::nft::Nft;
use crate::state::RawResource;
use crate::store::Store;

const WEB: &str = "c/ns/web";
const SERVICES: &str = "type.googleapis.com/kpx.v1.ServiceView";

pub(super) struct Node {
    dir: tempfile::TempDir,
    nft: FakeNft,
    conntrack: FakeConntrack,
}

impl Node {
    pub(super) fn new() -> Node {
        Node { dir: tempfile::tempdir().expect("tmp"), nft: FakeNft::new(), conntrack: FakeConntrack::new() }
    }

    /// An agent over this node's store and kernel (a restart when called again).
    pub(super) fn agent(&self) -> Agent {
        self.agent_with(ProxySettings::default())
    }

    fn agent_with(&self, settings: ProxySettings) -> Agent {
        let backend = Box::new(NftablesBackend::new(Box::new(self.nft.clone())));
        let store = self.store();
        Agent::start("n1".into(), settings, backend, store, Arc::new(self.conntrack.clone()), "test".into())
            .expect("start")
    }

    /// The store, once the agent that had it let go of it (sled's flusher thread holds the
    /// lock a moment after the last handle is dropped).
    fn store(&self) -> Store {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match Store::open(self.dir.path()) {
                Ok(store) => return store,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("store: {e}"),
            }
        }
    }

    /// The nftables table as the kernel would list it.
    /// kpx's table as listed, but for the element recording kpx's last write (its
    /// generation moves with every transaction; `backend::nftables::written`).
    fn table(&self) -> String {
        let listed = self.nft.clone().list_table().expect("list");
        let mut in_written = false;
        listed
            .lines()
            .filter(|l| {
                in_written |= l.trim() == "set written {";
                let keep = !(in_written && l.trim().starts_with("elements = "));
                in_written &= l.trim() != "}";
                keep
            })
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

fn raw(view: &ServiceView) -> RawResource {
    let body = view.encode();
    RawResource {
        name: view.resource_name(),
        version: content_version(&body),
        type_url: SERVICES.into(),
        body,
    }
}

fn node_config(config: &NodeConfig) -> RawResource {
    let body = config.encode();
    RawResource {
        name: config.name.clone(),
        version: content_version(&body),
        type_url: ResourceType::NodeConfig.type_url().into(),
        body,
    }
}

fn web(endpoints: &[&str]) -> ServiceView {
    service("web", "10.96.0.10", endpoints)
}

#[test]
fn a_delta_reaches_the_kernel_and_the_store_before_it_is_acked() {
    let node = Node::new();
    let mut agent = node.agent();
    assert!(!node.nft.has_table(), "a first start has nothing to program");
    assert_eq!(
        agent.proxy_health().borrow().answer(crate::status::Probe::Healthz, std::time::SystemTime::now()).0,
        200,
        "and nothing out of sync"
    );
    let applied = agent.apply(SERVICES, vec![raw(&web(&["10.244.0.1"]))], vec![]).expect("ACK");
    assert_eq!((applied.resources, applied.removed), (1, 0));
    assert_eq!(node.nft.elements("service-ips-v4"), ["10.96.0.10 . tcp . 80 : goto pick-v4-1"]);
    assert_eq!(node.nft.elements("endpoints-v4"), ["10.96.0.10 . tcp . 80 . 0 : 10.244.0.1 . 8080"]);
    assert_eq!(agent.status.applies, 1);
    drop(agent);
    let stored = node.store().load().expect("read").expect("intact");
    assert_eq!(stored.services[WEB].version, raw(&web(&["10.244.0.1"])).version);

    let mut agent = node.agent();
    let before = node.nft.transactions();
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.1"]))], vec![]).expect("ACK");
    assert_eq!(node.nft.transactions(), before, "a version the node has is no change");
    agent.apply(SERVICES, vec![], vec![WEB.into()]).expect("ACK");
    assert!(node.nft.elements("service-ips-v4").is_empty(), "{}", node.table());
}

#[test]
fn a_refused_update_is_a_nack_and_the_last_good_state_stays_in_kernel_and_store() {
    let node = Node::new();
    let mut agent = node.agent();
    let good = raw(&web(&["10.244.0.1"]));
    agent.apply(SERVICES, vec![good.clone()], vec![]).expect("ACK");
    let kernel_before = node.table();
    node.nft.fail_next("Could not process rule: No buffer space available");
    let err = agent.apply(SERVICES, vec![raw(&web(&["10.244.0.2"]))], vec![]).expect_err("NACK");
    assert!(matches!(err, ApplyError::Backend { .. }), "{err}");
    assert!(err.to_string().contains("No buffer space available"), "the reason goes back: {err}");
    assert_eq!(agent.state().services[WEB].version, good.version, "state undone");
    assert_eq!(node.table(), kernel_before, "kernel as before (restored by a full sync)");
    assert_eq!((agent.status.nacks, agent.status.out_of_sync), (1, true), "behind until a change succeeds");
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.2"]))], vec![]).expect("ACK: the change again");
    assert!(!agent.status.out_of_sync, "in sync once it is in");
    agent.apply(SERVICES, vec![good.clone()], vec![]).expect("ACK: back to the last good state");
    assert_eq!(node.table(), kernel_before);
    drop(agent);
    let stored = node.store().load().expect("read").expect("intact");
    assert_eq!(stored.services[WEB].version, good.version, "store as before");

    // When even the restoring full sync fails, the node says it is out of sync. (Another
    // program's write first: else the kernel, proven unchanged since kpx's last write,
    // needs no write to be restored.)
    let mut agent = node.agent();
    node.nft.clone().run("flush set inet kpx written").expect("another program's write");
    node.nft.fail_next("refused");
    node.nft.fail_next("refused again");
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.3"]))], vec![]).expect_err("NACK");
    assert!(agent.status.out_of_sync);
    assert_eq!(
        agent.proxy_health().borrow().answer(crate::status::Probe::Healthz, std::time::SystemTime::now()).0,
        503
    );
    agent.resync();
    assert!(!agent.status.out_of_sync && node.table() == kernel_before, "the periodic resync repairs it");
    assert_eq!(
        agent.proxy_health().borrow().answer(crate::status::Probe::Healthz, std::time::SystemTime::now()).0,
        200
    );
}

#[test]
fn an_invalid_resource_refuses_the_whole_response_before_the_kernel() {
    let node = Node::new();
    let mut agent = node.agent();
    let before = node.nft.transactions();
    let mut bad = raw(&web(&["10.244.0.1"]));
    bad.body = vec![0xff, 0xff, 0xff];
    let other = raw(&service("other", "10.96.0.11", &["10.244.0.9"]));
    let err = agent.apply(SERVICES, vec![other, bad], vec![]).expect_err("NACK");
    assert!(matches!(err, ApplyError::Invalid(_)), "{err}");
    assert!(err.to_string().contains(WEB), "names the resource: {err}");
    assert_eq!(node.nft.transactions(), before, "nothing reached the kernel");
    assert!(agent.state().services.is_empty(), "not even the valid one");
    let err = agent.apply("type.googleapis.com/kpx.v1.Other", vec![], vec![]).expect_err("unknown type");
    assert!(err.to_string().contains("kpx.v1.Other"), "{err}");
    // The last NACK is kept apart from connection errors.
    agent.set_connected(false, Some("connect: connection refused".into()));
    let (type_url, reason, _) = agent.status.last_nack.clone().expect("a NACK is remembered");
    assert_eq!(type_url, "type.googleapis.com/kpx.v1.Other");
    assert!(reason.contains("unknown resource type"), "{reason}");
    assert_eq!(agent.status.last_error, "connect: connection refused");
}

#[test]
fn a_restart_programs_the_stored_state_before_any_control_plane_answers() {
    let node = Node::new();
    let mut agent = node.agent();
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.1"]))], vec![]).expect("ACK");
    drop(agent);
    // A reboot: the kernel lost everything, the state directory did not.
    let node = Node { nft: FakeNft::new(), ..node };
    let agent = node.agent();
    assert_eq!(node.nft.elements("endpoints-v4"), ["10.96.0.10 . tcp . 80 . 0 : 10.244.0.1 . 8080"]);
    let versions = agent.state().versions(ResourceType::ServiceView);
    assert_eq!(versions.get(WEB), Some(&raw(&web(&["10.244.0.1"])).version), "resumes with what it has");
}

#[test]
fn a_damaged_store_leaves_the_kernel_alone_until_the_control_planes_full_state_is_in() {
    let node = Node::new();
    let mut agent = node.agent();
    agent
        .apply(
            SERVICES,
            vec![raw(&web(&["10.244.0.1"])), raw(&service("db", "10.96.0.11", &["10.244.0.9"]))],
            vec![],
        )
        .expect("ACK");
    drop(agent);
    let kernel = node.table();
    node.store().insert_raw(format!("svc/{WEB}").as_bytes(), b"\x00\x02v1\xff\xff");
    let transactions = node.nft.transactions();
    let mut agent = node.agent();
    assert!(agent.recovering());
    assert!(
        agent.state().versions(ResourceType::ServiceView).is_empty(),
        "no versions: everything is resent"
    );
    assert_eq!(node.nft.transactions(), transactions, "the kernel was not touched");
    assert!(agent.status.last_error.contains("damaged"), "{}", agent.status.last_error);
    assert_eq!(
        agent.proxy_health().borrow().answer(crate::status::Probe::Healthz, std::time::SystemTime::now()).0,
        503,
        "not synced yet"
    );
    // The control plane sends the state in parts; none of it reaches the kernel yet.
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.2"]))], vec![]).expect("ACK");
    agent.resync();
    assert_eq!(node.table(), kernel, "still the rules the kernel had");
    agent.apply(SERVICES, vec![raw(&service("db", "10.96.0.11", &["10.244.0.9"]))], vec![]).expect("ACK");
    agent.finish_recovery();
    assert!(!agent.recovering());
    assert_eq!(
        node.nft.elements("endpoints-v4"),
        ["10.96.0.10 . tcp . 80 . 0 : 10.244.0.2 . 8080", "10.96.0.11 . tcp . 80 . 0 : 10.244.0.9 . 8080"]
    );
    assert_eq!(
        agent.proxy_health().borrow().answer(crate::status::Probe::Healthz, std::time::SystemTime::now()).0,
        200
    );
    drop(agent);
    let reopened = node.store().load().expect("read").expect("the store is whole again");
    assert_eq!(reopened.services.len(), 2);
}

#[test]
fn an_empty_store_beside_kpxs_rules_is_suspicious_not_truth() {
    let node = Node::new();
    let mut agent = node.agent();
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.1"]))], vec![]).expect("ACK");
    drop(agent);
    // The state directory is gone (a pod without its hostPath), the kernel's rules are not.
    let node = Node { dir: tempfile::tempdir().expect("tmp"), ..node };
    let kernel = node.table();
    let agent = node.agent();
    assert!(agent.recovering(), "kpx's table is there: the empty store is not the truth");
    assert_eq!(node.table(), kernel);
    drop(agent);
    // A node where kpx never ran has nothing to program, and programs what comes whole.
    let fresh = Node::new();
    let mut agent = fresh.agent();
    assert!(!agent.recovering() && !fresh.nft.has_table() && fresh.nft.transactions() == 0);
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.1"]))], vec![]).expect("ACK");
    assert_eq!(
        (fresh.nft.transactions(), fresh.nft.element_updates()),
        (3, 2),
        "one full sync: its rules, then its elements, then the record of that write"
    );
}

#[test]
fn a_node_config_change_reprograms_with_the_new_context_and_a_refusal_keeps_the_old() {
    let node = Node::new();
    let mut agent = node.agent();
    let mut config = NodeConfig {
        name: "n1".into(),
        addresses: vec!["10.0.0.1".parse().expect("ip")],
        pod_cidrs: vec!["10.244.1.0/24".parse().expect("cidr")],
        ..Default::default()
    };
    let configs = ResourceType::NodeConfig.type_url();
    agent.apply(configs, vec![node_config(&config)], vec![]).expect("ACK");
    assert_eq!(node.nft.elements("local-cidrs-v4"), ["10.244.1.0/24"]);
    assert_eq!(agent.context().nodeport_addresses, config.addresses);
    config.pod_cidrs = vec!["10.244.2.0/24".parse().expect("cidr")];
    node.nft.fail_next("refused");
    agent.apply(configs, vec![node_config(&config)], vec![]).expect_err("NACK");
    assert_eq!(node.nft.elements("local-cidrs-v4"), ["10.244.1.0/24"]);
    assert_eq!(agent.context().local.cidrs(), ["10.244.1.0/24".parse::<ipnet::IpNet>().expect("cidr")]);
    agent.apply(configs, vec![node_config(&config)], vec![]).expect("ACK");
    assert_eq!(node.nft.elements("local-cidrs-v4"), ["10.244.2.0/24"]);
    let other = NodeConfig { name: "n2".into(), ..config.clone() };
    let err = agent.apply(configs, vec![node_config(&other)], vec![]).expect_err("another node's config");
    assert!(err.to_string().contains("another node"), "{err}");

    // The agent's own --cluster-cidr wins over the config's pod CIDRs.
    drop(agent);
    let settings =
        ProxySettings { cluster_cidrs: vec!["10.32.0.0/12".parse().expect("cidr")], ..Default::default() };
    let agent = node.agent_with(settings);
    assert_eq!(node.nft.elements("local-cidrs-v4"), ["10.32.0.0/12"]);
    assert_eq!(agent.context().nodeport_addresses, config.addresses, "the stored config still counts");
}

#[test]
fn an_endpoint_that_goes_away_takes_its_stale_udp_flows_with_it() {
    let node = Node::new();
    let mut agent = node.agent();
    let dns = |endpoints: &[&str]| {
        let eps = endpoints.iter().map(|a| endpoint(a, "n1")).collect();
        ServiceView::new(
            "c",
            "ns",
            "dns",
            vec!["10.96.0.53".parse().expect("ip")],
            vec![ServicePort::new("dns", Protocol::Udp, 53, eps)],
        )
    };
    agent.apply(SERVICES, vec![raw(&dns(&["10.244.0.1", "10.244.0.2"]))], vec![]).expect("ACK");
    let first = node.conntrack.take();
    assert_eq!(first.len(), 1, "a port's first endpoints clear what was sent while none answered: {first:?}");
    assert_eq!((first[0].destination, first[0].nat_to), (Some("10.96.0.53".parse().expect("ip")), None));
    agent.apply(SERVICES, vec![raw(&dns(&["10.244.0.2"]))], vec![]).expect("ACK");
    let gone = node.conntrack.take();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0].nat_to, Some("10.244.0.1:8080".parse().expect("ip:port")));
    assert_eq!(
        gone[0].args().join(" "),
        "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.244.0.1 --reply-port-src 8080"
    );
    node.nft.fail_next("refused");
    agent.apply(SERVICES, vec![raw(&dns(&[]))], vec![]).expect_err("NACK");
    assert!(node.conntrack.take().is_empty(), "a refused update deletes no flows");
}

#[test]
fn rules_flushed_behind_its_back_are_found_by_the_canary_and_programmed_again() {
    let node = Node::new();
    let mut agent = node.agent();
    agent.check_rules();
    assert_eq!(node.nft.transactions(), 0, "nothing programmed yet: nothing to check");
    agent.apply(SERVICES, vec![raw(&web(&["10.244.0.1"]))], vec![]).expect("ACK");
    let programmed = node.table();
    let before = node.nft.transactions();
    agent.check_rules();
    assert_eq!(node.nft.transactions(), before, "intact rules are left alone");
    let repaired = |agent: &Agent| {
        let text = agent.metrics.render();
        text.lines().find(|l| l.starts_with("kpx_rules_repaired_total ")).map(str::to_owned)
    };
    assert_eq!(repaired(&agent).as_deref(), Some("kpx_rules_repaired_total 0"));
    // `nft flush ruleset`: the table is gone.
    node.nft.clone().run("delete table inet kpx").expect("delete");
    agent.check_rules();
    assert_eq!(node.table(), programmed, "programmed again, whole");
    // A flush of the table's rules (the canary's among them).
    node.nft.clone().run("flush chain inet kpx canary").expect("flush");
    agent.check_rules();
    assert_eq!(node.table(), programmed);
    assert_eq!(repaired(&agent).as_deref(), Some("kpx_rules_repaired_total 2"));
}
