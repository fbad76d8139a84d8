//! The IPVS backend (in progress): `netlink` speaks the kernel's IPVS family,
//! `desired` says what IPVS should hold for a node state, `backend` makes it so.
//! Tested inside the VM of `tests/vm/run-in-vm.sh` (this machine's kernel has no IPVS).

pub mod backend;
pub mod desired;
pub mod netlink;

pub use backend::IpvsBackend;
