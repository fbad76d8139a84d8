//! The scale benchmark at a tiny size, as a smoke check that it runs end to end
//! (no timing is asserted: figures are only meaningful on an idle machine at
//! full size, `sudo tests/bench-scale.sh`). Run as root; binaries built first.

use kpx_e2e::process::binary;

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
            "--node-services",
            "60",
            "--changes",
            "1",
            "--stuck-percent",
            "25",
            "--ack-timeout",
            "3",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run bench_scale");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for section in
        ["== fan-out", "== node programming and data path: nftables", "iptables-legacy", "TCP connect"]
    {
        assert!(text.contains(section), "no {section:?} in:\n{text}");
    }
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("valid JSON");
    for key in ["fanout", "nftables", "iptables-legacy"] {
        assert!(figures.get(key).is_some(), "no {key} in {figures}");
    }
    assert_eq!(figures["fanout"]["nodes"], 12);
    // Every fourth node never reads its stream: the control plane closes and counts them.
    assert_eq!(figures["fanout"]["stuck_streams"], 3, "{figures}");
    assert_eq!(figures["fanout"]["stuck_streams_closed"], 3, "{figures}");
}
