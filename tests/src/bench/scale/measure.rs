//! What the benchmark reads of processes (RSS, faults, CPU), of the control plane's
//! metrics and of the agents' JSON logs, and of the machine.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::process::KpxProcess;
use crate::harness::topology::sock;
use serde_json::json;

/// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The RSS once it has stopped falling: no drop of more than 256 KiB over two seconds
/// (at most 30 s).
pub fn settled_rss_kib(pid: u32) -> u64 {
    let mut readings = std::collections::VecDeque::from([rss_kib(pid)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        readings.push_back(rss_kib(pid));
        if readings.len() > 5 {
            readings.pop_front();
            if readings.front().copied().unwrap_or(0) <= readings.back().copied().unwrap_or(0) + 256 {
                break;
            }
        }
    }
    readings.back().copied().unwrap_or(0)
}

pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// One sample of a metric of the fan-out's control plane (its /metrics on 127.0.0.1:28002).
pub fn control_plane_metric(name: &str) -> f64 {
    let Ok((200, body)) = crate::harness::traffic::http_get_path(sock("127.0.0.1", 28002), "/metrics") else {
        return f64::NAN;
    };
    crate::harness::traffic::metric_value(&body, name).unwrap_or(f64::NAN)
}

/// The control plane's heap by the allocator's account (allocated, active, resident), in KiB.
pub fn control_plane_heap_kib() -> [f64; 3] {
    ["allocated", "active", "resident"]
        .map(|kind| control_plane_metric(&format!("kpx_controlplane_heap_bytes{{kind=\"{kind}\"}}")) / 1024.0)
}

/// The numbers of `/proc/PID/stat` from its state's field on (the state is field 3 of
/// stat(5), at index 0 here).
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit(')').next()?.split_whitespace().map(str::to_owned).collect())
}

/// A process's minor and major page faults so far (fields 10 and 12 of stat(5)).
pub fn page_faults(pid: u32) -> Option<(u64, u64)> {
    let fields = stat_fields(pid)?;
    Some((fields.get(7)?.parse().ok()?, fields.get(9)?.parse().ok()?))
}

/// A process's CPU time so far, user and system (fields 14 and 15 of stat(5)).
pub fn cpu_seconds(pid: u32) -> f64 {
    let fields = stat_fields(pid).unwrap_or_default();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf is always safe to call.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// What the figures were measured on: cores, memory, kernel, nft.
pub fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    let nft = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_gib": (mem_kib as f64 / 1048576.0).round(),
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "nft": nft,
    })
}

/// Events of a JSON log file.
pub fn events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Seconds since the Unix epoch of a log timestamp (`2026-12-04T14:21:01.302810Z`).
pub fn unix_seconds(timestamp: &str) -> Option<f64> {
    let (date, time) = timestamp.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|v| v.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, min, sec) =
        (t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?);
    // Days from 1970-01-01 of a proleptic Gregorian date.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// Ends the benchmark if the agent has exited (instead of waiting out a deadline for it).
pub fn exited_before(agent: &KpxProcess, what: &str) {
    if agent.exited() {
        panic!("{} exited before {what}; log:\n{}", agent.name, agent.log_text());
    }
}

/// From `written` (Unix seconds, when a change was made at its source) to when the
/// agent's kernel committed it, by the agent's `delta applied` event: the event is logged
/// once the delta is stored too, which took `elapsed - kernel` after the commit (the
/// result is rounded to the log's microseconds, never below zero).
pub fn committed_after(event: &serde_json::Value, written: f64) -> Duration {
    let logged = event["timestamp"]
        .as_str()
        .and_then(unix_seconds)
        .unwrap_or_else(|| panic!("the agent's event has no UTC timestamp: {event}"));
    let after_kernel_us =
        event["elapsed_us"].as_f64().unwrap_or(0.0) - event["kernel_us"].as_f64().unwrap_or(0.0);
    Duration::from_secs_f64((logged - written - after_kernel_us / 1e6).max(0.0))
}

/// Now, in Unix seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The agent's "delta applied" events of Services (the log holds every run of it).
pub fn service_deltas(log: &Path) -> Vec<serde_json::Value> {
    events(log)
        .into_iter()
        .filter(|e| e["message"] == "delta applied" && e["type_url"] == kpx_proto::SERVICE_VIEW_TYPE_URL)
        .collect()
}
