//! The behaviour suite (`kpx_e2e::scenarios`) with `--backend ipvs`, run inside the VM of
//! `tests/vm/run-in-vm.sh` by `tests/tests/ipvs.rs`. With scenario names as arguments it
//! runs those (the ones the backend claims, see tests/BEHAVIOURS.md) and exits 1 if one
//! fails; without, it runs them all and reports. Each prints `pass NAME` or `FAIL NAME: why`.

use kpx_e2e::scenarios;
use kpx_e2e::topology::ProxyBackend;

type Scenario = fn(ProxyBackend);

const SCENARIOS: &[(&str, Scenario)] = &[
    ("node_port", scenarios::node_port),
    ("external_and_load_balancer_ips", scenarios::external_and_load_balancer_ips),
    ("external_traffic_policy_local", scenarios::external_traffic_policy_local),
    ("internal_traffic_policy_local", scenarios::internal_traffic_policy_local),
    ("topology_hints", scenarios::topology_hints),
    ("session_affinity", scenarios::session_affinity),
    ("terminating_endpoints", scenarios::terminating_endpoints),
    ("masquerade", scenarios::masquerade),
    ("dual_stack", scenarios::dual_stack),
    ("ports", scenarios::ports),
    ("udp_conntrack", scenarios::udp_conntrack),
    ("ignored_services", scenarios::ignored_services),
    ("bad_input", scenarios::bad_input),
];

fn main() {
    let chosen: Vec<String> = std::env::args().skip(1).collect();
    let mut failed = Vec::new();
    for (name, scenario) in SCENARIOS {
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
    if !chosen.is_empty() && !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}
