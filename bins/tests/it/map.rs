//! Mapped tasks end to end (docs/design/map.md, issue 18): the same
//! `flowforge run`, on SQLite and on PostgreSQL alike, maps a task over 0,
//! 1 and 1 000 items (skipped `empty_map`; one child; a thousand children
//! under a concurrency limit, their outputs collected in index order),
//! retries a child that fails once, fails the mapped task when a child
//! fails for good (cancelling its dependents and compensating what ran),
//! fails a map whose source is not an array or is too long, or whose
//! children's outputs are too large to collect, and `validate` refuses an
//! `over` that reads no dependency.

use serde_json::{Value, json};

use crate::poison::Db;
use crate::run::{SCHEMA, Workdir, check_report_consistency, task};
use crate::{assert_schema_valid, run};

/// `flowforge run` of `def` on `db`: the exit code and the report,
/// checked against the schema.
fn run_on(db: &Db, def: &Value) -> (i32, Value) {
    run_with(db, def, &[])
}

/// [`run_on`], with more arguments.
fn run_with(db: &Db, def: &Value, args: &[&str]) -> (i32, Value) {
    let w = Workdir::new();
    let file = w.json("def.json", def);
    let out = db.run(&w, &file, args);
    assert!(
        out.code == 0 || out.code == 1,
        "{}: the run ends, the engine does not fail: {out:?}",
        db.name()
    );
    let report = assert_schema_valid(SCHEMA, &out.stdout);
    check_report_consistency(&report);
    (out.code, report)
}

/// Workflow `name`: `src` outputs `{"items": items}`; `each` echoes every item (at most
/// `concurrency` at once); `after` reads the collected outputs; `undo_src`
/// compensates `src`.
fn mapped(name: &str, items: &Value, each: Value) -> Value {
    json!({"name": name, "version": 1, "tasks": [
        {"key": "src", "task_type": "noop", "config": {"output": {"items": items}}},
        each,
        {"key": "after", "task_type": "echo", "depends_on": ["each"]},
        {"key": "undo_src", "task_type": "noop", "compensate_for": "src"}
    ]})
}

fn echo_each(concurrency: u32) -> Value {
    json!({"key": "each", "task_type": "echo", "depends_on": ["src"],
           "map": {"over": "$.tasks.src.output.items", "concurrency": concurrency}})
}

/// The files of `examples/map.json`, in the order `list` gives them.
pub(crate) const EXAMPLE_FILES: [&str; 6] = [
    "beach.jpg",
    "forest.jpg",
    "harbour.jpg",
    "mountain.jpg",
    "city.jpg",
    "desert.jpg",
];

/// The items a mapped task's collected output shows, in its order (each
/// child an `echo`).
pub(crate) fn collected_items<'r>(report: &'r Value, key: &str) -> Vec<&'r str> {
    task(report, key)["output"]
        .as_array()
        .expect("the children's outputs")
        .iter()
        .map(|o| o["item"].as_str().expect("an item"))
        .collect()
}

fn events_of<'r>(report: &'r Value, key: &str) -> Vec<&'r str> {
    report["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["task"] == key)
        .filter_map(|e| e["transition"].as_str())
        .collect()
}

#[test]
fn a_map_over_0_1_and_1000_items_runs_each_item_and_collects_in_order() {
    for db in Db::all() {
        let name = db.name();
        let (code, report) = run_on(&db, &mapped("map-none", &json!([]), echo_each(4)));
        assert_eq!(code, 0, "{name}: a run whose tasks succeeded or were skipped succeeds");
        assert_eq!(task(&report, "each")["state"], "skipped", "{name}");
        assert_eq!(task(&report, "each")["skip_reason"], "empty_map", "{name}");
        assert_eq!(task(&report, "after")["skip_reason"], "upstream_skipped", "{name}");

        let (code, report) = run_on(&db, &mapped("map-one", &json!([{"n": 7}]), echo_each(4)));
        assert_eq!(code, 0, "{name}: {report:#}");
        let each = task(&report, "each");
        assert_eq!(each["state"], "succeeded", "{name}");
        let outputs = each["output"].as_array().expect("an array of the children's outputs");
        assert_eq!(outputs.len(), 1, "{name}");
        assert_eq!(outputs[0]["item"], json!({"n": 7}), "{name}");
        assert_eq!(outputs[0]["index"], 0, "{name}");
        assert_eq!(
            outputs[0]["inputs"]["src"]["items"],
            json!([{"n": 7}]),
            "{name}: a child gets its mapped task's inputs too"
        );
        assert_eq!(
            events_of(&report, "each[0]"),
            ["dependencies_satisfied", "claim", "succeed"],
            "{name}"
        );
        assert_eq!(events_of(&report, "each"), ["collect"], "{name}");

        // Each `echo` child shows every item in its inputs: a thousand of
        // them take more than the default output limit together.
        let items: Vec<Value> = (0..1000).map(|i| json!(i * 7)).collect();
        let (code, report) = run_with(
            &db,
            &mapped("map-thousand", &json!(items), echo_each(50)),
            &[
                "--max-task-output-bytes",
                "16000000",
                "--max-task-inputs-bytes",
                "16000000",
            ],
        );
        assert_eq!(code, 0, "{name}: {}", task(&report, "each"));
        assert_eq!(report["state"], "succeeded", "{name}");
        let outputs = task(&report, "each")["output"].as_array().expect("outputs").clone();
        assert_eq!(outputs.len(), 1000, "{name}");
        for (i, output) in outputs.iter().enumerate() {
            assert_eq!(output["index"], i, "{name}: index order");
            assert_eq!(output["item"], items[i], "{name}: child {i} ran for its own item");
        }
        let collected = &task(&report, "after")["output"]["inputs"]["each"];
        assert_eq!(collected.as_array().map(Vec::len), Some(1000), "{name}");
        assert!(
            report["compensations"]
                .as_array()
                .is_none_or(|c| c.iter().all(|c| c["state"] != "succeeded"))
        );
    }
}

#[test]
fn a_child_that_fails_then_succeeds_on_retry_is_collected() {
    for db in Db::all() {
        let name = db.name();
        let each = json!({"key": "each", "task_type": "fail", "depends_on": ["src"],
            "config": {"fail_times": 1}, "retry": {"max_attempts": 2, "delay_seconds": 0},
            "map": {"over": "$.tasks.src.output.items"}});
        let (code, report) = run_on(&db, &mapped("map-retry", &json!(["a", "b", "c"]), each));
        assert_eq!(code, 0, "{name}: {report:#}");
        assert_eq!(
            task(&report, "each")["output"],
            json!([{"attempts": 2}, {"attempts": 2}, {"attempts": 2}]),
            "{name}: every child succeeded on its second attempt"
        );
        for i in 0..3 {
            let key = format!("each[{i}]");
            let events = events_of(&report, &key);
            assert!(
                events.contains(&"schedule_retry"),
                "{name}: {key} retried on its own: {events:?}"
            );
            assert_eq!(events.last(), Some(&"succeed"), "{name}: {key}");
        }
    }
}

#[test]
fn a_child_that_fails_for_good_fails_its_mapped_task_and_the_run_rolls_back() {
    for db in Db::all() {
        let name = db.name();
        let each = json!({"key": "each", "task_type": "fail", "depends_on": ["src"],
            "config": {"message": "bad item"}, "retry": {"max_attempts": 1},
            "map": {"over": "$.tasks.src.output.items", "concurrency": 1}});
        let (code, report) = run_on(&db, &mapped("map-child-fails", &json!(["a", "b", "c"]), each));
        assert_eq!(code, 1, "{name}: {report:#}");
        assert_eq!(report["state"], "failed", "{name}");
        let each = task(&report, "each");
        assert_eq!(each["state"], "failed", "{name}");
        assert!(
            each["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("child each[0] failed: bad item")),
            "{name}: the error names the child: {each}"
        );
        assert_eq!(events_of(&report, "each"), ["fail_map"], "{name}");
        assert_eq!(
            events_of(&report, "each[1]"),
            ["cancel_pending"],
            "{name}: a child held back by the limit never runs"
        );
        assert_eq!(task(&report, "after")["cancel_reason"], "upstream_failed", "{name}");
        let undone: Vec<(&str, &str)> = report["compensations"]
            .as_array()
            .expect("compensations")
            .iter()
            .map(|c| (c["key"].as_str().unwrap_or(""), c["state"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(
            undone,
            [("undo_src", "succeeded")],
            "{name}: the usual rollback follows"
        );
    }
}

#[test]
fn a_map_whose_source_is_not_an_array_or_too_long_fails_for_good() {
    for db in Db::all() {
        let name = db.name();
        let (code, report) = run_on(&db, &mapped("map-object", &json!({"a": 1}), echo_each(2)));
        assert_eq!(code, 1, "{name}");
        let each = task(&report, "each");
        assert_eq!(each["state"], "failed", "{name}");
        assert_eq!(
            each["error"], "map_source_not_array: $.tasks.src.output.items is an object, not an array",
            "{name}"
        );
        assert_eq!(each["attempt"], 1, "{name}: failed for good, never retried");
        assert_eq!(task(&report, "after")["cancel_reason"], "upstream_failed", "{name}");

        let each = json!({"key": "each", "task_type": "echo", "depends_on": ["src"],
            "map": {"over": "$.tasks.src.output.items", "max_items": 2}});
        let (code, report) = run_on(&db, &mapped("map-too-long", &json!([1, 2, 3]), each));
        assert_eq!(code, 1, "{name}");
        assert_eq!(
            task(&report, "each")["error"],
            "map_too_large: $.tasks.src.output.items holds 3 items, more than max_items 2",
            "{name}"
        );

        let items: Vec<u32> = (0..100).collect();
        let (code, report) = run_with(
            &db,
            &mapped("map-output-too-large", &json!(items), echo_each(10)),
            &["--max-task-output-bytes", "10000"],
        );
        assert_eq!(code, 1, "{name}");
        let error = task(&report, "each")["error"].as_str().unwrap_or_default().to_owned();
        assert!(
            error.starts_with("map_output_too_large: its children's outputs add up to ")
                && error.ends_with("bytes of JSON; the limit (max_task_output_bytes) is 10000 bytes"),
            "{name}: {error}"
        );
    }
}

#[test]
fn validate_refuses_a_map_over_anything_but_a_dependency() {
    let w = Workdir::new();
    let cases = [
        (
            json!([
                {"key": "a", "task_type": "noop"},
                {"key": "b", "task_type": "noop"},
                {"key": "m", "task_type": "echo", "depends_on": ["a"], "map": {"over": "$.tasks.b.output"}}
            ]),
            "$.tasks[2] (task 'm'): task 'm': map.over reads task 'b', which is not one of its dependencies",
        ),
        (
            json!([
                {"key": "a", "task_type": "noop"},
                {"key": "m", "task_type": "echo", "depends_on": ["a"], "map": {"over": "$.a.items"}}
            ]),
            "$.tasks[1].map.over: map.over must read `$.tasks.<key>.output…`",
        ),
        (
            json!([
                {"key": "a", "task_type": "noop"},
                {"key": "m", "task_type": "echo", "depends_on": ["a"], "map": {"over": "$.tasks.a.output"}},
                {"key": "m[0]", "task_type": "noop", "depends_on": ["a"]}
            ]),
            "child of the mapped task 'm'",
        ),
        (
            json!([
                {"key": "a", "task_type": "noop"},
                {"key": "m", "task_type": "echo", "depends_on": ["a"], "trigger": "all_done",
                 "map": {"over": "$.tasks.a.output"}}
            ]),
            "cannot declare another trigger",
        ),
    ];
    for (i, (tasks, expected)) in cases.into_iter().enumerate() {
        let file = w.json(
            &format!("case-{i}.json"),
            &json!({"name": format!("case-{i}"), "version": 1, "tasks": tasks}),
        );
        let out = run(["validate".as_ref(), file.as_os_str()]);
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stdout.contains(expected), "{expected}: {out:?}");
    }
}
