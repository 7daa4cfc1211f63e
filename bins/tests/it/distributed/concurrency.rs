//! Concurrency limits in the distributed mode (docs/design/concurrency.md):
//! with the scheduler and publisher as processes and a worker with more
//! slots than the limit, twenty runs queued on one key over PostgreSQL
//! never have three running, as their event history shows.

use flowforge::{HandlerError, Service, TaskContext, TaskTypes};
use flowforge_domain::{Priority, RunState};
use serde_json::{Value, json};

use super::cluster::{Cluster, SdkWorker};
use super::{definition, detail, eventually};
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
                .expect("start"),
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
