//! A rendered workload's container run as its kubelet would run it, with the real
//! binaries inside a test's network namespace: the container's command and args (with
//! `$(VAR)` expanded from its env), its volumes materialised from the rendered objects
//! (ConfigMaps, Secrets the test supplies, projected ServiceAccount tokens, hostPaths
//! under the test's folder) and mounted at their mountPaths in a mount namespace of its
//! own, a read-only root when the container asks for one, and its securityContext's user,
//! no_new_privs and capability bounding set applied with setpriv. What this proves: the
//! manifests' paths, flags, files and privileges are enough for the programs to work.
//!
//! The container's /etc and /var are overlays whose upper layers are in the test's folder
//! and its /run a tmpfs, so nothing is written to the host's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::harness::netns::Netns;
use crate::harness::process::{binary, KpxProcess};

/// What the kubelet and the API server would supply that the rendered objects do not hold.
pub struct PodWorld<'a> {
    /// Every rendered object (ConfigMaps are looked up here by name).
    pub objects: &'a [Value],
    /// Secrets by name: file name → content.
    pub secrets: &'a BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    /// `spec.nodeName`.
    pub node_name: &'a str,
    /// The ServiceAccount token a projected (or the automounted) token volume holds.
    pub token: &'a str,
    /// The automounted ServiceAccount volume's `ca.crt` (the API server's CA) and the
    /// `KUBERNETES_SERVICE_HOST`/`_PORT` the kubelet injects.
    pub api_server: Option<(&'a Path, &'a str, u16)>,
    /// /etc/hosts lines of the pod (as the node's resolver would answer them).
    pub hosts: &'a [(&'a str, &'a str)],
    /// A folder of the test's where volumes, hostPaths and overlay layers go.
    pub dir: &'a Path,
}

/// A started container: its process, and where its hostPaths are on this machine.
pub struct RunningPod {
    // Dropped in this order: the process ends before its cgroup is removed.
    pub process: KpxProcess,
    pub host_root: PathBuf,
    /// The container's environment (what an exec probe runs with).
    pub env: BTreeMap<String, String>,
    /// The pod's folder: its volumes are under `volumes/NAME`.
    pub root: PathBuf,
    _cgroup: Option<MemoryCgroup>,
}

/// A memory cgroup (cgroup v1, this machine's) limited as a container's
/// `resources.limits.memory`, removed when dropped (after its processes ended).
struct MemoryCgroup {
    path: PathBuf,
}

impl MemoryCgroup {
    const ROOT: &'static str = "/sys/fs/cgroup/memory";

    fn new(name: &str, limit: u64) -> MemoryCgroup {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        assert!(
            Path::new(Self::ROOT).join("memory.limit_in_bytes").exists(),
            "this runner gives a container its memory limit in a cgroup v1 memory controller at {}",
            Self::ROOT
        );
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(Self::ROOT).join(format!("kpx-test-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("cgroup {}: {e}", path.display()));
        std::fs::write(path.join("memory.limit_in_bytes"), limit.to_string())
            .expect("the cgroup's memory limit");
        MemoryCgroup { path }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its last process may still be on its way out.
        for _ in 0..200 {
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        eprintln!("cannot remove cgroup {}", self.path.display());
    }
}

/// A Kubernetes memory quantity in bytes (`512Mi`, `1Gi`, `128M`, `1000`).
fn quantity_bytes(text: &str) -> u64 {
    let units: [(&str, u64); 6] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (digits, unit) = units
        .iter()
        .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|d| (d, *unit)))
        .unwrap_or((text, 1));
    digits.parse::<u64>().unwrap_or_else(|_| panic!("memory quantity {text:?} is not one this runner reads"))
        * unit
}

impl RunningPod {
    /// A line of the container process's /proc status (`CapEff`, `Uid`, `NoNewPrivs`…).
    pub fn status(&self, field: &str) -> String {
        let pid = self.process.pid().expect("a PID");
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
    }

    /// Whether `path` is mounted read-only in the container.
    pub fn read_only(&self, path: &str) -> bool {
        let pid = self.process.pid().expect("a PID");
        let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
        // The last mount at `path` is the one the container sees.
        let options = text
            .lines()
            .rev()
            .find(|l| l.split_whitespace().nth(4) == Some(path))
            .and_then(|l| l.split_whitespace().nth(5).map(str::to_owned))
            .unwrap_or_else(|| panic!("{path} is not a mount of the container"));
        options.split(',').any(|o| o == "ro")
    }

    /// Runs the container's exec `probe` (`readinessProbe`, `livenessProbe`) inside the
    /// container's mount and network namespaces with its environment, as the kubelet does.
    pub fn exec_probe(&self, container: &Value, probe: &str) -> std::process::Output {
        let command: Vec<String> = container[probe]["exec"]["command"]
            .as_array()
            .unwrap_or_else(|| panic!("{probe} is not an exec probe: {}", container[probe]))
            .iter()
            .map(|c| c.as_str().expect("a string").to_owned())
            .collect();
        let pid = self.process.pid().expect("a running container");
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "-n", "--"])
            .arg(binary(&command[0]))
            .args(&command[1..])
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(&self.env)
            .output()
            .expect("nsenter runs")
    }

    /// The container port named `name`.
    pub fn port(container: &Value, name: &str) -> u16 {
        container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no container port named {name}: {container}"))
    }
}

/// The first container of the workload `kind`/`name`.
pub fn container<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    &crate::harness::install::object(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]
}

/// Starts the first container of the workload `kind`/`name` inside `ns`, after its init
/// containers, each run to its end (which must be a success), as the kubelet does.
pub fn start(ns: &Netns, world: &PodWorld<'_>, kind: &str, name: &str) -> RunningPod {
    let workload = crate::harness::install::object(world.objects, kind, name);
    let pod = &workload["spec"]["template"]["spec"];
    let root = world.dir.join(name);
    let host_root = root.join("node");
    std::fs::create_dir_all(&host_root).expect("the pod's folder");
    for init in pod["initContainers"].as_array().into_iter().flatten() {
        let init_name = init["name"].as_str().expect("init container name");
        let at = Launch { kind, name, pod, container: init, root: root.join(format!("init-{init_name}")) };
        let (mut process, _env, _cgroup) = at.launch(ns, world, &host_root, &format!("{name}-{init_name}"));
        let status = process.wait_exit(crate::DEADLINE);
        assert!(
            status.is_some_and(|s| s.success()),
            "{kind} {name}: init container {init_name} ended {status:?}:\n{}",
            process.log_text()
        );
        println!("{kind} {name}: init container {init_name} ended {status:?}");
    }
    let at = Launch { kind, name, pod, container: &pod["containers"][0], root: root.clone() };
    let (process, env, cgroup) = at.launch(ns, world, &host_root, name);
    RunningPod { process, host_root, env, root, _cgroup: cgroup }
}

/// One container of a pod, to start.
struct Launch<'a> {
    kind: &'a str,
    name: &'a str,
    pod: &'a Value,
    container: &'a Value,
    /// Its own folder (volumes, overlays); hostPaths are the pod's.
    root: PathBuf,
}

impl Launch<'_> {
    /// Starts the container, logging to `<log_name>.log`; also returns its memory cgroup.
    fn launch(
        &self,
        ns: &Netns,
        world: &PodWorld<'_>,
        host_root: &Path,
        log_name: &str,
    ) -> (KpxProcess, BTreeMap<String, String>, Option<MemoryCgroup>) {
        let Launch { kind, name, pod, container, ref root } = *self;

        let mut env = BTreeMap::new();
        if let Some((_, host, port)) = world.api_server {
            env.insert("KUBERNETES_SERVICE_HOST".to_owned(), host.to_owned());
            env.insert("KUBERNETES_SERVICE_PORT".to_owned(), port.to_string());
        }
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().expect("env name").to_owned();
            let value = if let Some(value) = var["value"].as_str() {
                value.to_owned()
            } else if var["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName" {
                world.node_name.to_owned()
            } else if var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid" {
                pod_uid(self.name)
            } else {
                panic!("{kind} {name}: env {var} is not something this runner supplies");
            };
            env.insert(name, value);
        }
        let expand = |text: &str| {
            let mut text = text.to_owned();
            for (name, value) in &env {
                text = text.replace(&format!("$({name})"), value);
            }
            text
        };
        let strings = |v: &Value| -> Vec<String> {
            v.as_array().into_iter().flatten().map(|s| expand(s.as_str().expect("a string"))).collect()
        };
        let command = strings(&container["command"]);
        let args = strings(&container["args"]);
        let program = command.first().unwrap_or_else(|| panic!("{kind} {name}: no command"));
        assert!(command.len() == 1, "{kind} {name}: one program, its flags in args: {command:?}");

        // Volumes, made on this machine, then mounted (mountPath → source, read-only).
        let mut mounts: Vec<(String, PathBuf, bool)> = Vec::new();
        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let volume_name = mount["name"].as_str().expect("volumeMount name");
            let volume = volumes
                .iter()
                .find(|v| v["name"] == volume_name)
                .unwrap_or_else(|| panic!("{kind} {name}: volumeMount {volume_name} has no volume"));
            let source = materialise(world, volume, &root.join("volumes").join(volume_name), host_root);
            mounts.push((
                mount["mountPath"].as_str().expect("mountPath").to_owned(),
                source,
                mount["readOnly"] == true,
            ));
        }
        let automount = pod["automountServiceAccountToken"] != false;
        if automount {
            let (ca, _, _) = world.api_server.expect("an automounted ServiceAccount needs the API server");
            let dir = root.join("volumes").join("kube-api-access");
            std::fs::create_dir_all(&dir).expect("volume");
            std::fs::write(dir.join("token"), world.token).expect("token");
            std::fs::copy(ca, dir.join("ca.crt")).expect("ca.crt");
            std::fs::write(dir.join("namespace"), crate::harness::install::NAMESPACE).expect("namespace");
            mounts.push(("/var/run/secrets/kubernetes.io/serviceaccount".to_owned(), dir, true));
        }

        let security = &container["securityContext"];
        let pod_security = &pod["securityContext"];
        let read_only_root = security["readOnlyRootFilesystem"] == true;
        let privileged = security["privileged"] == true;
        let mut script = String::from("set -e\n");
        // The memory limit, in a cgroup the container sees as its own at
        // /sys/fs/cgroup/memory (as a cgroup v1 runtime shows it), kept at hand before /sys is
        // mounted anew.
        let cgroup = container["resources"]["limits"]["memory"]
            .as_str()
            .map(|limit| MemoryCgroup::new(log_name, quantity_bytes(limit)));
        if let Some(cgroup) = &cgroup {
            let held = root.join("cgroup");
            std::fs::create_dir_all(&held).expect("cgroup mount point");
            script.push_str(&format!(
                "echo $$ > '{}/cgroup.procs'\nmount --bind '{}' '{}'\n",
                cgroup.path.display(),
                cgroup.path.display(),
                held.display()
            ));
        }
        for dir in ["etc", "var"] {
            let upper = root.join("overlay").join(dir);
            std::fs::create_dir_all(upper.join("up")).expect("overlay");
            std::fs::create_dir_all(upper.join("work")).expect("overlay");
            script.push_str(&format!(
                "mount -t overlay kpx-pod -o lowerdir=/{dir},upperdir='{}',workdir='{}' /{dir}\n",
                upper.join("up").display(),
                upper.join("work").display()
            ));
        }
        // As runc: an unprivileged container's /sys and /proc/sys are read-only.
        let ro = if privileged { "rw" } else { "ro" };
        script
            .push_str(&format!("mount -t tmpfs kpx-pod-run /run\nmount -t sysfs -o {ro} kpx-pod-sys /sys\n"));
        if cgroup.is_some() {
            script.push_str(&format!(
            "mount -t tmpfs kpx-pod-cgroup /sys/fs/cgroup\nmkdir /sys/fs/cgroup/memory\nmount --bind '{}' /sys/fs/cgroup/memory\n",
            root.join("cgroup").display()
        ));
        }
        for (ip, host) in world.hosts {
            script.push_str(&format!("echo '{ip} {host}' >> /etc/hosts\n"));
        }
        for (target, source, read_only) in &mounts {
            let target = target.replace("/var/run/", "/run/");
            if source.is_dir() {
                script.push_str(&format!("mkdir -p '{target}'\n"));
            } else {
                script.push_str(&format!("mkdir -p \"$(dirname '{target}')\" && touch '{target}'\n"));
            }
            script.push_str(&format!("mount --bind '{}' '{target}'\n", source.display()));
            if *read_only {
                script.push_str(&format!("mount -o remount,bind,ro '{target}'\n"));
            }
        }
        // After the volumes, which come from the node's own mounts (a hostPath of
        // /proc/sys/net stays writable).
        if !privileged {
            script.push_str("mount --bind /proc/sys /proc/sys\nmount -o remount,bind,ro /proc/sys\n");
        }
        if read_only_root {
            script.push_str("mount -o remount,bind,ro /\nmount -o remount,bind,ro /etc\nmount -o remount,bind,ro /var\nmount -o remount,bind,ro /run\n");
        }
        script.push_str("exec \"$@\"\n");

        let mut setpriv = vec!["setpriv".to_owned()];
        let user = security["runAsUser"].as_u64().or(pod_security["runAsUser"].as_u64());
        let group = security["runAsGroup"].as_u64().or(pod_security["runAsGroup"].as_u64());
        if let Some(user) = user {
            setpriv.push(format!("--reuid={user}"));
            setpriv.push(format!("--regid={}", group.unwrap_or(user)));
            setpriv.push("--clear-groups".to_owned());
        }
        if security["allowPrivilegeEscalation"] == false {
            setpriv.push("--no-new-privs".to_owned());
        }
        if !privileged {
            let drop_all =
                security["capabilities"]["drop"].as_array().is_some_and(|d| d.iter().any(|c| c == "ALL"));
            assert!(drop_all, "{kind} {name}: unprivileged containers here drop ALL and add what they need");
            let added: Vec<String> = security["capabilities"]["add"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| format!("+{}", c.as_str().expect("capability").to_lowercase()))
                .collect();
            let set = std::iter::once("-all".to_owned()).chain(added).collect::<Vec<_>>().join(",");
            setpriv.push(format!("--bounding-set={set}"));
            setpriv.push(format!("--inh-caps={set}"));
            if user.is_some_and(|u| u != 0) {
                setpriv.push(format!("--ambient-caps={set}"));
            }
        }

        let mut process = Command::new("nsenter");
        process
            .arg(format!("--net=/run/netns/{}", ns.name))
            .args(["--", "unshare", "--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
            .args(&setpriv)
            .arg("--")
            .arg(binary(program))
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(&env);
        let log = world.dir.join(format!("{log_name}.log"));
        println!("{kind} {name}: {program} {}", args.join(" "));
        (KpxProcess::start_command(process, program, log), env, cgroup)
    }
}

/// Makes `volume`'s files under `at` (hostPaths under `host_root`); the path to mount.
fn materialise(world: &PodWorld<'_>, volume: &Value, at: &Path, host_root: &Path) -> PathBuf {
    if let Some(host_path) = volume.get("hostPath") {
        let path = host_path["path"].as_str().expect("hostPath path");
        let on_node = host_root.join(path.trim_start_matches('/'));
        match host_path["type"].as_str().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(&on_node).expect("hostPath directory"),
            "FileOrCreate" => {
                std::fs::create_dir_all(on_node.parent().expect("parent")).expect("hostPath parent");
                std::fs::write(&on_node, b"").expect("hostPath file");
            }
            // The node's own, read as it is (e.g. /lib/modules, /proc/sys/net).
            "" | "Directory" if Path::new(path).exists() => return PathBuf::from(path),
            "" => std::fs::create_dir_all(&on_node).expect("hostPath directory"),
            other => panic!("hostPath type {other} is not something this runner makes"),
        }
        return on_node;
    }
    std::fs::create_dir_all(at).expect("volume folder");
    if let Some(config_map) = volume.get("configMap") {
        write_items(at, &config_map_data(world, config_map), &config_map["items"]);
    } else if let Some(secret) = volume.get("secret") {
        write_items(at, &secret_data(world, &secret["secretName"]), &secret["items"]);
    } else if let Some(projected) = volume.get("projected") {
        for source in projected["sources"].as_array().into_iter().flatten() {
            if let Some(token) = source.get("serviceAccountToken") {
                let path = token["path"].as_str().expect("token path");
                std::fs::write(at.join(path), world.token).expect("token");
            } else if let Some(secret) = source.get("secret") {
                write_items(at, &secret_data(world, &secret["name"]), &secret["items"]);
            } else if let Some(config_map) = source.get("configMap") {
                write_items(at, &config_map_data(world, config_map), &config_map["items"]);
            } else {
                panic!("projected source {source} is not something this runner makes");
            }
        }
    } else {
        panic!("volume {volume} is not something this runner makes");
    }
    at.to_owned()
}

/// The UID of the pod of workload `name` (one pod per workload here).
fn pod_uid(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

fn config_map_data(world: &PodWorld<'_>, reference: &Value) -> BTreeMap<String, Vec<u8>> {
    let name = reference["name"].as_str().expect("configMap name");
    // Every namespace holds it, made by the cluster: the API server's CA.
    if name == "kube-root-ca.crt" {
        let (ca, _, _) =
            world.api_server.expect("kube-root-ca.crt is the API server's CA: the test supplies one");
        return BTreeMap::from([("ca.crt".to_owned(), std::fs::read(ca).expect("the API server's CA"))]);
    }
    let object = crate::harness::install::object(world.objects, "ConfigMap", name);
    object["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().expect("ConfigMap data").as_bytes().to_vec()))
        .collect()
}

fn secret_data(world: &PodWorld<'_>, name: &Value) -> BTreeMap<String, Vec<u8>> {
    let name = name.as_str().expect("secret name");
    world.secrets.get(name).cloned().unwrap_or_else(|| panic!("the test supplies no Secret {name}"))
}

/// Writes `data` (every key, or only `items`' keys at their paths) into `at`.
fn write_items(at: &Path, data: &BTreeMap<String, Vec<u8>>, items: &Value) {
    let chosen: Vec<(String, String)> = match items.as_array() {
        Some(items) => items
            .iter()
            .map(|i| {
                (i["key"].as_str().expect("key").to_owned(), i["path"].as_str().expect("path").to_owned())
            })
            .collect(),
        None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
    };
    for (key, path) in chosen {
        let content = data.get(&key).unwrap_or_else(|| panic!("no key {key} in {:?}", data.keys()));
        std::fs::write(at.join(path), content).expect("volume file");
    }
}
