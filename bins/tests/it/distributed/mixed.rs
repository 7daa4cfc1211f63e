//! Workers serving different task types on one queue: a worker started
//! without `--allow-command` neither advertises nor takes `command`, so
//! the `command` dispatches it receives go back to the queue for a worker
//! that runs them, and `submit` refuses `command` while no live worker
//! serves it.

use flowforge::RunState;
use flowforge_domain::TaskRunState;
use serde_json::json;

use super::cluster::Cluster;
use super::{served, settled};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_tasks_all_succeed_beside_a_worker_that_does_not_serve_them() {
    let Some(mut cluster) = Cluster::migrated("mixed").await else {
        return;
    };
    let store = cluster.db.store().await;
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    // The restrictive worker has more slots, so it receives most dispatches.
    cluster.spawn("restrictive", ["worker", "--concurrency", "2"]);
    let types = served(&store, "echo").await;
    assert!(
        !types.contains("command"),
        "advertised without --allow-command: {types:?}"
    );

    let tasks: Vec<_> = (0..8)
        .map(|i| {
            json!({"key": format!("c{i}"), "task_type": "command",
                   "retry": {"max_attempts": 1}, "timeout_seconds": 60,
                   "config": {"argv": ["sh", "-c", format!("echo '{{\"n\": {i}}}'")]}})
        })
        .collect();
    let file = cluster.json(
        "commands.json",
        &json!({"name": "commands", "version": 1, "tasks": tasks}),
    );
    let refused = cluster.run(["submit".as_ref(), file.as_os_str()]).await;
    assert_eq!(refused.code, 2, "no live worker serves command: {refused:?}");
    assert!(refused.stderr.contains("command"), "names the type: {refused:?}");

    cluster.spawn("permissive", ["worker", "--concurrency", "1", "--allow-command"]);
    served(&store, "command").await;
    let run = cluster.submit(&file).await;
    let stored = settled(&store, run).await;
    assert_eq!(stored.summary.state, RunState::Succeeded, "{}", cluster.logs());
    for (i, t) in stored.tasks.iter().enumerate() {
        assert_eq!(t.state, TaskRunState::Succeeded, "{t:?}");
        assert_eq!(t.attempt, 1, "never failed on the restrictive worker: {t:?}");
        assert!(t.output.as_ref().is_some_and(|o| o["n"].is_u64()), "{i}: {t:?}");
    }
}
