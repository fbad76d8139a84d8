//! The scale benchmark's IPVS part: `bench_backends` run in the test VM (this machine's
//! kernel has no IPVS), IPVS beside nftables in the same run, its figures read back from
//! its output.

use std::path::Path;
use std::process::Command;

use serde_json::json;

/// One backend's line of `bench_backends` (as it goes into the benchmark's JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BackendFigures {
    pub backend: String,
    pub services: usize,
    pub full_sync_ms: f64,
    pub change_p50_ms: f64,
    pub change_p99_ms: f64,
    /// A new backend's full sync over the rules the first left (a restart's work).
    pub restart_ms: Option<f64>,
}

/// The figures of `bench_backends`' output: lines like
/// `ipvs                10000  full sync    1234.5 ms   one endpoint change p50     0.67 ms  p99     8.04 ms   restart over its rules     512.0 ms`
/// (the restart's figure absent in older output).
/// Other lines (its heading, a backend it could not measure) are left out.
pub fn parse(output: &str) -> Vec<BackendFigures> {
    output.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<BackendFigures> {
    let (label, rest) = line.split_once("  ")?;
    let rest = rest.trim_start();
    let (services, rest) = rest.split_once("  full sync ")?;
    let (full, rest) = rest.split_once(" ms")?;
    let (_, rest) = rest.split_once("one endpoint change p50 ")?;
    let (p50, rest) = rest.split_once(" ms")?;
    let (_, rest) = rest.split_once("p99 ")?;
    let (p99, rest) = rest.split_once(" ms")?;
    let restart = rest
        .split_once("restart over its rules ")
        .and_then(|(_, r)| r.split_once(" ms"))
        .and_then(|(ms, _)| ms.trim().parse().ok());
    Some(BackendFigures {
        backend: label.trim().to_owned(),
        services: services.trim().parse().ok()?,
        full_sync_ms: full.trim().parse().ok()?,
        change_p50_ms: p50.trim().parse().ok()?,
        change_p99_ms: p99.trim().parse().ok()?,
        restart_ms: restart,
    })
}

/// Runs `bench_backends --changes CHANGES SERVICES ipvs nftables` in the VM
/// (`tests/vm/run-in-vm.sh`) and returns its figures as JSON, or why it could not.
pub fn measure(bench_backends: &Path, services: usize, changes: usize) -> Result<serde_json::Value, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vm/run-in-vm.sh");
    if !script.exists() {
        return Err(format!("{} is missing", script.display()));
    }
    let args = [
        bench_backends.display().to_string(),
        "--changes".into(),
        changes.to_string(),
        services.to_string(),
        "ipvs".into(),
        "nftables".into(),
    ];
    let out = Command::new(&script)
        .args(&args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({}):\n{text}{}",
            script.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let figures = parse(&text);
    if !figures.iter().any(|f| f.backend == "ipvs") {
        return Err(format!("no IPVS figures in the VM's output:\n{text}"));
    }
    Ok(json!({
        "services": services,
        "changes": changes,
        "command": format!("sudo tests/vm/run-in-vm.sh {}", args.join(" ").replace(&format!("{}/", repository_root()), "")),
        "backends": figures,
    }))
}

/// The repository's root, for commands printed relative to it.
fn repository_root() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|p| p.display().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_of_each_measured_backend_are_read_and_the_rest_left_out() {
        let output = "backend          services  (10 endpoints each; 100 changes)\n\
            nftables (lib)      10000  full sync    3301.2 ms   one endpoint change p50     0.84 ms  p99    14.64 ms\n\
            nftables (nft -f)   10000  full sync    7012.0 ms   one endpoint change p50     0.64 ms  p99     1.97 ms\n\
            ipvs: no IPVS in this kernel\n\
            ipvs                10000  full sync  105000.0 ms   one endpoint change p50     0.67 ms  p99     8.04 ms   restart over its rules    9714.1 ms\n";
        let figures = parse(output);
        assert_eq!(figures.len(), 3, "{figures:?}");
        assert_eq!(
            figures[2],
            BackendFigures {
                backend: "ipvs".into(),
                services: 10000,
                full_sync_ms: 105000.0,
                change_p50_ms: 0.67,
                change_p99_ms: 8.04,
                restart_ms: Some(9714.1)
            }
        );
        assert_eq!(figures[1].backend, "nftables (nft -f)");
        assert_eq!(figures[0].change_p99_ms, 14.64);
        assert_eq!(figures[0].restart_ms, None);
    }
}
