//! Faults under continuous traffic, over real processes: a control plane killed and
//! started again (nothing resent; a change made while it was down arrives, and only it),
//! a second replica taking over, the link to the control plane cut (noticed by HTTP/2
//! keepalive, resumed when it is back), a control plane that stalls, the agent killed in
//! the middle of programming 10,000 Services (the kernel holds each Service whole or not
//! at all), and its state directory on a full filesystem. Each counts the requests a
//! prober sent and fails if one of them failed. A damaged store and rules flushed behind
//! the agent's back are scenarios of the behaviour suite (`kpx_e2e::scenarios::behaviour`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::kernel_rules::{tcp_cluster_ips, Programmed};
use crate::harness::manifests::{documents, ep, service, slice};
use crate::harness::process::KpxProcess;
use crate::harness::topology::{sock, ProxyBackend, Topology, CONTROL_PLANE_ADDR, NODE_NAME};
use crate::harness::traffic::Prober;
use crate::{wait_for, DEADLINE};

const WEB_VIP: &str = "10.96.4.10";
const API_VIP: &str = "10.96.4.11";
const SERVICE_VIEW: &str = "type.googleapis.com/kpx.v1.ServiceView";
const NODE_CONFIG: &str = "type.googleapis.com/kpx.v1.NodeConfig";

fn spec(vip: &str) -> String {
    format!("  clusterIP: {vip}\n  ports:\n  - {{name: http, protocol: TCP, port: 80}}\n")
}

/// `web` on pod0 (the one probed) and `api` on pod `api_pod`.
fn manifests(t: &Topology, api_pod: usize) {
    t.write_manifest(
        "web.yaml",
        &documents(&[
            service("web", &spec(WEB_VIP), ""),
            slice("web", "web-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(0))]),
            service("api", &spec(API_VIP), ""),
            slice("api", "api-1", false, &[("http", "TCP", 8080)], &[ep(Topology::pod_ip(api_pod))]),
        ]),
    );
}

/// How soon a dead or stalled stream must be noticed with the default keepalive (a PING
/// every 10 s, 10 s for its answer): 30 s, and 10 s more on an emulated CPU.
fn keepalive_bound() -> Duration {
    Duration::from_secs(if crate::harness::traffic::patience() > 1 { 40 } else { 30 })
}

fn message(e: &serde_json::Value) -> &str {
    e["message"].as_str().unwrap_or_default()
}

/// How many times the agent has found its control plane unreachable so far.
fn unreachable(dp: &KpxProcess) -> usize {
    dp.events().iter().filter(|e| message(e).starts_with("control plane unreachable")).count()
}

/// How many streams the agent has opened so far.
fn streams_opened(dp: &KpxProcess) -> usize {
    dp.events().iter().filter(|e| message(e).starts_with("stream open")).count()
}

/// What a control plane sent when the node's subscriptions of each type were synced:
/// (ServiceView resources, NodeConfig resources).
fn sent_on_resume(cp: &KpxProcess) -> (u64, u64) {
    let sent = |type_url: &str| {
        let e = cp.wait_event("the resumed subscription synced", DEADLINE, |e| {
            message(e) == "subscription synced" && e["type_url"] == type_url
        });
        e["sent"].as_u64().unwrap_or(u64::MAX) + e["removed"].as_u64().unwrap_or(u64::MAX)
    };
    (sent(SERVICE_VIEW), sent(NODE_CONFIG))
}

fn start() -> (Topology, Vec<crate::harness::traffic::Backend>) {
    let t = Topology::new(2);
    let backends = t.start_backends(8080);
    t.write_node();
    manifests(&t, 1);
    (t, backends)
}

fn probe(t: &Topology) -> Prober {
    Prober::start(
        &t.client,
        &[sock(WEB_VIP, 80)],
        "pod0",
        Duration::from_millis(20),
        Duration::from_secs(240),
    )
}

pub fn control_plane_crash_and_a_change_while_it_is_down(backend: ProxyBackend) {
    let (t, _backends) = start();
    let mut cp = t.start_control_plane();
    let dp = t.start_dataplane_with(backend, &[]);
    t.wait_answered_by(WEB_VIP, 80, "pod0");
    t.wait_answered_by(API_VIP, 80, "pod1");
    let prober = probe(&t);

    // Killed and started again with nothing changed: the node resumes, nothing is resent.
    cp.kill();
    std::thread::sleep(Duration::from_secs(1));
    let opened = streams_opened(&dp);
    cp = t.start_control_plane();
    assert_eq!(sent_on_resume(&cp), (0, 0), "nothing resent to a node that has everything");
    wait_for("the node to resume", DEADLINE, || (streams_opened(&dp) > opened).then_some(()));

    // Killed, and `api` moves to pod0 meanwhile: exactly that change arrives.
    cp.kill();
    manifests(&t, 0);
    std::thread::sleep(Duration::from_secs(1));
    cp = t.start_control_plane();
    assert_eq!(sent_on_resume(&cp), (1, 0), "only the Service that changed");
    t.wait_answered_by(API_VIP, 80, "pod0");
    let seen = prober.finish();
    println!("{backend:?}: control plane killed twice: {} requests, {} failed", seen.sent, seen.failed);
    assert!(seen.sent > 50, "{seen:?}");
    assert_eq!(seen.failed, 0, "{seen:?}");
    drop(cp);
}

pub fn a_second_replica_takes_over(backend: ProxyBackend) {
    let (t, _backends) = start();
    let mut first = t.start_control_plane();
    let second_addr = "127.0.0.1:18010";
    let second = t.start_control_plane_at(second_addr, "127.0.0.1:18012");
    // Both listening before the agent starts: it must begin with the first one.
    for cp in [&first, &second] {
        cp.wait_event("the replica to listen", DEADLINE, |e| {
            message(e) == "serving delta xDS and the admin API"
        });
    }
    let replicas = format!("http://{CONTROL_PLANE_ADDR},http://{second_addr}");
    let mut flags = vec![];
    flags.extend(backend.args().iter().map(|a| (*a).to_owned()));
    let dp = t.start_agent(NODE_NAME, &replicas, "state", &flags);
    t.wait_answered_by(WEB_VIP, 80, "pod0");
    first.wait_event("the node's stream", DEADLINE, |e| message(e) == "subscription synced");
    let prober = probe(&t);
    let opened = streams_opened(&dp);
    first.kill();
    let failed_over = Instant::now();
    wait_for("the node to follow the second replica", DEADLINE, || {
        (streams_opened(&dp) > opened).then_some(())
    });
    let took = failed_over.elapsed();
    assert_eq!(sent_on_resume(&second), (0, 0), "replicas serve the same versions: nothing resent");
    let sent = prober.result().sent;
    wait_for("100 requests more through the second replica's rules", DEADLINE, || {
        (prober.result().sent > sent + 100).then_some(())
    });
    // A change now reaches the node through the second replica.
    manifests(&t, 0);
    t.wait_answered_by(API_VIP, 80, "pod0");
    let seen = prober.finish();
    println!(
        "{backend:?}: failover to the second replica in {} ms; {} requests, {} failed",
        took.as_millis(),
        seen.sent,
        seen.failed
    );
    assert_eq!(seen.failed, 0, "{seen:?}");
}

pub fn a_cut_link_is_noticed_by_keepalive_and_the_stream_resumes(backend: ProxyBackend) {
    let (t, _backends) = start();
    let cp = t.start_control_plane();
    let dp = t.start_dataplane_with(backend, &[]);
    t.wait_answered_by(WEB_VIP, 80, "pod0");
    cp.wait_event("the node's stream", DEADLINE, |e| message(e) == "subscription synced");
    let prober = probe(&t);
    let port = CONTROL_PLANE_ADDR.rsplit(':').next().unwrap_or("18000");
    // Every packet to or from the control plane's port is dropped (its own table, not kpx's).
    t.node.exec("nft", &["add", "table", "inet", "cut"]);
    t.node.exec("nft", &["add chain inet cut out { type filter hook output priority -300 ; }"]);
    for direction in ["dport", "sport"] {
        t.node.exec("nft", &["add", "rule", "inet", "cut", "out", "tcp", direction, port, "drop"]);
    }
    let since = Instant::now();
    let before = unreachable(&dp);
    wait_for("the agent to notice the dead stream", Duration::from_secs(60), || {
        (unreachable(&dp) > before).then_some(())
    });
    let noticed = since.elapsed();
    cp.wait_event("the control plane to drop the dead stream", Duration::from_secs(60), |e| {
        (message(e) == "stream ended" || message(e) == "stream closed") && e["node"] == NODE_NAME
    });
    let freed = since.elapsed();
    std::thread::sleep(Duration::from_secs(30).saturating_sub(since.elapsed()));
    let opened = streams_opened(&dp);
    t.node.exec("nft", &["delete", "table", "inet", "cut"]);
    let restored = Instant::now();
    wait_for("the stream to resume", Duration::from_secs(60), || {
        (streams_opened(&dp) > opened).then_some(())
    });
    let resumed = restored.elapsed();
    let seen = prober.finish();
    println!(
        "{backend:?}: link cut for {:.0} s: the agent noticed in {:.1} s, the control plane freed the stream in {:.1} s, resumed {:.1} s after the link was back; {} requests, {} failed",
        since.elapsed().as_secs_f64() - resumed.as_secs_f64(),
        noticed.as_secs_f64(),
        freed.as_secs_f64(),
        resumed.as_secs_f64(),
        seen.sent,
        seen.failed
    );
    assert!(noticed <= keepalive_bound(), "noticed within the default keepalive bound: {noticed:?}");
    assert_eq!(seen.failed, 0, "{seen:?}");
    // Nothing was lost meanwhile: a change still arrives.
    manifests(&t, 0);
    t.wait_answered_by(API_VIP, 80, "pod0");
}

/// A control plane that stalls (frozen with SIGSTOP: its TCP connections stay up, the
/// kernel even accepts new ones, but nothing answers) while a second replica is up: the
/// agent notices by HTTP/2 keepalive within the default bound (a PING every 10 s, 10 s
/// for its answer), follows the second replica, and a change arrives through it. The
/// stalled one, let run again, sees the node gone and drops its stream; when the second
/// replica is killed, the agent goes back to the first. A prober sees no failure.
pub fn a_stalled_control_plane_is_noticed_and_another_replica_followed(backend: ProxyBackend) {
    let (t, _backends) = start();
    let first = t.start_control_plane();
    let second_addr = "127.0.0.1:18010";
    let mut second = t.start_control_plane_at(second_addr, "127.0.0.1:18012");
    for cp in [&first, &second] {
        cp.wait_event("the replica to listen", DEADLINE, |e| {
            message(e) == "serving delta xDS and the admin API"
        });
    }
    let replicas = format!("http://{CONTROL_PLANE_ADDR},http://{second_addr}");
    let flags: Vec<String> = backend.args().iter().map(|a| (*a).to_owned()).collect();
    let dp = t.start_agent(NODE_NAME, &replicas, "state", &flags);
    t.wait_answered_by(WEB_VIP, 80, "pod0");
    first.wait_event("the node's stream", DEADLINE, |e| message(e) == "subscription synced");
    let prober = probe(&t);
    let (failed_before, opened) = (unreachable(&dp), streams_opened(&dp));
    first.freeze();
    let stalled = Instant::now();
    wait_for("the agent to notice the stalled control plane", Duration::from_secs(60), || {
        (unreachable(&dp) > failed_before).then_some(())
    });
    let noticed = stalled.elapsed();
    wait_for("the agent to follow the second replica", Duration::from_secs(60), || {
        (streams_opened(&dp) > opened).then_some(())
    });
    let followed = stalled.elapsed();
    assert_eq!(sent_on_resume(&second), (0, 0), "nothing resent by the second replica");
    manifests(&t, 0);
    t.wait_answered_by(API_VIP, 80, "pod0");

    // The first runs again: the node's old stream is gone, and it lets it go.
    first.thaw();
    first.wait_event("the thawed replica to drop the node's dead stream", Duration::from_secs(60), |e| {
        (message(e) == "stream ended" || message(e) == "stream closed") && e["node"] == NODE_NAME
    });
    let opened = streams_opened(&dp);
    second.kill();
    wait_for("the agent to go back to the first replica", Duration::from_secs(60), || {
        (streams_opened(&dp) > opened).then_some(())
    });
    manifests(&t, 1);
    t.wait_answered_by(API_VIP, 80, "pod1");
    let seen = prober.finish();
    println!(
        "{backend:?}: a stalled control plane noticed in {:.1} s, the second replica followed {:.1} s after the stall; {} requests, {} failed",
        noticed.as_secs_f64(),
        followed.as_secs_f64(),
        seen.sent,
        seen.failed
    );
    assert!(noticed <= keepalive_bound(), "noticed within the default keepalive bound: {noticed:?}");
    assert_eq!(seen.failed, 0, "{seen:?}");
    drop(first);
}

/// Writes zeros to `path` until the filesystem is full; returns how much it wrote.
fn fill(path: &std::path::Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("the filler file");
    let block = vec![0u8; 64 << 10];
    let mut written = 0;
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
    written
}

/// The agent's state directory on a full filesystem (a tmpfs of its own): a change is
/// NACKed with the reason (the control plane logs it), the kernel keeps the last good
/// rules (the Service still answers from its old endpoint), and once there is space
/// again the agent gets the change and programs it, without a restart. A prober on
/// another Service sees no failure throughout.
pub fn a_full_state_filesystem_nacks_and_recovers(backend: ProxyBackend) {
    let (t, _backends) = start();
    let cp = t.start_control_plane();
    let (dp, state) = t.start_dataplane_on_tmpfs(backend, "16m");
    t.wait_answered_by(WEB_VIP, 80, "pod0");
    t.wait_answered_by(API_VIP, 80, "pod1");
    let prober = probe(&t);
    let filler = dp.path_inside(&state.join("filler"));
    let filled = fill(&filler);
    let nacks = |cp: &KpxProcess| cp.events().iter().filter(|e| message(e).starts_with("NACK")).count();
    let before = nacks(&cp);
    // Big enough to need new room in the store's log (a small one fits in what it has):
    // Services without endpoints (about 6 minutes with IPVS on the emulated CPU, where
    // each new Service costs a conntrack process; 2 s here).
    t.write_manifest("many.yaml", &services_without_endpoints(FILLER_SERVICES));
    manifests(&t, 0);
    let slow = Duration::from_secs(if crate::harness::traffic::patience() > 1 { 300 } else { 30 });
    let nack = cp.wait_event("the change NACKed", slow, |e| message(e).starts_with("NACK"));
    println!("{backend:?}: state filesystem full ({} KiB written): NACK {}", filled >> 10, nack["reason"]);
    assert!(nacks(&cp) > before);
    for _ in 0..20 {
        assert_eq!(
            t.client
                .run_in(|| crate::harness::traffic::tcp_request(crate::harness::topology::sock(API_VIP, 80))),
            crate::harness::traffic::Answer::From("pod1".into()),
            "the kernel keeps the last good rules"
        );
    }
    assert!(
        !tcp_cluster_ips(&t.node, backend).keys().any(|k| k.starts_with("10.97.")),
        "none of the refused Services is in the kernel"
    );
    std::fs::remove_file(&filler).expect("remove the filler");
    let freed = Instant::now();
    wait_for("the change programmed", slow, || {
        (t.client
            .run_in(|| crate::harness::traffic::tcp_request(crate::harness::topology::sock(API_VIP, 80)))
            == crate::harness::traffic::Answer::From("pod0".into()))
        .then_some(())
    });
    if backend != ProxyBackend::Ipvs {
        // The check above sees these Services once they are programmed (rejected: they
        // have no endpoints), so its "none" meant none.
        let key = format!("{}:80", many_vip(0));
        wait_for("the filler Services in the kernel, rejected", slow, || {
            (tcp_cluster_ips(&t.node, backend).get(&key) == Some(&Programmed::Rejected)).then_some(())
        });
    }
    let seen = prober.finish();
    println!(
        "{backend:?}: space back: the change programmed {:.1} s later; {} requests, {} failed",
        freed.elapsed().as_secs_f64(),
        seen.sent,
        seen.failed
    );
    assert_eq!(seen.failed, 0, "{seen:?}");
}

/// How many Services without endpoints fill the store's log past the room it has.
const FILLER_SERVICES: usize = 4_000;

/// `n` Services `many-I` (ClusterIP 10.97.x.y, port 80) without endpoints.
fn services_without_endpoints(n: usize) -> String {
    let docs: Vec<String> = (0..n).map(|i| service(&format!("many-{i}"), &spec(&many_vip(i)), "")).collect();
    documents(&docs)
}

/// `n` Services `many-I` (ClusterIP 10.97.x.y, port 80) with both pods as endpoints.
fn many_services(n: usize) -> String {
    let eps = [ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1))];
    let docs: Vec<String> = (0..n)
        .flat_map(|i| {
            let name = format!("many-{i}");
            [
                service(&name, &spec(&many_vip(i)), ""),
                slice(&name, &format!("{name}-1"), false, &[("http", "TCP", 8080)], &eps),
            ]
        })
        .collect();
    documents(&docs)
}

fn many_vip(i: usize) -> String {
    format!("10.97.{}.{}", i / 250, i % 250 + 1)
}

/// The kernel's state of the `many-*` Services: how many are whole; panics on one that
/// is there in part or whole with other endpoints than both pods.
fn whole_many_services(t: &Topology, backend: ProxyBackend) -> BTreeSet<String> {
    let want: BTreeSet<String> = [0, 1].iter().map(|&i| format!("{}:8080", Topology::pod_ip(i))).collect();
    let mut whole = BTreeSet::new();
    for (vip, state) in tcp_cluster_ips(&t.node, backend) {
        if !vip.starts_with("10.97.") {
            continue;
        }
        assert_eq!(state, Programmed::Whole(want.clone()), "{vip}: a Service programmed in part");
        whole.insert(vip);
    }
    whole
}

/// SIGKILL in the middle of programming 10,000 Services (the control plane sends them
/// in responses of up to 500, each programmed and stored before the next is ACKed): the kernel
/// holds every Service whole or not at all; the agent, restarted while the control
/// plane is down, programs what it stored (the Services it had are there, whole); once
/// the control plane is back all 10,000 arrive; a prober on another Service sees no
/// failure throughout.
pub fn the_agent_killed_during_a_10k_service_apply(backend: ProxyBackend) {
    // On the VMs' emulated CPU, 600 (two responses) keep the run within minutes: IPVS
    // there takes ~0.2 s per new Service (a conntrack process each).
    let services = if crate::harness::traffic::patience() > 1 { 600 } else { 10_000 };
    let (t, _backends) = start();
    let mut cp = t.start_control_plane();
    let mut dp = t.start_dataplane_with(backend, &[]);
    t.wait_answered_by(WEB_VIP, 80, "pod0");
    let prober = probe(&t);
    let applied = |dp: &KpxProcess| {
        dp.events().iter().filter(|e| message(e) == "delta applied" && e["type_url"] == SERVICE_VIEW).count()
    };
    let before = applied(&dp);
    t.write_manifest("many.yaml", &many_services(services));
    wait_for("the agent to program the first part of the Services", Duration::from_secs(300), || {
        (applied(&dp) > before).then_some(())
    });
    dp.kill();
    cp.kill();
    let at_kill = whole_many_services(&t, backend);
    println!("{backend:?}: killed with {} of {services} Services in the kernel, each whole", at_kill.len());
    assert!(!at_kill.is_empty() && at_kill.len() < services, "killed during the apply: {}", at_kill.len());

    // Restarted without a control plane: what it stored is programmed, whole.
    dp = t.start_dataplane_with(backend, &[]);
    dp.wait_event("the restarted agent to program its stored state", DEADLINE, |e| {
        message(e) == "programmed stored state"
    });
    let restored = whole_many_services(&t, backend);
    println!("{backend:?}: restarted from its store alone: {} Services, each whole", restored.len());
    assert!(!restored.is_empty() && restored.is_subset(&at_kill), "{} of {}", restored.len(), at_kill.len());

    cp = t.start_control_plane();
    wait_for("all the Services in the kernel", Duration::from_secs(600), || {
        (whole_many_services(&t, backend).len() == services).then_some(())
    });
    let seen = prober.finish();
    println!(
        "{backend:?}: then all {services} programmed; {} requests to another Service, {} failed",
        seen.sent, seen.failed
    );
    assert_eq!(seen.failed, 0, "{seen:?}");
    drop(cp);
    drop(dp);

    // The check sees a Service programmed in part: one endpoint taken from the kernel
    // (IPVS: an address bound with no virtual service behind it).
    let vip = many_vip(0);
    let key = match backend {
        ProxyBackend::Nftables => {
            t.node.exec(
                "nft",
                &["delete", "element", "inet", "kpx", "endpoints-v4", &format!("{{ {vip} . tcp . 80 . 1 }}")],
            );
            format!("{vip}:80")
        }
        ProxyBackend::Ipvs => {
            t.node.ip(&["addr", "add", "10.97.250.1/32", "dev", "kpx-ipvs0"]);
            "10.97.250.1:?".to_owned()
        }
        ProxyBackend::Iptables | ProxyBackend::IptablesLegacy => {
            let flavour = if backend == ProxyBackend::IptablesLegacy { "legacy" } else { "nft" };
            let save = t.node.exec(&format!("iptables-{flavour}-save"), &["-t", "nat"]);
            let chain = save
                .lines()
                .find(|l| l.starts_with("-A KPX-SERVICES") && l.contains(&format!("-d {vip}/32")))
                .and_then(|l| l.rsplit(' ').next())
                .expect("the Service's chain");
            t.node.exec(&format!("iptables-{flavour}"), &["-t", "nat", "-F", chain]);
            format!("{vip}:80")
        }
    };
    let state = tcp_cluster_ips(&t.node, backend).remove(&key);
    assert!(matches!(state, Some(Programmed::Partial(_))), "{state:?}");
}

/// Every fault scenario by name, for runners that are not test harnesses (the IPVS
/// suite runs them in its VM); the same list as `tests/tests/faults.rs`.
pub const ALL: &[(&str, crate::scenarios::behaviour::Scenario)] = &[
    ("control_plane_crash_and_a_change_while_it_is_down", control_plane_crash_and_a_change_while_it_is_down),
    ("a_second_replica_takes_over", a_second_replica_takes_over),
    (
        "a_cut_link_is_noticed_by_keepalive_and_the_stream_resumes",
        a_cut_link_is_noticed_by_keepalive_and_the_stream_resumes,
    ),
    (
        "a_stalled_control_plane_is_noticed_and_another_replica_followed",
        a_stalled_control_plane_is_noticed_and_another_replica_followed,
    ),
    ("the_agent_killed_during_a_10k_service_apply", the_agent_killed_during_a_10k_service_apply),
    ("a_full_state_filesystem_nacks_and_recovers", a_full_state_filesystem_nacks_and_recovers),
];
