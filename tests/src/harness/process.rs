//! kpx processes started by a test, inside a namespace, with JSON logs in a
//! file the test can wait on. Ended by PID when dropped.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::netns::Netns;

/// Where cargo put the workspace's binaries: beside the running binary, or beside the
/// `deps/` folder a test binary runs from.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let parent = exe.parent().expect("binary folder");
    let dir = if parent.ends_with("deps") { parent.parent().expect("target dir") } else { parent };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace's binaries first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// The process named `program` among `root` and its descendants (the program itself
/// when a wrapper such as a profiler runs it as a child of its own).
pub fn program_pid(root: u32, program: &str) -> Option<u32> {
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    // The kernel keeps 15 bytes of a program's name.
    let name: String = program.chars().take(15).collect();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        if comm(pid).trim_end() == name {
            return Some(pid);
        }
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        queue.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    None
}

pub struct KpxProcess {
    child: Child,
    pub log: PathBuf,
    pub name: String,
}

impl KpxProcess {
    /// Starts kpx's `program args…` inside `ns`, logging JSON to `log`.
    pub fn start(ns: &Netns, program: &str, args: &[String], log: PathBuf) -> KpxProcess {
        let mut args = args.to_vec();
        args.push("--log-format=json".into());
        Self::start_path(ns, &binary(program), program, &args, log)
    }

    /// Starts kpx's `program args…` inside `ns` with extra environment variables.
    pub fn start_with_env(
        ns: &Netns,
        program: &str,
        args: &[String],
        log: PathBuf,
        env: &[(&str, String)],
    ) -> KpxProcess {
        let mut args = args.to_vec();
        args.push("--log-format=json".into());
        Self::spawn(ns, &binary(program), program, &args, log, env)
    }

    /// Starts any program inside `ns` (as `name` in messages), its output to `log`.
    pub fn start_path(
        ns: &Netns,
        path: &std::path::Path,
        name: &str,
        args: &[String],
        log: PathBuf,
    ) -> KpxProcess {
        Self::spawn(ns, path, name, args, log, &[])
    }

    fn spawn(
        ns: &Netns,
        path: &std::path::Path,
        name: &str,
        args: &[String],
        log: PathBuf,
        env: &[(&str, String)],
    ) -> KpxProcess {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &ns.name]).arg(path).args(args);
        command.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        Self::run(command, name, log)
    }

    /// Starts a command made elsewhere (e.g. a pod's launcher), its output to `log`.
    pub fn start_command(command: Command, name: &str, log: PathBuf) -> KpxProcess {
        Self::run(command, name, log)
    }

    /// Starts `command` (its stdio to `log`, `RUST_LOG=info`), named `name` in messages.
    fn run(mut command: Command, name: &str, log: PathBuf) -> KpxProcess {
        let file = File::options().create(true).append(true).open(&log).expect("log file");
        let child = command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        KpxProcess { child, log, name: name.to_owned() }
    }

    /// Starts kpx's `program args…` inside `ns` in a mount namespace of its own where
    /// `dir` is a tmpfs of `size` (e.g. `8m`): a small filesystem the test can fill
    /// through `/proc/PID/root` without touching the host's mounts.
    pub fn start_on_tmpfs(
        ns: &Netns,
        program: &str,
        args: &[String],
        log: PathBuf,
        dir: &std::path::Path,
        size: &str,
    ) -> KpxProcess {
        std::fs::create_dir_all(dir).expect("the tmpfs mount point");
        // unshare, sh and ip each exec the next: the PID is the program's.
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("mount -t tmpfs -o size={size} kpx-test-state '{}' && exec \"$@\"", dir.display()))
            .args(["sh", "ip", "netns", "exec", &ns.name])
            .arg(binary(program))
            .args(args)
            .arg("--log-format=json");
        Self::run(command, program, log)
    }

    /// `path` as this process sees it (through its mount namespace).
    pub fn path_inside(&self, path: &std::path::Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.child.id())).join(relative)
    }

    /// The program's process id: the child's (`ip netns exec` execs the program), or,
    /// under a wrapper that runs it as a child of its own (a profiler), the first
    /// descendant whose name is the program's (the child's until the wrapper started it).
    pub fn pid(&self) -> Option<u32> {
        // Not started yet, or named by the test rather than by its program: the child.
        Some(program_pid(self.child.id(), &self.name).unwrap_or(self.child.id()))
    }

    /// Log lines as JSON objects (lines that are not JSON are skipped).
    pub fn events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until a log event matches; returns it.
    pub fn wait_event(
        &self,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        crate::wait_for(&format!("{} to log {what}", self.name), deadline, || {
            if self.exited() {
                panic!("{} exited before logging {what}; log:\n{}", self.name, self.log_text());
            }
            self.events().into_iter().find(|e| pred(e))
        })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process has ended (a zombie counts: it is reaped only by stop or drop).
    pub fn exited(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()));
        stat.map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
    }

    /// Ends the process: SIGTERM, then SIGKILL if it lingers.
    pub fn stop(&mut self) {
        self.terminate();
    }

    /// Like [`KpxProcess::stop`]; how the process ended (`None`: it had to be killed).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        for _ in 0..400 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.kill();
        None
    }

    /// Waits up to `within` for the process to end by itself; how it ended (`None`: it was
    /// still running, and is killed).
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.kill();
        None
    }

    /// Kills the process at once (a crash).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the process (SIGSTOP): its sockets stay open and the kernel still accepts
    /// connections on them, but nothing in it answers (a stalled process).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen process run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: i32) {
        if let Some(Ok(pid)) = self.pid().map(i32::try_from) {
            // SAFETY: sending a signal to our own child (or its wrapper's) by PID.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

impl Drop for KpxProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
        if std::thread::panicking() {
            // The test failed: what the process said is the first thing to read.
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            eprintln!("--- last lines of {}:\n{}", self.log.display(), tail.join("\n"));
        }
    }
}

/// The Python of the tests' virtual environment (`target/pyenv`, which `tests/run.sh`
/// makes with grpcio, grpcio-reflection and xds-protos).
pub fn python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin/python");
    assert!(venv.exists(), "{} is missing: tests/run.sh makes it", venv.display());
    venv
}
