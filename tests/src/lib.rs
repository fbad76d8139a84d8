//! kpx's end-to-end tests, by role:
//! - [`harness`]: network namespaces joined by veth, real listeners in "pod" namespaces,
//!   real kpx processes, real traffic, fake API servers and control planes, and the
//!   measuring helpers;
//! - [`scenarios`]: what the test files and the VM run, written once (the behaviour suite
//!   per backend, faults under traffic, rolling updates, IPVS-only behaviour);
//! - [`bench`]: the parts of the benchmarks (`src/bin/bench_*`) that are not their `main`.
//!
//! The test files (`tests/*.rs`) say what they prove; `src/bin/` holds the benchmarks and
//! what runs inside the IPVS VM.
//!
//! Everything a test creates is removed when its handle drops, also when the
//! test fails. Nothing is created in the host namespace: veth pairs are made
//! inside the node namespace with their peer directly in the other one.

pub mod bench;
pub mod harness;
pub mod scenarios;

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
