//! The harness of kpx's end-to-end tests: network namespaces joined by veth,
//! real listeners in "pod" namespaces, real kpx processes, real traffic.
//!
//! Everything a test creates is removed when its handle drops, also when the
//! test fails. Nothing is created in the host namespace: veth pairs are made
//! inside the node namespace with their peer directly in the other one.

pub mod backends_in_vm;
pub mod fake_apiserver;
pub mod fake_control_plane;
pub mod fault_scenarios;
pub mod http_traffic;
pub mod install;
pub mod ipvs_scenarios;
pub mod kernel_rules;
pub mod manifests;
pub mod netns;
pub mod pki;
pub mod pod;
pub mod process;
pub mod rolling_update;
pub mod scenarios;
pub mod topology;
pub mod traffic;

use std::time::{Duration, Instant};

/// Waits until `check` returns `Some`, or fails after `deadline` with `what`.
pub fn wait_for<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < deadline, "timed out after {deadline:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A generous deadline for things that take well under a second on an idle machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The `p` quantile (0..=1) of `sorted`, by nearest rank; zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}
