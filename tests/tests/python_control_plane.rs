//! A third-party control plane: `clients/python/kpx_control_plane.py` (grpcio, xds-protos,
//! code generated from `proto/kpx/v1/kpx.proto`) drives a real node agent in network
//! namespaces: traffic, a NACK of a bad resource with the last good state kept, a removal,
//! and a resume after the Python server restarts with nothing resent. Run as root; needs
//! `target/pyenv` (tests/run.sh installs grpcio-tools, xds-protos and PyYAML there).

use std::path::PathBuf;

use kpx_e2e::harness::process::KpxProcess;
use kpx_e2e::harness::topology::{sock, ProxyBackend, Topology, CONTROL_PLANE_ADDR};
use kpx_e2e::harness::traffic::{tcp_request, Answer};
use kpx_e2e::{wait_for, DEADLINE};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The YAML the Python control plane serves: `web` on pods `endpoints`, maybe a bad one.
fn services(web: Option<&[usize]>, bad: bool) -> String {
    let mut out = String::from("services:\n");
    if let Some(pods) = web {
        out.push_str("  - {namespace: demo, name: web, clusterIPs: [10.96.7.1], ports: [{name: http, protocol: TCP, port: 80, endpoints: [");
        let eps: Vec<String> = pods
            .iter()
            .map(|i| format!("{{address: {}, port: 8080, node: node-a}}", Topology::pod_ip(*i)))
            .collect();
        out.push_str(&eps.join(", "));
        out.push_str("]}]}\n");
    }
    if bad {
        out.push_str("  - {namespace: demo, name: broken, clusterIPs: [10.96.7.2], ports: [{name: http, protocol: TCP, port: 0}]}\n");
    }
    out.push_str("nodes:\n  - {name: node-a, addresses: [10.0.0.1], podCIDRs: [10.244.0.0/16]}\n");
    out
}

fn start_python(t: &Topology, config: &std::path::Path) -> KpxProcess {
    let script = root().join("clients/python/kpx_control_plane.py");
    let args = vec![
        script.display().to_string(),
        format!("--config={}", config.display()),
        format!("--listen={CONTROL_PLANE_ADDR}"),
    ];
    let n = (0..).find(|n| !t.dir.path().join(format!("python-{n}.log")).exists()).unwrap_or(0);
    let log = t.dir.path().join(format!("python-{n}.log"));
    let p = KpxProcess::start_path(
        &t.node,
        &kpx_e2e::harness::process::python(),
        "kpx_control_plane.py",
        &args,
        log,
    );
    p.wait_event("the Python control plane to listen", DEADLINE, |e| e["message"] == "serving delta ADS");
    p
}

fn write(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[test]
fn a_python_control_plane_drives_a_node_acks_nacks_removes_and_resumes() {
    let t = Topology::new(2);
    let _backends = t.start_backends(8080);
    let config = t.dir.path().join("services.yaml");
    // Nothing to serve yet: the server sends its headers at once, so the node counts
    // itself connected before any response.
    write(&config, "services: []\nnodes: []\n");
    let mut cp = start_python(&t, &config);
    let dp = t.start_dataplane_with(ProxyBackend::Nftables, &[]);
    dp.wait_event("the stream to open before any response", DEADLINE, |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with("stream open"))
    });
    let status = String::from_utf8_lossy(&t.kpxctl(&["status", "-o", "json"]).stdout).into_owned();
    assert!(status.contains("\"connected\": true") || status.contains("\"connected\":true"), "{status}");
    write(&config, &services(Some(&[0, 1]), false));
    let vip = sock("10.96.7.1", 80);
    for pod in ["pod0", "pod1"] {
        wait_for(&format!("{vip} answered by {pod}"), DEADLINE, || {
            (t.client.run_in(move || tcp_request(vip)) == Answer::From(pod.into())).then_some(())
        });
    }
    cp.wait_event("an ACK from the node", DEADLINE, |e| e["message"] == "ACK");

    // A bad resource: NACKed with the field, nothing of it programmed, web keeps working.
    write(&config, &services(Some(&[0, 1]), true));
    let nack = cp.wait_event("a NACK from the node", DEADLINE, |e| e["message"] == "NACK");
    let reason = nack["error"].as_str().unwrap_or_default();
    assert!(reason.contains("resource \"py/demo/broken\": ports[0].port: 0 is not a port"), "{nack}");
    assert!(!t.ruleset().contains("10.96.7.2"), "nothing of the refused response is in the kernel");
    let answer = t.client.run_in(move || tcp_request(vip));
    assert!(
        matches!(&answer, Answer::From(p) if p == "pod0" || p == "pod1"),
        "web still answers: {answer:?}"
    );

    // A removal: web goes, and so do its rules. The agent logs "delta applied" once the
    // kernel, the store and conntrack are done: after the rules are visible.
    let applied = |dp: &KpxProcess| dp.events().iter().filter(|e| e["message"] == "delta applied").count();
    let applied_earlier = applied(&dp);
    write(&config, &services(None, false));
    wait_for("web's rules to go", DEADLINE, || (!t.ruleset().contains("10.96.7.1")).then_some(()));
    wait_for("the agent to log web's removal", DEADLINE, || (applied(&dp) > applied_earlier).then_some(()));

    // Back, then the Python server restarts: the node resumes and nothing is resent.
    let applied_removal = applied(&dp);
    write(&config, &services(Some(&[1]), false));
    wait_for(&format!("{vip} answered by pod1 only"), DEADLINE, || {
        (t.ruleset().contains("10.96.7.1")
            && t.client.run_in(move || tcp_request(vip)) == Answer::From("pod1".into()))
        .then_some(())
    });
    wait_for("the agent to log web's return", DEADLINE, || (applied(&dp) > applied_removal).then_some(()));
    let applied_before = applied(&dp);
    cp.kill();
    cp = start_python(&t, &config);
    let resumed = cp.wait_event("the node to resume its Services", DEADLINE, |e| {
        e["message"] == "subscribed" && e["type_url"].as_str().is_some_and(|u| u.ends_with("ServiceView"))
    });
    assert_eq!(resumed["has"], 1, "the node said what it has: {resumed}");
    wait_for("the node to reconnect", DEADLINE, || {
        (dp.events()
            .iter()
            .filter(|e| e["message"].as_str().is_some_and(|m| m.starts_with("stream open")))
            .count()
            >= 2)
            .then_some(())
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    let sent: Vec<_> = cp.events().into_iter().filter(|e| e["message"] == "sending").collect();
    assert!(sent.is_empty(), "nothing is resent to a node that has everything: {sent:?}");
    let applied_after = applied(&dp);
    assert_eq!(applied_before, applied_after, "the node applied nothing on resume");
    assert_eq!(t.client.run_in(move || tcp_request(vip)), Answer::From("pod1".into()));
}
