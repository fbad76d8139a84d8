//! Node programming at a scale: initial sync, changes, full sync and restarts over the
//! store, the data path, and one change through the Kubernetes API.

use std::time::{Duration, Instant};

use super::measure::*;
use super::workload::*;
use super::*;
use crate::harness::percentile;
use crate::harness::process::KpxProcess;
use crate::harness::topology::{sock, ProxyBackend, Topology};
use crate::harness::traffic::Prober;
use serde_json::json;

/// One endpoint change as a user makes it, through the Kubernetes API: Service 0's
/// EndpointSlice replaced in an API server (the tests' fake, serving kube-rs the real
/// list/watch protocol over HTTP) → the watch event → the control plane → the node agent
/// → the kernel committed. Each change waits for the last to be applied and for a quiet
/// moment, as a lone change.
pub fn api_latency(a: &Args, scale: Scale) -> serde_json::Value {
    use crate::harness::fake_apiserver::FakeApiServer;
    println!(
        "\n== one endpoint change through the Kubernetes API (an in-process API server's list/watch): {} Services × {} endpoints",
        scale.services, scale.endpoints
    );
    let t = Topology::new(1);
    let api = FakeApiServer::start(&t.node, sock("127.0.0.1", 16443));
    api.apply_yaml(&crate::harness::topology::node_yaml(crate::harness::topology::NODE_NAME, "zone-a"));
    let all: String =
        (0..scale.services).map(|i| BenchService::numbered(i, scale.endpoints, 0).yaml()).collect();
    api.apply_yaml(&all);
    drop(all);
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let _cp = t.start_control_plane_from(&[format!("kubeconfig:{}", kubeconfig.display())], &[]);
    let dp = t.start_dataplane_with(ProxyBackend::Nftables, &[]);
    crate::wait_for("the node's initial sync", Duration::from_secs(1800), || {
        exited_before(&dp, "its initial sync");
        let applied: u64 = service_deltas(&dp.log).iter().map(|e| e["resources"].as_u64().unwrap_or(0)).sum();
        (applied >= scale.services as u64).then_some(())
    });
    let mut latencies = Vec::new();
    for change in 1..=a.node_changes {
        let before = service_deltas(&dp.log).len();
        std::thread::sleep(Duration::from_millis(100));
        let written = unix_now();
        api.apply_yaml(&BenchService::numbered(0, scale.endpoints, change).slice_yaml());
        let event = crate::wait_for("the change applied", Duration::from_secs(120), || {
            exited_before(&dp, "the change applied");
            service_deltas(&dp.log).into_iter().nth(before)
        });
        latencies.push(committed_after(&event, written));
    }
    latencies.sort();
    println!(
        "EndpointSlice replaced in the API → kernel committed, over {} changes: p50 {} ms, p99 {} ms",
        latencies.len(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    json!({
        "services": scale.services, "endpoints_per_service": scale.endpoints, "changes": latencies.len(),
        "api_to_kernel_p50_ms": ms(percentile(&latencies, 0.5)),
        "api_to_kernel_p99_ms": ms(percentile(&latencies, 0.99)),
    })
}

/// Node programming at one scale: a real control plane and node agent in a namespace.
/// Initial sync (the whole pipeline, and the agent's own apply time), `changes` single
/// endpoint changes (delta received → kernel committed and stored, from the agent's
/// log), a full sync (the agent restarted over its store reprograms everything), the
/// agent's peak (VmHWM) and steady RSS, and TCP connects to the data-path Services.
pub fn node_programming(a: &Args, scale: Scale, backend: ProxyBackend, label: &str) -> serde_json::Value {
    let total = scale.services + DATA_PATH_SERVICES.len();
    println!(
        "\n== node programming and data path: {label}, {} Services × {} distinct endpoints ({} endpoints; + {} Services backed by a pod for the data path)",
        scale.services,
        scale.endpoints,
        scale.services * scale.endpoints,
        DATA_PATH_SERVICES.len()
    );
    let t = Topology::new(1);
    let _backend = t.start_backends(8080);
    let manifests = t.manifests();
    write_manifests(&manifests, scale.services, scale.endpoints, 0);
    write_data_path_services(&manifests);
    let _cp = t.start_control_plane();
    let start = Instant::now();
    // KPX_BENCH_DP_WRAPPER="heaptrack" runs each agent under a profiler (RSS figures are
    // then the wrapper's).
    let wrapper: Vec<String> = std::env::var("KPX_BENCH_DP_WRAPPER")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let mut dp: KpxProcess = t.start_dataplane_under(backend, &wrapper);
    let log = dp.log.clone();
    let initial = crate::wait_for("the node's initial sync", Duration::from_secs(1800), || {
        exited_before(&dp, "its initial sync");
        let deltas = service_deltas(&log);
        let applied: u64 = deltas.iter().map(|e| e["resources"].as_u64().unwrap_or(0)).sum();
        (applied >= total as u64).then_some(deltas)
    });
    let pipeline = start.elapsed();
    let initial_apply: Duration =
        initial.iter().map(|e| Duration::from_micros(e["elapsed_us"].as_u64().unwrap_or(0))).sum();
    let pid = crate::wait_for("the agent's pid", Duration::from_secs(5), || dp.pid());
    let peak_after_sync = peak_rss_kib(pid);
    // One endpoint change at a time: Service 0's last endpoint moves to another address.
    let (mut latencies, mut to_kernel) = (Vec::new(), Vec::new());
    // Page faults taken by the agent over the changes: a major one is a page read back
    // from disk (this machine's kernel pages cold file pages out), in a change's time.
    let faults_before = page_faults(pid);
    for change in 1..=a.node_changes {
        let before = service_deltas(&log).len();
        write_manifests_one(&manifests, scale.endpoints, change);
        let event = crate::wait_for("the change applied", Duration::from_secs(120), || {
            exited_before(&dp, "the change applied");
            service_deltas(&log).into_iter().nth(before)
        });
        let us = |field: &str| Duration::from_micros(event[field].as_u64().unwrap_or(0));
        latencies.push(us("elapsed_us"));
        to_kernel.push(us("kernel_us"));
    }
    let faults =
        page_faults(pid).zip(faults_before).map(|((min, maj), (min0, maj0))| (min - min0, maj - maj0));
    latencies.sort();
    to_kernel.sort();
    // Steady: idle (by default through two canary checks and housekeeping).
    std::thread::sleep(Duration::from_secs(a.node_idle_s));
    let steady = rss_kib(pid);
    let peak = peak_rss_kib(pid);
    // Data path: connect latency to the first and the last Service.
    let connect = |addr: &str| -> Duration {
        let to = sock(addr, 80);
        let mut times: Vec<Duration> = t.client.run_in(move || {
            (0..200)
                .filter_map(|_| {
                    let s = Instant::now();
                    std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2))
                        .ok()
                        .map(|_| s.elapsed())
                })
                .collect()
        });
        times.sort();
        percentile(&times, 0.5)
    };
    let (first, last) = (connect(DATA_PATH_SERVICES[0].1), connect(DATA_PATH_SERVICES[1].1));
    // Restart over an intact table: the agent restarted over its store programs all it
    // holds again over the table it left (nftables: compared, only what differs written).
    // Under continuous traffic to the data-path Services: every 10 ms, each must be
    // answered by the pod throughout.
    let targets: Vec<_> = DATA_PATH_SERVICES.iter().map(|(_, vip)| sock(vip, 80)).collect();
    let prober =
        Prober::start(&t.client, &targets, "pod0", Duration::from_millis(10), Duration::from_secs(1800));
    dp.stop();
    let this_build = crate::harness::process::binary("kpx-dataplane");
    let restart = restart_and_measure(&t, backend, &this_build, &wrapper, total);
    let probed = prober.finish();
    // Full rewrite: the same over a node whose table is gone (nftables; the other
    // backends rewrite at every restart).
    let rewrite = (backend == ProxyBackend::Nftables).then(|| {
        t.node.exec("nft", &["delete", "table", "inet", "kpx"]);
        restart_and_measure(&t, backend, &this_build, &wrapper, total)
    });
    // The same full rewrite by another build's agent, alternating with this one's.
    let compared = match (&rewrite, &a.baseline) {
        (Some(rewrite), Some((commit, binary))) => {
            Some(compare_rewrites(&t, backend, (&this_build, binary), &wrapper, total, rewrite, commit))
        }
        _ => None,
    };
    println!(
        "initial sync: {:.2} s from the agent's start to the last Service programmed (the agent applying: {:.2} s); agent peak RSS {} MiB after it",
        pipeline.as_secs_f64(),
        initial_apply.as_secs_f64(),
        peak_after_sync / 1024
    );
    println!(
        "one endpoint change inside the agent, over {} changes: delta received → kernel committed p50 {} ms, p99 {} ms; → kernel and store committed (the ACK) p50 {} ms, p99 {} ms",
        latencies.len(),
        ms(percentile(&to_kernel, 0.5)),
        ms(percentile(&to_kernel, 0.99)),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    if let Some((minor, major)) = faults {
        println!(
            "page faults in the agent over those changes: {minor} minor, {major} major (read back from disk)"
        );
    }
    let told =
        |r: &Restart| if r.phases.is_empty() { String::new() } else { format!(" ({})", r.phases.join(", ")) };
    println!(
        "restart over an intact table: {:.3} s, {} of {} elements written{}, peak RSS {} MiB{}",
        restart.seconds,
        restart.written.map_or("?".into(), |w| w.to_string()),
        restart.elements.map_or("all".into(), |w| w.to_string()),
        restart.accounted_after.map_or(String::new(), |s| format!(
            " (its bookkeeping rebuilt in {s:.2} s more, off the restart's path)"
        )),
        restart.peak_kib / 1024,
        told(&restart)
    );
    if let Some(rewrite) = &rewrite {
        println!(
            "full rewrite (the table gone): {:.2} s, {} elements written, peak RSS {} MiB{}; restart / rewrite time {:.1} %",
            rewrite.seconds,
            rewrite.written.map_or("?".into(), |w| w.to_string()),
            rewrite.peak_kib / 1024,
            told(rewrite),
            100.0 * restart.seconds / rewrite.seconds.max(f64::EPSILON)
        );
    }
    println!(
        "requests to the data-path Services across the restart (old agent stopped → new one programmed and stopped): {} sent, {} failed{}",
        probed.sent,
        probed.failed,
        if probed.failures.is_empty() { String::new() } else { format!(" {:?}", probed.failures) }
    );
    println!(
        "agent RSS: peak {} MiB, steady {} MiB ({} s idle after the changes)",
        peak / 1024,
        steady / 1024,
        a.node_idle_s
    );
    println!(
        "TCP connect, median of 200: first Service {} µs, last Service {} µs",
        first.as_micros(),
        last.as_micros()
    );
    json!({
        "backend": label, "services": scale.services, "endpoints_per_service": scale.endpoints,
        "data_path_services": DATA_PATH_SERVICES.len(),
        "initial_sync_pipeline_s": pipeline.as_secs_f64(), "initial_sync_agent_apply_s": initial_apply.as_secs_f64(),
        "full_sync_s": restart.seconds,
        "restart_s": restart.seconds, "restart_elements": restart.elements, "restart_elements_written": restart.written,
        "restart_peak_rss_mib": restart.peak_kib as f64 / 1024.0, "restart_accounted_after_s": restart.accounted_after,
        "restart_requests_sent": probed.sent, "restart_requests_failed": probed.failed,
        "rewrite_s": rewrite.as_ref().map(|r| r.seconds), "rewrite_elements_written": rewrite.as_ref().and_then(|r| r.written),
        "rewrite_peak_rss_mib": rewrite.as_ref().map(|r| r.peak_kib as f64 / 1024.0),
        "changes": latencies.len(),
        "change_p50_ms": ms(percentile(&latencies, 0.5)), "change_p99_ms": ms(percentile(&latencies, 0.99)),
        "change_to_kernel_p50_ms": ms(percentile(&to_kernel, 0.5)), "change_to_kernel_p99_ms": ms(percentile(&to_kernel, 0.99)),
        "agent_peak_rss_mib": peak as f64 / 1024.0,
        "agent_minor_faults_during_changes": faults.map(|f| f.0), "agent_major_faults_during_changes": faults.map(|f| f.1), "agent_steady_rss_mib": steady as f64 / 1024.0,
        "agent_steady_after_idle_s": a.node_idle_s,
        "agent_peak_rss_after_initial_sync_mib": peak_after_sync as f64 / 1024.0,
        "agent_full_sync_peak_rss_mib": restart.peak_kib as f64 / 1024.0,
        "rewrite_render_ms": rewrite.as_ref().and_then(|r| r.render_ms),
        "rewrite_compared": compared,
        "connect_first_us": first.as_micros() as u64, "connect_last_us": last.as_micros() as u64,
    })
}

/// An agent restarted over its store: how long until its stored state was programmed,
/// its peak RSS, and what the backend logged of it.
pub struct Restart {
    pub seconds: f64,
    /// nftables over an untouched table: how long its bookkeeping took to rebuild, off
    /// the restart's path.
    pub accounted_after: Option<f64>,
    pub peak_kib: u64,
    /// The elements the full sync wanted and wrote (nftables' log).
    pub elements: Option<u64>,
    pub written: Option<u64>,
    /// Each `*_ms` and `elements*` field the backend logged.
    pub phases: Vec<String>,
    /// nftables' full sync: how long the Services took to render and encode into the
    /// transaction (the backend's `render_ms`).
    pub render_ms: Option<u64>,
}

/// How many full rewrites each build makes in [`compare_rewrites`].
pub const COMPARED_REWRITES: usize = 3;

/// nftables' full rewrite by this build's agent and by another's (`builds`: this one's
/// binary, then the other's), alternating, [`COMPARED_REWRITES`] times each (`first` is
/// this build's first): the median of each one's time, and of its render, side by side.
pub fn compare_rewrites(
    t: &Topology,
    backend: ProxyBackend,
    builds: (&std::path::Path, &std::path::Path),
    wrapper: &[String],
    services: usize,
    first: &Restart,
    commit: &str,
) -> serde_json::Value {
    let (mut this, mut other) = (vec![(first.seconds, first.render_ms)], Vec::new());
    for round in 0..COMPARED_REWRITES * 2 - 1 {
        let (binary, runs) = if round % 2 == 0 { (builds.1, &mut other) } else { (builds.0, &mut this) };
        t.node.exec("nft", &["delete", "table", "inet", "kpx"]);
        let r = restart_and_measure(t, backend, binary, wrapper, services);
        runs.push((r.seconds, r.render_ms));
    }
    let median = |runs: &[(f64, Option<u64>)]| {
        let mut seconds: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let mut render: Vec<u64> = runs.iter().filter_map(|r| r.1).collect();
        seconds.sort_by(f64::total_cmp);
        render.sort();
        (seconds.get(seconds.len() / 2).copied(), render.get(render.len() / 2).copied())
    };
    let ((this_s, this_render), (other_s, other_render)) = (median(&this), median(&other));
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b.max(f64::EPSILON));
    let render_ratio = ratio(this_render.map(|r| r as f64), other_render.map(|r| r as f64));
    println!(
        "full rewrite, this build against {commit}, median of {COMPARED_REWRITES} each (alternating): {} s against {} s; the Services rendered and encoded (render_ms) {} ms against {} ms: this build / {commit} = {}",
        this_s.map_or("?".into(), |s| format!("{s:.2}")),
        other_s.map_or("?".into(), |s| format!("{s:.2}")),
        this_render.map_or("?".into(), |r| r.to_string()),
        other_render.map_or("?".into(), |r| r.to_string()),
        render_ratio.map_or("?".into(), |r| format!("{r:.2}")),
    );
    json!({
        "baseline_commit": commit, "rewrites_each": COMPARED_REWRITES,
        "rewrite_s": this_s, "baseline_rewrite_s": other_s,
        "render_ms": this_render, "baseline_render_ms": other_render, "render_ratio": render_ratio,
        "rewrite_ratio": ratio(this_s, other_s),
    })
}

/// Starts the agent over its store, measures it programming what it stored, stops it.
pub fn restart_and_measure(
    t: &Topology,
    backend: ProxyBackend,
    binary: &std::path::Path,
    wrapper: &[String],
    services: usize,
) -> Restart {
    // nftables logs how it wrote a full sync, or that its table needed no write.
    let unchanged = "full sync: kpx's table is as its last write left it, nothing written";
    let mut dp = t.start_dataplane_from(binary, backend, wrapper);
    let programmed = crate::wait_for("its stored state programmed", Duration::from_secs(1800), || {
        exited_before(&dp, "programming its stored state");
        dp.events().into_iter().find(|e| {
            e["message"] == "programmed stored state" && e["services"].as_u64() == Some(services as u64)
        })
    });
    let seconds = programmed["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0;
    // An untouched nftables table is accounted for after it is programmed, on a thread of
    // its own: the peak counts that too.
    let accounted = "kpx's table accounted for: ready for changes";
    let unchanged_table = dp.events().iter().any(|e| e["message"] == unchanged);
    let accounted_after = unchanged_table.then(|| {
        let event =
            dp.wait_event("its table accounted for", Duration::from_secs(600), |e| e["message"] == accounted);
        event["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
    });
    let pid = crate::wait_for("the agent's pid", Duration::from_secs(5), || dp.pid());
    let peak_kib = peak_rss_kib(pid);
    let written =
        dp.events().into_iter().rfind(|e| e["message"] == "full sync written" || e["message"] == unchanged);
    dp.stop();
    let field = |name: &str| match written.as_ref() {
        Some(e) if e["message"] == unchanged && name == "elements_written" => Some(0),
        Some(e) => e[name].as_u64(),
        None => None,
    };
    let phases = written
        .as_ref()
        .and_then(|e| e.as_object().cloned())
        .map(|e| {
            e.iter()
                .filter(|(k, _)| {
                    k.ends_with("_ms")
                        || k.starts_with("elements")
                        || ["compared", "message", "unchanged_chains", "restore_bytes"].contains(&k.as_str())
                })
                .map(|(k, v)| format!("{k} {v}"))
                .collect()
        })
        .unwrap_or_default();
    Restart {
        seconds,
        accounted_after,
        peak_kib,
        elements: field("elements"),
        written: field("elements_written"),
        render_ms: written.as_ref().and_then(|e| e["render_ms"].as_u64()),
        phases,
    }
}
