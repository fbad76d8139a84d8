//! Kernel settings under `/proc/sys` of the node's network namespace.

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

/// `/proc/sys` itself.
pub struct ProcSys;

fn path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

impl Sysctl for ProcSys {
    fn read(&self, name: &str) -> Result<String, ExecError> {
        std::fs::read_to_string(path(name)).map(|v| v.trim().to_owned()).map_err(|source| ExecError::Sysctl {
            name: name.to_owned(),
            action: "read".into(),
            source,
        })
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError> {
        let current = self.read(name)?;
        if current == value {
            return Ok(());
        }
        std::fs::write(path(name), value).map_err(|source| ExecError::Sysctl {
            name: name.to_owned(),
            action: format!("set to {value} (it is {current})"),
            source,
        })
    }
}
