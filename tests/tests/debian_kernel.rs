//! The netfilter backends on an older stock kernel: the behaviour suite with nftables and
//! with iptables (nf_tables flavour) inside the VM of `tests/vm/run-in-vm.sh`, whose
//! Debian kernel (6.1 on bookworm) is older than this machine's. It caught a map lookup
//! that only newer kernels accept. The two runs take turns (one VM at a time).

use kpx_proto::sync::Locked as _;
use std::sync::Mutex;

use kpx_e2e::harness::process::binary;
use kpx_e2e::scenarios::behaviour;

static ONE_VM_AT_A_TIME: Mutex<()> = Mutex::new(());

fn suite_in_vm(backend: &str) {
    let _turn = ONE_VM_AT_A_TIME.locked();
    let runner = concat!(env!("CARGO_MANIFEST_DIR"), "/vm/run-in-vm.sh");
    let out = std::process::Command::new(runner)
        .arg(binary("behaviour_in_vm"))
        .arg(format!("--backend={backend}"))
        .output()
        .expect("run the VM");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{backend} in the VM: {}\n{stdout}\n{stderr}", out.status);
    for (scenario, _) in behaviour::ALL.iter().chain(kpx_e2e::scenarios::ipvs::VM_ONLY) {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("pass {scenario} "))), "{scenario}: {stdout}");
    }
}

#[test]
fn nftables_passes_the_behaviour_suite_on_a_debian_kernel() {
    suite_in_vm("nftables");
}

#[test]
fn iptables_passes_the_behaviour_suite_on_a_debian_kernel() {
    suite_in_vm("iptables");
}
