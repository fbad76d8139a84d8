//! `kpx-dataplane --config`: a KubeProxyConfiguration-style file drives the
//! agent (mode, node name, masquerading, …), and a field kpx does not support
//! is refused at start with its name. Run as root; binaries built first.

use kpx_e2e::harness::manifests::web_on_pod0;
use kpx_e2e::harness::process::binary;
use kpx_e2e::harness::topology::{Topology, CONTROL_PLANE_ADDR};

#[test]
fn a_kube_proxy_configuration_file_drives_the_agent_and_bad_fields_are_named() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web_on_pod0("web", "10.96.4.1"));
    let _cp = t.start_control_plane();
    let config = t.dir.path().join("kube-proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nhostnameOverride: node-a\n\
             iptables: {{masqueradeAll: true, syncPeriod: 1h, minSyncPeriod: 0s}}\n\
             kpx: {{controlPlane: 'http://{CONTROL_PLANE_ADDR}', stateDir: '{}', iptablesMode: nft}}\n",
            t.dir.path().join("state").display()
        ),
    )
    .expect("write config");
    let config_arg = format!("--config={}", config.display());
    let dp = kpx_e2e::harness::process::KpxProcess::start(
        &t.node,
        "kpx-dataplane",
        &[config_arg],
        t.dir.path().join("dp.log"),
    );
    t.wait_answered_by("10.96.4.1", 80, "pod0");
    let saved =
        String::from_utf8_lossy(&t.node.try_exec("iptables-nft-save", &["-t", "nat"]).stdout).into_owned();
    assert!(saved.contains("KPX-SERVICES"), "mode: iptables (nft flavour) from the file:\n{saved}");
    assert!(
        saved.contains("-A KPX-SVC-") && saved.contains("-j KPX-MARK-MASQ"),
        "masqueradeAll from the file:\n{saved}"
    );
    drop(dp);

    std::fs::write(
        &config,
        "kind: KubeProxyConfiguration\nmode: iptables\nnftables: {localhostNodePorts: true}\n",
    )
    .expect("write");
    let out = t.node.try_exec(
        &binary("kpx-dataplane").display().to_string(),
        &[&format!("--config={}", config.display())],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("nftables.localhostNodePorts"), "the unsupported field is named: {message}");

    // kube-proxy 1.40's default: the ipvs mode needs the KubeProxyIPVS gate, now off.
    std::fs::write(&config, "kind: KubeProxyConfiguration\nmode: ipvs\nkpx: {kubernetesVersion: v1.40.0}\n")
        .expect("write");
    let out = t.node.try_exec(
        &binary("kpx-dataplane").display().to_string(),
        &[&format!("--config={}", config.display()), "--node-name=node-a"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains("mode") && message.contains("KubeProxyIPVS") && message.contains("nftables"),
        "refused, naming the field, the gate and the way out: {message}"
    );

    let out = t.node.try_exec(&binary("kpx-dataplane").display().to_string(), &["--ipvs-scheduler=fastest"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains("--ipvs-scheduler") && message.contains("mh"),
        "the flag and the choices: {message}"
    );
}

/// kubeadm's kube-proxy ConfigMap (`config.conf`, as `kubeadm init` writes it) given
/// unchanged, with the node's name and the control plane as flags: the agent starts,
/// programs its Services, makes kube-proxy's default conntrack settings, and warns once,
/// naming the fields it does not act on.
#[test]
fn kubeadms_kube_proxy_configuration_is_taken_unchanged() {
    use kpx_e2e::DEADLINE;
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_manifest("web.yaml", &web_on_pod0("web", "10.96.4.2"));
    let _cp = t.start_control_plane();
    let config = t.dir.path().join("config.conf");
    let kubeadm =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../dataplane/src/config/testdata/kubeadm-kube-proxy.yaml");
    std::fs::copy(kubeadm, &config).expect("copy kubeadm's configuration");
    let args = [
        format!("--config={}", config.display()),
        "--node-name=node-a".to_owned(),
        format!("--control-plane=http://{CONTROL_PLANE_ADDR}"),
        format!("--state-dir={}", t.dir.path().join("state").display()),
    ];
    let dp = kpx_e2e::harness::process::KpxProcess::start(
        &t.node,
        "kpx-dataplane",
        &args,
        t.dir.path().join("dp.log"),
    );
    let warning = dp.wait_event("the warning naming the ignored fields", DEADLINE, |e| {
        e["level"] == "WARN" && e["message"].as_str().is_some_and(|m| m.contains("does not act on"))
    });
    let fields = warning["fields"].as_str().unwrap_or_default().to_owned();
    for field in ["clientConnection", "oomScoreAdj", "winkernel"] {
        assert!(fields.contains(field), "{field} named in {fields}");
    }
    assert!(!fields.contains("conntrack"), "conntrack's fields are honoured: {fields}");
    t.wait_answered_by("10.96.4.2", 80, "pod0");
    // kubeadm leaves conntrack's fields null: kube-proxy's defaults, made in the node's kernel.
    let sysctl = |name: &str| t.node.exec("sysctl", &["-n", name]).trim().to_owned();
    assert_eq!(sysctl("net.netfilter.nf_conntrack_tcp_timeout_close_wait"), "3600");
    assert_eq!(sysctl("net.netfilter.nf_conntrack_tcp_timeout_established"), "86400");
    assert!(t.ruleset().contains("table inet kpx"), "mode \"\": kpx's default backend, nftables");
}
