//! `flowforge validate`: the examples, every row of the shape/graph boundary
//! table (text and JSON), the size limit, unreadable files, a 9 000-task
//! chain, the report schema and usage errors.

use serde_json::{Value, json};

use predicates::prelude::*;

use crate::{Files, assert_schema_valid, flowforge, run};

const EXAMPLES: [&str; 4] = [
    "examples/diamond.json",
    "examples/etl.json",
    "examples/release.json",
    "examples/saga.json",
];

#[test]
fn every_example_is_valid() {
    for example in EXAMPLES {
        let out = run(["validate", example]);
        assert_eq!(out.code, 0, "{example}: {out:?}");
        assert!(
            out.stdout.starts_with(&format!("✓ {example}: valid (fingerprint ")),
            "{out:?}"
        );
        assert!(out.stderr.is_empty(), "{out:?}");
    }
    let all = run(["validate", EXAMPLES[0], EXAMPLES[1], EXAMPLES[2], EXAMPLES[3]]);
    assert_eq!(all.code, 0, "{all:?}");
    assert_eq!(all.stdout.lines().count(), 4);
}

#[test]
fn the_json_report_of_the_examples_matches_its_schema() {
    let out = run([
        "validate",
        "--output",
        "json",
        EXAMPLES[0],
        EXAMPLES[1],
        EXAMPLES[2],
        EXAMPLES[3],
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let report = assert_schema_valid("validate-report.schema.json", &out.stdout);
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 4);
    for (file, name) in files.iter().zip(EXAMPLES) {
        assert_eq!(file["file"], name);
        assert_eq!(file["valid"], true);
        assert_eq!(file["errors"], json!([]));
        let fingerprint = file["fingerprint"].as_str().unwrap();
        // The text report shows the same fingerprint.
        let text = run(["validate", name]);
        assert!(text.stdout.contains(fingerprint), "{text:?}");
    }
}

/// One expected error: kind, JSONPath, task, a fragment of the message.
type Expected<'a> = (&'a str, &'a str, Option<&'a str>, &'a str);

/// Validates `payload` from a file and checks both reports: exit 2, and
/// exactly the `expected` errors (text lines and JSON entries).
fn check(payload: Value, expected: &[Expected<'_>]) {
    let files = Files::new();
    let path = files.json("bad.json", &payload);
    let shown = path.display().to_string();

    let text = run(["validate".as_ref(), path.as_os_str()]);
    assert_eq!(text.code, 2, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{text:?}");
    for (line, (kind, jsonpath, task, fragment)) in lines.iter().zip(expected) {
        let task = task.map(|t| format!(" (task '{t}')")).unwrap_or_default();
        let prefix = format!("{shown}: {kind} {jsonpath}{task}: ");
        assert!(line.starts_with(&prefix), "expected `{prefix}…`, got `{line}`");
        assert!(line.contains(fragment), "expected `{fragment}` in `{line}`");
    }

    let json = run([
        "validate".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
        path.as_os_str(),
    ]);
    assert_eq!(json.code, 2, "{json:?}");
    let report = assert_schema_valid("validate-report.schema.json", &json.stdout);
    let file = &report["files"][0];
    assert_eq!(file["valid"], false);
    assert_eq!(file["fingerprint"], Value::Null);
    let errors = file["errors"].as_array().expect("errors array");
    assert_eq!(errors.len(), expected.len(), "{errors:?}");
    for (error, (kind, jsonpath, task, fragment)) in errors.iter().zip(expected) {
        assert_eq!(error["kind"], *kind, "{error}");
        assert_eq!(error["path"], *jsonpath, "{error}");
        assert_eq!(error["task"], task.map_or(Value::Null, |t| json!(t)), "{error}");
        assert!(
            error["message"].as_str().expect("message").contains(fragment),
            "{error}"
        );
    }
}

// Spec 001's boundary table, row by row.

#[test]
fn empty_tasks_is_a_shape_error_at_tasks() {
    check(
        json!({"name": "w", "version": 1, "tasks": []}),
        &[("shape", "$.tasks", None, "")],
    );
}

#[test]
fn a_missing_name_is_a_shape_error_at_the_root() {
    check(
        json!({"version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        &[("shape", "$", None, "\"name\"")],
    );
}

#[test]
fn duplicate_keys_are_a_graph_error_at_the_second_task() {
    check(
        json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"}, {"key": "a", "task_type": "noop"}]}),
        &[("graph", "$.tasks[1]", Some("a"), "duplicate task key 'a'")],
    );
}

#[test]
fn an_unknown_dependency_is_a_graph_error_naming_it() {
    check(
        json!({"name": "w", "version": 1, "tasks": [
            {"key": "extract", "task_type": "noop"},
            {"key": "load", "task_type": "noop", "depends_on": ["ghost"]}]}),
        &[(
            "graph",
            "$.tasks[1]",
            Some("load"),
            "task 'load' depends on unknown task 'ghost'",
        )],
    );
}

#[test]
fn a_cycle_is_a_graph_error_with_its_path() {
    check(
        json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop", "depends_on": ["b"]},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]}]}),
        &[(
            "graph",
            "$.tasks[0]",
            Some("a"),
            "dependency cycle detected: a -> b -> a",
        )],
    );
}

#[test]
fn a_payload_both_malformed_and_cyclic_gets_only_the_shape_error() {
    check(
        json!({"name": "w", "version": 1, "owner": "me", "tasks": [
            {"key": "a", "task_type": "noop", "depends_on": ["b"]},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]}]}),
        &[("shape", "$", None, "owner")],
    );
}

#[test]
fn a_wrong_field_is_a_shape_error_at_its_path() {
    check(
        json!({"name": "w", "version": 1, "tasks": [{"key": "", "task_type": "noop"}]}),
        &[
            ("shape", "$.tasks[0].key", None, ""),
            ("shape", "$.tasks[0].key", None, ""),
        ],
    );
}

#[test]
fn a_file_that_is_not_json_is_a_json_error() {
    let files = Files::new();
    let path = files.write("broken.json", "{\"name\": ");
    let out = run([
        "validate".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
        path.as_os_str(),
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    let report = assert_schema_valid("validate-report.schema.json", &out.stdout);
    assert_eq!(report["files"][0]["errors"][0]["kind"], "json");
    assert_eq!(report["files"][0]["errors"][0]["path"], "$");
}

#[test]
fn a_9000_task_chain_is_valid() {
    let tasks: Vec<Value> = (0..9_000)
        .map(|i| {
            let depends_on: Vec<String> = if i == 0 { vec![] } else { vec![format!("t{}", i - 1)] };
            json!({"key": format!("t{i}"), "task_type": "noop", "depends_on": depends_on})
        })
        .collect();
    let files = Files::new();
    let path = files.json("chain.json", &json!({"name": "chain", "version": 1, "tasks": tasks}));
    let out = run(["validate".as_ref(), path.as_os_str()]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains(": valid (fingerprint "), "{out:?}");
}

#[test]
fn a_file_over_2_mib_is_refused() {
    let files = Files::new();
    let mut body = vec![b' '; 3 * 1024 * 1024];
    body[0] = b'{';
    *body.last_mut().unwrap() = b'}';
    let path = files.write("huge.json", body);
    let out = run([
        "validate".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
        path.as_os_str(),
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    let report = assert_schema_valid("validate-report.schema.json", &out.stdout);
    let error = &report["files"][0]["errors"][0];
    // The body limit is part of the shape (docs/design/definitions.md#limits).
    assert_eq!(error["kind"], "shape", "{error}");
    assert_eq!(
        error["message"], "definition is 3145728 bytes; the limit is 2097152",
        "{error}"
    );
    let text = run(["validate".as_ref(), path.as_os_str()]);
    assert_eq!(text.code, 2);
    assert!(text.stdout.contains("the limit is 2097152"), "{text:?}");
}

#[test]
fn a_missing_file_is_an_io_error() {
    let out = run(["validate", "examples/no-such-file.json"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stdout
            .starts_with("examples/no-such-file.json: io: cannot read file: No such file or directory"),
        "{out:?}"
    );
    let json = run(["validate", "--output", "json", "examples/no-such-file.json"]);
    assert_eq!(json.code, 2);
    let report = assert_schema_valid("validate-report.schema.json", &json.stdout);
    let error = &report["files"][0]["errors"][0];
    assert_eq!(
        (&error["kind"], &error["path"]),
        (&json!("io"), &Value::Null),
        "{error}"
    );
}

#[test]
fn a_folder_is_an_io_error() {
    let out = run(["validate", "examples"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.starts_with("examples: io: cannot read file: "), "{out:?}");
}

#[test]
fn one_invalid_file_among_valid_ones_exits_2_and_reports_each() {
    let out = run([
        "validate",
        "--output",
        "json",
        "examples/diamond.json",
        "examples/missing.json",
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    let report = assert_schema_valid("validate-report.schema.json", &out.stdout);
    assert_eq!(report["files"][0]["valid"], true);
    assert_eq!(report["files"][1]["valid"], false);
}

#[test]
fn bad_usage_exits_2() {
    for args in [
        &["validate"][..],
        &["validate", "--output", "xml", "examples/etl.json"],
        &["validate", "--bogus", "examples/etl.json"],
        &["frobnicate"],
        &[],
    ] {
        flowforge(args)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains("--help"));
    }
}

#[test]
fn help_and_version_exit_0() {
    for args in [&["--help"][..], &["validate", "--help"], &["--version"]] {
        let out = run(args);
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
    }
}
