//! The scale benchmark at a tiny size, as a smoke check that it runs end to end
//! (no timing is asserted: figures are only meaningful on an idle machine at
//! full size, `sudo tests/bench-scale.sh`). Run as root; binaries built first.

use kpx_e2e::harness::process::binary;

#[test]
fn the_scale_benchmark_runs_at_a_small_size_and_writes_its_json() {
    let dir = tempfile::tempdir().expect("tmp");
    let json = dir.path().join("scale.json");
    let out = std::process::Command::new(binary("bench_scale"))
        .args([
            "--services",
            "60",
            "--endpoints",
            "3",
            "--nodes",
            "12",
            "--node-scales",
            "60x3,30x5",
            "--node-changes",
            "3",
            "--node-idle",
            "1",
            "--changes",
            "1",
            "--stuck-percent",
            "25",
            "--ack-timeout",
            "3",
            "--mcs-endpoints",
            "30",
        ])
        // This build's agent as its own baseline: the comparison of full rewrites runs.
        .arg("--baseline")
        .arg(format!("this={}", binary("kpx-dataplane").display()))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run bench_scale");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for section in [
        "== fan-out",
        "== fan-out's floor",
        "== node programming and data path: nftables",
        "iptables-legacy",
        "TCP connect",
        "== one endpoint change through the Kubernetes API",
        "== IPVS vs nftables in the VM",
        "== an MCS export across 3 clusters",
    ] {
        assert!(text.contains(section), "no {section:?} in:\n{text}");
    }
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("valid JSON");
    assert!(figures.get("fanout").is_some(), "no fanout in {figures}");
    assert_eq!(figures["mcs"]["endpoints"], 30, "{figures}");
    assert_eq!(figures["mcs"]["changes"], 3, "{figures}");
    let runs: Vec<(String, u64, u64)> = figures["node_programming"]
        .as_array()
        .expect("node_programming runs")
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap_or(0);
            (r["backend"].as_str().unwrap_or("").to_owned(), n("services"), n("endpoints_per_service"))
        })
        .collect();
    let run = |b: &str, s: u64, e: u64| (b.to_owned(), s, e);
    assert_eq!(
        runs,
        [run("nftables", 60, 3), run("nftables", 30, 5), run("iptables-legacy", 60, 3)],
        "{figures}"
    );
    for r in figures["node_programming"].as_array().into_iter().flatten() {
        assert_eq!(r["changes"], 3, "{r}");
        // The data-path Services answered (a connect that failed would leave 0).
        assert!(r["connect_first_us"].as_u64() > Some(0) && r["connect_last_us"].as_u64() > Some(0), "{r}");
    }
    // The documentation's tables are generated from this JSON: the generator reads it,
    // and fills the headline of a file that has its markers.
    let table = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench-table.py"))
        .arg(&json)
        .output()
        .expect("run bench-table.py");
    let markdown = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{markdown}{}", String::from_utf8_lossy(&table.stderr));
    let front = dir.path().join("front.md");
    std::fs::write(&front, "# front\n<!-- bench-headline:begin -->\n<!-- bench-headline:end -->\nend\n")
        .expect("write");
    let filled = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench-table.py"))
        .arg(&json)
        .arg("--into")
        .arg(&front)
        .status()
        .expect("run bench-table.py");
    assert!(filled.success());
    let front = std::fs::read_to_string(&front).expect("read");
    assert!(front.contains("| node agent (nftables), 60 Services × 3 endpoints: initial sync"), "{front}");
    assert!(front.ends_with("<!-- bench-headline:end -->\nend\n"), "{front}");
    // Each change through the API reached the kernel (a change never applied would time out).
    assert_eq!(figures["api"]["changes"], 3, "{figures}");
    assert!(figures["api"]["api_to_kernel_p50_ms"].as_f64() > Some(0.0), "{figures}");
    for row in [
        "60 Services × 3",
        "30 Services × 5",
        "one endpoint change → all 12 nodes",
        "beyond the idle rate",
        "allocated by the program",
        "the transport alone",
        "through the Kubernetes API",
        "IPVS, 60 Services × 10 endpoints, in the test VM",
        "a restart's full sync over its own rules",
        "full rewrite by this build / by this's agent",
    ] {
        assert!(markdown.contains(row), "no {row:?} in:\n{markdown}");
    }
    // IPVS and nftables each programmed the Services and timed 3 changes in the VM.
    let vm = &figures["ipvs_vm"];
    assert_eq!(vm["changes"], 3, "{figures}");
    let measured: Vec<&str> =
        vm["backends"].as_array().into_iter().flatten().filter_map(|b| b["backend"].as_str()).collect();
    assert!(measured.contains(&"ipvs") && measured.contains(&"nftables (lib)"), "{vm}");
    for b in vm["backends"].as_array().into_iter().flatten() {
        // Timed, not echoed: a change the VM never made would leave no figure above zero.
        assert!(b["change_p50_ms"].as_f64() > Some(0.0) && b["full_sync_ms"].as_f64() > Some(0.0), "{b}");
        // And a second backend's full sync over the rules the first left (a restart).
        assert!(b["restart_ms"].as_f64() > Some(0.0), "{b}");
    }
    assert_eq!(figures["fanout"]["nodes"], 12);
    // Every fourth node never reads its stream: the control plane closes and counts them.
    assert_eq!(figures["fanout"]["stuck_streams"], 3, "{figures}");
    assert_eq!(figures["fanout"]["stuck_streams_closed"], 3, "{figures}");
    // The CPU per change, the idle rate between changes and what is beyond it are figures
    // (at 12 nodes they may be below the clock tick /proc counts in, so zero is allowed).
    let fanout = &figures["fanout"];
    for field in [
        "controlplane_cpu_s_per_change",
        "controlplane_idle_cpu_s_per_s",
        "controlplane_cpu_s_per_change_beyond_idle",
    ] {
        assert!(fanout[field].as_f64().is_some_and(|v| v >= 0.0), "{field}: {fanout}");
    }
    assert!(fanout["change_window_ms"].as_f64() > Some(0.0), "{fanout}");
    // The allocator's account per stream, from the control plane's metrics: HTTP/2's
    // buffers alone are 28 KiB a connection, so a figure read back is well above 8 KiB.
    let heap = &fanout["controlplane_heap_kib_per_stream"];
    assert!(heap["allocated"].as_f64() > Some(8.0), "{fanout}");
    assert!(heap["active"].as_f64() > Some(0.0), "{fanout}");
    // The transport's floor served the same nodes, every one of which had the change (the
    // benchmark waits for each node's arrival).
    let floor = &figures["fanout_floor"];
    assert_eq!(floor["nodes"], 12, "{figures}");
    assert_eq!(floor["stuck_streams"], 0, "{floor}");
    assert!(floor["change_window_ms"].as_f64() > Some(0.0), "{floor}");
}
