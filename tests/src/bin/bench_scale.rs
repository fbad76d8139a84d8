//! Where kpx stands at scale: `sudo tests/bench-scale.sh [flags]` prints a table and
//! writes JSON (`--json PATH`). Nothing is asserted; figures are for reading.
//!
//! 1. fan-out: one kpx-controlplane (release build, loopback), `--nodes` simulated
//!    nodes, each a real delta ADS stream on its own connection that ACKs what it
//!    gets (`--slow-percent` of them wait 2 s before each ACK; `--stuck-percent` of them
//!    open their stream and never read it). Initial sync of every node that reads; then
//!    `--changes` times one endpoint of one Service is changed in the manifests and the
//!    time until each fast node has it is measured; control plane RSS per stream and CPU
//!    seconds per change; then how long until the control plane closed the stuck streams
//!    (`--ack-timeout`), and its RSS with them and after.
//! 2. node programming, at each of `--node-scales` (Services × distinct endpoints per
//!    Service; default 10k × 10, 5k × 50, 50k × 10): kpx-dataplane with nftables in a
//!    network namespace with its control plane (iptables-legacy at the first scale too):
//!    the initial sync (agent start → last Service programmed, and the agent's own apply
//!    time), `--node-changes` one-endpoint changes (delta received → kernel committed +
//!    stored, from its log), a full sync (restarted over its store), peak and steady RSS.
//! 3. data path: TCP connect latency to the first and the last Service (in every
//!    backend's order), two Services of their own backed by a real pod, per run of 2.
//! 4. one endpoint change through the Kubernetes API (the tests' list/watch server).
//! 5. IPVS beside nftables at `--services` Services, `--node-changes` changes, in the
//!    test VM (`tests/vm/run-in-vm.sh`: this kernel has no IPVS).
//! 6. one Service exported by three clusters (`--mcs-endpoints` endpoints in all), kpx
//!    the MCS controller: exports → the node's kernel, and `--node-changes` endpoint
//!    changes in any cluster → the node's kernel.

use kpx_e2e::bench::backends_in_vm;
use kpx_e2e::bench::scale::fanout::*;
use kpx_e2e::bench::scale::measure::*;
use kpx_e2e::bench::scale::node::*;
use kpx_e2e::bench::scale::*;
use kpx_e2e::harness::process::binary;
use kpx_e2e::harness::topology::ProxyBackend;
use serde_json::json;

fn raise_fd_limit() {
    let limit = libc::rlimit { rlim_cur: 1 << 20, rlim_max: 1 << 20 };
    // SAFETY: setrlimit with a valid struct; failure only means fewer streams fit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
}

/// IPVS beside nftables, one endpoint change at `--services` Services, in the test VM.
fn ipvs_in_vm(a: &Args) -> Option<serde_json::Value> {
    println!(
        "\n== IPVS vs nftables in the VM (this kernel has no IPVS; emulated: compare within the run): {} Services × 10 endpoints, {} changes",
        a.services, a.node_changes
    );
    match backends_in_vm::measure(&binary("bench_backends"), a.services, a.node_changes) {
        Ok(figures) => {
            for b in figures["backends"].as_array().into_iter().flatten() {
                println!(
                    "{}: one endpoint change p50 {} ms, p99 {} ms; full sync {:.1} s",
                    b["backend"].as_str().unwrap_or("?"),
                    b["change_p50_ms"],
                    b["change_p99_ms"],
                    b["full_sync_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0
                );
            }
            Some(figures)
        }
        Err(e) => {
            println!("not measured: {e}");
            None
        }
    }
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_scale: {e}");
            std::process::exit(2);
        }
    };
    raise_fd_limit();
    let mut out = serde_json::Map::new();
    if !a.skip.iter().any(|s| s == "fanout") {
        fanout(&a, FanoutServer::Kpx { tls: false }, &mut out);
        if a.tls {
            fanout(&a, FanoutServer::Kpx { tls: true }, &mut out);
            compare_tls(&out);
        }
    }
    if !a.skip.iter().any(|s| s == "floor") {
        fanout(&a, FanoutServer::Floor, &mut out);
    }
    if !a.skip.iter().any(|s| s == "node") {
        // nftables at every scale; iptables-legacy at the first, for the data path's
        // first-vs-last comparison (its rules are a list walked per packet).
        let mut runs: Vec<serde_json::Value> = a
            .node_scales
            .iter()
            .map(|&scale| node_programming(&a, scale, ProxyBackend::Nftables, "nftables"))
            .collect();
        if let Some(&first) = a.node_scales.first().filter(|_| !a.skip.iter().any(|s| s == "iptables")) {
            runs.push(node_programming(&a, first, ProxyBackend::IptablesLegacy, "iptables-legacy"));
        }
        out.insert("node_programming".into(), serde_json::Value::Array(runs));
    }
    if let Some(&first) = a.node_scales.first().filter(|_| !a.skip.iter().any(|s| s == "api")) {
        out.insert("api".into(), api_latency(&a, first));
    }
    if !a.skip.iter().any(|s| s == "mcs") {
        out.insert("mcs".into(), kpx_e2e::bench::scale::mcs::mcs_latency(&a));
    }
    if !a.skip.iter().any(|s| s == "ipvs") {
        if let Some(figures) = ipvs_in_vm(&a) {
            out.insert("ipvs_vm".into(), figures);
        }
    }
    out.insert(
        "command".into(),
        json!(format!(
            "sudo tests/bench-scale.sh {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        )
        .trim_end()),
    );
    out.insert("machine".into(), machine());
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(out)).unwrap_or_default();
    if let Some(path) = &a.json {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("bench_scale: --json {}: {e}", path.display());
        } else {
            println!("\nJSON written to {}", path.display());
        }
    }
}
