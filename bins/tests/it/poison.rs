//! Poison results and size limits end to end (docs/design/data-flow.md#limits,
//! issue 10 items 4 and 5): the same `flowforge run`, on SQLite and on
//! PostgreSQL alike, turns an output holding U+0000 into a permanent failure
//! that names where, keeps a NUL on stderr as U+FFFD, refuses a NUL in the
//! input or the definition with exit 2, and holds the run input, a task's
//! output (a command's stdout while it is read) and a task's inputs to their
//! settings, each error naming its setting.

use std::ffi::OsString;
use std::path::Path;

use serde_json::{Value, json};

use crate::distributed::{TestDb, postgres_url};
use crate::run::{SCHEMA, Workdir, check_report_consistency, task};
use crate::{Outcome, assert_schema_valid};

/// Where a run is stored.
pub(crate) enum Db {
    /// The working folder's default SQLite file.
    Sqlite,
    /// A PostgreSQL database of the test's own.
    Postgres(TestDb),
}

impl Db {
    /// Every store the tests run against (PostgreSQL unless it is
    /// unreachable and not required).
    pub(crate) fn all() -> Vec<Self> {
        let mut dbs = vec![Self::Sqlite];
        if let Some(url) = postgres_url() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            dbs.push(Self::Postgres(runtime.block_on(TestDb::migrated(&url))));
        }
        dbs
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// `flowforge run FILE --output json ARGS…` on this store.
    pub(crate) fn run(&self, w: &Workdir, file: &Path, args: &[&str]) -> Outcome {
        let mut all: Vec<OsString> = vec!["run".into(), file.into(), "--output".into(), "json".into()];
        if let Self::Postgres(db) = self {
            all.extend(["--db".into(), db.url.clone().into()]);
        }
        all.extend(args.iter().map(OsString::from));
        w.run(all)
    }

    /// As [`Self::run`], for a run that ends failed: its report, checked.
    fn failed_run(&self, w: &Workdir, file: &Path, args: &[&str]) -> Value {
        let out = self.run(w, file, args);
        assert_eq!(out.code, 1, "{}: the run fails, not the engine: {out:?}", self.name());
        let report = assert_schema_valid(SCHEMA, &out.stdout);
        check_report_consistency(&report);
        assert_eq!(report["state"], "failed", "{}", self.name());
        report
    }
}

/// A task's state, attempt and error in a report.
fn ending(report: &Value, key: &str) -> (String, u64, String) {
    let t = task(report, key);
    (
        t["state"].as_str().unwrap_or_default().to_owned(),
        t["attempt"].as_u64().unwrap_or_default(),
        t["error"].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn an_output_holding_nul_fails_for_good_and_a_nul_on_stderr_is_kept_as_u_fffd() {
    for db in Db::all() {
        let w = Workdir::new();
        // Retries left on both: a poison result must not use them.
        let retry = json!({"max_attempts": 3, "delay_seconds": 0});
        let def = w.json(
            "poison.json",
            &json!({"name": "poison", "version": 1, "tasks": [
                {"key": "emit", "task_type": "command", "retry": retry,
                 "config": {"argv": ["sh", "-c", r#"cat > /dev/null; printf '{"a": ["ok", "\\u0000"]}'"#]}},
                {"key": "after", "task_type": "echo", "depends_on": ["emit"]},
                {"key": "noisy", "task_type": "command", "retry": {"max_attempts": 1},
                 "config": {"argv": ["sh", "-c", r"cat > /dev/null; printf 'bad\000byte' >&2; exit 3"]}}
            ]}),
        );
        let report = db.failed_run(&w, &def, &[]);
        assert_eq!(
            ending(&report, "emit"),
            (
                "failed".into(),
                1,
                "the task's output holds a NUL character (U+0000) at $.a[1], which cannot be stored".into()
            ),
            "{}",
            db.name()
        );
        assert_eq!(task(&report, "emit")["output"], Value::Null, "{}", db.name());
        assert_eq!(task(&report, "after")["state"], "cancelled", "{}", db.name());
        assert_eq!(
            ending(&report, "noisy"),
            (
                "failed".into(),
                1,
                "command exited with status 3: bad\u{FFFD}byte".into()
            ),
            "{}",
            db.name()
        );
    }
}

#[test]
fn a_nul_in_the_input_or_the_definition_exits_2_naming_where() {
    for db in Db::all() {
        let w = Workdir::new();
        let def = w.json(
            "echo.json",
            &json!({"name": "nul-input", "version": 1, "tasks": [{"key": "show", "task_type": "echo"}]}),
        );
        let out = db.run(&w, &def, &["--input", r#"{"a": {"b c": "x\u0000"}}"#]);
        assert_eq!(out.code, 2, "{}: {out:?}", db.name());
        assert!(
            out.stderr
                .contains("the run input holds a NUL character (U+0000) at $.a['b c'], which cannot be stored"),
            "{}: {out:?}",
            db.name()
        );
        assert!(out.stdout.is_empty(), "{}: no run, no report: {out:?}", db.name());

        let def = w.json(
            "nul.json",
            &json!({"name": "nul-def", "version": 1,
                    "tasks": [{"key": "a", "task_type": "echo", "config": {"note": "x\u{0}"}}]}),
        );
        let out = db.run(&w, &def, &[]);
        assert_eq!(out.code, 2, "{}: {out:?}", db.name());
        assert!(
            out.stderr
                .contains("shape $.tasks[0].config.note: holds a NUL character (U+0000), which cannot be stored"),
            "{}: {out:?}",
            db.name()
        );
    }
}

#[test]
fn the_run_input_is_held_to_its_limit() {
    for db in Db::all() {
        let w = Workdir::new();
        let def = w.json(
            "echo.json",
            &json!({"name": "big-input", "version": 1, "tasks": [{"key": "show", "task_type": "echo"}]}),
        );
        let input = json!({"pad": "x".repeat(100)}).to_string();
        let out = db.run(&w, &def, &["--max-run-input-bytes", "64", "--input", &input]);
        assert_eq!(out.code, 2, "{}: {out:?}", db.name());
        assert!(
            out.stderr
                .contains("the run input is 110 bytes of JSON; the limit (max_run_input_bytes) is 64 bytes"),
            "{}: {out:?}",
            db.name()
        );
        let out = db.run(&w, &def, &["--max-run-input-bytes", "110", "--input", &input]);
        assert_eq!(out.code, 0, "{}: at the limit exactly: {out:?}", db.name());
    }
}

#[test]
fn a_task_output_is_held_to_its_limit_a_command_while_it_prints() {
    for db in Db::all() {
        let w = Workdir::new();
        let retry = json!({"max_attempts": 3, "delay_seconds": 0});
        let def = w.json(
            "outputs.json",
            &json!({"name": "big-output", "version": 1, "tasks": [
                {"key": "echo", "task_type": "echo", "retry": retry},
                // Far more than the limit, and more than a pipe holds: the
                // reader keeps the limit and drains the rest.
                {"key": "flood", "task_type": "command", "retry": retry,
                 "config": {"argv": ["sh", "-c", "cat > /dev/null; head -c 4000000 /dev/zero | tr '\\0' x"]}}
            ]}),
        );
        let input = json!({"pad": "x".repeat(300)}).to_string();
        let report = db.failed_run(&w, &def, &["--max-task-output-bytes", "200", "--input", &input]);
        let (state, attempt, error) = ending(&report, "echo");
        assert_eq!((state.as_str(), attempt), ("failed", 1), "{}: {error}", db.name());
        assert!(
            error.starts_with("the task's output is ")
                && error.ends_with("the limit (max_task_output_bytes) is 200 bytes"),
            "{}: {error}",
            db.name()
        );
        assert_eq!(
            ending(&report, "flood"),
            (
                "failed".into(),
                1,
                "command printed more than 200 bytes on stdout; the limit (max_task_output_bytes) is 200 bytes".into()
            ),
            "{}",
            db.name()
        );
    }
}

/// Asserts that `key` failed for good on its first attempt, its inputs
/// over a limit of 200 bytes.
fn failed_over_the_inputs_limit(db: &Db, report: &Value, key: &str) {
    let (state, attempt, error) = ending(report, key);
    assert_eq!((state.as_str(), attempt), ("failed", 1), "{}: {error}", db.name());
    assert!(
        error.starts_with("the task's inputs (its dependencies' outputs) are "),
        "{}: {error}",
        db.name()
    );
    assert!(
        error.ends_with("the limit (max_task_inputs_bytes) is 200 bytes"),
        "{}: {error}",
        db.name()
    );
}

#[test]
fn the_inputs_one_task_is_given_are_held_to_their_limit() {
    for db in Db::all() {
        let w = Workdir::new();
        let def = w.json(
            "join.json",
            &json!({"name": "big-inputs", "version": 1, "tasks": [
                {"key": "a", "task_type": "echo"},
                {"key": "b", "task_type": "echo"},
                {"key": "join", "task_type": "echo", "depends_on": ["a", "b"],
                 "retry": {"max_attempts": 3, "delay_seconds": 0}}
            ]}),
        );
        // Each echo output holds the input (about 130 bytes): one fits in
        // 200 bytes, the two together do not.
        let input = json!({"pad": "x".repeat(100)}).to_string();
        let report = db.failed_run(&w, &def, &["--max-task-inputs-bytes", "200", "--input", &input]);
        assert_eq!(task(&report, "a")["state"], "succeeded", "{}", db.name());
        assert_eq!(task(&report, "b")["state"], "succeeded", "{}", db.name());
        failed_over_the_inputs_limit(&db, &report, "join");
    }
}

/// A task its predecessor's slot runs next, taking its input from that
/// slot instead of the store (docs/design/outbox-and-queues.md#carried-inputs),
/// is held to the same limit.
#[test]
fn a_task_run_straight_after_its_dependency_is_held_to_the_inputs_limit() {
    for db in Db::all() {
        let w = Workdir::new();
        let def = w.json(
            "chain.json",
            &json!({"name": "big-chain", "version": 1, "tasks": [
                {"key": "a", "task_type": "echo"},
                {"key": "b", "task_type": "echo", "depends_on": ["a"],
                 "retry": {"max_attempts": 3, "delay_seconds": 0}}
            ]}),
        );
        // a's output holds the input: under the output limit, over the
        // inputs limit.
        let input = json!({"pad": "x".repeat(250)}).to_string();
        let report = db.failed_run(&w, &def, &["--max-task-inputs-bytes", "200", "--input", &input]);
        assert_eq!(task(&report, "a")["state"], "succeeded", "{}", db.name());
        failed_over_the_inputs_limit(&db, &report, "b");
    }
}
