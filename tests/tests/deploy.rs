//! The install: kustomize and Helm render the same objects for the default and for each
//! overlay, those objects validate against Kubernetes 1.36's schemas, the chart lints
//! clean, the systemd units verify without a word, and the product build carries no fake.

use std::collections::BTreeMap;
use std::process::Command;

use kpx_e2e::harness::install::{
    self, by_identity, documents, helm_template, kustomize, output_of, provided_tool, repo_path,
};
use kpx_e2e::harness::kube_apiserver::KubeApiServer;
use kpx_e2e::harness::manifests::web_on_pod0;
use kpx_e2e::harness::pod::{self, PodWorld, RunningPod};
use kpx_e2e::harness::topology::{node_yaml, sock, ProxyBackend, Topology, NODE_IP, NODE_NAME};
use kpx_e2e::harness::traffic::http_get_path;
use kpx_e2e::{wait_for, DEADLINE};

/// The fake API server's port (in the node's namespace).
const API_PORT: u16 = 16445;

/// Each kustomization and the chart values rendering the same objects.
const VARIANTS: [(&str, Option<&str>); 5] = [
    ("", None),
    ("overlays/iptables", Some("ci/iptables-values.yaml")),
    ("overlays/ipvs", Some("ci/ipvs-values.yaml")),
    ("overlays/multi-cluster", Some("ci/multi-cluster-values.yaml")),
    ("overlays/mcs", Some("ci/mcs-values.yaml")),
];

#[test]
fn helm_renders_what_kustomize_renders() {
    for (overlay, values) in VARIANTS {
        let kustomized = by_identity(&documents(&kustomize(overlay)));
        let templated = by_identity(&documents(&helm_template(values)));
        let kinds: Vec<_> = kustomized.keys().collect();
        println!("deploy/kubernetes/{overlay} = helm -f {values:?}: {kinds:?}");
        assert_eq!(
            kustomized.keys().collect::<Vec<_>>(),
            templated.keys().collect::<Vec<_>>(),
            "{overlay}: the same objects"
        );
        for (id, object) in &kustomized {
            let other = &templated[id];
            assert!(
                object == other,
                "{overlay}: {id} differs\nkustomize: {}\nhelm: {}",
                serde_json::to_string_pretty(object).unwrap_or_default(),
                serde_json::to_string_pretty(other).unwrap_or_default()
            );
        }
    }
}

#[test]
fn the_comparison_tells_the_variants_apart() {
    // helm_renders_what_kustomize_renders can fail: each variant differs from the default.
    let default = by_identity(&documents(&kustomize("")));
    for (overlay, values) in &VARIANTS[1..] {
        assert!(by_identity(&documents(&helm_template(*values))) != default, "{overlay} renders the default");
    }
}

/// Every rendered object, both ways and for every variant, against Kubernetes 1.36's
/// schemas with unknown fields refused; and a misspelt field is refused (the validator's
/// exit status is checked both ways, and an object it has no schema for fails the test).
#[test]
fn the_rendered_objects_validate_against_kubernetes_1_36() {
    let dir = tempfile::tempdir().expect("tempdir");
    let validate = |name: &str, yaml: &str| -> (bool, String) {
        let file = dir.path().join(name);
        std::fs::write(&file, yaml).expect("write");
        let out = Command::new(provided_tool("target/pyenv/bin/kubernetes-validate"))
            .args(["--kubernetes-version", "1.36.0", "--strict"])
            .arg(&file)
            .output()
            .expect("kubernetes-validate runs");
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), said)
    };
    for (overlay, values) in VARIANTS {
        for (how, yaml) in [("kustomize", kustomize(overlay)), ("helm", helm_template(values))] {
            let objects = documents(&yaml).len();
            let (ok, said) = validate(&format!("{how}-{}.yaml", overlay.replace('/', "-")), &yaml);
            let passed = said
                .lines()
                .filter(|l| l.contains("passed for resource") && l.contains("against version 1.36"))
                .count();
            println!("{how} {overlay:?}: {passed} of {objects} objects valid for Kubernetes 1.36");
            assert!(ok && passed == objects, "{how} {overlay}: {said}");
            assert!(!said.contains("WARN") && !said.contains("ERROR"), "{how} {overlay}: {said}");
        }
    }
    let misspelt = kustomize("").replace("imagePullPolicy:", "imagePullPolicyy:");
    let (ok, said) = validate("misspelt.yaml", &misspelt);
    assert!(!ok && said.contains("'imagePullPolicyy' was unexpected"), "{said}");
}

#[test]
fn the_overlays_change_only_what_they_say() {
    let base = documents(&kustomize(""));
    let agent = |objects: &[serde_json::Value]| {
        install::object(objects, "DaemonSet", "kpx-dataplane")["spec"]["template"]["spec"]["containers"][0]
            .clone()
    };
    let default = agent(&base);
    assert!(
        default["args"].as_array().is_some_and(|a| a.iter().any(|a| a == "--backend=nftables")),
        "{default}"
    );
    assert_eq!(
        default["securityContext"]["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN", "NET_RAW"])
    );
    assert!(default["securityContext"].get("privileged").is_none(), "not privileged by default");
    let ipvs = agent(&documents(&kustomize("overlays/ipvs")));
    assert!(ipvs["args"].as_array().is_some_and(|a| a.iter().any(|a| a == "--backend=ipvs")), "{ipvs}");
    assert_eq!(ipvs["securityContext"]["privileged"], true);
    let iptables = agent(&documents(&kustomize("overlays/iptables")));
    assert!(iptables["args"].as_array().is_some_and(|a| a.iter().any(|a| a == "--backend=iptables")));
    assert!(!iptables["args"].as_array().is_some_and(|a| a.iter().any(|a| a == "--backend=nftables")));
    // The init container makes the settings of the same backend.
    for (overlay, backend) in [("", "nftables"), ("overlays/iptables", "iptables"), ("overlays/ipvs", "ipvs")]
    {
        let objects = documents(&kustomize(overlay));
        let init = &install::object(&objects, "DaemonSet", "kpx-dataplane")["spec"]["template"]["spec"]
            ["initContainers"][0];
        let args = init["args"].as_array().expect("init args");
        assert!(args.iter().any(|a| a == "--init-only"), "{init}");
        assert!(args.iter().any(|a| *a == format!("--backend={backend}")), "{overlay}: {init}");
        assert_eq!(init["securityContext"]["privileged"], true, "{init}");
    }
}

#[test]
fn a_backend_the_chart_does_not_know_is_refused_naming_it() {
    let out = Command::new(provided_tool("target/tools/helm"))
        .args(["template", "kpx"])
        .arg(repo_path("deploy/helm/kpx"))
        .args(["--set", "backend=userspace"])
        .output()
        .expect("helm runs");
    assert!(!out.status.success(), "helm must refuse backend=userspace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("backend: \"userspace\" is not one of nftables, iptables, ipvs"), "{stderr}");
}

#[test]
fn the_chart_lints_clean() {
    for (_, values) in VARIANTS {
        let chart = repo_path("deploy/helm/kpx");
        let mut command = Command::new(provided_tool("target/tools/helm"));
        command.args(["lint", "--strict"]).arg(&chart);
        if let Some(values) = values {
            command.arg("-f").arg(chart.join(values));
        }
        let text = output_of(&mut command);
        println!("{text}");
        assert!(text.contains("1 chart(s) linted, 0 chart(s) failed"), "{text}");
        assert!(!text.contains("[WARNING]") && !text.contains("[ERROR]"), "{text}");
    }
}

/// The systemd units, pointed at the built binaries, as `systemd-analyze verify` reads
/// them: it exits 0 on warnings, so any word it says fails the test.
#[test]
fn the_systemd_units_verify_without_a_word() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binaries = repo_path("target/debug");
    let mut units = Vec::new();
    for unit in ["kpx-controlplane.service", "kpx-dataplane.service"] {
        let text = std::fs::read_to_string(repo_path(&format!("deploy/systemd/{unit}"))).expect("unit");
        assert!(text.contains("ExecStart=/usr/local/bin/"), "{unit} starts the installed binary");
        let text = text
            .replace("/usr/local/bin/", &format!("{}/", binaries.display()))
            .replace("EnvironmentFile=/etc/kpx/", &format!("EnvironmentFile={}/", dir.path().display()));
        std::fs::write(dir.path().join(unit), text).expect("write unit");
        units.push(dir.path().join(unit));
    }
    for env in ["controlplane.env", "dataplane.env"] {
        std::fs::copy(repo_path(&format!("deploy/systemd/{env}")), dir.path().join(env)).expect("env file");
    }
    let out =
        Command::new("systemd-analyze").arg("verify").args(&units).output().expect("systemd-analyze runs");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify ({}): {said}",
        out.status
    );

    // It does speak up: a misspelt key is reported.
    let broken = dir.path().join("kpx-dataplane.service");
    let text = std::fs::read_to_string(&broken).expect("unit").replace("ProtectHome=", "ProtectHomee=");
    std::fs::write(&broken, text).expect("write unit");
    let out =
        Command::new("systemd-analyze").arg("verify").arg(&broken).output().expect("systemd-analyze runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unknown key 'ProtectHomee'"), "{out:?}");
}

/// The rendered control plane Deployment and node agent DaemonSet, each run as its kubelet
/// would (pod.rs: its command, flags, volumes, read-only root, user and capabilities)
/// against an API server speaking HTTPS, with the TLS material of deploy/tls/make-certs.sh:
/// the control plane becomes ready, the agent authenticates with its projected token,
/// programs the node with NET_ADMIN and NET_RAW only, answers its probes, and traffic to a
/// ClusterIP reaches the pod. When the agent stops, the rules stay.
fn rendered_pods_serve(objects: Vec<serde_json::Value>, backend: ProxyBackend) {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    // The real kube-apiserver: the rendered RBAC applied to it, each pod's token made by it.
    let Some(api) = KubeApiServer::start(&t.node, API_PORT, "the_rendered_pods_serve") else { return };
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    api.apply_yaml(&web_on_pod0("web", "10.96.9.1"));
    let kinds = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    let rbac: Vec<String> = objects
        .iter()
        .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
        .map(|o| serde_yaml::to_string(o).expect("YAML"))
        .collect();
    api.apply_yaml(&rbac.join("---\n"));
    // The pods the tokens are bound to, as the DaemonSet's and the Deployment's would be.
    for (pod, account) in
        [("kpx-dataplane-test", "kpx-dataplane"), ("kpx-controlplane-test", "kpx-controlplane")]
    {
        api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: kube-system}}\nspec:\n  \
             serviceAccountName: {account}\n  automountServiceAccountToken: false\n  nodeName: {NODE_NAME}\n  \
             containers: [{{name: c, image: kpx}}]\n"
        ));
    }
    // A projected token for the API server and, for the agent, for the control plane (kpx).
    let token = |pod: &str, account: &str| {
        let bound = format!("--bound-object-name={pod}");
        let audiences = [
            "--audience=kpx",
            "--audience=https://kubernetes.default.svc.cluster.local",
            "--bound-object-kind=Pod",
        ];
        api.create_token("kube-system", account, &[&audiences[..], &[bound.as_str()]].concat())
    };
    let agent_token = token("kpx-dataplane-test", "kpx-dataplane");
    let control_plane_token = token("kpx-controlplane-test", "kpx-controlplane");

    let certs = t.dir.path().join("certs");
    output_of(Command::new(repo_path("deploy/tls/make-certs.sh")).arg(&certs).args(["--name", "127.0.0.1"]));
    let file = |name: &str| std::fs::read(certs.join(name)).expect("made by make-certs.sh");
    let secrets = BTreeMap::from([(
        "kpx-controlplane-tls".to_owned(),
        BTreeMap::from([
            ("tls.crt".to_owned(), file("tls.crt")),
            ("tls.key".to_owned(), file("tls.key")),
            ("ca.crt".to_owned(), file("ca.crt")),
        ]),
    )]);
    let pods = t.dir.path().join("pods");
    let api_ca = api.ca();
    let world = PodWorld {
        objects: &objects,
        secrets: &secrets,
        node_name: NODE_NAME,
        token: &agent_token,
        api_server: Some((&api_ca, "127.0.0.1", API_PORT)),
        hosts: &[("127.0.0.1", "kpx-controlplane.kube-system.svc")],
        dir: &pods,
    };
    let control_plane_world = PodWorld { token: &control_plane_token, ..world };

    // A kube-proxy runs on the node (a migration's first step): its healthz and metrics
    // ports are taken, as kube-proxy takes them.
    let _kube_proxys_ports = t.node.run_in(|| {
        ["0.0.0.0:10256", "127.0.0.1:10249"]
            .map(|a| std::net::TcpListener::bind(a).expect("kube-proxy's port"))
    });
    // The kernel's conntrack timeouts, before kpx.
    let sysctl = |name: &str| t.node.exec("sysctl", &["-n", name]).trim().to_owned();
    let close_wait = "net.netfilter.nf_conntrack_tcp_timeout_close_wait";
    assert_ne!(sysctl(close_wait), "3600", "a new namespace has the kernel's default");

    let cp = pod::start(&t.node, &control_plane_world, "Deployment", "kpx-controlplane");
    let cp_container = pod::container(&objects, "Deployment", "kpx-controlplane");
    wait_probe(&t, &cp, cp_container, "readinessProbe", "127.0.0.1");
    wait_probe(&t, &cp, cp_container, "livenessProbe", "127.0.0.1");

    // As the securityContext says: an unprivileged user, no capabilities, a read-only root.
    assert_eq!(cp.status("Uid").split_whitespace().next(), Some("65532"));
    assert_eq!(cp.status("CapEff"), "0000000000000000");
    assert_eq!(cp.status("NoNewPrivs"), "1");
    assert!(
        cp.read_only("/") && cp.read_only("/etc") && cp.read_only("/var"),
        "the control plane's root is read-only"
    );

    let mut agent = pod::start(&t.node, &world, "DaemonSet", "kpx-dataplane");
    let agent_container = pod::container(&objects, "DaemonSet", "kpx-dataplane");
    t.wait_answered_by("10.96.9.1", 80, "pod0");
    // hostNetwork: the kubelet probes the node's address.
    wait_probe(&t, &agent, agent_container, "readinessProbe", NODE_IP);
    wait_probe(&t, &agent, agent_container, "livenessProbe", NODE_IP);
    let reviews = api.audited("/apis/authentication.k8s.io/v1/tokenreviews");
    assert!(!reviews.is_empty(), "the agent proved itself with its projected token");
    // Every request of the control plane and the agents, with their tokens, was allowed by
    // the rendered RBAC.
    let refused: Vec<_> = api.audit().into_iter().filter(|a| a.code == 403).collect();
    assert!(refused.is_empty(), "refused by the rendered RBAC: {refused:?}");
    // Root, but with NET_ADMIN and NET_RAW only (bits 12 and 13), on a read-only root.
    assert_eq!(agent.status("CapEff"), "0000000000003000");
    assert_eq!(agent.status("CapBnd"), "0000000000003000");
    assert!(agent.read_only("/") && agent.read_only("/etc"), "the agent's root is read-only");
    assert!(agent.read_only("/proc/sys"), "and so is its /proc/sys, as in an unprivileged container");
    assert!(!agent.read_only("/var/lib/kpx"), "its state directory is writable");
    // kube-proxy's conntrack settings, made by the privileged init container, as
    // kube-proxy's defaults have them; with iptables' localhost NodePorts, route_localnet.
    assert_eq!(sysctl(close_wait), "3600");
    assert_eq!(sysctl("net.netfilter.nf_conntrack_tcp_timeout_established"), "86400");
    if backend != ProxyBackend::Nftables {
        assert_eq!(sysctl("net.ipv4.conf.all.route_localnet"), "1", "iptables' localhost NodePorts");
    }
    // Set back behind its back (as a node's other software may): the agent, unprivileged,
    // makes it again through the node's /proc/sys/net mounted for it.
    t.node.exec("sysctl", &["-qw", &format!("{close_wait}=60")]);
    wait_for("the agent to make the CLOSE_WAIT timeout again", DEADLINE, || {
        (sysctl(close_wait) == "3600").then_some(())
    });
    // Nothing logged at ERROR that is not one (sled once complained of the memory limit).
    let errors: Vec<_> = agent.process.events().into_iter().filter(|e| e["level"] == "ERROR").collect();
    assert!(errors.is_empty(), "the agent logged at ERROR: {errors:?}");
    let iptables = t.node.exec("iptables-nft-save", &["-t", "nat"]);
    match backend {
        ProxyBackend::Nftables => {
            assert!(!iptables.contains("10.96.9.1"), "nftables, not iptables: {iptables}")
        }
        _ => assert!(iptables.contains("10.96.9.1"), "the iptables overlay programs iptables: {iptables}"),
    }
    let state = agent.host_root.join("var/lib/kpx");
    assert!(
        std::fs::read_dir(&state).map(|d| d.count()).unwrap_or(0) > 0,
        "the agent keeps its state in the hostPath {}",
        state.display()
    );

    // An operator with the admin certificate make-certs.sh made (kpxctl through a
    // port-forward, as it were).
    let out = t.kpxctl(&[
        "--control-plane=https://127.0.0.1:18000",
        &format!("--tls-ca={}", certs.join("ca.crt").display()),
        &format!("--tls-cert={}", certs.join("admin.crt").display()),
        &format!("--tls-key={}", certs.join("admin.key").display()),
        "sources",
    ]);
    assert!(out.status.success(), "kpxctl with the admin certificate: {out:?}");

    // A rolling update stops the agent: the node keeps its Service routing meanwhile.
    let status = agent.process.terminate();
    assert!(status.is_some_and(|s| s.success()), "the agent ends cleanly on SIGTERM: {status:?}");
    t.wait_answered_by("10.96.9.1", 80, "pod0");

    // Another process now holds the agent's healthz port and answers 200 on every path
    // (kube-proxy's healthz did, for agents that crashed on its port): the probes, with the
    // pod's config and identity, fail and say why.
    let healthz = RunningPod::port(agent_container, "healthz");
    let _impostor = HttpImpostor::start(&t, healthz);
    let config = agent.root.join("volumes/config/config.yaml");
    for kind in ["ready", "live"] {
        let out = t.node.try_exec_with_env(
            &kpx_e2e::harness::process::binary("kpx-dataplane").display().to_string(),
            &[&format!("--config={}", config.display()), &format!("--probe={kind}")],
            &agent.env,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--probe={kind} passed another process's answer: {stderr}");
        assert!(stderr.contains("answered by another pod's agent or another process"), "{stderr}");
    }
    drop(cp);
}

/// Waits until the container's `probe` passes: an exec probe exits 0, an httpGet on a
/// named port answers 200 at `host`.
fn wait_probe(t: &Topology, pod: &RunningPod, container: &serde_json::Value, probe: &str, host: &str) {
    if container[probe].get("exec").is_some() {
        let what = format!("{} {probe} (exec {})", pod.process.name, container[probe]["exec"]["command"]);
        wait_for(&what, DEADLINE, || pod.exec_probe(container, probe).status.success().then_some(()));
        println!("{what}: exit 0");
        return;
    }
    let get = &container[probe]["httpGet"];
    let path = get["path"].as_str().expect("httpGet path").to_owned();
    let port = RunningPod::port(container, get["port"].as_str().expect("a named port"));
    let to = sock(host, port);
    let what = format!("{} {probe} (GET {to}{path})", pod.process.name);
    wait_for(&what, DEADLINE, || {
        let path = path.clone();
        match t.node.run_in(move || http_get_path(to, &path)) {
            Ok((200, _)) => Some(()),
            _ => None,
        }
    });
    println!("{what}: 200");
}

/// A process that answers `200` with kube-proxy's healthz body to every HTTP request on
/// `port` of the node.
struct HttpImpostor {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpImpostor {
    fn start(t: &Topology, port: u16) -> HttpImpostor {
        let listener = t.node.run_in(move || {
            let l = std::net::TcpListener::bind(("0.0.0.0", port)).expect("the agent's port is free again");
            l.set_nonblocking(true).expect("nonblocking");
            l
        });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            use std::io::{Read, Write};
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let mut buf = [0u8; 1024];
                        let _ = s.read(&mut buf);
                        let body = r#"{"lastUpdated":"","currentTime":"","nodeEligible":true}"#;
                        let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{body}");
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        });
        HttpImpostor { stop, thread: Some(thread) }
    }
}

impl Drop for HttpImpostor {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn the_rendered_pods_serve_with_nftables() {
    rendered_pods_serve(documents(&kustomize("")), ProxyBackend::Nftables);
}

#[test]
fn the_rendered_pods_serve_with_iptables() {
    rendered_pods_serve(documents(&kustomize("overlays/iptables")), ProxyBackend::Iptables);
}

/// The chart's settings reach the programs as flags and config they accept: NodePort
/// addresses, masqueradeAll and the cluster CIDR (a value the agent refused would stop
/// it before it served).
#[test]
fn the_rendered_pods_serve_with_the_charts_settings() {
    let set = ["nodePortAddresses={10.0.0.0/24}", "masqueradeAll=true", "clusterCIDRs={10.244.0.0/16}"];
    let objects = documents(&install::helm_template_with(None, &set));
    let config = &install::object(&objects, "ConfigMap", "kpx-dataplane")["data"]["config.yaml"];
    let config = config.as_str().expect("config.yaml");
    assert!(
        config.contains("nodePortAddresses: [\"10.0.0.0/24\"]") && config.contains("masqueradeAll: true"),
        "{config}"
    );
    // iptables' localhost NodePorts can be turned off (no route_localnet then).
    let iptables = documents(&install::helm_template_with(
        None,
        &["backend=iptables", "iptables.localhostNodePorts=false"],
    ));
    let iptables_config =
        install::object(&iptables, "ConfigMap", "kpx-dataplane")["data"]["config.yaml"].clone();
    assert!(
        iptables_config.as_str().is_some_and(|c| c.contains("iptables:\n  localhostNodePorts: false")),
        "{iptables_config}"
    );
    let args = &pod::container(&objects, "Deployment", "kpx-controlplane")["args"];
    assert!(args.as_array().is_some_and(|a| a.iter().any(|a| a == "--cluster-cidr=10.244.0.0/16")), "{args}");
    rendered_pods_serve(objects, ProxyBackend::Nftables);
}

/// The image, built without a daemon from the binaries the tests use: it unpacks, runs
/// both binaries under chroot, holds every tool the backends call, and its own agent
/// (its nft library, its iptables) programs a real kernel; the manifests and the chart
/// name it by the workspace version.
#[test]
fn the_image_holds_both_binaries_and_every_tool_the_backends_call() {
    let built = output_of(
        Command::new(repo_path("deploy/image/build.sh")).args(["--binaries"]).arg(repo_path("target/debug")),
    );
    println!("{built}");
    let ns = kpx_e2e::harness::netns::Netns::new("image");
    let checked = output_of(Command::new(repo_path("deploy/image/check.sh")).args(["--netns", &ns.name]));
    println!("{checked}");
    for what in [
        "kpx-dataplane --version",
        "kpx-controlplane --version",
        "nft",
        "iptables-legacy-restore",
        "ip6tables-nft-save",
        "ipset",
        "conntrack",
    ] {
        assert!(checked.lines().any(|l| l.starts_with(&format!("PASS {what}:"))), "{what}: {checked}");
    }
    assert!(checked.contains("PASS kpx-dataplane --cleanup --backend iptables"), "{checked}");
    let image = format!("localhost/kpx:{}", env!("CARGO_PKG_VERSION"));
    for (how, objects) in install::default_installs() {
        for (kind, name) in [("Deployment", "kpx-controlplane"), ("DaemonSet", "kpx-dataplane")] {
            assert_eq!(pod::container(&objects, kind, name)["image"], image.as_str(), "{how}: {kind} {name}");
        }
    }
}

/// The features kpx-dataplane is built with when cargo builds `scope` (`[]`: the
/// workspace's default members, as `cargo build --release` and the image's build do).
fn dataplane_features(scope: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.current_dir(repo_path("")).args(["tree", "--offline", "-e", "features", "-i", "kpx-dataplane"]);
    let tree = output_of(command.args(["--prefix", "none"]).args(scope));
    assert!(
        tree.lines().any(|l| l.starts_with("kpx-dataplane v")),
        "cargo tree named no kpx-dataplane: {tree}"
    );
    tree
}

#[test]
fn the_product_build_carries_no_fake_kernel() {
    // The tests crate asks for the in-memory kernel: a build of the whole workspace has it.
    assert!(dataplane_features(&["--workspace"]).contains("kpx-dataplane feature \"fake\""));
    // A build of the product alone does not.
    let product = dataplane_features(&[]);
    assert!(!product.contains("\"fake\""), "{product}");
}

/// `helm install` against a real API server (`--dry-run=server`: the chart's lookups ask
/// the cluster, nothing is created): on a cluster with no kube-proxy the agents take
/// kube-proxy's ports (healthz 10256 for load balancers' node checks, metrics and
/// /proxyMode on 10249); with kube-proxy's DaemonSet there, they stay beside it.
#[test]
fn helm_install_takes_kube_proxys_ports_only_where_no_kube_proxy_runs() {
    let ns = kpx_e2e::harness::netns::Netns::new("api");
    let Some(api) = KubeApiServer::start(&ns, API_PORT, "helm_install_takes_kube_proxys_ports") else {
        return;
    };
    let install = || {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(provided_tool("target/tools/helm"))
            .arg(format!("--kubeconfig={}", api.admin_kubeconfig().display()))
            .args(["install", "kpx"])
            .arg(repo_path("deploy/helm/kpx"))
            .args(["--namespace", install::NAMESPACE, "--dry-run=server"])
            .output()
            .expect("helm runs");
        assert!(
            out.status.success(),
            "helm install --dry-run=server: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // The manifest follows the release's notes and hooks.
        let manifest = text.split_once("MANIFEST:").map_or(text.as_str(), |(_, m)| m).to_owned();
        let objects = documents(&manifest);
        let config = install::object(&objects, "ConfigMap", "kpx-dataplane")["data"]["config.yaml"]
            .as_str()
            .map(str::to_owned);
        let config: serde_json::Value = serde_yaml::from_str(&config.expect("config.yaml")).expect("YAML");
        let daemonset = install::object(&objects, "DaemonSet", "kpx-dataplane");
        let port =
            daemonset["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"].clone();
        (config["healthzBindAddress"].clone(), config["metricsBindAddress"].clone(), port)
    };
    assert_eq!(
        install(),
        (serde_json::json!("0.0.0.0:10256"), serde_json::json!("127.0.0.1:10249"), serde_json::json!(10256)),
        "no kube-proxy: its ports"
    );
    api.apply_yaml(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: kube-proxy, namespace: kube-system}\nspec:\n  \
         selector: {matchLabels: {k8s-app: kube-proxy}}\n  template:\n    metadata: {labels: {k8s-app: kube-proxy}}\n    \
         spec: {containers: [{name: kube-proxy, image: kube-proxy}]}\n",
    );
    assert_eq!(
        install(),
        (serde_json::json!("0.0.0.0:10356"), serde_json::json!("127.0.0.1:10349"), serde_json::json!(10356)),
        "beside a kube-proxy: ports of its own"
    );
}

/// The MCS CRDs as a cluster holds them: `serviceexports`' annotations (`None`: not there).
fn crd_annotations(api: &KubeApiServer) -> Option<serde_json::Value> {
    let crd = api.object(
        "customresourcedefinitions.apiextensions.k8s.io",
        "default",
        "serviceexports.multicluster.x-k8s.io",
    )?;
    Some(crd["metadata"]["annotations"].clone())
}

#[test]
fn helm_leaves_mcs_crds_it_did_not_install_alone_and_keeps_its_own() {
    let ns = kpx_e2e::harness::netns::Netns::new("api");
    let Some(api) = KubeApiServer::start(&ns, API_PORT + 1, "helm_leaves_mcs_crds") else { return };
    let helm = |args: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(provided_tool("target/tools/helm"))
            .arg(format!("--kubeconfig={}", api.admin_kubeconfig().display()))
            .args(args)
            .output()
            .expect("helm runs");
        assert!(out.status.success(), "helm {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    };
    let chart = repo_path("deploy/helm/kpx").display().to_string();
    let install =
        ["install", "kpx", &chart, "-n", install::NAMESPACE, "--set", "mcs.clustersetCIDRs={10.112.0.0/16}"];
    let uninstall = ["uninstall", "kpx", "-n", install::NAMESPACE];
    let names = ["serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"];

    // Applied by hand first (docs/multi-cluster.md, step 1): the install neither fails on
    // them ("cannot be imported into the current release", before) nor takes them over.
    let crds = std::fs::read_to_string(repo_path("deploy/kubernetes/overlays/mcs/crds.yaml")).expect("CRDs");
    api.install_crds(&crds, &names);
    helm(&install);
    let annotations = crd_annotations(&api).expect("the CRD");
    assert!(annotations.get("meta.helm.sh/release-name").is_none(), "left alone: {annotations}");
    helm(&uninstall);
    assert!(crd_annotations(&api).is_some(), "still there after helm uninstall");

    // None there: the chart installs them, upgrades its own, and keeps them on uninstall.
    api.kubectl_ok(&["delete", "crd", names[0], names[1]]);
    helm(&install);
    let annotations = crd_annotations(&api).expect("the chart's CRD");
    assert_eq!(annotations["meta.helm.sh/release-name"], "kpx", "{annotations}");
    let mut upgrade = install;
    upgrade[0] = "upgrade";
    helm(&upgrade);
    helm(&uninstall);
    assert!(crd_annotations(&api).is_some(), "kept on helm uninstall (helm.sh/resource-policy: keep)");
}

#[test]
fn an_agents_only_install_renders_no_control_plane_and_the_access_one_needs() {
    let url = "controlPlane.url=https://10.0.0.11:31800";
    let objects =
        documents(&kpx_e2e::harness::install::helm_template_with(None, &["controlPlane.enabled=false", url]));
    let kinds: Vec<String> =
        objects.iter().map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"])).collect();
    for absent in ["Deployment", "PodDisruptionBudget"] {
        assert!(objects.iter().all(|o| o["kind"] != absent), "no {absent}: {kinds:?}");
    }
    assert!(
        objects
            .iter()
            .all(|o| o["kind"] != "Service" && o["metadata"]["name"] != "kpx-controlplane-mcs-lease"),
        "no control plane Service, no Lease Role: {kinds:?}"
    );
    let token = install::object(&objects, "Secret", "kpx-controlplane-token");
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    assert_eq!(token["metadata"]["annotations"]["kubernetes.io/service-account.name"], "kpx-controlplane");
    install::object(&objects, "ServiceAccount", "kpx-controlplane");
    for role in ["kpx-controlplane", "kpx-controlplane-token-review", "kpx-controlplane-mcs"] {
        let binding = install::object(&objects, "ClusterRoleBinding", role);
        assert_eq!(binding["subjects"][0]["name"], "kpx-controlplane", "{binding}");
    }
    let config = install::object(&objects, "ConfigMap", "kpx-dataplane")["data"]["config.yaml"].clone();
    assert!(config.as_str().is_some_and(|c| c.contains("controlPlane: https://10.0.0.11:31800")), "{config}");
    // The home cluster's Service as a NodePort, for those agents.
    let home =
        documents(&kpx_e2e::harness::install::helm_template_with(None, &["controlPlane.nodePort=31800"]));
    let service = install::object(&home, "Service", "kpx-controlplane");
    assert_eq!(service["spec"]["type"], "NodePort");
    assert_eq!(service["spec"]["ports"][0]["nodePort"], 31800);
}
