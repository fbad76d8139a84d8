//! What a test stands on: namespaces ([`netns`]), a node with pods and kpx on it
//! ([`topology`]), kpx processes ([`process`]), listeners and clients ([`traffic`],
//! [`http_traffic`]), what the kernel holds ([`kernel_rules`]), manifests, certificates,
//! a fake API server and a scripted control plane, the rootless tier's in-process
//! control plane and agents ([`in_process`]), the rendered install ([`install`],
//! [`pod`]) and the measuring helpers ([`percentile`]).

pub mod fake_apiserver;
pub mod fake_control_plane;
pub mod http_traffic;
pub mod in_process;
pub mod install;
pub mod kernel_rules;
pub mod kube_apiserver;
pub mod manifests;
pub mod netns;
pub mod pki;
pub mod pod;
pub mod process;
pub mod topology;
pub mod traffic;

use std::time::Duration;

/// The `p` quantile (0..=1) of `sorted`, by nearest rank; zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}
