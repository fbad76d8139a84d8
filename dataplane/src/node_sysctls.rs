//! The kernel settings a node needs for kpx, as kube-proxy sets them: its `conntrack`
//! configuration (table size, TCP and UDP timeouts, TCP liberal mode) and what the
//! backend needs (`route_localnet` for localhost NodePorts, IPVS's own). They are set
//! by `kpx-dataplane --init-only` — a privileged init container in the chart, so that the
//! agent itself runs unprivileged — and checked again by the agent at start, which writes
//! only what differs (nothing, after the init container) and fails naming a setting it
//! cannot make.

use crate::config::{AgentConfig, BackendConfig, ConntrackSettings};
use crate::exec::sysctl::Sysctl;
use crate::exec::ExecError;

/// kube-proxy's cap on a scaled `nf_conntrack_max`.
const MAX_CONNTRACK: u64 = 1 << 20;

impl ConntrackSettings {
    /// The table size kube-proxy would ask for on `cpus` CPUs (`None`: none).
    pub fn max(&self, cpus: u64) -> Option<u64> {
        (self.max_per_core > 0).then(|| (self.max_per_core * cpus).min(MAX_CONNTRACK).max(self.min))
    }
}

/// How a setting counts as made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    Exactly,
    /// A larger value is kept (a table someone made bigger is not shrunk); one that cannot
    /// be raised is warned about, not an error: the conntrack table's size is the host's,
    /// read-only from a network namespace (kube-proxy fails there; kind sets maxPerCore 0).
    AtLeast,
}

/// One kernel setting and why kpx wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    pub value: u64,
    pub wanted: Wanted,
    pub why: &'static str,
}

impl Setting {
    fn exactly(name: &'static str, value: u64, why: &'static str) -> Setting {
        Setting { name, value, wanted: Wanted::Exactly, why }
    }
}

/// The settings of `conntrack` on a node of `cpus` CPUs.
pub fn conntrack(settings: &ConntrackSettings, cpus: u64) -> Vec<Setting> {
    const TIMEOUTS: &str = "conntrack configuration";
    let mut out = Vec::new();
    if let Some(max) = settings.max(cpus) {
        out.push(Setting {
            name: "net.netfilter.nf_conntrack_max",
            value: max,
            wanted: Wanted::AtLeast,
            why: "conntrack.maxPerCore, conntrack.min",
        });
    }
    let timeouts = [
        ("net.netfilter.nf_conntrack_tcp_timeout_established", settings.tcp_established_timeout),
        ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", settings.tcp_close_wait_timeout),
        ("net.netfilter.nf_conntrack_udp_timeout", settings.udp_timeout),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", settings.udp_stream_timeout),
    ];
    for (name, timeout) in timeouts {
        if let Some(timeout) = timeout.filter(|t| !t.is_zero()) {
            out.push(Setting::exactly(name, timeout.as_secs(), TIMEOUTS));
        }
    }
    if settings.tcp_be_liberal {
        out.push(Setting::exactly("net.netfilter.nf_conntrack_tcp_be_liberal", 1, "conntrack.tcpBeLiberal"));
    }
    out
}

/// `route_localnet`, which NodePorts on 127.0.0.1 need (iptables' localhost NodePorts).
pub const ROUTE_LOCALNET: &str = "net.ipv4.conf.all.route_localnet";

/// The setting localhost NodePorts need.
pub fn localhost_nodeports() -> Setting {
    Setting::exactly(ROUTE_LOCALNET, 1, "iptables.localhostNodePorts")
}

/// Every setting the configuration asks of a node of `cpus` CPUs. IPVS's own settings
/// exist only once the IPVS module is loaded: its (privileged) backend makes them.
pub fn wanted(config: &AgentConfig, cpus: u64) -> Vec<Setting> {
    let mut out = conntrack(&config.conntrack, cpus);
    if let BackendConfig::Iptables { localhost_nodeports: true, .. } = config.backend {
        out.push(localhost_nodeports());
    }
    out
}

/// The node's CPUs, as kube-proxy counts them for the conntrack table (all of them, not
/// the process's share).
pub fn node_cpus() -> u64 {
    // SAFETY: sysconf reads a system value and has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(online).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// A setting that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{cause} (wanted for {why}; `kpx-dataplane --init-only`, run privileged before the agent, sets it — the chart's init container does)")]
pub struct SettingError {
    pub why: &'static str,
    pub cause: ExecError,
}

/// Keeps the settings made: the agent checks them with its canary, and makes again one
/// changed behind its back (with `/proc/sys/net` writable to it, see [`crate::exec::sysctl::ProcSys`]).
pub struct Keeper {
    sysctl: Box<dyn Sysctl>,
    settings: Vec<Setting>,
    /// The last failure logged (not logged again while it lasts).
    failing: Option<String>,
    /// The settings whose refusal was warned about (once each).
    warned: std::collections::BTreeSet<&'static str>,
}

impl Keeper {
    pub fn new(sysctl: Box<dyn Sysctl>, settings: Vec<Setting>) -> Keeper {
        Keeper { sysctl, settings, failing: None, warned: Default::default() }
    }

    /// Makes the settings now; fails naming one that cannot be made (a table size that
    /// cannot be raised is warned about, once).
    pub fn make(&mut self) -> Result<Vec<Applied>, SettingError> {
        let applied = apply(self.sysctl.as_mut(), &self.settings)?;
        for (done, refusal) in applied.iter().filter_map(|a| Some((a, a.refused.as_ref()?))) {
            if self.warned.insert(done.name) {
                tracing::warn!(sysctl = done.name, value = %done.before, error = %refusal, "kept as it is: it cannot be raised from here (set conntrack.maxPerCore: 0 to leave it alone)");
            }
        }
        Ok(applied)
    }

    /// Checks the settings and makes again those changed behind kpx's back; returns them.
    pub fn keep(&mut self) -> Vec<&'static str> {
        match self.make() {
            Ok(applied) => {
                self.failing = None;
                let changed: Vec<&'static str> =
                    applied.iter().filter(|a| a.after.is_some()).map(|a| a.name).collect();
                if !changed.is_empty() {
                    tracing::warn!(settings = ?changed, "kernel settings changed behind kpx's back: made again");
                }
                changed
            }
            Err(e) => {
                let message = e.to_string();
                if self.failing.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, "a kernel setting changed behind kpx's back and cannot be made again");
                    self.failing = Some(message);
                }
                Vec::new()
            }
        }
    }
}

/// What [`apply`] did to one setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub name: &'static str,
    pub before: String,
    /// `None`: left as it was (it had the value, or more of it, or see `refused`).
    pub after: Option<u64>,
    /// Why an [`Wanted::AtLeast`] setting could not be raised.
    pub refused: Option<String>,
}

/// Makes every setting, in order; stops at the first that cannot be made. A setting the
/// kernel does not show yet (conntrack's, before its module is loaded: the first rules
/// load it) is left out of what is returned, to be made at a later call.
pub fn apply(sysctl: &mut dyn Sysctl, settings: &[Setting]) -> Result<Vec<Applied>, SettingError> {
    let mut done = Vec::new();
    for setting in settings {
        let failed = |cause| SettingError { why: setting.why, cause };
        let before = match sysctl.read(setting.name) {
            Err(ExecError::Sysctl { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(sysctl = setting.name, "not in this kernel yet; made once it is");
                continue;
            }
            other => other.map_err(failed)?,
        };
        let enough = match setting.wanted {
            Wanted::Exactly => before == setting.value.to_string(),
            Wanted::AtLeast => before.parse::<u64>().is_ok_and(|v| v >= setting.value),
        };
        let (mut after, mut refused) = (None, None);
        if !enough {
            match sysctl.set(setting.name, &setting.value.to_string()) {
                Ok(()) => {
                    tracing::info!(sysctl = setting.name, before = %before, value = setting.value, why = setting.why, "kernel setting made");
                    after = Some(setting.value);
                }
                Err(e) if setting.wanted == Wanted::AtLeast => refused = Some(e.to_string()),
                Err(e) => return Err(failed(e)),
            }
        }
        done.push(Applied { name: setting.name, before, after, refused });
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::fake::FakeSysctl;

    #[test]
    fn kube_proxys_defaults_size_the_table_and_set_the_tcp_timeouts() {
        let settings = conntrack(&ConntrackSettings::default(), 2);
        let named: Vec<(&str, u64)> = settings.iter().map(|s| (s.name, s.value)).collect();
        assert_eq!(
            named,
            [
                ("net.netfilter.nf_conntrack_max", 131_072),
                ("net.netfilter.nf_conntrack_tcp_timeout_established", 86_400),
                ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", 3_600),
            ]
        );
        assert_eq!(ConntrackSettings::default().max(64), Some(1 << 20), "capped as kube-proxy caps it");
        let off = ConntrackSettings { max_per_core: 0, tcp_close_wait_timeout: None, ..Default::default() };
        assert_eq!(conntrack(&off, 2).len(), 1, "maxPerCore 0 and no timeout: left alone");
    }

    #[test]
    fn a_setting_already_made_is_not_written_and_one_that_cannot_be_is_named() {
        let sysctl = FakeSysctl::new();
        sysctl.preset("net.netfilter.nf_conntrack_max", "262144");
        sysctl.preset("net.netfilter.nf_conntrack_tcp_timeout_close_wait", "60");
        let settings = conntrack(&ConntrackSettings::default(), 2);
        let done = apply(&mut sysctl.clone(), &settings).expect("applied");
        assert_eq!(done[0].after, None, "a larger table is kept");
        assert_eq!(sysctl.get("net.netfilter.nf_conntrack_tcp_timeout_close_wait").as_deref(), Some("3600"));
        assert_eq!(sysctl.writes().len(), 2, "{:?}", sysctl.writes());

        // Made once: an unprivileged agent (read-only /proc/sys) finds nothing to write.
        sysctl.make_read_only();
        let again = apply(&mut sysctl.clone(), &settings).expect("nothing to write");
        assert!(again.iter().all(|a| a.after.is_none()), "{again:?}");

        // Changed behind kpx's back: made again by the keeper.
        let writable = FakeSysctl::new();
        let mut keeper = Keeper::new(Box::new(writable.clone()), settings.clone());
        assert!(!keeper.keep().is_empty(), "first made");
        writable.preset("net.netfilter.nf_conntrack_tcp_timeout_close_wait", "60");
        assert_eq!(keeper.keep(), ["net.netfilter.nf_conntrack_tcp_timeout_close_wait"]);
        assert_eq!(
            writable.get("net.netfilter.nf_conntrack_tcp_timeout_close_wait").as_deref(),
            Some("3600")
        );
        assert!(keeper.keep().is_empty(), "nothing changed since");

        // Not shown yet (a module not loaded): left for later, no error.
        let absent = FakeSysctl::new();
        absent.hide("net.netfilter.nf_conntrack_max");
        let done = apply(&mut absent.clone(), &settings).expect("the others made");
        assert!(done.iter().all(|a| a.name != "net.netfilter.nf_conntrack_max"), "{done:?}");
        assert_eq!(done.len(), 2);

        // A table that cannot be raised (read-only from a network namespace) is kept.
        let small = FakeSysctl::new();
        small.preset("net.netfilter.nf_conntrack_max", "65536");
        small.make_read_only();
        let done = apply(&mut small.clone(), &settings[..1]).expect("a warning, not an error");
        assert!(done[0].refused.as_deref().is_some_and(|r| r.contains("Read-only")), "{done:?}");

        let more = [localhost_nodeports()];
        let err = apply(&mut sysctl.clone(), &more).expect_err("read-only").to_string();
        assert!(
            err.contains(ROUTE_LOCALNET) && err.contains("--init-only") && err.contains("localhostNodePorts"),
            "{err}"
        );
    }
}
