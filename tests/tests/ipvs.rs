//! IPVS on a real IPVS kernel: this machine's kernel has none, so the checks run inside
//! a VM with a stock Debian kernel (`tests/vm/run-in-vm.sh`, about 35 s of set-up the first
//! time, then ~10 s a boot): the netlink layer (`src/bin/ipvs_vm_checks.rs`) and the
//! behaviour scenarios the IPVS backend passes so far (`src/bin/behaviour_ipvs_vm.rs`;
//! the others are listed in tests/BEHAVIOURS.md as not yet).

use kpx_e2e::process::binary;

/// The scenarios `--backend ipvs` passes (tests/BEHAVIOURS.md says the same).
const PASSING: &[&str] = &[
    "topology_hints",
    "terminating_endpoints",
    "dual_stack",
    "ports",
    "udp_conntrack",
    "ignored_services",
    "bad_input",
];

fn in_vm(program: &str, args: &[&str]) -> String {
    let runner = concat!(env!("CARGO_MANIFEST_DIR"), "/vm/run-in-vm.sh");
    let out =
        std::process::Command::new(runner).arg(binary(program)).args(args).output().expect("run the VM");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program} in the VM: {}\n{stdout}\n{stderr}", out.status);
    stdout
}

#[test]
fn ipvs_netlink_programs_a_real_ipvs_kernel() {
    let stdout = in_vm("ipvs_vm_checks", &[]);
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok: ")).count(), 5, "{stdout}");
}

#[test]
fn the_ipvs_backend_passes_its_behaviour_scenarios() {
    let stdout = in_vm("behaviour_ipvs_vm", PASSING);
    for scenario in PASSING {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("pass {scenario} "))), "{scenario}: {stdout}");
    }
}
