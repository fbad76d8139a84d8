//! Network interfaces through the `ip` tool: a dummy interface and the addresses bound
//! to it (the IPVS backend's `kpx-ipvs0`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::{process, ExecError};

/// What kpx asks of the node's links.
pub trait Links: Send {
    /// Creates the dummy interface `name` unless it exists, and sets it up.
    fn ensure_dummy(&mut self, name: &str) -> Result<(), ExecError>;
    /// Removes the interface `name` if it exists; whether it did.
    fn remove(&mut self, name: &str) -> Result<bool, ExecError>;
    /// The addresses on `name` that are not the kernel's own link-local ones (none when
    /// it does not exist).
    fn addresses(&mut self, name: &str) -> Result<BTreeSet<IpAddr>, ExecError>;
    /// Binds `add` to `name` and releases `remove`, in one batch.
    fn rebind(
        &mut self,
        name: &str,
        add: &BTreeSet<IpAddr>,
        remove: &BTreeSet<IpAddr>,
    ) -> Result<(), ExecError>;
}

/// The `ip` tool, one process per call.
pub struct IpProcess;

const TOOL: &str = "ip";

fn ip(args: &[&str], input: Option<&str>) -> Result<String, ExecError> {
    process::run(TOOL, TOOL, args, input)
}

fn host_prefix(address: &IpAddr) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

impl IpProcess {
    fn exists(name: &str) -> Result<bool, ExecError> {
        let out = process::output(TOOL, TOOL, &["link", "show", "dev", name], None)?;
        Ok(out.status.success())
    }
}

impl Links for IpProcess {
    fn ensure_dummy(&mut self, name: &str) -> Result<(), ExecError> {
        if !Self::exists(name)? {
            ip(&["link", "add", name, "type", "dummy"], None)?;
        }
        ip(&["link", "set", name, "up"], None).map(drop)
    }

    fn remove(&mut self, name: &str) -> Result<bool, ExecError> {
        if !Self::exists(name)? {
            return Ok(false);
        }
        ip(&["link", "del", name], None)?;
        Ok(true)
    }

    fn addresses(&mut self, name: &str) -> Result<BTreeSet<IpAddr>, ExecError> {
        if !Self::exists(name)? {
            return Ok(BTreeSet::new());
        }
        let text = ip(&["-o", "addr", "show", "dev", name], None)?;
        Ok(text
            .lines()
            // The kernel's own link-local address is not ours.
            .filter(|line| !line.contains("scope link"))
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                words.find(|w| *w == "inet" || *w == "inet6")?;
                words.next()?.split('/').next()?.parse().ok()
            })
            .collect())
    }

    fn rebind(
        &mut self,
        name: &str,
        add: &BTreeSet<IpAddr>,
        remove: &BTreeSet<IpAddr>,
    ) -> Result<(), ExecError> {
        let mut batch = String::new();
        for a in add {
            let nodad = if a.is_ipv6() { " nodad" } else { "" };
            batch.push_str(&format!("addr replace {} dev {name}{nodad}\n", host_prefix(a)));
        }
        for a in remove {
            batch.push_str(&format!("addr del {} dev {name}\n", host_prefix(a)));
        }
        if batch.is_empty() {
            return Ok(());
        }
        ip(&["-batch", "-"], Some(&batch)).map(drop)
    }
}
