//! The benchmarks' parts beside their `main` (`src/bin/bench_scale.rs`,
//! `src/bin/bench_backends.rs`): IPVS in the VM beside nftables ([`backends_in_vm`]).

pub mod backends_in_vm;
pub mod scale;
