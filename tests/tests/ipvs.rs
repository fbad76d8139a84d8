//! IPVS on a real IPVS kernel: this machine's kernel has none, so the checks run inside
//! a VM with a stock Debian kernel (`tests/vm/run-in-vm.sh`, about 35 s of set-up the first
//! time, then ~10 s a boot): the netlink layer (`src/bin/ipvs_vm_checks.rs`) and the
//! whole behaviour suite, the IPVS-only scenarios and the faults
//! (`src/bin/behaviour_in_vm.rs`), in one boot.

use kpx_e2e::harness::process::binary;
use kpx_e2e::scenarios::{behaviour, faults, ipvs};

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
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok: ")).count(), 6, "{stdout}");
}

#[test]
fn the_ipvs_backend_passes_the_behaviour_suite_and_its_own_scenarios() {
    let stdout = in_vm("behaviour_in_vm", &[]);
    for (scenario, _) in behaviour::ALL.iter().chain(ipvs::ALL).chain(ipvs::VM_ONLY).chain(faults::ALL) {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("pass {scenario} "))), "{scenario}: {stdout}");
    }
}
