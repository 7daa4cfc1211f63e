//! `flowforge run` end to end (docs/design/cli.md#commands, issue 3): each
//! example with its exit code and a JSON report valid against the committed
//! schema, the default database created in the working folder, `--input` inline
//! and `@file`, invalid definitions and inputs (exit 2 with the error),
//! `sqlite::memory:`, a changed definition under a published version, an
//! unknown task type, `runs list|get|cancel`, a cancel from another process
//! (exit 3) and Ctrl-C (exit 130, the run recorded as cancelled). Every test
//! runs in a temp folder of its own.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::{Outcome, assert_schema_valid, root};

pub(crate) const SCHEMA: &str = "run-report.schema.json";

/// How long a child process may take before the test gives up on it.
const PATIENCE: Duration = Duration::from_secs(120);

/// A fresh working folder: `flowforge` runs in it, so the default
/// `sqlite://.flowforge/flowforge.db` is created there.
pub(crate) struct Workdir {
    dir: tempfile::TempDir,
}

impl Workdir {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("tmp")).expect("tmp folder");
        Self { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The default database of this folder.
    fn default_db(&self) -> PathBuf {
        self.path().join(".flowforge/flowforge.db")
    }

    /// Writes a definition (or any JSON) file; returns its absolute path.
    pub(crate) fn json(&self, name: &str, value: &Value) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(value).expect("serialise")).expect("write");
        path
    }

    /// `flowforge ARGS…` in this folder, with no `FLOWFORGE_*` settings
    /// inherited and `TMPDIR` inside the folder (the examples write there).
    fn command<I, S>(&self, args: I) -> std::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.program(env!("CARGO_BIN_EXE_flowforge"));
        cmd.args(args);
        cmd
    }

    /// `program` in this folder, with the environment `command` gives.
    fn program(&self, program: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(program);
        cmd.current_dir(self.path())
            .env("TMPDIR", self.path().join("tmp"))
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FLOWFORGE_") {
                cmd.env_remove(key);
            }
        }
        cmd
    }

    pub(crate) fn run<I, S>(&self, args: I) -> Outcome
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let output = assert_cmd::Command::from_std(self.command(args))
            .timeout(PATIENCE)
            .output()
            .expect("flowforge runs");
        Outcome {
            code: output.status.code().expect("flowforge exits with a code"),
            stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
            stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
        }
    }
}

/// `flowforge run examples/<name>.json --output json` in a fresh folder.
fn run_example(name: &str) -> (Workdir, Outcome, Value) {
    let w = Workdir::new();
    let file = root().join("examples").join(format!("{name}.json"));
    assert!(!w.default_db().exists());
    let out = w.run(["run".as_ref(), file.as_os_str(), "--output".as_ref(), "json".as_ref()]);
    assert!(
        w.default_db().is_file(),
        "{name}: the default database was not created: {out:?}"
    );
    let report = assert_schema_valid(SCHEMA, &out.stdout);
    check_report_consistency(&report);
    (w, out, report)
}

/// What the schema cannot say: a cancel reason exactly on cancelled tasks
/// (docs/design/cancellation.md#transitive-cancellation) and an output exactly
/// on succeeded ones.
pub(crate) fn check_report_consistency(report: &Value) {
    for task in report["tasks"].as_array().expect("tasks") {
        assert_eq!(
            task["state"] == "cancelled",
            !task["cancel_reason"].is_null(),
            "cancel_reason set iff cancelled: {task}"
        );
        assert_eq!(task["state"] == "succeeded", !task["output"].is_null(), "{task}");
    }
}

fn keys(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("an array")
        .iter()
        .map(|t| t["key"].as_str().expect("key"))
        .collect()
}

/// The topological order `flowforge graph` reports for a definition file.
fn topological_order(w: &Workdir, file: &Path) -> Vec<String> {
    let out = w.run(["graph".as_ref(), file.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    assert_eq!(out.code, 0, "{out:?}");
    let graph: Value = serde_json::from_str(&out.stdout).expect("graph json");
    graph["order"]
        .as_array()
        .expect("order")
        .iter()
        .map(|k| k.as_str().expect("key").to_owned())
        .collect()
}

pub(crate) fn task<'r>(report: &'r Value, key: &str) -> &'r Value {
    report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["key"] == key)
        .unwrap_or_else(|| panic!("no task {key} in {report:#}"))
}

#[test]
fn the_etl_example_succeeds_and_its_report_matches_the_schema() {
    let (w, out, report) = run_example("etl");
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(report["state"], "succeeded");
    assert_eq!(report["workflow"]["name"], "nightly-etl");
    assert_eq!(report["input"], json!({}));
    assert!(report["started_at"].is_string() && report["finished_at"].is_string());
    let order = topological_order(&w, &root().join("examples/etl.json"));
    assert_eq!(keys(&report["tasks"]), order, "tasks in topological order");
    for t in report["tasks"].as_array().expect("tasks") {
        assert_eq!(
            (t["state"].as_str(), t["attempt"].as_u64()),
            (Some("succeeded"), Some(1)),
            "{t}"
        );
    }
    assert_eq!(task(&report, "extract")["output"]["rows"], 5);
    assert_eq!(
        task(&report, "transform")["output"]["totals"],
        json!({"east": 200, "north": 165, "south": 115}),
        "transform computed from extract's file"
    );
    // load wrote its report beside the data, in this test's TMPDIR.
    let written = PathBuf::from(
        task(&report, "load")["output"]["report"]
            .as_str()
            .expect("a report path"),
    );
    assert!(written.starts_with(w.path().join("tmp")), "{written:?}");
    let content: Value =
        serde_json::from_str(&std::fs::read_to_string(&written).expect("report written")).expect("the report is JSON");
    assert_eq!(content["totals"]["north"], 165);
    assert!(report["compensations"].as_array().expect("compensations").is_empty());
}

#[test]
fn the_diamond_example_succeeds_and_join_sees_both_branches() {
    let (_w, out, report) = run_example("diamond");
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(report["state"], "succeeded");
    assert_eq!(keys(&report["tasks"]), ["start", "left", "right", "join"]);
    let start = json!({"batch": "2024-06-01", "items": 3});
    let branch = json!({"inputs": {"start": start}, "run_input": {}});
    assert_eq!(task(&report, "left")["output"], branch);
    assert_eq!(
        task(&report, "join")["output"],
        json!({"inputs": {"left": branch, "right": branch}, "run_input": {}})
    );
}

#[test]
fn the_saga_example_fails_and_compensates_in_reverse_order() {
    let (_w, out, report) = run_example("saga");
    assert_eq!(out.code, 1, "a failed run exits 1: {out:?}");
    assert_eq!(report["state"], "failed");
    let states: Vec<(&str, &str, u64, Option<&str>)> = report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| {
            (
                t["key"].as_str().expect("key"),
                t["state"].as_str().expect("state"),
                t["attempt"].as_u64().expect("attempt"),
                t["cancel_reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("reserve_inventory", "succeeded", 1, None),
            ("charge_payment", "succeeded", 1, None),
            ("ship_order", "failed", 2, None),
            ("notify_customer", "cancelled", 1, Some("upstream_failed")),
        ]
    );
    let compensations: Vec<(&str, &str, &str)> = report["compensations"]
        .as_array()
        .expect("compensations")
        .iter()
        .map(|c| {
            (
                c["key"].as_str().expect("key"),
                c["compensate_for"].as_str().expect("compensate_for"),
                c["state"].as_str().expect("state"),
            )
        })
        .collect();
    assert_eq!(
        compensations,
        [
            ("refund_payment", "charge_payment", "succeeded"),
            ("release_inventory", "reserve_inventory", "succeeded"),
        ],
        "reverse order; cancel_shipment never runs (ship_order never succeeded)"
    );
    assert_eq!(
        report["compensations"][0]["output"]["inputs"],
        json!({"charge_payment": {"charge": "CH-2002", "amount_cents": 4200}})
    );
    let events = report["events"].as_array().expect("events");
    let last = events.last().expect("events");
    assert_eq!((&last["task"], &last["transition"]), (&Value::Null, &json!("fail")));
    let ship: Vec<&str> = events
        .iter()
        .filter(|e| e["task"] == "ship_order")
        .map(|e| e["transition"].as_str().expect("transition"))
        .collect();
    assert_eq!(
        ship,
        [
            "dependencies_satisfied",
            "claim",
            "fail",
            "schedule_retry",
            "retry_ready",
            "claim",
            "fail"
        ]
    );
    // The progress went to stderr as plain lines (not a terminal).
    assert!(
        out.stderr.contains("failed   ship_order after 2 attempt(s)"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_report_schema_refuses_what_design_7_does_not_allow() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("bins/schemas").join(SCHEMA)).expect("schema readable"),
    )
    .expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let valid = json!({
        "run_id": "01a22735-3630-7019-bc12-97b04f3d9d90",
        "workflow": {"name": "w", "version": 1, "fingerprint": "a".repeat(64)},
        "state": "failed", "input": {"any": ["json"]},
        "started_at": "2026-11-29T12:08:48.438Z", "finished_at": "2026-11-29T12:08:48.554Z",
        "tasks": [
            {"key": "a", "task_type": "noop", "state": "succeeded", "attempt": 1, "cancel_reason": null,
             "output": {}, "error": null, "started_at": "2026-11-29T12:08:48.436Z",
             "finished_at": "2026-11-29T12:08:48.437Z"},
            {"key": "b", "task_type": "echo", "state": "cancelled", "attempt": 1,
             "cancel_reason": "upstream_failed", "output": null, "error": null,
             "started_at": null, "finished_at": "2026-11-29T12:08:48.437Z"}
        ],
        "compensations": [
            {"key": "undo_a", "compensate_for": "a", "state": "not_run", "attempt": 0, "output": null, "error": null}
        ],
        "events": [
            {"seq": 1, "task": "a", "transition": "claim", "from": "ready", "to": "running", "attempt": 1, "token": 1,
             "worker": "w1", "at": "2026-11-29T12:08:48.436Z", "error": null},
            {"seq": 2, "task": "a", "transition": "stale_write_rejected", "from": null, "to": null, "attempt": 1,
             "token": 1, "worker": "w0", "at": "2026-11-29T12:08:48.437Z", "error": "stale"},
            {"seq": 3, "task": null, "transition": "fail", "from": "running", "to": "failed", "attempt": null,
             "token": null, "worker": null, "at": "2026-11-29T12:08:48.554Z", "error": null}
        ]
    });
    assert!(
        validator.is_valid(&valid),
        "{:?}",
        validator.iter_errors(&valid).map(|e| e.to_string()).collect::<Vec<_>>()
    );
    type Breakage = (&'static str, fn(&mut Value));
    let broken: [Breakage; 9] = [
        ("an extra property", |r| r["extra"] = json!(1)),
        ("an extra task property", |r| r["tasks"][0]["extra"] = json!(1)),
        ("a missing field", |r| {
            r["tasks"][0].as_object_mut().expect("object").remove("error");
        }),
        ("an unknown state", |r| r["state"] = json!("done")),
        ("a cancel reason on a succeeded task", |r| {
            r["tasks"][0]["cancel_reason"] = json!("user")
        }),
        ("a cancelled task without a reason", |r| {
            r["tasks"][1]["cancel_reason"] = Value::Null
        }),
        ("a not_run compensation with attempts", |r| {
            r["compensations"][0]["attempt"] = json!(1)
        }),
        ("a run event with a task attempt", |r| {
            r["events"][2]["attempt"] = json!(1)
        }),
        ("a time that is not RFC 3339 UTC", |r| {
            r["events"][0]["at"] = json!("yesterday")
        }),
    ];
    for (what, breaks) in broken {
        let mut report = valid.clone();
        breaks(&mut report);
        assert!(!validator.is_valid(&report), "the schema accepts {what}");
    }
}

/// A definition with one `echo` task (its output shows the run input).
fn echo_definition(name: &str) -> Value {
    json!({"name": name, "version": 1, "tasks": [{"key": "show", "task_type": "echo"}]})
}

#[test]
fn the_input_inline_or_from_a_file_reaches_the_run_input() {
    let w = Workdir::new();
    let def = w.json("echo.json", &echo_definition("echo-input"));
    let inline = json!({"region": "north", "limit": 3});
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--input".as_ref(),
        inline.to_string().as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let report = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(report["input"], inline);
    assert_eq!(
        task(&report, "show")["output"],
        json!({"inputs": {}, "run_input": inline})
    );

    let from_file = json!(["a", {"nested": true}]);
    w.json("input.json", &from_file);
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--input".as_ref(),
        "@input.json".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let report = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(report["input"], from_file);
    assert_eq!(task(&report, "show")["output"]["run_input"], from_file);
}

#[test]
fn an_invalid_definition_exits_2_with_the_error_kind_and_path() {
    let w = Workdir::new();
    let graph_error = w.json(
        "graph.json",
        &json!({"name": "bad", "version": 1,
                "tasks": [{"key": "a", "task_type": "noop", "depends_on": ["ghost"]}]}),
    );
    let out = w.run(["run".as_ref(), graph_error.as_os_str()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr
            .contains("graph $.tasks[0] (task 'a'): task 'a' depends on unknown task 'ghost'"),
        "{out:?}"
    );
    let shape_error = w.json(
        "shape.json",
        &json!({"name": "bad", "version": 0, "tasks": [{"task_type": "noop"}]}),
    );
    let out = w.run([
        "run".as_ref(),
        shape_error.as_os_str(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("shape $.version: "), "{out:?}");
    assert!(out.stderr.contains("shape $.tasks[0]: "), "{out:?}");
    assert!(
        out.stdout.is_empty(),
        "no report for a definition that never ran: {out:?}"
    );
    let not_json = w.path().join("broken.json");
    std::fs::write(&not_json, "{ nope").expect("write");
    let out = w.run(["run".as_ref(), not_json.as_os_str()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(!out.stderr.is_empty());
    assert!(!w.default_db().exists(), "nothing was stored");
}

#[test]
fn a_concurrency_key_the_input_lacks_exits_2_naming_the_limit() {
    let w = Workdir::new();
    let def = w.json(
        "limited.json",
        &json!({"name": "limited", "version": 1,
                "concurrency": [{"key": "$.site", "max": 1}],
                "tasks": [{"key": "show", "task_type": "echo"}]}),
    );
    let out = w.run(["run".as_ref(), def.as_os_str(), "--input".as_ref(), "{}".as_ref()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("$.concurrency[0]"), "{out:?}");
    let input = json!({"site": "eu"});
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--input".as_ref(),
        input.to_string().as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let report = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(report["state"], "succeeded");
}

#[test]
fn an_invalid_input_or_flag_exits_2() {
    let w = Workdir::new();
    let def = w.json("echo.json", &echo_definition("bad-input"));
    let out = w.run(["run".as_ref(), def.as_os_str(), "--input".as_ref(), "{\"x\": ".as_ref()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--input is not valid JSON"), "{out:?}");
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--input".as_ref(),
        "@missing.json".as_ref(),
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("missing.json"), "{out:?}");
    std::fs::write(w.path().join("broken.json"), "[1,").expect("write");
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--input".as_ref(),
        "@broken.json".as_ref(),
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("broken.json is not valid JSON"), "{out:?}");
    let out = w.run(["run".as_ref(), def.as_os_str(), "--concurrency".as_ref(), "0".as_ref()]);
    assert_eq!(out.code, 2, "{out:?}");
    let out = w.run(["run".as_ref(), def.as_os_str(), "--db".as_ref(), "mysql://x".as_ref()]);
    assert_eq!(out.code, 2, "{out:?}");
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--pg-pool-size".as_ref(),
        "2".as_ref(),
        "--pg-pool-min".as_ref(),
        "3".as_ref(),
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("--pg-pool-min 3 is more than --pg-pool-size 2"),
        "{out:?}"
    );
}

#[test]
fn an_in_memory_database_works_and_writes_no_file() {
    let w = Workdir::new();
    let def = w.json("echo.json", &echo_definition("in-memory"));
    let out = w.run([
        "run".as_ref(),
        def.as_os_str(),
        "--db".as_ref(),
        "sqlite::memory:".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(assert_schema_valid(SCHEMA, &out.stdout)["state"], "succeeded");
    assert!(!w.path().join(".flowforge").exists(), "sqlite::memory: wrote a file");
}

fn fingerprint(w: &Workdir, file: &Path) -> String {
    let out = w.run([
        "validate".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
        file.as_os_str(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let report: Value = serde_json::from_str(&out.stdout).expect("json");
    report["files"][0]["fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_owned()
}

#[test]
fn a_changed_definition_under_a_published_version_exits_2_with_both_fingerprints() {
    let w = Workdir::new();
    let original = w.json("v1.json", &echo_definition("versioned"));
    let mut edited = echo_definition("versioned");
    edited["description"] = json!("the same name and version, different content");
    let changed = w.json("v1-changed.json", &edited);
    let out = w.run(["run".as_ref(), original.as_os_str()]);
    assert_eq!(out.code, 0, "{out:?}");
    // Running the very same file again is fine (publishing is idempotent).
    assert_eq!(w.run(["run".as_ref(), original.as_os_str()]).code, 0);

    let out = w.run(["run".as_ref(), changed.as_os_str()]);
    assert_eq!(out.code, 2, "{out:?}");
    let (stored, new) = (fingerprint(&w, &original), fingerprint(&w, &changed));
    assert_ne!(stored, new);
    assert!(out.stderr.contains(&stored), "the stored fingerprint: {out:?}");
    assert!(out.stderr.contains(&new), "this file's fingerprint: {out:?}");
    assert!(out.stderr.contains("bump the version"), "{out:?}");

    edited["version"] = json!(2);
    let bumped = w.json("v2.json", &edited);
    assert_eq!(
        w.run(["run".as_ref(), bumped.as_os_str()]).code,
        0,
        "a new version publishes"
    );
}

#[test]
fn an_unknown_task_type_exits_2_naming_it() {
    let w = Workdir::new();
    let def = w.json(
        "unknown.json",
        &json!({"name": "unknown", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "teleport", "depends_on": ["a"]}
        ]}),
    );
    let out = w.run(["run".as_ref(), def.as_os_str()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("unknown task type(s) teleport"), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

#[test]
fn runs_list_get_and_cancel_read_the_same_database() {
    let (w, out, report) = run_example("diamond");
    assert_eq!(out.code, 0, "{out:?}");
    let id = report["run_id"].as_str().expect("run id").to_owned();

    let list = w.run(["runs", "list"]);
    assert_eq!(list.code, 0, "{list:?}");
    let line = list
        .stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} not listed: {list:?}"));
    assert!(line.contains("diamond") && line.contains("succeeded"), "{line}");

    let get = w.run(["runs", "get", &id, "--output", "json"]);
    assert_eq!(get.code, 0, "{get:?}");
    let stored = assert_schema_valid(SCHEMA, &get.stdout);
    assert_eq!(stored, report, "runs get shows the report `run` printed");
    let text = w.run(["runs", "get", &id]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.starts_with(&format!("run {id}: diamond v1 succeeded")),
        "{text:?}"
    );

    let cancel = w.run(["runs", "cancel", &id]);
    assert_eq!(cancel.code, 0, "{cancel:?}");
    assert!(cancel.stdout.contains("already ended: succeeded"), "{cancel:?}");
    let again = w.run(["runs", "get", &id, "--output", "json"]);
    assert_eq!(assert_schema_valid(SCHEMA, &again.stdout)["state"], "succeeded");

    let missing = w.run(["runs", "get", "00000000-0000-7000-8000-000000000000"]);
    assert_eq!(missing.code, 2, "{missing:?}");
}

/// A definition whose first task sleeps far longer than any test.
fn sleepy_definition() -> Value {
    json!({"name": "sleepy", "version": 1, "tasks": [
        {"key": "nap", "task_type": "sleep", "timeout_seconds": 3600, "config": {"seconds": 1800}},
        {"key": "after", "task_type": "echo", "depends_on": ["nap"]}
    ]})
}

/// A running `flowforge` child whose stderr lines are read on a thread.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn spawn(mut cmd: std::process::Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn flowforge");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `text`.
    fn wait_for_line(&mut self, text: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => {
                    self.kill();
                    panic!("no stderr line with {text:?} ({e}); saw {:#?}", self.seen);
                }
            }
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("a pid"))
    }

    /// Kills this child only (cleanup after a failure).
    fn kill(&mut self) {
        let _ = kill(self.pid(), Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// Waits for the exit; returns the code and stdout.
    fn wait(mut self) -> (i32, String, Vec<String>) {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("flowforge did not exit; stderr so far {:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stdout)
            .expect("read stdout");
        self.seen.extend(self.lines.try_iter());
        (status.code().expect("exited with a code"), stdout, self.seen)
    }
}

#[test]
fn ctrl_c_cancels_the_run_records_it_and_exits_130() {
    let w = Workdir::new();
    let def = w.json("sleepy.json", &sleepy_definition());
    let mut running =
        Running::spawn(w.command(["run".as_ref(), def.as_os_str(), "--output".as_ref(), "json".as_ref()]));
    running.wait_for_line("start    nap (attempt 1)");
    // SIGINT to this child's pid only: never a group, never pid 0.
    kill(running.pid(), Signal::SIGINT).expect("signal the child");
    let (code, stdout, stderr) = running.wait();
    assert_eq!(code, 130, "interrupted: stdout {stdout}\nstderr {stderr:#?}");
    let printed = assert_schema_valid(SCHEMA, &stdout);
    let id = printed["run_id"].as_str().expect("run id");

    let get = w.run(["runs", "get", id, "--output", "json"]);
    assert_eq!(get.code, 0, "{get:?}");
    let stored = assert_schema_valid(SCHEMA, &get.stdout);
    assert_eq!(stored["state"], "cancelled", "{stored:#}");
    let nap = task(&stored, "nap");
    assert_eq!(
        (&nap["state"], &nap["cancel_reason"]),
        (&json!("cancelled"), &json!("user")),
        "{stored:#}"
    );
    assert_eq!(task(&stored, "after")["state"], "cancelled", "{stored:#}");
    assert!(stored["finished_at"].is_string());
}

#[test]
fn a_run_cancelled_from_another_process_exits_3() {
    let w = Workdir::new();
    let def = w.json("sleepy.json", &sleepy_definition());
    // A short lease: the running process hears of the cancel at its next
    // heartbeat, a second later.
    let mut running = Running::spawn(w.command([
        "run".as_ref(),
        def.as_os_str(),
        "--lease-seconds".as_ref(),
        "3".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
    ]));
    running.wait_for_line("start    nap (attempt 1)");
    let list = w.run(["runs", "list"]);
    let id = list
        .stdout
        .lines()
        .find(|l| l.contains("sleepy"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("the run is listed: {list:?}"))
        .to_owned();
    let cancel = w.run(["runs", "cancel", &id, "--lease-seconds", "3"]);
    assert_eq!(cancel.code, 0, "{cancel:?}");
    let (code, stdout, stderr) = running.wait();
    assert_eq!(code, 3, "a cancelled run exits 3: stdout {stdout}\nstderr {stderr:#?}");
    let report = assert_schema_valid(SCHEMA, &stdout);
    assert_eq!(report["run_id"], id.as_str());
    assert_eq!(report["state"], "cancelled");
    assert_eq!(task(&report, "nap")["state"], "cancelled", "{report:#}");
}

/// On a terminal `flowforge run` draws its live view (a progress bar and a
/// line per task) instead of plain lines: run under a pseudo-terminal that
/// util-linux `script` opens, as a user's shell would.
#[test]
fn on_a_terminal_the_progress_is_a_live_view() {
    let work = Workdir::new();
    let line = format!(
        "'{}' run '{}'",
        env!("CARGO_BIN_EXE_flowforge"),
        root().join("examples/diamond.json").display()
    );
    let mut script = work.program("script");
    script.args(["-qec", &line, "/dev/null"]);
    let output = assert_cmd::Command::from_std(script)
        .timeout(PATIENCE)
        .output()
        .expect("script (util-linux) runs flowforge on a pseudo-terminal");
    let shown = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains('░') || shown.contains('█'), "no progress bar:\n{shown}");
    assert!(shown.contains("join") && shown.contains("succeeded"), "{shown}");
    assert!(!shown.contains("] start"), "plain lines on a terminal:\n{shown}");
}

/// `flowforge runs retry` (docs/design/retry.md): a failed run is retried
/// in place — the dry run lists the set and changes nothing; the retry
/// reruns only the failed task and the one it cancelled, keeps the
/// succeeded task's attempt and output, and the history holds both
/// generations; a succeeded run is not retried (exit 2).
#[test]
fn a_failed_run_is_retried_in_place_from_the_failed_task() {
    let w = Workdir::new();
    let file = w.json(
        "retry.json",
        &json!({"name": "retry-me", "version": 1, "tasks": [
            {"key": "first", "task_type": "echo"},
            {"key": "flaky", "task_type": "fail", "depends_on": ["first"], "config": {"fail_times": 1}},
            {"key": "after", "task_type": "echo", "depends_on": ["flaky"]}
        ]}),
    );
    let out = w.run(["run".as_ref(), file.as_os_str(), "--output".as_ref(), "json".as_ref()]);
    assert_eq!(out.code, 1, "{out:?}");
    let failed = assert_schema_valid(SCHEMA, &out.stdout);
    let id = failed["run_id"].as_str().expect("run id").to_owned();
    assert_eq!((&failed["state"], &failed["generation"]), (&json!("failed"), &json!(1)));

    let dry = w.run(["runs", "retry", &id, "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    assert_eq!(
        dry.stdout,
        format!("run {id} generation 2: would retry\n  flaky (failed → ready)\n  after (cancelled → pending)\n")
    );
    let unchanged = w.run(["runs", "get", &id, "--output", "json"]);
    assert_eq!(
        assert_schema_valid(SCHEMA, &unchanged.stdout),
        failed,
        "a dry run writes nothing"
    );

    let retried = w.run(["runs", "retry", &id, "--output", "json"]);
    assert_eq!(retried.code, 0, "{retried:?}");
    let report = assert_schema_valid(SCHEMA, &retried.stdout);
    check_report_consistency(&report);
    assert_eq!((&report["run_id"], &report["state"]), (&json!(id), &json!("succeeded")));
    assert_eq!(report["generation"], 2);
    assert_eq!(
        task(&report, "first"),
        task(&failed, "first"),
        "a kept task is untouched"
    );
    assert_eq!(
        (
            &task(&report, "flaky")["attempt"],
            &task(&report, "flaky")["generation"]
        ),
        (&json!(2), &json!(2))
    );
    assert_eq!(task(&report, "flaky")["output"], json!({"attempts": 2}));
    let events = report["events"].as_array().expect("events");
    let resume = events
        .iter()
        .position(|e| e["transition"] == "resume")
        .expect("a resume event");
    assert!(events[..resume].iter().all(|e| e["generation"] == 1));
    assert!(events[resume..].iter().all(|e| e["generation"] == 2));
    assert!(
        events[..resume]
            .iter()
            .any(|e| e["task"] == "flaky" && e["transition"] == "fail"),
        "generation 1's failed attempt stays in the history"
    );

    let again = w.run(["runs", "retry", &id]);
    assert_eq!(again.code, 2, "{again:?}");
    assert!(
        again.stderr.contains("only a failed or cancelled run can be retried"),
        "{again:?}"
    );
}

/// A run whose compensators have run (docs/design/retry.md#compensated-runs)
/// is retried only from named tasks (exit 2 without, the run untouched); then
/// the compensated tasks are redone by rule. When the next generation fails
/// again its rollback runs the compensator again, attempts counting on; a
/// third generation succeeds. The history keeps all three.
#[test]
fn a_compensated_run_is_retried_from_named_tasks_and_rolls_back_again() {
    let w = Workdir::new();
    let file = w.json(
        "saga.json",
        &json!({"name": "saga-retry", "version": 1, "tasks": [
            {"key": "reserve", "task_type": "echo"},
            {"key": "ship", "task_type": "fail", "depends_on": ["reserve"], "config": {"fail_times": 4},
             "retry": {"max_attempts": 2, "delay_seconds": 0.05}},
            {"key": "release", "task_type": "echo", "compensate_for": "reserve"}
        ]}),
    );
    let out = w.run(["run".as_ref(), file.as_os_str(), "--output".as_ref(), "json".as_ref()]);
    assert_eq!(out.code, 1, "{out:?}");
    let first = assert_schema_valid(SCHEMA, &out.stdout);
    let id = first["run_id"].as_str().expect("run id").to_owned();
    let release = |r: &Value| {
        let c = &r["compensations"][0];
        (c["state"].clone(), c["attempt"].clone(), c["generation"].clone())
    };
    assert_eq!(release(&first), (json!("succeeded"), json!(1), json!(1)));

    let refused = w.run(["runs", "retry", &id]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("compensators have run"), "{refused:?}");
    assert!(refused.stderr.contains("--from"), "{refused:?}");
    let untouched = w.run(["runs", "get", &id, "--output", "json"]);
    assert_eq!(assert_schema_valid(SCHEMA, &untouched.stdout), first);

    let dry = w.run(["runs", "retry", &id, "--from", "ship", "--dry-run"]);
    assert_eq!(
        dry.stdout,
        format!("run {id} generation 2: would retry\n  reserve (succeeded → ready)\n  ship (failed → pending)\n"),
        "the compensated task is redone by rule: {dry:?}"
    );
    let second = w.run(["runs", "retry", &id, "--from", "ship", "--output", "json"]);
    assert_eq!(second.code, 1, "{second:?}");
    let second = assert_schema_valid(SCHEMA, &second.stdout);
    check_report_consistency(&second);
    assert_eq!((&second["state"], &second["generation"]), (&json!("failed"), &json!(2)));
    assert_eq!(
        (
            &task(&second, "reserve")["attempt"],
            &task(&second, "reserve")["generation"]
        ),
        (&json!(2), &json!(2))
    );
    assert_eq!(
        release(&second),
        (json!("succeeded"), json!(2), json!(2)),
        "generation 2's rollback ran the compensator again"
    );
    let resets: Vec<(&Value, &Value)> = second["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["task"] == "release")
        .map(|e| (&e["transition"], &e["generation"]))
        .collect();
    assert!(
        resets.contains(&(&json!("succeed"), &json!(1)))
            && resets.contains(&(&json!("reset"), &json!(2)))
            && resets.contains(&(&json!("succeed"), &json!(2))),
        "both rollbacks stay in the history: {resets:?}"
    );

    let third = w.run(["runs", "retry", &id, "--from", "ship", "--output", "json"]);
    assert_eq!(third.code, 0, "{third:?}");
    let third = assert_schema_valid(SCHEMA, &third.stdout);
    check_report_consistency(&third);
    assert_eq!(
        (&third["state"], &third["generation"]),
        (&json!("succeeded"), &json!(3))
    );
    assert_eq!(task(&third, "ship")["output"], json!({"attempts": 5}));
    assert_eq!(
        third["compensations"],
        json!([]),
        "generation 2's rollback undid what generation 3 made again: it is history now"
    );
    assert!(
        third["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["task"] == "release" && e["transition"] == "succeed" && e["generation"] == 2),
        "and the history keeps it"
    );
}
