//! A real Kubernetes API server for tests, as controller-runtime's envtest starts one:
//! Debian's etcd and the real `kube-apiserver` (v1.36, `../shared/k8s/bin` beside the
//! checkout, or the folder named by `KPX_KUBE_BIN`), no kubelet, no controllers, inside a
//! network namespace of the test, torn down when dropped. What it answers is what a
//! cluster answers: plain-text 404s for a group it does not serve, RBAC, server-side
//! apply, TokenRequest and TokenReview, validation and defaulting of every field.
//!
//! Where no binary is found, [`KubeApiServer::start`] says that the test skipped (on
//! standard output, where cargo shows it) and returns `None`: a user's checkout without
//! `../shared` can still run the rest.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::install::{provided_tool, repo_path};
use crate::harness::netns::Netns;
use crate::harness::pki::Pki;
use crate::harness::process::KpxProcess;
use crate::{wait_for, DEADLINE};

/// The variable that names a folder holding `kube-apiserver` and `kube-proxy`.
pub const BIN_VARIABLE: &str = "KPX_KUBE_BIN";

/// The API server's address on the link [`KubeApiServer::link`] makes to another
/// namespace (that end is [`LINKED_PEER`]); its serving certificate names it.
pub const LINKED_ADDR: &str = "10.255.255.1";
const LINKED_PEER: &str = "10.255.255.2";

/// The node's address on its link to pod 0 (`Topology`): pods reach the API server there.
pub const POD_GATEWAY: &str = "10.244.1.1";

/// The admin's bearer token (group `system:masters`).
pub const ADMIN_TOKEN: &str = "kpx-test-admin";

/// The folder with the real Kubernetes binaries, or `None` (and a line saying the test
/// skipped) where there is none.
pub fn binaries(test: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os(BIN_VARIABLE) {
        Some(dir) => PathBuf::from(dir),
        None => repo_path("../shared/k8s/bin"),
    };
    if dir.join("kube-apiserver").exists() {
        return Some(dir);
    }
    println!(
        "skipped: {test} needs the real kube-apiserver ({} has none; {BIN_VARIABLE} names a folder with it)",
        dir.display()
    );
    None
}

/// The real `kube-proxy` of the same folder, or `None` (said as for [`binaries`]).
pub fn kube_proxy(test: &str) -> Option<PathBuf> {
    let path = binaries(test)?.join("kube-proxy");
    if path.exists() {
        return Some(path);
    }
    println!("skipped: {test} needs the real kube-proxy ({} is missing)", path.display());
    None
}

pub struct KubeApiServer {
    ns: String,
    bin: PathBuf,
    dir: tempfile::TempDir,
    etcd: Option<KpxProcess>,
    apiserver: Option<KpxProcess>,
    pub addr: SocketAddr,
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver inside `ns`, the API server on 127.0.0.1:`port`, and
    /// waits until it is ready and its paths are installed; `None` where there is no binary.
    pub fn start(ns: &Netns, port: u16, test: &str) -> Option<KubeApiServer> {
        let bin = binaries(test)?;
        let dir = tempfile::tempdir().expect("temp dir");
        let pki = Pki::new(dir.path(), "apiserver");
        // As a cluster's API server certificate: its Service's names, and the addresses a
        // test dials it at (loopback, a linked node, the node seen from pod 0).
        let ips = ["127.0.0.1", LINKED_ADDR, POD_GATEWAY].map(|ip| ip.parse().expect("an IP address"));
        let names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"];
        pki.issue("serving", "kube-apiserver", &names, &ips, crate::harness::pki::Validity::Current);
        // The key that signs ServiceAccount tokens, and its public half that checks them.
        let signing = rcgen::KeyPair::generate().expect("a key");
        std::fs::write(dir.path().join("service-accounts.key"), signing.serialize_pem()).expect("key");
        std::fs::write(dir.path().join("service-accounts.pub"), signing.public_key_pem())
            .expect("public key");
        std::fs::write(
            dir.path().join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n"),
        )
        .expect("tokens");
        // One audit line a request, once it is answered: what a test counts.
        std::fs::write(
            dir.path().join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n",
        )
        .expect("audit policy");
        let mut server = KubeApiServer {
            ns: ns.name.clone(),
            bin,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            etcd: None,
            apiserver: None,
            dir,
        };
        let d = server.dir.path().to_owned();
        // Several API servers may share a namespace: etcd's ports follow the API server's.
        let (client, peer) = (port + 1000, port + 2000);
        let etcd_args: Vec<String> = [
            format!("--data-dir={}", d.join("etcd").display()),
            "--name=kpx-test".into(),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=kpx-test=http://127.0.0.1:{peer}"),
            "--log-level=warn".into(),
        ]
        .into();
        server.etcd = Some(server.spawn(Path::new("etcd"), &etcd_args, &d.join("etcd.log")));
        server.write_kubeconfig(&d.join("admin.kubeconfig"), ADMIN_TOKEN);
        server.start_apiserver();
        Some(server)
    }

    fn apiserver_args(&self) -> Vec<String> {
        let d = self.dir.path();
        let file = |name: &str| d.join(name).display().to_string();
        vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.addr.port() + 1000),
            "--bind-address=0.0.0.0".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", self.addr.port()),
            "--service-cluster-ip-range=10.96.0.0/12".into(),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", file("tokens.csv")),
            format!("--client-ca-file={}", file("apiserver-ca.crt")),
            format!("--tls-cert-file={}", file("serving.crt")),
            format!("--tls-private-key-file={}", file("serving.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", file("service-accounts.pub")),
            format!("--service-account-signing-key-file={}", file("service-accounts.key")),
            "--allow-privileged=true".into(),
            "--enable-admission-plugins=".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--audit-policy-file={}", file("audit-policy.yaml")),
            format!("--audit-log-path={}", file("audit.log")),
            "--v=1".into(),
        ]
    }

    /// Starts `program args` inside the namespace, its output appended to `log`.
    fn spawn(&self, program: &Path, args: &[String], log: &Path) -> KpxProcess {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns]).arg(program).args(args);
        let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        KpxProcess::start_command(command, &name, log.to_owned())
    }

    fn start_apiserver(&mut self) {
        let log = self.dir.path().join("kube-apiserver.log");
        self.apiserver = Some(self.spawn(&self.bin.join("kube-apiserver"), &self.apiserver_args(), &log));
        self.wait_ready();
    }

    /// Waits until `/readyz` answers 200 and a group's path answers (the paths are
    /// installed some seconds after the port opens: until then 503 for everything).
    fn wait_ready(&self) {
        wait_for("the real kube-apiserver to be ready", DEADLINE, || {
            if self.apiserver.as_ref().is_some_and(KpxProcess::exited) {
                panic!("kube-apiserver ended; its log:\n{}", self.log());
            }
            let ready = self.kubectl(&["get", "--raw=/readyz"]);
            let listed = self.kubectl(&["get", "namespaces", "kube-system", "-o", "name"]);
            (ready.status.success() && listed.status.success()).then_some(())
        });
    }

    /// Stops kube-apiserver (etcd keeps the objects) until [`KubeApiServer::restart`].
    pub fn stop(&mut self) {
        if let Some(mut process) = self.apiserver.take() {
            process.stop();
        }
    }

    /// Starts kube-apiserver again over the same etcd, and waits until it is ready.
    pub fn restart(&mut self) {
        self.start_apiserver();
    }

    /// Joins `other` (another test's node) to the API server's namespace by a veth, so
    /// that clients there reach it at [`LINKED_ADDR`]; the link goes with the namespaces.
    pub fn link(&self, other: &Netns) {
        let ip = |ns: &str, args: &[&str]| {
            crate::harness::netns::run("ip", &[&["-n", ns], args].concat());
        };
        ip(
            &self.ns,
            &["link", "add", "to-linked", "type", "veth", "peer", "name", "to-api", "netns", &other.name],
        );
        ip(&self.ns, &["addr", "add", &format!("{LINKED_ADDR}/30"), "dev", "to-linked"]);
        ip(&self.ns, &["link", "set", "to-linked", "up"]);
        ip(&other.name, &["addr", "add", &format!("{LINKED_PEER}/30"), "dev", "to-api"]);
        ip(&other.name, &["link", "set", "to-api", "up"]);
    }

    /// [`KubeApiServer::write_kubeconfig`] for a client in a namespace [`KubeApiServer::link`]ed to this one.
    pub fn write_linked_kubeconfig(&self, path: &Path, token: &str) {
        self.write_kubeconfig_at(
            path,
            token,
            &SocketAddr::new(LINKED_ADDR.parse().expect("IP"), self.addr.port()),
        );
    }

    /// [`KubeApiServer::write_kubeconfig`] for a client in a pod of the node ([`POD_GATEWAY`]).
    pub fn write_pod_kubeconfig(&self, path: &Path, token: &str) {
        self.write_kubeconfig_at(path, token, &self.from_pods());
    }

    /// The API server's address as pods of the node reach it.
    pub fn from_pods(&self) -> SocketAddr {
        SocketAddr::new(POD_GATEWAY.parse().expect("IP"), self.addr.port())
    }

    /// A kubeconfig for `token` at this server (its CA, a bearer token).
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        self.write_kubeconfig_at(path, token, &self.addr);
    }

    fn write_kubeconfig_at(&self, path: &Path, token: &str, addr: &SocketAddr) {
        let ca = self.dir.path().join("apiserver-ca.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster: {{server: \"https://{}\", certificate-authority: \"{}\"}}\n\
             users:\n- name: user\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: real\n  context: {{cluster: real, user: user}}\n\
             current-context: real\n",
            addr,
            ca.display()
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// The CA that signed the API server's serving certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("apiserver-ca.crt")
    }

    /// The admin's kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// `kubectl ARGS` as the admin, inside the namespace; its outcome.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_input(args, None)
    }

    fn kubectl_input(&self, args: &[&str], input: Option<&str>) -> Output {
        use std::io::Write as _;
        let kubectl = provided_tool("target/tools/kubectl");
        let kubeconfig = format!("--kubeconfig={}", self.admin_kubeconfig().display());
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.ns])
            .arg(&kubectl)
            .arg(&kubeconfig)
            .args(["--request-timeout=20s"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
        let mut stdin = child.stdin.take().expect("kubectl's stdin");
        if let Some(input) = input {
            stdin.write_all(input.as_bytes()).expect("kubectl's input");
        }
        drop(stdin);
        child.wait_with_output().expect("kubectl's outcome")
    }

    /// `kubectl ARGS` as the admin, which must succeed; its standard output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply` of a manifest (several YAML documents), creating the namespaces it
    /// names first. Client-side: server-side apply refuses what kubelets write (a Node's
    /// addresses hold one InternalIP per family, and `type` is their merge key). Retried while the API server is not ready for it (a CRD's
    /// kinds are served a second or two after it is established).
    pub fn apply_yaml(&self, yaml: &str) {
        for namespace in namespaces_of(yaml) {
            let out = self.kubectl(&["create", "namespace", &namespace]);
            let text = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() || text.contains("AlreadyExists"),
                "create namespace {namespace}: {text}"
            );
        }
        wait_for("kubectl apply to be accepted", DEADLINE, || {
            let out = self.kubectl_input(&["apply", "-f", "-"], Some(yaml));
            let text = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() {
                return Some(());
            }
            // Anything but a kind not served yet is the test's mistake: say it at once.
            assert!(
                text.contains("ensure CRDs are installed first")
                    || text.contains("the server could not find"),
                "kubectl apply: {text}\n{yaml}"
            );
            None
        });
    }

    /// The object `resource` (`serviceimports.multicluster.x-k8s.io`, `endpointslices`, …)
    /// `namespace/name` as the API server holds it, or `None` where there is none.
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let out = self.kubectl(&["get", resource, name, "-n", namespace, "-o", "json", "--ignore-not-found"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl get {resource} {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (!text.trim().is_empty()).then(|| serde_json::from_str(&text).expect("kubectl's JSON"))
    }

    /// Merges `status` (JSON) into the status subresource of `kind` `namespace/name`, as the
    /// controller that owns it would (a create or apply leaves a Service's status empty).
    pub fn patch_status(&self, kind: &str, namespace: &str, name: &str, status: &str) {
        let patch = format!("{{\"status\":{status}}}");
        self.kubectl_ok(&[
            "patch",
            kind,
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ]);
    }

    /// Deletes `kind` `namespace/name` (no namespace: a cluster-scoped object).
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let mut args = vec!["delete", kind, name, "--wait=false"];
        if !namespace.is_empty() {
            args.extend(["-n", namespace]);
        }
        self.kubectl_ok(&args);
    }

    /// Applies a CRD manifest and waits until the API server serves its kinds.
    pub fn install_crds(&self, yaml: &str, resources: &[&str]) {
        self.apply_yaml(yaml);
        for resource in resources {
            self.kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{resource}"),
            ]);
            wait_for("the CRD's kind to be served", DEADLINE, || {
                self.kubectl(&["get", resource, "-A", "-o", "name"]).status.success().then_some(())
            });
        }
    }

    /// A bound ServiceAccount token (`kubectl create token`), valid for an hour.
    pub fn create_token(&self, namespace: &str, account: &str, extra: &[&str]) -> String {
        let mut args = vec!["create", "token", account, "-n", namespace, "--duration=1h"];
        args.extend_from_slice(extra);
        self.kubectl_ok(&args).trim().to_owned()
    }

    /// The requests the API server answered whose path contains `path`, from its audit
    /// log: (verb, requestURI, code).
    pub fn audited(&self, path: &str) -> Vec<(String, String, u64)> {
        self.audit().into_iter().filter(|a| a.uri.contains(path)).map(|a| (a.verb, a.uri, a.code)).collect()
    }

    /// Every request the API server answered, in order, from its audit log.
    pub fn audit(&self) -> Vec<Audited> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .map(|e| {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                let object = &e["objectRef"];
                Audited {
                    verb: text(&e["verb"]),
                    uri: text(&e["requestURI"]),
                    code: e["responseStatus"]["code"].as_u64().unwrap_or_default(),
                    user: text(&e["user"]["username"]),
                    group: text(&object["apiGroup"]),
                    resource: text(&object["resource"]),
                    subresource: text(&object["subresource"]),
                    namespace: text(&object["namespace"]),
                    name: text(&object["name"]),
                }
            })
            .collect()
    }

    /// The API server's log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }
}

/// The real kube-proxy (nftables mode) of a node, as kubeadm runs it: the ServiceAccount
/// `kube-proxy` bound to the API server's own `system:node-proxier`, its token in a
/// kubeconfig, a `KubeProxyConfiguration` for the test's node.
pub struct KubeProxy {
    binary: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl KubeProxy {
    /// Sets kube-proxy up in `api` for the node `topology` (its files in the topology's
    /// folder); [`KubeProxy::start`] runs it.
    pub fn new(
        api: &KubeApiServer,
        binary: &Path,
        topology: &crate::harness::topology::Topology,
    ) -> KubeProxy {
        api.apply_yaml(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: kube-proxy, namespace: kube-system}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: kube-proxy}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-proxier}\n\
             subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]\n",
        );
        let dir = topology.dir.path();
        let kubeconfig = dir.join("kube-proxy.kubeconfig");
        api.write_kubeconfig(&kubeconfig, &api.create_token("kube-system", "kube-proxy", &[]));
        let config = dir.join("kube-proxy.yaml");
        // `conntrack.maxPerCore: 0`: nf_conntrack_max is read-only in a network namespace.
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n\
                 clientConnection: {{kubeconfig: {}}}\nhostnameOverride: {}\n\
                 clusterCIDR: {}\nconntrack: {{maxPerCore: 0}}\n",
                kubeconfig.display(),
                crate::harness::topology::NODE_NAME,
                crate::harness::topology::CLUSTER_CIDR,
            ),
        )
        .expect("kube-proxy's configuration");
        KubeProxy { binary: binary.to_owned(), config, log: dir.join("kube-proxy.log") }
    }

    /// Starts kube-proxy in the node's namespace.
    pub fn start(&self, node: &Netns) -> KpxProcess {
        let args = [format!("--config={}", self.config.display()), "--v=2".to_owned()];
        KpxProcess::start_path(node, &self.binary, "kube-proxy", &args, self.log.clone())
    }
}

/// One request, as the audit log has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    pub verb: String,
    pub uri: String,
    pub code: u64,
    /// Who asked (`system:serviceaccount:kube-system:kpx-controlplane`).
    pub user: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Audited {
    /// Whether it changed something: create, update, patch or delete.
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete")
    }

    /// `group/resource[/subresource]:verb`, as RBAC rules name what they grant.
    pub fn grant(&self) -> String {
        let sub = if self.subresource.is_empty() { String::new() } else { format!("/{}", self.subresource) };
        format!("{}/{}{sub}:{}", self.group, self.resource, self.verb)
    }
}

/// The user kpx's control plane is, with the install's ServiceAccount token.
pub const CONTROL_PLANE_USER: &str = "system:serviceaccount:kube-system:kpx-controlplane";

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        // The API server first: etcd going first makes it log errors until it is ended.
        self.stop();
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop();
        }
    }
}

/// The namespaces a manifest's documents are in.
fn namespaces_of(yaml: &str) -> std::collections::BTreeSet<String> {
    serde_yaml::Deserializer::from_str(yaml)
        .filter_map(|document| serde::Deserialize::deserialize(document).ok())
        .filter_map(|value: serde_json::Value| value["metadata"]["namespace"].as_str().map(str::to_owned))
        .collect()
}
