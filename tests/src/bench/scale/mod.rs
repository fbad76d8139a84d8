//! `bench_scale`'s parts (its `main` is `src/bin/bench_scale.rs`, which says what it
//! measures): the flags ([`Args`]), the workload it writes ([`workload`]), what it reads
//! of processes ([`measure`]), the fan-out to simulated nodes ([`fanout`]) and node
//! programming, restarts and the API path ([`node`]).

pub mod fanout;
pub mod mcs;
pub mod measure;
pub mod node;
pub mod workload;

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct Args {
    pub services: usize,
    pub endpoints: usize,
    pub nodes: usize,
    pub slow_percent: usize,
    pub stuck_percent: usize,
    /// The control plane's `--ack-timeout`, in seconds.
    pub ack_timeout_s: u64,
    pub changes: usize,
    pub node_scales: Vec<Scale>,
    /// One endpoint changes measured per node-programming scale.
    pub node_changes: usize,
    /// How long the agent idles before its steady RSS is read, in seconds.
    pub node_idle_s: u64,
    pub json: Option<PathBuf>,
    pub skip: Vec<String>,
    /// Also run the fan-out over mutual TLS and print both side by side.
    pub tls: bool,
    /// Another build's agent (its commit, its binary): nftables' full rewrite is also
    /// timed with it, in the same run, and the two printed side by side.
    pub baseline: Option<(String, PathBuf)>,
    /// The endpoints of the one Service exported across three clusters (MCS).
    pub mcs_endpoints: usize,
}

/// Node programming's scales: Kubernetes' per-cluster envelope of 250k endpoints (5k ×
/// 50) between a common shape and five times the envelope.
pub const DEFAULT_NODE_SCALES: &str = "10000x10,5000x50,50000x10";

pub fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        services: 10_000,
        endpoints: 10,
        nodes: 5_000,
        slow_percent: 5,
        stuck_percent: 5,
        ack_timeout_s: 120,
        changes: 5,
        node_scales: parse_scales("--node-scales", DEFAULT_NODE_SCALES)?,
        node_changes: 100,
        node_idle_s: 25,
        json: None,
        skip: vec![],
        tls: false,
        baseline: None,
        mcs_endpoints: 1_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|_| format!("{flag}: {v:?} is not a number"));
        match flag.as_str() {
            "--services" => a.services = number(value()?)?,
            "--endpoints" => a.endpoints = number(value()?)?,
            "--nodes" => a.nodes = number(value()?)?,
            "--slow-percent" => a.slow_percent = number(value()?)?,
            "--stuck-percent" => a.stuck_percent = number(value()?)?,
            "--ack-timeout" => a.ack_timeout_s = number(value()?)? as u64,
            "--changes" => a.changes = number(value()?)?.max(1),
            "--node-scales" => a.node_scales = parse_scales(&flag, &value()?)?,
            "--node-changes" => a.node_changes = number(value()?)?.max(1),
            "--node-idle" => a.node_idle_s = number(value()?)? as u64,
            "--mcs-endpoints" => a.mcs_endpoints = number(value()?)?.max(3),
            "--json" => a.json = Some(PathBuf::from(value()?)),
            "--skip" => a.skip.push(value()?),
            "--tls" => a.tls = true,
            "--baseline" => {
                let v = value()?;
                let (commit, path) =
                    v.split_once('=').ok_or_else(|| format!("{flag}: {v:?} is not COMMIT=PATH"))?;
                if !std::path::Path::new(path).is_file() {
                    return Err(format!("{flag}: {path:?} is no file"));
                }
                a.baseline = Some((commit.to_owned(), PathBuf::from(path)));
            }
            other => return Err(format!("unknown flag {other} (--services --endpoints --nodes --slow-percent --stuck-percent --ack-timeout SECONDS --changes --node-scales SxE,… --node-changes --node-idle SECONDS --json --skip fanout|floor|node|iptables|api|ipvs --tls --baseline COMMIT=AGENT_BINARY)")),
        }
    }
    Ok(a)
}

/// One node-programming scale: Services × distinct endpoints per Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    pub services: usize,
    pub endpoints: usize,
}

impl std::fmt::Display for Scale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}", self.services, self.endpoints)
    }
}

pub fn parse_scales(flag: &str, text: &str) -> Result<Vec<Scale>, String> {
    text.split(',')
        .map(|one| {
            let (s, e) =
                one.split_once('x').ok_or_else(|| format!("{flag}: {one:?} is not SERVICESxENDPOINTS"))?;
            let number = |v: &str| v.trim().parse::<usize>().ok().filter(|n| *n > 0);
            match (number(s), number(e)) {
                (Some(services), Some(endpoints)) => Ok(Scale { services, endpoints }),
                _ => Err(format!("{flag}: {one:?}: both numbers must be positive")),
            }
        })
        .collect()
}
