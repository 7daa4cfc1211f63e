//! Worker slots: one that panics ends the worker with an error, so the
//! process exits non-zero and its supervisor restarts it, instead of
//! reporting a clean stop while serving nothing; one that is stopping
//! takes no more work, and hands back what it took but did not claim.

use std::sync::Arc;
use std::time::Duration;

use flowforge::HandlerRegistry;
use flowforge_adapters_inproc::{InprocConsumer, InprocDelivery, InprocQueue};
use flowforge_adapters_sqlite::SqliteStore;
use flowforge_app::cache::DefinitionCache;
use flowforge_app::worker::{Worker, WorkerConfig};
use flowforge_domain::{Priority, TaskRunState};
use flowforge_ports::{
    DefinitionStore, Dispatch, DispatchConsumer, DispatchId, DispatchPublisher, DispatchQueue, RunId, RunStore,
    SystemClock, TaskRunView, WorkerId, queue,
};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A run of `definition` started in a new in-memory store, with its task
/// runs in creation order.
async fn started(definition: serde_json::Value) -> (SqliteStore, RunId, Vec<TaskRunView>) {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("an in-memory store");
    let definition =
        flowforge::parse_definition(&serde_json::to_vec(&definition).expect("serialise")).expect("a valid definition");
    let published = store.publish_definition(&definition).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let tasks = store.get_run(run).await.expect("get_run").expect("the run").tasks;
    (store, run, tasks)
}

/// Dispatch `n` of `task`, as type `task_type`, at `token`.
fn dispatch(n: i64, run: RunId, task: &TaskRunView, task_type: &str, token: i64) -> Dispatch {
    Dispatch {
        dispatch_id: DispatchId(n),
        task_run_id: task.id,
        run_id: run,
        task_key: task.key.clone(),
        task_type: task_type.into(),
        fencing_token: token,
        ready_at: None,
        priority: Priority::DEFAULT,
    }
}

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
    let (store, run, tasks) = started(json!({"name": "three", "version": 1, "tasks": [
        {"key": "a", "task_type": "gate"},
        {"key": "b", "task_type": "gate"},
        {"key": "c", "task_type": "gate"}
    ]}))
    .await;
    let queue = InprocQueue::new();
    let dispatches: Vec<Dispatch> = (1..)
        .zip(&tasks)
        .map(|(n, t)| dispatch(n, run, t, "gate", t.token))
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

/// The in-process queue, except that the worker is told to stop the
/// moment a slot takes its next delivery beside the one it runs: the
/// window between that take and the slot's next turn.
struct StopOnTake {
    queue: InprocQueue,
    shutdown: CancellationToken,
}

struct StopOnTakeConsumer {
    consumer: InprocConsumer,
    shutdown: CancellationToken,
}

impl DispatchQueue for StopOnTake {
    type Consumer = StopOnTakeConsumer;

    async fn consumer(&self) -> Result<StopOnTakeConsumer, queue::Error> {
        Ok(StopOnTakeConsumer {
            consumer: self.queue.consumer().await?,
            shutdown: self.shutdown.clone(),
        })
    }
}

impl DispatchConsumer for StopOnTakeConsumer {
    type Delivery = InprocDelivery;

    async fn next(&mut self) -> Result<Option<InprocDelivery>, queue::Error> {
        self.consumer.next().await
    }

    fn try_next(&mut self) -> Option<InprocDelivery> {
        let taken = self.consumer.try_next();
        if taken.is_some() {
            self.shutdown.cancel();
        }
        taken
    }
}

/// A slot that took its next delivery as its task finished, and is told
/// to stop before it starts on it, hands that delivery back to the queue
/// as it is, unless the finish claimed it
/// (docs/design/leases-and-fencing.md#finish-and-claim-next). Here it is
/// of a type this worker does not serve, so nothing claims it, and it is
/// stale: handled instead of handed back, it would be acked and gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_slot_hands_back_the_delivery_it_took_unclaimed() {
    let (store, run, tasks) = started(json!({"name": "two", "version": 1, "tasks": [
        {"key": "a", "task_type": "here"},
        {"key": "b", "task_type": "elsewhere"}
    ]}))
    .await;
    let [a, b] = [&tasks[0], &tasks[1]];
    let queue = InprocQueue::new();
    let published = queue
        .publish(&[
            dispatch(1, run, a, "here", a.token),
            dispatch(2, run, b, "elsewhere", b.token + 1),
        ])
        .await;
    assert!(published.into_iter().all(|r| r.is_ok()));

    let mut registry = HandlerRegistry::new();
    registry.register_fn("here", |_| async { Ok(json!({})) });
    let shutdown = CancellationToken::new();
    let worker = Arc::new(Worker::new(
        store.clone(),
        StopOnTake {
            queue: queue.clone(),
            shutdown: shutdown.clone(),
        },
        Arc::new(DefinitionCache::new(store.clone())),
        Arc::new(registry),
        Default::default(),
        WorkerConfig::new(WorkerId("stopping".into()), 1),
    ));
    tokio::time::timeout(Duration::from_secs(60), worker.run(shutdown.clone()))
        .await
        .expect("the worker stops after the task it ran")
        .expect("a clean stop");

    assert!(shutdown.is_cancelled(), "the slot took b beside a");
    assert_eq!(queue.len(), 1, "b is back in the queue, not acked");
    let states: Vec<(String, TaskRunState, i64)> = store
        .get_run(run)
        .await
        .expect("get_run")
        .expect("the run")
        .tasks
        .iter()
        .map(|t| (t.key.clone(), t.state, t.token))
        .collect();
    assert_eq!(
        states,
        [
            ("a".to_owned(), TaskRunState::Succeeded, a.token + 1),
            ("b".to_owned(), TaskRunState::Ready, b.token)
        ]
    );
}
