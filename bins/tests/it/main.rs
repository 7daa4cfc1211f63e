//! The bins crate's one integration-test binary
//! (docs/design/testing.md#tests-by-layer): end-to-end
//! tests of the `flowforge` binary, a module per command — they run the
//! real executable in the workspace root, so file names in the output are
//! the relative paths a user would type (`examples/etl.json`), except
//! `run` and `poison` (bad values and size limits, on both stores), whose
//! tests each get a fresh working folder — `scenarios`, the
//! engine's behaviour driven through the embedding API, `distributed`,
//! the distributed mode against real PostgreSQL and RabbitMQ (in process
//! and as separate `flowforge` processes), and `browser`, the harness that
//! drives the web UI in a headless chromium.

mod browser;
mod conditions;
mod distributed;
mod examples;
mod graph;
mod hook;
mod map;
mod poison;
mod run;
mod scenarios;
mod schedules;
mod secrets;
mod server;
mod traces;
mod ui;
mod validate;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bins/ has a parent")
        .to_path_buf()
}

/// `flowforge ARGS…`, run in the workspace root.
fn flowforge<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowforge"));
    cmd.current_dir(root()).args(args);
    cmd
}

/// What one run of the binary did.
#[derive(Debug)]
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run<I, S>(args: I) -> Outcome
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let output = flowforge(args).output().expect("flowforge runs");
    Outcome {
        code: output.status.code().expect("flowforge exits with a code"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// Parses `text` as JSON and checks it against the committed schema
/// `bins/schemas/<name>`; returns the value.
fn assert_schema_valid(name: &str, text: &str) -> Value {
    let schema_path = root().join("bins/schemas").join(name);
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("schema readable")).expect("schema is JSON");
    jsonschema::meta::validate(&schema).unwrap_or_else(|e| panic!("{name} is not a valid JSON Schema: {e}"));
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let instance: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"));
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "report does not match {name}:\n{}\n{text}",
        errors.join("\n")
    );
    instance
}

/// A temporary folder holding definition files.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// Writes `contents` to `name`; returns its absolute path.
    fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write temp file");
        path
    }

    fn json(&self, name: &str, value: &Value) -> PathBuf {
        self.write(name, serde_json::to_vec_pretty(value).expect("serialise"))
    }
}

/// An HTTP client for the tests. The `http` task type's TLS (rustls over
/// ring, no process-wide provider chosen by features) leaves reqwest's
/// default client without a crypto provider until one is installed.
pub(crate) fn http_client() -> reqwest::Client {
    flowforge_adapters_http::task::install_default_tls_provider();
    reqwest::Client::new()
}
