//! Running a kernel tool (`iptables-restore`, `ipset`, `ip`): one process per call, input
//! on stdin, its stderr as the error. The backends' only way to spawn a process.

use std::io::Write;
use std::process::{Command, Stdio};

use super::BackendError;

/// Runs `program ARGS` (reported as `tool`), feeding it `input`; its stdout when it succeeds.
pub fn run(
    tool: &'static str,
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, BackendError> {
    let spawn_error = |source| BackendError::Spawn { tool, source };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let (Some(text), Some(mut pipe)) = (input, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(spawn_error)?;
    }
    let out = child.wait_with_output().map_err(spawn_error)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message =
            if program == tool { stderr.trim().to_owned() } else { format!("{program}: {}", stderr.trim()) };
        return Err(BackendError::Refused { tool, message });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
