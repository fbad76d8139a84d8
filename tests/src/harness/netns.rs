//! Network namespaces owned by a test.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs a command, panicking with its output when it fails.
pub fn run(program: &str, args: &[&str]) -> String {
    let out =
        Command::new(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `kpxt<pid>-<n>-<role>` with its loopback up.
    pub fn new(role: &str) -> Netns {
        let name = format!("kpxt{}-{}-{role}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NAME …`
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Like [`Netns::exec`], but returns the outcome instead of panicking.
    pub fn try_exec(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ip netns exec: {e}"))
    }

    /// Like [`Netns::try_exec`], with only `env` (and a PATH) as the environment.
    pub fn try_exec_with_env(
        &self,
        program: &str,
        args: &[&str],
        env: &std::collections::BTreeMap<String, String>,
    ) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(env)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ip netns exec: {e}"))
    }

    /// Runs `f` on a thread that has entered this namespace: sockets it creates live here.
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.place().run_in(f)
    }

    /// A way back into this namespace that does not own it.
    pub fn place(&self) -> NetnsPlace {
        NetnsPlace { path: format!("/run/netns/{}", self.name) }
    }

    /// Starts `f` on a thread inside this namespace and returns at once.
    pub fn spawn_in(&self, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
    }
}

/// Where a namespace is (it is removed by its [`Netns`], not by this).
#[derive(Debug, Clone)]
pub struct NetnsPlace {
    path: String,
}

impl NetnsPlace {
    /// Runs `f` on a thread that has entered the namespace.
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.path.clone();
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

fn enter(path: &str) {
    let file = File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns on a valid namespace fd affects only the calling thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}
