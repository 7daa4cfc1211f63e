//! What several commands share: reading a definition file and `--input`,
//! waiting for Ctrl-C, the exit code of an ended run, this host's name.

use std::path::Path;

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
