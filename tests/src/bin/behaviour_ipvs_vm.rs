//! The behaviour suite (`kpx_e2e::scenarios`) with `--backend ipvs`, run inside the VM of
//! `tests/vm/run-in-vm.sh` by `tests/tests/ipvs.rs`: every scenario runs and prints
//! `pass NAME` or `FAIL NAME: why`; the exit code is 1 when one of the scenarios named on
//! the command line (those the backend claims, see tests/BEHAVIOURS.md) failed.

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
    let claimed: Vec<String> = std::env::args().skip(1).collect();
    let filter = std::env::var("KPX_SCENARIO").ok();
    let mut failed_claims = Vec::new();
    for (name, scenario) in SCENARIOS {
        if filter.as_deref().is_some_and(|f| f != *name) {
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
                let why = why.lines().next().unwrap_or_default().to_owned();
                println!("FAIL {name} ({took:.1} s): {why}");
                if claimed.iter().any(|c| c == name) {
                    failed_claims.push(*name);
                }
            }
        }
    }
    if !failed_claims.is_empty() {
        eprintln!("claimed scenarios failed: {failed_claims:?}");
        std::process::exit(1);
    }
}
