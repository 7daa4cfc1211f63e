//! What several commands share: reading a definition file and `--input`,
//! waiting for Ctrl-C, the exit code of an ended run, this host's name,
//! durations.

use std::path::Path;
use std::time::Duration;

use flowforge_domain::{RunState, WorkflowDefinition};
use serde_json::Value;

use super::Exit;
use super::validate::{check_file, render_text};

/// Reads a definition file, printing its problems (exit 2) if invalid.
pub(crate) fn load_definition(file: &Path) -> Result<WorkflowDefinition, Exit> {
    let report = check_file(file);
    match report.definition {
        Some(def) => Ok(def),
        None => {
            eprint!("{}", render_text(&report));
            Err(Exit::Invalid)
        }
    }
}

/// Parses `--input`: inline JSON or `@file`.
pub(crate) fn parse_input(input: Option<&str>) -> Result<Value, Exit> {
    let Some(input) = input else {
        return Ok(Value::Object(Default::default()));
    };
    let (text, source) = match input.strip_prefix('@') {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (text, path.to_owned()),
            Err(e) => {
                eprintln!("error: cannot read --input file {path}: {e}");
                return Err(Exit::Invalid);
            }
        },
        None => (input.to_owned(), "--input".to_owned()),
    };
    serde_json::from_str(&text).map_err(|e| {
        eprintln!("error: {source} is not valid JSON: {e}");
        Exit::Invalid
    })
}

/// Resolves when the user asks to stop: Ctrl-C or SIGTERM.
pub(crate) async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The exit code of a run that ended in `state`.
pub(crate) fn exit_for(state: Option<RunState>) -> Exit {
    match state {
        Some(RunState::Succeeded) => Exit::Ok,
        Some(RunState::Cancelled) => Exit::Cancelled,
        _ => Exit::RunFailed,
    }
}

/// This host's name, for worker ids.
pub(crate) fn host() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `30d`, `12h`, `15m`, `90s`: a clap value parser.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration: write a number with s, m, h or d, such as 30d");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .filter(|s| *s > 0)
    .ok_or_else(bad)?;
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_parse_and_bad_ones_say_how() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        for bad in ["", "d", "30", "30w", "0h", "-1d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
