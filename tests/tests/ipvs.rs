//! IPVS on a real IPVS kernel: this machine's kernel has none, so the checks
//! (`src/bin/ipvs_vm_checks.rs`) run inside a VM with a stock Debian kernel
//! (`tests/vm/run-in-vm.sh`, about 35 s of set-up the first time, then ~10 s a boot).

use kpx_e2e::process::binary;

#[test]
fn ipvs_netlink_programs_a_real_ipvs_kernel() {
    let runner = concat!(env!("CARGO_MANIFEST_DIR"), "/vm/run-in-vm.sh");
    let checks = binary("ipvs_vm_checks");
    let out = std::process::Command::new(runner).arg(&checks).output().expect("run the VM");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "in the VM: {}\n{stdout}\n{stderr}", out.status);
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok: ")).count(), 5, "{stdout}");
}
