//! Worker slots: one that panics ends the worker with an error, so the
//! process exits non-zero and its supervisor restarts it, instead of
//! reporting a clean stop while serving nothing; one that is stopping
//! takes no more work.

use std::sync::Arc;
use std::time::Duration;

use flowforge::HandlerRegistry;
use flowforge_adapters_inproc::{InprocConsumer, InprocQueue};
use flowforge_adapters_sqlite::SqliteStore;
use flowforge_app::cache::DefinitionCache;
use flowforge_app::worker::{Worker, WorkerConfig};
use flowforge_domain::{Priority, TaskRunState};
use flowforge_ports::{
    DefinitionStore, Dispatch, DispatchId, DispatchPublisher, DispatchQueue, RunStore, SystemClock, WorkerId, queue,
};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A queue whose every consumer panics while opening.
struct PanickingQueue;

impl DispatchQueue for PanickingQueue {
    type Consumer = InprocConsumer;

    async fn consumer(&self) -> Result<InprocConsumer, queue::Error> {
        panic!("the consumer exploded");
    }
}

#[tokio::test]
async fn a_worker_whose_slot_panicked_ends_with_an_infrastructure_error() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("an in-memory store");
    let worker = Arc::new(Worker::new(
        store.clone(),
        PanickingQueue,
        Arc::new(DefinitionCache::new(store)),
        Arc::new(HandlerRegistry::new()),
        Default::default(),
        WorkerConfig::new(WorkerId("panicky".into()), 2),
    ));
    let error = worker
        .run(CancellationToken::new())
        .await
        .expect_err("a panicked slot is a failed worker");
    assert!(error.is_infrastructure(), "exit code 4: {error}");
    assert!(error.to_string().contains("the consumer exploded"), "{error}");
}

/// A slot stopping while its task runs finishes that task and takes
/// nothing more, not even what already waits beside it in the in-process
/// queue for its finish to claim
/// (docs/design/leases-and-fencing.md#finish-and-claim-next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_slot_takes_no_more_work() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("an in-memory store");
    let definition = flowforge::parse_definition(
        &serde_json::to_vec(&json!({"name": "three", "version": 1, "tasks": [
            {"key": "a", "task_type": "gate"},
            {"key": "b", "task_type": "gate"},
            {"key": "c", "task_type": "gate"}
        ]}))
        .expect("serialise"),
    )
    .expect("a valid definition");
    let published = store.publish_definition(&definition).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let queue = InprocQueue::new();
    let tasks = store.get_run(run).await.expect("get_run").expect("the run").tasks;
    let dispatches: Vec<Dispatch> = (1..)
        .zip(&tasks)
        .map(|(n, t)| Dispatch {
            dispatch_id: DispatchId(n),
            task_run_id: t.id,
            run_id: run,
            task_key: t.key.clone(),
            task_type: "gate".into(),
            fencing_token: t.token,
            ready_at: None,
            priority: Priority::DEFAULT,
        })
        .collect();
    assert!(queue.publish(&dispatches).await.into_iter().all(|r| r.is_ok()));

    // Each task signals its start, then waits to be let go.
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let mut registry = HandlerRegistry::new();
    {
        let (started, release) = (started.clone(), release.clone());
        registry.register_fn("gate", move |_| {
            let (started, release) = (started.clone(), release.clone());
            async move {
                started.notify_one();
                release.notified().await;
                Ok(json!({}))
            }
        });
    }
    let worker = Arc::new(Worker::new(
        store.clone(),
        queue.clone(),
        Arc::new(DefinitionCache::new(store.clone())),
        Arc::new(registry),
        Default::default(),
        WorkerConfig::new(WorkerId("stopping".into()), 1),
    ));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    started.notified().await;
    shutdown.cancel();
    release.notify_one();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the worker stops after the task it runs")
        .expect("joined")
        .expect("a clean stop");

    assert_eq!(queue.len(), 2, "what waits stays queued");
    let states: Vec<TaskRunState> = store
        .get_run(run)
        .await
        .expect("get_run")
        .expect("the run")
        .tasks
        .iter()
        .map(|t| t.state)
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == TaskRunState::Succeeded).count(),
        1,
        "{states:?}"
    );
    assert_eq!(
        states.iter().filter(|s| **s == TaskRunState::Ready).count(),
        2,
        "{states:?}"
    );
}
