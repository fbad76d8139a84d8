//! Kernel settings under `/proc/sys` of the node's network namespace.

use super::ExecError;

/// What kpx asks of sysctl.
pub trait Sysctl: Send {
    /// Sets `name` (dotted, like `net.ipv4.vs.conntrack`) to `value`.
    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError>;
}

/// `/proc/sys` itself.
pub struct ProcSys;

impl Sysctl for ProcSys {
    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError> {
        let path = format!("/proc/sys/{}", name.replace('.', "/"));
        std::fs::write(&path, value).map_err(|source| ExecError::Spawn { tool: "sysctl", source })
    }
}
