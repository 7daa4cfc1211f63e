//! Conditions end to end (docs/design/conditions.md, issue 18): the same
//! `flowforge run`, on SQLite and on PostgreSQL alike, skips a branch whose
//! `when` is false and whatever needs it, runs a `none_failed` join after
//! the branch that ran, runs an `all_done` task after a failure with each
//! dependency's state in its inputs, never compensates a skipped task,
//! fails a task whose `when` cannot be evaluated, and decides a task
//! without dependencies from the run input; `validate` refuses a `when`
//! that does not parse, naming its JSONPath.

use serde_json::{Value, json};

use crate::poison::Db;
use crate::run::{SCHEMA, Workdir, check_report_consistency, task};
use crate::{assert_schema_valid, run};

/// `flowforge run` of `def` with `input` on `db`: the exit code and the
/// report, checked against the schema.
fn run_on(db: &Db, def: &Value, input: &Value) -> (i32, Value) {
    let w = Workdir::new();
    let file = w.json("def.json", def);
    let input = input.to_string();
    let out = db.run(&w, &file, &["--input", &input]);
    assert!(
        out.code == 0 || out.code == 1,
        "{}: the run ends, the engine does not fail: {out:?}",
        db.name()
    );
    let report = assert_schema_valid(SCHEMA, &out.stdout);
    check_report_consistency(&report);
    (out.code, report)
}

/// A task's state and skip reason in a report.
fn state(report: &Value, key: &str) -> (String, Option<String>) {
    let t = task(report, key);
    (
        t["state"].as_str().unwrap_or_default().to_owned(),
        t["skip_reason"].as_str().map(str::to_owned),
    )
}

fn skipped(reason: &str) -> (String, Option<String>) {
    ("skipped".to_owned(), Some(reason.to_owned()))
}

fn ran(state: &str) -> (String, Option<String>) {
    (state.to_owned(), None)
}

fn branch() -> Value {
    json!({"name": "branch", "version": 1, "tasks": [
        {"key": "decide", "task_type": "echo"},
        {"key": "yes", "task_type": "echo", "depends_on": ["decide"],
         "when": "inputs.decide.run_input.branch == 'yes'"},
        {"key": "no", "task_type": "echo", "depends_on": ["decide"],
         "when": "inputs.decide.run_input.branch == 'no'"},
        {"key": "after_no", "task_type": "noop", "depends_on": ["no"]},
        {"key": "join", "task_type": "echo", "depends_on": ["yes", "no"], "trigger": "none_failed"},
        {"key": "strict_join", "task_type": "noop", "depends_on": ["yes", "no"]}
    ]})
}

#[test]
fn a_false_when_skips_its_branch_and_a_none_failed_join_runs_after_the_other() {
    for db in Db::all() {
        for (taken, other) in [("yes", "no"), ("no", "yes")] {
            let (code, report) = run_on(&db, &branch(), &json!({"branch": taken}));
            let name = format!("{} taking {taken}", db.name());
            assert_eq!(code, 0, "{name}: a run whose tasks succeeded or were skipped succeeds");
            assert_eq!(report["state"], "succeeded", "{name}");
            assert_eq!(state(&report, taken), ran("succeeded"), "{name}");
            assert_eq!(state(&report, other), skipped("condition_false"), "{name}");
            let after_no = if taken == "no" {
                ran("succeeded")
            } else {
                skipped("upstream_skipped")
            };
            assert_eq!(state(&report, "after_no"), after_no, "{name}");
            assert_eq!(state(&report, "join"), ran("succeeded"), "{name}");
            assert_eq!(state(&report, "strict_join"), skipped("upstream_skipped"), "{name}");
            // The join sees every dependency: the skipped one as null.
            let inputs = &task(&report, "join")["output"]["inputs"];
            assert_eq!(inputs[other], Value::Null, "{name}");
            assert_eq!(inputs[taken]["run_input"]["branch"], taken, "{name}");
            assert_eq!(
                task(&report, other)["output"],
                Value::Null,
                "{name}: a skipped task has no output"
            );
        }
    }
}

#[test]
fn a_none_failed_join_after_only_skipped_dependencies_is_skipped() {
    for db in Db::all() {
        let (code, report) = run_on(&db, &branch(), &json!({"branch": "neither"}));
        assert_eq!(code, 0, "{}", db.name());
        assert_eq!(state(&report, "yes"), skipped("condition_false"), "{}", db.name());
        assert_eq!(state(&report, "no"), skipped("condition_false"), "{}", db.name());
        assert_eq!(state(&report, "join"), skipped("upstream_skipped"), "{}", db.name());
    }
}

#[test]
fn all_done_runs_after_a_failure_and_sees_each_dependencys_state() {
    for db in Db::all() {
        let def = json!({"name": "cleanup", "version": 1, "tasks": [
            {"key": "work", "task_type": "fail", "retry": {"max_attempts": 1}},
            {"key": "report", "task_type": "noop", "depends_on": ["work"]},
            {"key": "other", "task_type": "noop"},
            {"key": "cleanup", "task_type": "echo", "depends_on": ["work", "report", "other"],
             "trigger": "all_done"},
            {"key": "after_cleanup", "task_type": "noop", "depends_on": ["cleanup"]}
        ]});
        let (code, report) = run_on(&db, &def, &json!({}));
        let name = db.name();
        assert_eq!(code, 1, "{name}: a task failed for good, so the run fails");
        assert_eq!(report["state"], "failed", "{name}");
        assert_eq!(state(&report, "work"), ran("failed"), "{name}");
        assert_eq!(task(&report, "report")["cancel_reason"], "upstream_failed", "{name}");
        assert_eq!(state(&report, "cleanup"), ran("succeeded"), "{name}");
        assert_eq!(state(&report, "after_cleanup"), ran("succeeded"), "{name}");
        let inputs = &task(&report, "cleanup")["output"]["inputs"];
        assert_eq!(inputs["work"], json!({"state": "failed", "output": null}), "{name}");
        assert_eq!(
            inputs["report"],
            json!({"state": "cancelled", "output": null}),
            "{name}"
        );
        assert_eq!(inputs["other"], json!({"state": "succeeded", "output": {}}), "{name}");
    }
}

#[test]
fn a_skipped_task_is_never_compensated() {
    for db in Db::all() {
        let def = json!({"name": "saga", "version": 1, "tasks": [
            {"key": "book", "task_type": "noop"},
            {"key": "upgrade", "task_type": "noop", "depends_on": ["book"], "when": "run_input.vip"},
            {"key": "charge", "task_type": "fail", "depends_on": ["upgrade"], "trigger": "none_failed",
             "retry": {"max_attempts": 1}},
            {"key": "undo_book", "task_type": "noop", "compensate_for": "book"},
            {"key": "undo_upgrade", "task_type": "noop", "compensate_for": "upgrade"}
        ]});
        let (code, report) = run_on(&db, &def, &json!({"vip": false}));
        let name = db.name();
        assert_eq!(code, 0, "{name}: nothing failed");
        assert_eq!(state(&report, "upgrade"), skipped("condition_false"), "{name}");
        // `charge` needs one dependency to have succeeded: none did.
        assert_eq!(state(&report, "charge"), skipped("upstream_skipped"), "{name}");
        let (code, report) = run_on(
            &db,
            &json!({"name": "saga2", "version": 1, "tasks": [
                {"key": "book", "task_type": "noop"},
                {"key": "upgrade", "task_type": "noop", "depends_on": ["book"], "when": "run_input.vip"},
                {"key": "charge", "task_type": "fail", "depends_on": ["book", "upgrade"], "trigger": "none_failed",
                 "retry": {"max_attempts": 1}},
                {"key": "undo_book", "task_type": "noop", "compensate_for": "book"},
                {"key": "undo_upgrade", "task_type": "noop", "compensate_for": "upgrade"}
            ]}),
            &json!({"vip": false}),
        );
        assert_eq!(code, 1, "{name}");
        assert_eq!(report["state"], "failed", "{name}");
        assert_eq!(state(&report, "charge"), ran("failed"), "{name}");
        let compensations: Vec<(String, String)> = report["compensations"]
            .as_array()
            .expect("compensations")
            .iter()
            .map(|c| {
                (
                    c["key"].as_str().unwrap_or_default().to_owned(),
                    c["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            compensations,
            [("undo_book".to_owned(), "succeeded".to_owned())],
            "{name}: only what ran is undone"
        );
    }
}

#[test]
fn a_when_that_cannot_be_evaluated_fails_its_task_and_a_root_when_reads_the_run_input() {
    for db in Db::all() {
        let def = json!({"name": "broken", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop", "depends_on": ["a"], "when": "inputs.a.missing == 1"},
            {"key": "c", "task_type": "noop", "depends_on": ["b"]}
        ]});
        let (code, report) = run_on(&db, &def, &json!({}));
        let name = db.name();
        assert_eq!(code, 1, "{name}");
        assert_eq!(state(&report, "b"), ran("failed"), "{name}");
        let error = task(&report, "b")["error"].as_str().unwrap_or_default().to_owned();
        assert!(error.starts_with("`when` could not be evaluated:"), "{name}: {error}");
        assert!(error.contains("missing"), "{name}: {error}");
        assert_eq!(task(&report, "c")["cancel_reason"], "upstream_failed", "{name}");

        let def = json!({"name": "gate", "version": 1, "tasks": [
            {"key": "r", "task_type": "noop", "when": "run_input.go"},
            {"key": "s", "task_type": "noop", "depends_on": ["r"]}
        ]});
        for (go, expected) in [(true, ran("succeeded")), (false, skipped("condition_false"))] {
            let (code, report) = run_on(&db, &def, &json!({"go": go}));
            assert_eq!(code, 0, "{name}");
            assert_eq!(state(&report, "r"), expected, "{name}: go = {go}");
        }
    }
}

#[test]
fn validate_names_the_path_of_a_when_that_does_not_parse_and_warns_of_a_strict_join() {
    let w = Workdir::new();
    let file = w.json("branch.json", &branch());
    let out = run(["validate".as_ref(), file.as_os_str()]);
    assert_eq!(out.code, 0, "a warning does not refuse: {out:?}");
    assert!(
        out.stdout
            .contains("warning $.tasks[5] (task 'strict_join'): joins below '"),
        "{out:?}"
    );
    assert!(
        !out.stdout.contains("(task 'join')"),
        "a none_failed join is meant: {out:?}"
    );
    let out = run([
        "validate".as_ref(),
        file.as_os_str(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    let report = assert_schema_valid("validate-report.schema.json", &out.stdout);
    assert_eq!(report["files"][0]["warnings"][0]["task"], "strict_join", "{report}");
    let file = w.json(
        "bad.json",
        &json!({"name": "bad", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop", "depends_on": ["a"], "when": "inputs.a =="}
        ]}),
    );
    let out = run(["validate".as_ref(), file.as_os_str()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stdout.contains("$.tasks[1].when: not a valid expression: at 1:"),
        "{out:?}"
    );
    let file = w.json(
        "undo.json",
        &json!({"name": "undo", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "u", "task_type": "noop", "compensate_for": "a", "when": "true"}
        ]}),
    );
    let out = run(["validate".as_ref(), file.as_os_str()]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stdout.contains("$.tasks[1]") && out.stdout.contains("always runs"),
        "{out:?}"
    );
}

#[test]
fn a_retry_decides_the_conditions_of_its_retry_set_again() {
    let w = Workdir::new();
    let file = w.json(
        "retry.json",
        &json!({"name": "retry_conditions", "version": 1, "tasks": [
            {"key": "flaky", "task_type": "fail", "config": {"fail_times": 1}, "retry": {"max_attempts": 1}},
            {"key": "gate", "task_type": "noop", "depends_on": ["flaky"], "when": "inputs.flaky.attempts >= 2"},
            {"key": "after", "task_type": "noop", "depends_on": ["gate"], "trigger": "none_failed"},
            {"key": "side", "task_type": "noop", "when": "run_input.side"}
        ]}),
    );
    let out = w.run([
        "run".as_ref(),
        file.as_os_str(),
        "--input".as_ref(),
        r#"{"side": false}"#.as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    let failed = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(state(&failed, "side"), skipped("condition_false"));
    assert_eq!(task(&failed, "gate")["cancel_reason"], "upstream_failed");
    let id = failed["run_id"].as_str().expect("run id").to_owned();

    let retried = w.run(["runs", "retry", &id, "--output", "json"]);
    assert_eq!(retried.code, 0, "{retried:?}");
    let report = assert_schema_valid(SCHEMA, &retried.stdout);
    check_report_consistency(&report);
    assert_eq!(
        (&report["state"], &report["generation"]),
        (&json!("succeeded"), &json!(2))
    );
    assert_eq!(state(&report, "flaky"), ran("succeeded"));
    assert_eq!(
        state(&report, "gate"),
        ran("succeeded"),
        "its condition was decided again"
    );
    assert_eq!(state(&report, "after"), ran("succeeded"));
    assert_eq!(
        task(&report, "side"),
        task(&failed, "side"),
        "a kept skipped task is untouched"
    );
}
