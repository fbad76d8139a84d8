//! The behaviour suite (`kpx_e2e::scenarios`) and the IPVS-only scenarios
//! (`kpx_e2e::ipvs_scenarios`) with `--backend ipvs`, run inside the VM of
//! `tests/vm/run-in-vm.sh` by `tests/tests/ipvs.rs` (one boot for all). It runs the scenarios named as
//! arguments, or all of them, and exits 1 if one fails. Each prints `pass NAME` or `FAIL NAME: why`.

use kpx_e2e::topology::ProxyBackend;
use kpx_e2e::{ipvs_scenarios, scenarios};

fn main() {
    let chosen: Vec<String> = std::env::args().skip(1).collect();
    let mut failed = Vec::new();
    for (name, scenario) in scenarios::ALL.iter().chain(ipvs_scenarios::ALL) {
        if !chosen.is_empty() && !chosen.iter().any(|c| c == name) {
            continue;
        }
        let started = std::time::Instant::now();
        let result = std::panic::catch_unwind(|| scenario(ProxyBackend::Ipvs));
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
