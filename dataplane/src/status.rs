//! What the node agent tells operators about itself: connection and apply
//! status (admin API) and kube-proxy's `/healthz` and `/livez` answers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Default)]
pub struct AgentStatus {
    pub control_plane: String,
    pub connected: bool,
    pub connected_since: Option<SystemTime>,
    /// The last connection or sync failure.
    pub last_error: String,
    /// The last refused update: its type URL, the reason sent back, when.
    pub last_nack: Option<(String, String, SystemTime)>,
    pub last_apply: Option<Duration>,
    pub last_apply_at: Option<SystemTime>,
    /// The last time the kernel was made to match the accepted state.
    pub last_synced_at: Option<SystemTime>,
    /// The kernel does not match the accepted state (a sync failed since the last success).
    pub out_of_sync: bool,
    pub applies: u64,
    pub nacks: u64,
    /// When the agent started.
    pub started_at: Option<SystemTime>,
    /// The last time a control plane answered (a stream opened or a response came).
    pub last_contact: Option<SystemTime>,
}

pub fn unix_ms(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as i64)
}

pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// RFC 3339 in UTC with milliseconds, as kube-proxy's health bodies write time.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// What `/healthz`, `/livez` and the health-check ports answer from, published on every
/// sync so they never wait for the agent (an apply may hold it for seconds, e.g. behind
/// the xtables lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyHealth {
    pub last_synced_at: Option<SystemTime>,
    pub out_of_sync: bool,
    /// The Node has a deletion timestamp or the `ToBeDeletedByClusterAutoscaler` taint.
    pub node_being_deleted: bool,
    /// A control plane has answered since the agent started.
    pub reached_control_plane: bool,
}

/// Which of kube-proxy's two health answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/healthz`: healthy, and the node eligible for load-balancer traffic.
    Healthz,
    /// `/livez`: healthy, whatever becomes of the Node.
    Livez,
    /// `/readyz` (kpx's own, the pod's readiness): healthy, and a control plane has
    /// answered since the agent started (a fresh install whose agents never reached one
    /// does not roll out as a success).
    Readyz,
}

impl ProxyHealth {
    /// Healthy: the kernel has been synced and matches the accepted state.
    pub fn healthy(&self) -> bool {
        self.last_synced_at.is_some() && !self.out_of_sync
    }

    /// Whether load balancers may send to this node: not while its Node is being deleted
    /// (kube-proxy's `nodeEligible`).
    pub fn node_eligible(&self) -> bool {
        !self.node_being_deleted
    }

    /// kube-proxy's answer to `probe`: the HTTP status and the JSON body. kube-proxy v1.36
    /// also says `healthy` and, per IP family, when its rules were last synced and whether
    /// that family is healthy; kpx programs both families in one transaction, so they are
    /// the same.
    pub fn answer(&self, probe: Probe, now: SystemTime) -> (u16, String) {
        let last = self.last_synced_at.map_or_else(String::new, rfc3339);
        let times = format!("\"lastUpdated\":\"{last}\",\"currentTime\":\"{}\"", rfc3339(now));
        let healthy = self.healthy();
        let family = format!("{{\"lastUpdated\":\"{last}\",\"healthy\":{healthy}}}");
        let health = format!("\"healthy\":{healthy},\"status\":{{\"IPv4\":{family},\"IPv6\":{family}}}");
        match probe {
            Probe::Healthz => {
                let eligible = self.node_eligible();
                let code = if healthy && eligible { 200 } else { 503 };
                (code, format!("{{{times},\"nodeEligible\":{eligible},{health}}}"))
            }
            Probe::Livez => (if healthy { 200 } else { 503 }, format!("{{{times},{health}}}")),
            Probe::Readyz => {
                let reached = self.reached_control_plane;
                let code = if self.healthy() && reached { 200 } else { 503 };
                (code, format!("{{{times},\"controlPlaneReached\":{reached}}}"))
            }
        }
    }
}

impl AgentStatus {
    /// What the health answers read, for a node whose Node is (or is not) being deleted.
    pub fn proxy_health(&self, node_being_deleted: bool) -> ProxyHealth {
        ProxyHealth {
            last_synced_at: self.last_synced_at,
            out_of_sync: self.out_of_sync,
            node_being_deleted,
            reached_control_plane: self.last_contact.is_some(),
        }
    }

    /// How long since a control plane last answered (since the start if none has): 0 while
    /// a stream is open.
    pub fn since_contact(&self, now: SystemTime) -> Duration {
        if self.connected {
            return Duration::ZERO;
        }
        self.last_contact.or(self.started_at).and_then(|t| now.duration_since(t).ok()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_rfc3339_and_answers_like_kube_proxy() {
        let t = UNIX_EPOCH + Duration::from_millis(1_732_876_245_123);
        assert_eq!(rfc3339(t), "2024-11-29T10:30:45.123Z");
        let mut s = AgentStatus::default();
        let answer = |s: &AgentStatus, leaving: bool, probe| s.proxy_health(leaving).answer(probe, t);
        assert_eq!(answer(&s, false, Probe::Healthz).0, 503, "never synced");
        assert_eq!(answer(&s, false, Probe::Livez).0, 503, "never synced");
        s.last_synced_at = Some(t);
        let times =
            "\"lastUpdated\":\"2024-11-29T10:30:45.123Z\",\"currentTime\":\"2024-11-29T10:30:45.123Z\"";
        // kube-proxy v1.36's shape, as it answered on the same node (tests/migration.rs).
        let family = "{\"lastUpdated\":\"2024-11-29T10:30:45.123Z\",\"healthy\":true}";
        let health = format!("\"healthy\":true,\"status\":{{\"IPv4\":{family},\"IPv6\":{family}}}");
        assert_eq!(
            answer(&s, false, Probe::Healthz),
            (200, format!("{{{times},\"nodeEligible\":true,{health}}}"))
        );
        assert_eq!(answer(&s, false, Probe::Livez), (200, format!("{{{times},{health}}}")));
        assert_eq!(
            answer(&s, true, Probe::Healthz),
            (503, format!("{{{times},\"nodeEligible\":false,{health}}}"))
        );
        assert_eq!(answer(&s, true, Probe::Livez).0, 200, "a leaving node is still alive");
        assert_eq!(
            answer(&s, false, Probe::Readyz),
            (503, format!("{{{times},\"controlPlaneReached\":false}}")),
            "synced from the store, no control plane yet"
        );
        s.last_contact = Some(t);
        assert_eq!(
            answer(&s, false, Probe::Readyz),
            (200, format!("{{{times},\"controlPlaneReached\":true}}"))
        );
        s.out_of_sync = true;
        assert_eq!(answer(&s, false, Probe::Readyz).0, 503);
        assert_eq!(answer(&s, false, Probe::Healthz).0, 503);
        assert_eq!(answer(&s, false, Probe::Livez).0, 503);
    }
}
