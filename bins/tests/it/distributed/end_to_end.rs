//! End to end across processes (issue 5): `flowforge migrate`, then two
//! workers, two schedulers and two publishers as separate `flowforge`
//! processes; `flowforge workers list` shows both workers and their task
//! types; `flowforge submit --wait --output json` of a 50-task
//! fan-out/fan-in (exit 0) and of the saga example (exit 1) prints the
//! report the embedded mode prints for the same definition and input, and
//! the map example's children run across the workers, collected in index
//! order; a
//! task type neither built in nor served by a live worker, or a timeout
//! above what the broker lets a worker hold, is refused (exit 2); and every
//! process stops with exit 0 on SIGTERM.

use std::path::Path;

use flowforge_ports::{RunStore, WorkerRegistry};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::cluster::Cluster;
use super::{assert_same_report, comparable, eventually};
use crate::{Outcome, assert_schema_valid, root};

const SCHEMA: &str = "run-report.schema.json";

/// A 50-task fan-out/fan-in: one root, 48 branches that each see its
/// output, one join that sees all 48.
fn fan_out_fan_in() -> Value {
    let mut tasks = vec![json!({"key": "root", "task_type": "noop", "config": {"output": {"batch": 7}}})];
    for i in 0..48 {
        tasks.push(json!({"key": format!("branch_{i:02}"), "task_type": "echo", "depends_on": ["root"]}));
    }
    let branches: Vec<String> = (0..48).map(|i| format!("branch_{i:02}")).collect();
    tasks.push(json!({"key": "join", "task_type": "echo", "depends_on": branches}));
    json!({"name": "fan-out-fan-in", "version": 1, "tasks": tasks})
}

/// The embedded mode's report for `file`: `flowforge run` over a SQLite
/// file of the cluster's temp folder.
async fn embedded_report(cluster: &Cluster, file: &Path, expected_code: i32) -> Value {
    let db = format!("sqlite://{}", cluster.dir().join("embedded.db").display());
    let out = cluster
        .run([
            "run".as_ref(),
            file.as_os_str(),
            "--db".as_ref(),
            db.as_ref(),
            "--output".as_ref(),
            "json".as_ref(),
        ])
        .await;
    assert_eq!(out.code, expected_code, "embedded run of {}: {out:?}", file.display());
    assert_schema_valid(SCHEMA, &out.stdout)
}

/// `flowforge submit FILE --wait --output json` through the cluster.
async fn submit_and_wait(cluster: &Cluster, file: &Path) -> Outcome {
    cluster
        .run([
            "submit".as_ref(),
            file.as_os_str(),
            "--wait".as_ref(),
            "--output".as_ref(),
            "json".as_ref(),
        ])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_across_processes_report_what_the_embedded_mode_reports() {
    let Some(mut cluster) = Cluster::empty("endtoend").await else {
        return;
    };
    // `migrate` applies the schema, once or twice.
    for _ in 0..2 {
        let out = cluster.run(["migrate"]).await;
        assert_eq!(out.code, 0, "{out:?}");
        assert!(out.stdout.contains("is migrated"), "{out:?}");
    }
    let store = cluster.db.store().await;
    // Two workers, and a second scheduler and publisher beside the first: any
    // number of each may run side by side
    // (docs/design/scheduler.md#several-schedulers).
    let processes = [
        cluster.spawn("worker-1", ["worker", "--concurrency", "2"]),
        cluster.spawn("worker-2", ["worker", "--concurrency", "2"]),
        cluster.spawn("scheduler-1", ["scheduler"]),
        cluster.spawn("publisher-1", ["publisher"]),
        cluster.spawn("scheduler-2", ["scheduler"]),
        cluster.spawn("publisher-2", ["publisher"]),
    ];
    let worker_pids = [cluster.pid(processes[0]), cluster.pid(processes[1])];

    // Both workers registered, with the task types they serve.
    eventually("both workers to register", || async {
        let live = store.list_workers().await.expect("list workers");
        worker_pids
            .iter()
            .all(|pid| live.iter().any(|w| w.pid == *pid && w.stopped_at.is_none()))
            .then_some(())
    })
    .await;
    let listed = cluster.run(["workers", "list", "--output", "json"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let listed: Value = serde_json::from_str(&listed.stdout).expect("a JSON list");
    let listed = listed.as_array().expect("a JSON list");
    assert_eq!(listed.len(), 2, "{listed:#?}");
    for pid in worker_pids {
        let w = listed
            .iter()
            .find(|w| w["pid"] == pid)
            .unwrap_or_else(|| panic!("worker {pid} is not listed: {listed:#?}"));
        assert_eq!(w["task_types"], json!(["echo", "fail", "noop", "sleep"]), "{w}");
        assert_eq!(w["concurrency"], 2);
        assert!(w["stopped_at"].is_null() && w["last_seen_at"].is_string(), "{w}");
    }
    let text = cluster.run(["workers", "list"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    for w in listed {
        let id = w["id"].as_str().expect("an id");
        let line = text
            .stdout
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} not in {text:?}"));
        assert!(
            line.contains("running") && line.contains(" echo,fail,noop,sleep"),
            "{line}"
        );
    }

    // A task type nobody serves is refused before anything is stored.
    let unknown = cluster.json(
        "unknown.json",
        &json!({"name": "unknown", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "teleport", "depends_on": ["a"]}
        ]}),
    );
    let refused = cluster.run(["submit".as_ref(), unknown.as_os_str()]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("teleport"), "names the type: {refused:?}");
    assert!(refused.stdout.is_empty(), "{refused:?}");

    // So is a task timeout longer than a worker can hold a delivery (RabbitMQ's
    // consumer timeout, docs/design/outbox-and-queues.md#consumer-timeout).
    let too_long = cluster.json(
        "too-long.json",
        &json!({"name": "too-long", "version": 1, "tasks": [
            {"key": "slow", "task_type": "sleep", "timeout_seconds": 3600, "config": {"seconds": 1}}
        ]}),
    );
    let refused = cluster.run(["submit".as_ref(), too_long.as_os_str()]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("'slow'"), "names the task: {refused:?}");
    assert!(
        store.list_runs(10).await.expect("list runs").is_empty(),
        "nothing was started"
    );

    // A 50-task fan-out/fan-in succeeds (exit 0) ...
    let fan = cluster.json("fan.json", &fan_out_fan_in());
    let out = submit_and_wait(&cluster, &fan).await;
    assert_eq!(out.code, 0, "{out:?}\n{}", cluster.logs());
    let fanned = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(fanned["state"], "succeeded");
    assert_eq!(fanned["tasks"].as_array().map(Vec::len), Some(50));
    let join = &fanned["tasks"][49];
    assert_eq!(join["key"], "join");
    assert_eq!(join["output"]["inputs"].as_object().map(serde_json::Map::len), Some(48));
    let embedded = embedded_report(&cluster, &fan, 0).await;
    assert_same_report(&comparable(&fanned), &comparable(&embedded), "fan-out/fan-in");

    // ... and the saga fails and compensates (exit 1), the same way.
    let saga = root().join("examples/saga.json");
    let out = submit_and_wait(&cluster, &saga).await;
    assert_eq!(out.code, 1, "{out:?}\n{}", cluster.logs());
    let failed = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(failed["state"], "failed");
    let embedded = embedded_report(&cluster, &saga, 1).await;
    assert_same_report(&comparable(&failed), &comparable(&embedded), "saga.json");

    // A mapped task's children are dispatched and claimed across the
    // workers like any task, and collected in index order
    // (docs/design/map.md).
    let map = root().join("examples/map.json");
    let out = submit_and_wait(&cluster, &map).await;
    assert_eq!(out.code, 0, "{out:?}\n{}", cluster.logs());
    let mapped = assert_schema_valid(SCHEMA, &out.stdout);
    assert_eq!(
        crate::map::collected_items(&mapped, "thumbnail"),
        crate::map::EXAMPLE_FILES,
        "{mapped:#}"
    );
    let embedded = embedded_report(&cluster, &map, 0).await;
    assert_same_report(&comparable(&mapped), &comparable(&embedded), "map.json");

    // Every attempt was claimed by one of the two worker processes.
    let worked: std::collections::BTreeSet<u32> = [&fanned, &failed, &mapped]
        .iter()
        .flat_map(|r| r["events"].as_array().into_iter().flatten())
        .filter(|e| e["transition"] == "claim")
        .filter_map(|e| e["worker"].as_str().and_then(super::cluster::worker_pid))
        .collect();
    assert!(
        !worked.is_empty() && worked.iter().all(|pid| worker_pids.contains(pid)),
        "claims by unknown workers: {worked:?}"
    );

    // Every process stops gracefully on SIGTERM.
    for id in processes {
        cluster.signal(id, Signal::SIGTERM);
    }
    for id in processes {
        assert_eq!(cluster.wait_exit(id).await, 0, "{}", cluster.stderr(id));
    }
    assert_eq!(cluster.broker.ready().await, Some(0), "nothing left on the queue");
}
