//! The IPVS backend: [`desired`] says what one Service puts into IPVS, [`programmed`]
//! keeps what is programmed and what a change touches, [`ipset`] and [`chains`] cover
//! what IPVS cannot do (masquerade, source ranges, drops), [`backend`] makes the kernel
//! match through [`crate::exec`] (IPVS over generic netlink, ipset, iptables, `ip`).
//! Tested over the fakes here and inside the VM of `tests/vm/run-in-vm.sh` (this
//! machine's kernel has no IPVS).

pub mod backend;
pub mod chains;
pub mod desired;
pub mod ipset;
pub mod programmed;

pub use backend::{IpvsBackend, IpvsKernel, IpvsOptions};

#[cfg(test)]
mod tests;
