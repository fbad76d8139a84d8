//! Running a tool: one process per call, input on stdin, its stderr as the error. The
//! only place kpx spawns a process.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use super::ExecError;

/// Runs `program ARGS` (reported as `tool`), feeding it `input`; its stdout when it succeeds.
pub(super) fn run(
    tool: &'static str,
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, ExecError> {
    let out = output(tool, program, args, input)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message =
            if program == tool { stderr.trim().to_owned() } else { format!("{program}: {}", stderr.trim()) };
        return Err(ExecError::Refused { tool, message });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program ARGS` and returns what it did, whatever its exit status.
pub(super) fn output(
    tool: &'static str,
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<Output, ExecError> {
    let spawn_error = |source| ExecError::Spawn { tool, source };
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
    child.wait_with_output().map_err(spawn_error)
}
