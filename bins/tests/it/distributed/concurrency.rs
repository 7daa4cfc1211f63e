//! Concurrency limits in the distributed mode (docs/design/concurrency.md):
//! with the scheduler and publisher as processes and a worker with more
//! slots than the limit, twenty runs queued on one key over PostgreSQL
//! never have three running, as their event history shows; and
//! `cancel_in_progress` cancels and rolls back the older run before the
//! newer one starts.

use std::time::Duration;

use flowforge::{HandlerError, Service, TaskContext, TaskTypes};
use flowforge_domain::{Priority, RunState, TaskRunState};
use serde_json::{Value, json};

use super::cluster::{Cluster, SdkWorker};
use super::{definition, detail, eventually, task};
use crate::scenarios::concurrency::{most_at_once, run_interval};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_queued_runs_on_one_key_never_have_three_running_over_postgres() {
    let Some(mut cluster) = Cluster::migrated("concurrency").await else {
        return;
    };
    let worker = cluster
        .worker("limited-worker", 4)
        .handler_fn("limited.job", |_ctx: TaskContext| async move {
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            Ok::<Value, HandlerError>(json!({}))
        })
        .build()
        .await
        .expect("the worker builds");
    let serving = SdkWorker::serve(worker);

    let store = cluster.db.store().await;
    super::served(&store, "limited.job").await;
    cluster.spawn("publisher", ["publisher"]);
    cluster.spawn("scheduler", ["scheduler"]);
    let service = Service::new(store.clone());
    let def = definition(&json!({"name": "limited", "version": 1,
    "concurrency": [{"key": "$.customer", "max": 2}],
    "tasks": [
        {"key": "a", "task_type": "limited.job"},
        {"key": "b", "task_type": "limited.job", "depends_on": ["a"]}
    ]}));
    let published = service
        .publish(&def, &TaskTypes::LiveWorkers)
        .await
        .expect("publish: the worker's type is live");
    let mut runs = Vec::new();
    for n in 0..20 {
        runs.push(
            service
                .start(published.id, json!({"customer": "acme", "n": n}), Priority::DEFAULT)
                .await
                .expect("start")
                .id,
        );
    }

    let mut details = Vec::new();
    for run in runs {
        details.push(
            eventually("every limited run to finish", || async {
                let d = detail(&store, run).await;
                (d.summary.state == RunState::Succeeded).then_some(d)
            })
            .await,
        );
    }
    let intervals: Vec<(i64, i64)> = details.iter().map(run_interval).collect();
    assert_eq!(most_at_once(&intervals), 2, "{}", cluster.logs());

    serving.stop().await;
}

/// `cancel_in_progress` over PostgreSQL: the newer run's pass requests the
/// older run's cancel; the remote worker sees it at its next heartbeat,
/// the older run's finished task is rolled back, and only then does the
/// newer run start and succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_progress_cancels_and_rolls_back_the_older_run_over_postgres() {
    let Some(mut cluster) = Cluster::migrated("cancel-in-progress").await else {
        return;
    };
    let worker = cluster
        .worker("limit-worker", 2)
        // Heartbeats a third of the lease apart: the cancel arrives soon.
        .lease(Duration::from_secs(3))
        .handler_fn("lim.step", |_ctx: TaskContext| async move {
            Ok::<Value, HandlerError>(json!({}))
        })
        .handler_fn("lim.hold", |ctx: TaskContext| async move {
            if ctx.run_input["hold"] == json!(true) {
                ctx.cancel.cancelled().await;
                return Err(HandlerError::retryable("stopped on cancellation"));
            }
            Ok::<Value, HandlerError>(json!({}))
        })
        .build()
        .await
        .expect("the worker builds");
    let serving = SdkWorker::serve(worker);

    let store = cluster.db.store().await;
    super::served(&store, "lim.hold").await;
    cluster.spawn("publisher", ["publisher"]);
    cluster.spawn("scheduler", ["scheduler"]);
    let service = Service::new(store.clone());
    let def = definition(&json!({"name": "exclusive", "version": 1,
    "concurrency": [{"key": "$.site", "max": 1, "strategy": "cancel_in_progress"}],
    "tasks": [
        {"key": "prepare", "task_type": "lim.step"},
        {"key": "deploy", "task_type": "lim.hold", "depends_on": ["prepare"]},
        {"key": "unprepare", "task_type": "lim.step", "compensate_for": "prepare"}
    ]}));
    let published = service
        .publish(&def, &TaskTypes::LiveWorkers)
        .await
        .expect("publish: the worker's types are live");
    let older = service
        .start(published.id, json!({"site": "eu", "hold": true}), Priority::DEFAULT)
        .await
        .expect("start")
        .id;
    eventually("the older run's deploy running", || async {
        (task(&detail(&store, older).await, "deploy").state == TaskRunState::Running).then_some(())
    })
    .await;
    let newer = service
        .start(published.id, json!({"site": "eu"}), Priority::DEFAULT)
        .await
        .expect("start")
        .id;
    let settled = |run| {
        let store = &store;
        async move {
            eventually("the run to settle", || async {
                let d = detail(store, run).await;
                matches!(
                    d.summary.state,
                    RunState::Succeeded | RunState::Failed | RunState::Cancelled
                )
                .then_some(d)
            })
            .await
        }
    };
    let older = settled(older).await;
    let newer = settled(newer).await;
    assert_eq!(older.summary.state, RunState::Cancelled, "{}", cluster.logs());
    assert_eq!(older.summary.cancel_reason.as_deref(), Some("concurrency_limit"));
    let undo = task(&older, "unprepare");
    assert_eq!(
        undo.state,
        TaskRunState::Succeeded,
        "the older run's prepare is rolled back"
    );
    assert_eq!(newer.summary.state, RunState::Succeeded, "{}", cluster.logs());
    let (_, older_end) = run_interval(&older);
    let (newer_start, _) = run_interval(&newer);
    assert!(older_end <= newer_start, "one run of a site at a time");

    serving.stop().await;
}
