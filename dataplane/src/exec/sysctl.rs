//! Kernel settings under `/proc/sys` of the node's network namespace.

use std::path::{Path, PathBuf};

use super::ExecError;

/// What kpx asks of sysctl.
pub trait Sysctl: Send {
    /// The value of `name` (dotted, like `net.ipv4.vs.conntrack`), trimmed.
    fn read(&self, name: &str) -> Result<String, ExecError>;

    /// Sets `name` to `value`. A setting that has the value already is not written: an
    /// agent whose settings were made for it (by `--init-only`, privileged) needs no write
    /// access to `/proc/sys`.
    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError>;
}

/// `/proc/sys` itself; its `net` part where `net` says (the node's `/proc/sys/net` mounted
/// writable into an unprivileged container, whose own `/proc/sys` is read-only).
pub struct ProcSys {
    net: PathBuf,
}

impl Default for ProcSys {
    fn default() -> Self {
        ProcSys { net: PathBuf::from(PROC_SYS_NET) }
    }
}

/// Where the kernel shows the network namespace's settings.
pub const PROC_SYS_NET: &str = "/proc/sys/net";

impl ProcSys {
    /// `net.*` settings under `net` (a folder showing `/proc/sys/net`).
    pub fn with_net(net: &Path) -> Self {
        ProcSys { net: net.to_owned() }
    }

    fn path(&self, name: &str) -> PathBuf {
        let relative = name.replace('.', "/");
        match relative.strip_prefix("net/") {
            Some(rest) => self.net.join(rest),
            None => Path::new("/proc/sys").join(relative),
        }
    }
}

impl Sysctl for ProcSys {
    fn read(&self, name: &str) -> Result<String, ExecError> {
        std::fs::read_to_string(self.path(name))
            .map(|v| v.trim().to_owned())
            .map_err(|error| ExecError::Sysctl { name: name.to_owned(), action: "read".into(), error })
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError> {
        let current = self.read(name)?;
        if current == value {
            return Ok(());
        }
        std::fs::write(self.path(name), value).map_err(|error| ExecError::Sysctl {
            name: name.to_owned(),
            action: format!("set to {value} (it is {current})"),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_settings_are_read_where_the_nodes_proc_sys_net_is_mounted() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("netfilter")).expect("dir");
        let file = dir.path().join("netfilter/nf_conntrack_tcp_timeout_close_wait");
        std::fs::write(&file, "60\n").expect("write");
        let mut sysctl = ProcSys::with_net(dir.path());
        assert_eq!(sysctl.read("net.netfilter.nf_conntrack_tcp_timeout_close_wait").expect("read"), "60");
        sysctl.set("net.netfilter.nf_conntrack_tcp_timeout_close_wait", "3600").expect("set");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "3600");
        assert_eq!(ProcSys::default().path("kernel.pid_max"), Path::new("/proc/sys/kernel/pid_max"));
    }
}
