//! The IPVS backend (in progress): `netlink` speaks the kernel's IPVS family.
//! Tested only inside the VM of `tests/vm/run-in-vm.sh` (this machine's kernel has no IPVS).

pub mod netlink;
