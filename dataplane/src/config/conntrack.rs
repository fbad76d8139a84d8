//! kube-proxy's `conntrack` settings, as the agent is configured with them.

use std::time::Duration;

/// kube-proxy's `conntrack` configuration, with its defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// `nf_conntrack_max` is at least this times the CPUs (0: left alone) …
    pub max_per_core: u64,
    /// … and at least this.
    pub min: u64,
    /// `None` (or zero in the file): left as it is.
    pub tcp_established_timeout: Option<Duration>,
    pub tcp_close_wait_timeout: Option<Duration>,
    pub tcp_be_liberal: bool,
    pub udp_timeout: Option<Duration>,
    pub udp_stream_timeout: Option<Duration>,
}

impl Default for ConntrackSettings {
    /// kube-proxy's defaults (`pkg/proxy/apis/config/v1alpha1`).
    fn default() -> Self {
        ConntrackSettings {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established_timeout: Some(Duration::from_secs(24 * 3600)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: None,
            udp_stream_timeout: None,
        }
    }
}
