//! The engine's loops end to end: outputs flowing downstream, failures
//! cancelling dependents and compensating, panics reported as what they
//! are, cancellation stopping a running handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::TimeDelta;
use flowforge_app::{Error, HandlerRegistry};
use flowforge_domain::RunState;
use flowforge_ports::{Clock, HandlerError, TaskContext};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::{definition, engine, store, store_with};

fn diamond() -> Value {
    json!({"name": "diamond", "version": 1, "tasks": [
        {"key": "a", "task_type": "add"},
        {"key": "b", "task_type": "add", "depends_on": ["a"]},
        {"key": "c", "task_type": "add", "depends_on": ["a"]},
        {"key": "d", "task_type": "add", "depends_on": ["b", "c"]}
    ]})
}

/// `add`: one more than the sum of its inputs' `n` (the run input's `n`
/// for a root).
fn adding() -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    registry.register_fn("add", |ctx: TaskContext| async move {
        let n: i64 = if ctx.inputs.is_empty() {
            ctx.run_input["n"].as_i64().unwrap_or(0)
        } else {
            ctx.inputs.values().filter_map(|v| v["n"].as_i64()).sum()
        };
        Ok::<_, HandlerError>(json!({ "n": n + 1 }))
    });
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_flow_to_downstream_inputs_through_the_scheduler_and_the_worker() {
    let engine = engine(store().await, adding());
    let report = engine.run(&definition(diamond()), json!({"n": 1})).await.unwrap();
    assert_eq!(report.run_state(), Some(RunState::Succeeded));
    let output = |key: &str| {
        report
            .tasks
            .iter()
            .find(|t| t.key == key)
            .and_then(|t| t.output.clone())
            .unwrap()
    };
    assert_eq!(output("a"), json!({"n": 2}));
    assert_eq!(output("b"), json!({"n": 3}));
    assert_eq!(output("d"), json!({"n": 7}), "d sums b and c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_cancels_its_dependents_and_compensates_what_succeeded() {
    let mut registry = HandlerRegistry::new();
    registry.register_fn("ok", |_ctx: TaskContext| async { Ok::<_, HandlerError>(json!({})) });
    registry.register_fn("fail", |_ctx: TaskContext| async {
        Err::<Value, _>(HandlerError::permanent("no"))
    });
    let def = definition(json!({"name": "saga", "version": 1, "tasks": [
        {"key": "book", "task_type": "ok"},
        {"key": "undo_book", "task_type": "ok", "compensate_for": "book"},
        {"key": "pay", "task_type": "fail", "depends_on": ["book"]},
        {"key": "ship", "task_type": "ok", "depends_on": ["pay"]}
    ]}));
    let report = engine(store().await, registry).run(&def, json!({})).await.unwrap();
    assert_eq!(report.run_state(), Some(RunState::Failed));
    let ship = report.tasks.iter().find(|t| t.key == "ship").unwrap();
    assert_eq!(ship.state, "cancelled");
    assert_eq!(ship.cancel_reason.as_deref(), Some("upstream_failed"));
    assert_eq!(report.compensations.len(), 1);
    assert_eq!(report.compensations[0].key, "undo_book");
    assert_eq!(report.compensations[0].state, "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_task_and_says_it_panicked() {
    let mut registry = HandlerRegistry::new();
    registry.register_fn("boom", |_ctx: TaskContext| async { panic!("kaboom") });
    let def = definition(json!({"name": "boom", "version": 1, "tasks": [
        {"key": "a", "task_type": "boom", "retry": {"max_attempts": 1}}
    ]}));
    let report = engine(store().await, registry).run(&def, json!({})).await.unwrap();
    assert_eq!(report.run_state(), Some(RunState::Failed));
    assert_eq!(report.tasks[0].error.as_deref(), Some("handler panicked: kaboom"));
}

/// A clock that panics once armed: whichever loop next reads store time
/// panics inside the store call.
#[derive(Debug, Default)]
struct ExplodingClock {
    armed: AtomicBool,
}

impl Clock for ExplodingClock {
    fn offset(&self) -> TimeDelta {
        assert!(!self.armed.load(Ordering::SeqCst), "the clock exploded");
        TimeDelta::zero()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_loop_is_reported_as_a_panic_not_as_a_store_error() {
    let clock = Arc::new(ExplodingClock::default());
    let started = Arc::new(Notify::new());
    let mut registry = HandlerRegistry::new();
    let (signal, armed) = (Arc::clone(&started), Arc::clone(&clock));
    registry.register_fn("arm", move |_ctx: TaskContext| {
        let (signal, armed) = (Arc::clone(&signal), Arc::clone(&armed));
        async move {
            // From here on, the next store-time read panics: the finish,
            // or the scheduler's next pass, whichever comes first.
            armed.armed.store(true, Ordering::SeqCst);
            signal.notify_one();
            Ok::<_, HandlerError>(json!({}))
        }
    });
    let engine = engine(store_with(clock).await, registry);
    let def = definition(json!({"name": "arm", "version": 1, "tasks": [
        {"key": "a", "task_type": "arm"},
        {"key": "b", "task_type": "arm", "depends_on": ["a"]}
    ]}));
    let error = engine.run(&def, json!({})).await.unwrap_err();
    match &error {
        Error::LoopPanicked { message, .. } => assert_eq!(message, "the clock exploded"),
        other => panic!("expected a loop panic, got {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.starts_with("the engine's ") && text.contains("panicked: the clock exploded"),
        "{text}"
    );
    assert!(!text.contains("store"), "a panic is not a store error: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_stops_its_running_handler() {
    let running = Arc::new(Notify::new());
    let mut registry = HandlerRegistry::new();
    let signal = Arc::clone(&running);
    registry.register_fn("wait", move |ctx: TaskContext| {
        let signal = Arc::clone(&signal);
        async move {
            signal.notify_one();
            ctx.cancel.cancelled().await;
            Err::<Value, _>(HandlerError::permanent("stopped"))
        }
    });
    let engine = Arc::new(engine(store().await, registry));
    let def = definition(json!({"name": "wait", "version": 1, "tasks": [
        {"key": "a", "task_type": "wait"},
        {"key": "b", "task_type": "wait", "depends_on": ["a"]}
    ]}));
    let published = engine.publish(&def).await.unwrap();
    let run = engine.start(published.id, json!({})).await.unwrap();
    let serving = engine.serve(flowforge_ports::Scope::Run(run));
    running.notified().await;
    engine.cancel(run).await.unwrap();
    assert_eq!(engine.wait(run).await.unwrap(), RunState::Cancelled);
    serving.stop().await.unwrap();
    let report = engine.report(run).await.unwrap();
    let states: Vec<(&str, &str)> = report
        .tasks
        .iter()
        .map(|t| (t.key.as_str(), t.state.as_str()))
        .collect();
    assert_eq!(states, [("a", "cancelled"), ("b", "cancelled")]);
}

/// A wake-up within the pass spacing waits for the spacing to pass, but a
/// shutdown does not: the loop ends at once (docs/design/scheduler.md#pacing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_during_the_pass_spacing_ends_the_scheduler_at_once() {
    use flowforge_app::cache::DefinitionCache;
    use flowforge_app::observers::Observers;
    use flowforge_app::scheduler::{Scheduler, SchedulerConfig};

    let store = store().await;
    let nudge = Arc::new(Notify::new());
    let scheduler = Scheduler::new(
        store.clone(),
        Arc::new(DefinitionCache::new(store)),
        Observers::default(),
        SchedulerConfig {
            nudge: Some(Arc::clone(&nudge)),
            pass_spacing: std::time::Duration::from_secs(3600),
            ..SchedulerConfig::default()
        },
    );
    // Woken before its first pass ends, the loop spaces its second.
    nudge.notify_one();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let looping = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { scheduler.run(shutdown).await }
    });
    shutdown.cancel();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), looping)
        .await
        .expect("the loop ends without waiting out its spacing");
    ended.expect("the loop does not panic").expect("the loop ends cleanly");
}

/// Tells when a task of a given key succeeds.
struct Succeeded {
    key: &'static str,
    done: Arc<Notify>,
}

impl flowforge_ports::Observer for Succeeded {
    fn on_task_succeeded(&self, e: &flowforge_ports::TaskEvent) {
        if e.task_key == self.key {
            self.done.notify_one();
        }
    }
}

/// The in-process queue, counting the dispatches published into it.
#[derive(Clone)]
struct Counting {
    queue: flowforge_adapters_inproc::InprocQueue,
    published: Arc<std::sync::atomic::AtomicUsize>,
}

impl flowforge_ports::DispatchPublisher for Counting {
    async fn publish(&self, batch: &[flowforge_ports::Dispatch]) -> Vec<Result<(), flowforge_ports::queue::Error>> {
        self.published.fetch_add(batch.len(), Ordering::SeqCst);
        self.queue.publish(batch).await
    }

    fn durable(&self) -> bool {
        false
    }
}

impl flowforge_ports::DispatchQueue for Counting {
    type Consumer = <flowforge_adapters_inproc::InprocQueue as flowforge_ports::DispatchQueue>::Consumer;

    async fn consumer(&self) -> Result<Self::Consumer, flowforge_ports::queue::Error> {
        self.queue.consumer().await
    }
}

/// Runs the chain a → b → c on an engine whose worker slot continues
/// chains for `chain_hops` tasks, with only the worker running once the
/// run's root is dispatched, and returns how many dispatches went into the
/// queue in all (the root's included).
async fn chain_dispatches(chain_hops: u32) -> usize {
    use flowforge_ports::{OutboxStore, RunStore, Scope};

    let store = store().await;
    let done = Arc::new(Notify::new());
    let observer = Arc::new(Succeeded {
        key: "c",
        done: Arc::clone(&done),
    });
    let queue = Counting {
        queue: flowforge_adapters_inproc::InprocQueue::new(),
        published: Arc::default(),
    };
    let engine = flowforge_app::Engine::new(
        store.clone(),
        queue.clone(),
        adding(),
        vec![observer],
        flowforge_app::EngineConfig {
            concurrency: 1,
            chain_hops,
            ..flowforge_app::EngineConfig::default()
        },
    );
    let def = definition(json!({"name": "chain", "version": 1, "tasks": [
        {"key": "a", "task_type": "add"},
        {"key": "b", "task_type": "add", "depends_on": ["a"]},
        {"key": "c", "task_type": "add", "depends_on": ["b"]}
    ]}));
    let published = engine.publish(&def).await.expect("published");
    let run = engine.start(published.id, json!({"n": 1})).await.expect("started");
    let first = engine.publisher(Scope::Run(run)).publish_once().await.expect("swept");
    assert_eq!(
        first.published, 1,
        "the run's start dispatches its root through the sweep"
    );

    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(Arc::clone(engine.worker()).run(shutdown.clone()));
    tokio::time::timeout(std::time::Duration::from_secs(30), done.notified())
        .await
        .expect("b and c are handed on by the worker alone");
    shutdown.cancel();
    worker.await.expect("no panic").expect("a clean stop");
    assert!(
        store
            .begin_sweep(Scope::Run(run), 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
            .await
            .expect("a sweep")
            .is_none(),
        "every dispatch was committed published"
    );
    let c = store.get_run(run).await.expect("read").expect("the run");
    let c = c.tasks.iter().find(|t| t.key == "c").expect("task c");
    assert_eq!(c.output, Some(json!({"n": 4})));
    queue.published.load(Ordering::SeqCst)
}

/// The embedded worker pushes the dispatches its finish hands on into its
/// in-process queue itself, committed published
/// (docs/design/outbox-and-queues.md#publish-after-commit): once the first
/// task is dispatched, a chain runs to its end with no outbox publisher
/// running, and leaves nothing for a sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_worker_hands_a_chain_on_without_a_sweep() {
    assert_eq!(chain_dispatches(0).await, 3, "b and c go through the queue");
}

/// A slot runs the task its finish made ready itself, without the queue
/// (docs/design/outbox-and-queues.md#continuing-a-chain), for up to
/// `chain_hops` tasks in a row; then the queue takes the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_continues_a_chain_without_the_queue_for_its_hops() {
    assert_eq!(chain_dispatches(16).await, 1, "only the root went through the queue");
    assert_eq!(
        chain_dispatches(1).await,
        2,
        "after one kept task, c goes through the queue"
    );
}
