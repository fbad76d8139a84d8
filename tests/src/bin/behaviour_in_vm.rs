//! The behaviour suite (`kpx_e2e::scenarios::behaviour`) inside the VM of `tests/vm/run-in-vm.sh`
//! (a stock Debian kernel: IPVS, and an older kernel than this machine's), run by
//! `tests/tests/ipvs.rs`, one boot for all:
//!
//! `behaviour_in_vm [--backend=ipvs|nftables|iptables|iptables-legacy] [SCENARIO…]`
//!
//! Every backend also runs the VM-only scenarios (`kpx_e2e::scenarios::ipvs::VM_ONLY`:
//! SCTP traffic); with `--backend=ipvs` (the default) the IPVS-only scenarios
//! (`kpx_e2e::scenarios::ipvs`) and the faults (`kpx_e2e::scenarios::faults`) run too. It runs the scenarios named, or all, and exits 1
//! if one fails. Each prints `pass NAME` or `FAIL NAME: why`.

use kpx_e2e::harness::topology::ProxyBackend;
use kpx_e2e::scenarios::{behaviour, faults, ipvs};

fn main() {
    kpx_e2e::harness::traffic::emulated_cpu();
    let mut backend = ProxyBackend::Ipvs;
    let mut chosen = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.strip_prefix("--backend=") {
            Some("ipvs") => backend = ProxyBackend::Ipvs,
            Some("nftables") => backend = ProxyBackend::Nftables,
            Some("iptables") => backend = ProxyBackend::Iptables,
            Some("iptables-legacy") => backend = ProxyBackend::IptablesLegacy,
            Some(other) => {
                eprintln!("behaviour_in_vm: unknown backend {other:?}");
                std::process::exit(2);
            }
            None => chosen.push(arg),
        }
    }
    // IPVS runs only here: its own scenarios and the faults too.
    let mut own: Vec<(&str, behaviour::Scenario)> = ipvs::VM_ONLY.to_vec();
    if backend == ProxyBackend::Ipvs {
        own.extend(ipvs::ALL.iter().chain(faults::ALL));
    }
    let mut failed = Vec::new();
    for (name, scenario) in behaviour::ALL.iter().chain(&own) {
        if !chosen.is_empty() && !chosen.iter().any(|c| c == name) {
            continue;
        }
        let started = std::time::Instant::now();
        let result = std::panic::catch_unwind(|| scenario(backend));
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(()) => println!("pass {name} ({took:.1} s)"),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                println!("FAIL {name} ({took:.1} s): {}", why.lines().next().unwrap_or_default());
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}
