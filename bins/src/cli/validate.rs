//! `flowforge validate FILE… [--output text|json]`: reads each definition
//! file (at most 2 MiB is ever read), checks its shape then its graph, and
//! reports every problem with its kind and JSONPath, or the fingerprint.
//!
//! The JSON report is stable (docs/design/cli.md#reports), with a committed
//! schema (`bins/schemas/validate-report.schema.json`): `{ "files": [ { "file",
//! "valid", "fingerprint", "errors": [ { "kind", "path", "task", "message" } ]
//! } ] }`. `kind` is `io` (the file could not be read; `path` is null), `json`
//! (not JSON), `shape` (JSON Schema, including the size and nesting limits) or
//! `graph` (graph and value rules; `path` is the `$.tasks[i]` of the task
//! named). A valid file may carry `warnings` (`{ "path", "task", "message"
//! }`): a join below a `when` that keeps the default trigger.
//!
//! Exit 0 when every file is valid (warnings or not), 2 otherwise.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use flowforge_domain::WorkflowDefinition;
use flowforge_domain::condition;
use flowforge_domain::definition::MAX_BODY_BYTES;
use flowforge_domain::schema::{ParseError, Problem, parse_definition};
use serde::Serialize;

use super::{Exit, print_report};

/// Arguments of `flowforge validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Definition files (JSON).
    #[arg(required = true, value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// One line per valid file, one per error.
    Text,
    /// The stable JSON report (docs/design/cli.md#reports).
    Json,
}

/// The `validate --output json` report.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// One entry per file, in command-line order.
    pub(crate) files: Vec<FileReport>,
}

/// What one file turned out to be.
#[derive(Debug, Serialize)]
pub(crate) struct FileReport {
    /// The file as given on the command line.
    pub(crate) file: String,
    /// Whether it is a valid definition.
    pub(crate) valid: bool,
    /// Its fingerprint when valid.
    pub(crate) fingerprint: Option<String>,
    /// Every problem, in the order found (empty when valid).
    pub(crate) errors: Vec<ErrorEntry>,
    /// What is valid but likely not meant (docs/design/conditions.md#triggers);
    /// never a reason to refuse.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) warnings: Vec<WarningEntry>,
    /// The definition itself, when valid.
    #[serde(skip)]
    pub(crate) definition: Option<WorkflowDefinition>,
}

/// One problem of a file.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorEntry {
    /// `io`, `json`, `shape` or `graph`.
    pub(crate) kind: &'static str,
    /// JSONPath of the offending element (`null` for `io`).
    pub(crate) path: Option<String>,
    /// The task named, if any.
    pub(crate) task: Option<String>,
    /// What is wrong.
    pub(crate) message: String,
}

/// One warning of a valid file.
#[derive(Debug, Serialize)]
pub(crate) struct WarningEntry {
    /// JSONPath of the task: `$.tasks[i]`.
    pub(crate) path: String,
    /// The task.
    pub(crate) task: String,
    /// What looks wrong.
    pub(crate) message: String,
}

impl From<Problem> for ErrorEntry {
    fn from(p: Problem) -> Self {
        Self {
            kind: p.kind.as_str(),
            path: Some(p.path),
            task: p.task,
            message: p.message,
        }
    }
}

/// `flowforge validate`.
pub(crate) fn run(args: &Args) -> anyhow::Result<Exit> {
    let report = Report {
        files: args.files.iter().map(|f| check_file(f)).collect(),
    };
    let text = match args.output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
        Output::Text => report.files.iter().map(render_text).collect(),
    };
    print_report(&text)?;
    Ok(if report.files.iter().all(|f| f.valid) {
        Exit::Ok
    } else {
        Exit::Invalid
    })
}

/// Reads and validates one file.
pub(crate) fn check_file(path: &Path) -> FileReport {
    let file = path.display().to_string();
    let outcome = read_bounded(path).and_then(|bytes| parse_definition(&bytes).map_err(errors_of));
    match outcome {
        Ok(definition) => FileReport {
            file,
            valid: true,
            fingerprint: Some(definition.fingerprint()),
            errors: Vec::new(),
            warnings: condition::warnings(&definition)
                .into_iter()
                .map(|w| WarningEntry {
                    path: format!("$.tasks[{}]", w.index),
                    task: w.task,
                    message: w.message,
                })
                .collect(),
            definition: Some(definition),
        },
        Err(errors) => FileReport {
            file,
            valid: false,
            fingerprint: None,
            errors,
            warnings: Vec::new(),
            definition: None,
        },
    }
}

fn errors_of(error: ParseError) -> Vec<ErrorEntry> {
    error.problems().into_iter().map(ErrorEntry::from).collect()
}

/// Reads at most [`MAX_BODY_BYTES`] + 1 bytes: a larger file is refused
/// without ever being held in memory.
fn read_bounded(path: &Path) -> Result<Vec<u8>, Vec<ErrorEntry>> {
    let io_error = |e: std::io::Error| {
        vec![ErrorEntry {
            kind: "io",
            path: None,
            task: None,
            message: format!("cannot read file: {e}"),
        }]
    };
    let file = File::open(path).map_err(io_error)?;
    let declared = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    // Widening a usize constant: cannot truncate on any supported target.
    let limit = MAX_BODY_BYTES as u64 + 1;
    file.take(limit).read_to_end(&mut bytes).map_err(io_error)?;
    if bytes.len() > MAX_BODY_BYTES {
        // The size on disk when known (a pipe has none): what was read.
        let size = usize::try_from(declared).unwrap_or(usize::MAX).max(bytes.len());
        return Err(errors_of(ParseError::TooLarge { size }));
    }
    Ok(bytes)
}

/// The text form of one file's result: `✓ FILE: valid (fingerprint …)` or
/// one line per error, `FILE: KIND PATH (task 'T'): MESSAGE`.
pub(crate) fn render_text(report: &FileReport) -> String {
    if let Some(fingerprint) = &report.fingerprint {
        let mut out = format!("✓ {}: valid (fingerprint {fingerprint})\n", report.file);
        for w in &report.warnings {
            out.push_str(&format!(
                "{}: warning {} (task '{}'): {}\n",
                report.file, w.path, w.task, w.message
            ));
        }
        return out;
    }
    let mut out = String::new();
    for e in &report.errors {
        out.push_str(&report.file);
        out.push_str(": ");
        out.push_str(e.kind);
        if let Some(path) = &e.path {
            out.push(' ');
            out.push_str(path);
        }
        if let Some(task) = &e.task {
            out.push_str(&format!(" (task '{task}')"));
        }
        out.push_str(": ");
        out.push_str(&e.message);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &'static str, path: Option<&str>, task: Option<&str>, message: &str) -> ErrorEntry {
        ErrorEntry {
            kind,
            path: path.map(str::to_owned),
            task: task.map(str::to_owned),
            message: message.to_owned(),
        }
    }

    #[test]
    fn text_lines_name_file_kind_path_and_task() {
        let report = FileReport {
            file: "bad.json".into(),
            valid: false,
            fingerprint: None,
            errors: vec![
                entry("shape", Some("$.tasks"), None, "[] has less than 1 item"),
                entry("graph", Some("$.tasks[1]"), Some("a"), "duplicate task key 'a'"),
                entry("io", None, None, "cannot read file: gone"),
            ],
            warnings: Vec::new(),
            definition: None,
        };
        assert_eq!(
            render_text(&report),
            "bad.json: shape $.tasks: [] has less than 1 item\n\
             bad.json: graph $.tasks[1] (task 'a'): duplicate task key 'a'\n\
             bad.json: io: cannot read file: gone\n"
        );
    }
}
