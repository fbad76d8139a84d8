//! What both binaries' command lines share: Go-style durations (as Kubernetes writes
//! them), the log format, an error told with its causes, and waiting for the signal to
//! stop.

use std::time::Duration;

/// A duration that is not one, with the text that was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration (like 30s, 1m30s, 500ms, 1h)")]
pub struct BadDuration(pub String);

/// An error and its causes, each once: `a: b: c`. Transport errors say little at the top
/// (the reason — a refused certificate, a closed connection — is further down), and
/// kube's repeat their cause in their own message, so a cause already said is not said
/// again.
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    text
}

/// A Go-style duration: `30s`, `1m30s`, `1.5h`, `500ms`, `0s` (or a bare `0`).
pub fn parse_duration(text: &str) -> Result<Duration, BadDuration> {
    let bad = || BadDuration(text.to_owned());
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').ok_or_else(bad)?;
        let (number, tail) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total = Duration::try_from_secs_f64(value * seconds)
            .ok()
            .and_then(|d| total.checked_add(d))
            .ok_or_else(bad)?;
        rest = next;
    }
    Ok(total)
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Human,
    /// One JSON object per event.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is not a log format (human or json)")),
        }
    }
}

/// Sends logs to stderr in `format`, at the level `RUST_LOG` asks (default `info`).
/// `quiet`: directives (`target=level`) that hold unless `RUST_LOG` names that target itself,
/// for a library that logs what the binary already says in its own words.
pub fn init_logs(format: LogFormat, quiet: &[&str]) {
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    for directive in quiet {
        let target = directive.split('=').next().unwrap_or_default();
        if !asked.contains(target) {
            if let Ok(directive) = directive.parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Returns at SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "1d", "s", "1e400h", "-1s"] {
            assert_eq!(parse_duration(bad), Err(BadDuration(bad.to_owned())), "{bad:?}");
        }
        assert!(parse_duration("later")
            .expect_err("bad")
            .to_string()
            .contains("\"later\" is not a duration"));
    }

    #[test]
    fn log_formats() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert!("yaml".parse::<LogFormat>().is_err());
    }
}
