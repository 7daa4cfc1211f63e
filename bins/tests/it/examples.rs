//! The examples are real: `etl.json`'s `command` tasks are run here, in
//! topological order, with the protocol of docs/design/data-flow.md#inputs
//! (`{"inputs", "run_input"}` as JSON on stdin, a JSON object on stdout becomes
//! the output), so the shell in the example cannot rot before the embedded
//! runner arrives to run it for real.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Map, Value, json};

use crate::root;

/// Runs one `command` task's config as the built-in handler would.
fn run_command(config: &Value, stdin: &Value, tmp: &std::path::Path) -> Map<String, Value> {
    let argv: Vec<&str> = config["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|a| a.as_str().expect("argv strings"))
        .collect();
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .current_dir(root().join("examples"))
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in config.get("env").and_then(Value::as_object).into_iter().flatten() {
        cmd.env(k, v.as_str().expect("env values are strings"));
    }
    let mut child = cmd.spawn().expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&serde_json::to_vec(stdin).expect("serialise"))
        .expect("write stdin");
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{argv:?} failed: {stderr}");
    match serde_json::from_slice(&output.stdout) {
        Ok(Value::Object(map)) => map,
        other => panic!(
            "stdout is not a JSON object: {other:?}: {}",
            String::from_utf8_lossy(&output.stdout)
        ),
    }
}

#[test]
fn the_etl_example_runs_end_to_end_with_posix_sh() {
    let definition: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("examples/etl.json")).expect("read etl.json"))
            .expect("etl.json is JSON");
    let out = crate::run(["graph", "examples/etl.json", "--format", "json"]);
    let graph: Value = serde_json::from_str(&out.stdout).expect("graph json");
    let tasks: BTreeMap<&str, &Value> = definition["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| (t["key"].as_str().expect("key"), t))
        .collect();

    let tmp = tempfile::tempdir().expect("temp dir");
    let mut outputs: BTreeMap<String, Value> = BTreeMap::new();
    for key in graph["order"].as_array().expect("order") {
        let task = tasks[key.as_str().expect("key")];
        assert_eq!(task["task_type"], "command");
        let inputs: Map<String, Value> = task
            .get("depends_on")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|d| {
                let d = d.as_str().expect("dependency");
                (d.to_owned(), outputs[d].clone())
            })
            .collect();
        let output = run_command(&task["config"], &json!({"inputs": inputs, "run_input": {}}), tmp.path());
        outputs.insert(key.as_str().expect("key").to_owned(), Value::Object(output));
    }

    assert_eq!(outputs["extract"]["rows"], 5);
    assert_eq!(outputs["profile"]["lines"], 6);
    assert_eq!(
        outputs["transform"]["totals"],
        json!({"east": 200, "north": 165, "south": 115})
    );
    let report_path = outputs["load"]["report"].as_str().expect("report path");
    assert!(
        report_path.starts_with(&tmp.path().display().to_string()),
        "{report_path}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(report_path).expect("report written")).expect("report is JSON");
    assert_eq!(
        report,
        json!({"totals": {"east": 200, "north": 165, "south": 115}, "source_lines": 6})
    );
}

#[test]
fn the_map_example_runs_each_file_and_publishes_them_in_order() {
    let definition: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("examples/map.json")).expect("read map.json"))
            .expect("map.json is JSON");
    let w = crate::run::Workdir::new();
    let file = w.json("map.json", &definition);
    let out = w.run(["run".as_ref(), file.as_os_str(), "--output".as_ref(), "json".as_ref()]);
    assert_eq!(out.code, 0, "{out:?}");
    let report: Value = serde_json::from_str(&out.stdout).expect("report");
    assert_eq!(
        crate::map::collected_items(&report, "thumbnail"),
        crate::map::EXAMPLE_FILES
    );
}

#[test]
fn the_examples_use_only_built_in_task_types() {
    for name in ["diamond", "etl", "map", "release", "saga"] {
        let path = root().join(format!("examples/{name}.json"));
        let definition: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
        for task in definition["tasks"].as_array().expect("tasks") {
            let task_type = task["task_type"].as_str().expect("task_type");
            assert!(
                ["noop", "echo", "sleep", "fail", "command"].contains(&task_type),
                "{name}: {task_type}"
            );
        }
    }
}
