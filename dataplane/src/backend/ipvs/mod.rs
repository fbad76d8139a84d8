//! The IPVS backend: [`netlink`] speaks the kernel's IPVS family, [`desired`] says what
//! one Service puts into IPVS, [`table`] keeps what is programmed and what a change
//! touches, [`ipset`] and [`chains`] cover what IPVS cannot do (masquerade, source ranges,
//! drops), [`backend`] makes the kernel match. Tested inside the VM of
//! `tests/vm/run-in-vm.sh` (this machine's kernel has no IPVS).

pub mod backend;
pub mod chains;
pub mod desired;
pub mod ipset;
pub mod netlink;
pub mod table;

pub use backend::{IpvsBackend, IpvsOptions};
