//! Stalls, in process: a worker whose store goes silent stops its handler
//! before its lease can run out, so no two attempts of a task ever run at
//! once (docs/design/leases-and-fencing.md#local-lease-deadline); a
//! publisher or a scheduler stopped inside its transaction loses its
//! session, and with it its locks, after the idle bound, so the others
//! carry on (docs/design/outbox-and-queues.md#bounded-transactions).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flowforge::{HandlerError, HandlerRegistry, TaskContext};
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_adapters_rabbit::{RabbitPublisher, RabbitQueue};
use flowforge_app::cache::DefinitionCache;
use flowforge_app::publisher::{OutboxPublisher, PublisherConfig};
use flowforge_app::scheduler::{Scheduler, SchedulerConfig};
use flowforge_app::worker::{Handled, Worker, WorkerConfig};
use flowforge_domain::TaskRunState;
use flowforge_ports::{
    DefinitionStore, Dispatch, DispatchConsumer, DispatchPublisher, DispatchQueue, FinishResult, OutboxStore, RunPass,
    RunStore, Scope, SystemClock, TaskOutcome, WorkerId, queue,
};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    Broker, LONG_LEASE, TestDb, both_services, definition, detail, eventually, outbox, outbox_publisher, pg_address,
    pg_options, pg_url_via, postgres_url, task, within,
};
use flowforge_testkit::{Mode, Proxy};

/// The idle-in-transaction bound of the stalled processes' connections.
const IDLE_BOUND: Duration = Duration::from_secs(2);

/// What the handlers themselves saw: `(attempt, "start" | "stop", when)`.
type Log = Arc<Mutex<Vec<(u32, &'static str, Instant)>>>;

/// Logs the attempt's stop when dropped: whether the handler returns or
/// is abandoned, it has stopped running.
struct Stopped(Log, u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((self.1, "stop", Instant::now()));
    }
}

/// A handler type `guarded` logging its start and stop: the first attempt
/// runs until it is cancelled, the others succeed at once.
fn logging_registry(log: &Log, started: &Arc<Notify>) -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    let (log, started) = (Arc::clone(log), Arc::clone(started));
    registry.register_fn("guarded", move |ctx: TaskContext| {
        let (log, started) = (Arc::clone(&log), Arc::clone(&started));
        async move {
            let attempt = ctx.attempt;
            log.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((attempt, "start", Instant::now()));
            let _stopped = Stopped(Arc::clone(&log), attempt);
            if attempt == 1 {
                started.notify_one();
                ctx.cancel.cancelled().await;
                return Err(HandlerError::retryable("stopped"));
            }
            Ok(json!({ "attempt": attempt }))
        }
    });
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_store_goes_silent_stops_its_handler_before_the_lease_can_run_out() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "silentstore").await;
    let store = db.store().await;
    let queue = broker.declared_queue().await;
    // Worker A reaches PostgreSQL through a proxy that goes silent: its
    // renewals hang rather than fail.
    let proxy = Proxy::start(pg_address(&db.url)).await;
    let silent_store = PgStore::connect(
        &pg_url_via(&db.url, proxy.port()),
        Arc::new(SystemClock),
        PgOptions {
            max_connections: 2,
            acquire_timeout: Duration::from_secs(3),
            ..pg_options()
        },
    )
    .await
    .expect("open the database through the proxy");

    let log: Log = Arc::default();
    let started = Arc::new(Notify::new());
    let worker = |id: &str, store: PgStore, queue: RabbitQueue, lease: Duration| {
        let mut config = WorkerConfig::new(WorkerId(id.to_owned()), 1);
        config.lease = lease;
        Arc::new(Worker::new(
            store.clone(),
            queue,
            Arc::new(DefinitionCache::new(store)),
            Arc::new(logging_registry(&log, &started)),
            Default::default(),
            config,
        ))
    };
    // A short lease for A, so the test waits seconds, not half a minute.
    let lease = Duration::from_secs(6);
    let a = worker(
        "it-silent-a",
        silent_store,
        RabbitQueue::new(broker.config()).expect("a config"),
        lease,
    );
    let b = worker("it-silent-b", store.clone(), queue, LONG_LEASE);

    let def = definition(&json!({
        "name": "silent-store", "version": 1,
        "tasks": [{"key": "long", "task_type": "guarded", "retry": {"max_attempts": 2, "delay_seconds": 0.1}}]
    }));
    let published = store.publish_definition(&def).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let publisher = outbox_publisher(store.clone(), &broker);
    assert_eq!(publisher.publish_once().await.expect("the sweep").published, 1);

    let consumers = RabbitQueue::new(broker.config()).expect("a config");
    let mut consumer = consumers.consumer().await.expect("a consumer");
    let delivery = within("the delivery", consumer.next())
        .await
        .expect("consume")
        .expect("a delivery");
    let handling = {
        let a = Arc::clone(&a);
        tokio::spawn(async move { a.handle(delivery).await })
    };
    within("attempt 1 to start", started.notified()).await;
    proxy.set(Mode::Stall);

    // Worker B and a scheduler over the healthy connection: once the lease
    // has expired in store time, the reaper retries the task and B runs
    // attempt 2.
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(Arc::clone(&b).run(shutdown.clone()));
    let scheduler = Scheduler::new(
        store.clone(),
        Arc::new(DefinitionCache::new(store.clone())),
        Default::default(),
        SchedulerConfig::default(),
    );
    let stored = eventually("attempt 2 to succeed", || async {
        scheduler.schedule_once().await.expect("a scheduler pass");
        publisher.publish_once().await.expect("a sweep");
        let stored = detail(&store, run).await;
        (task(&stored, "long").state == TaskRunState::Succeeded).then_some(stored)
    })
    .await;
    assert_eq!(task(&stored, "long").attempt, 2);

    let seen = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let at = |attempt: u32, what: &str| {
        seen.iter()
            .find(|(a, w, _)| *a == attempt && *w == what)
            .map(|(_, _, when)| *when)
    };
    let stop_1 = at(1, "stop").unwrap_or_else(|| panic!("attempt 1 never stopped: {seen:?}"));
    let start_2 = at(2, "start").expect("attempt 2 started");
    assert!(
        stop_1 < start_2,
        "attempt 1 stopped only after attempt 2 had started: {seen:?}"
    );

    // A's late outcome never counts: written while the store is silent it
    // fails and the dispatch is returned; written once it answers again,
    // it is stale.
    proxy.set(Mode::Forward);
    let late = within("worker A to finish", handling).await.expect("join");
    assert!(
        matches!(late, Ok(Handled::Requeued | Handled::Finished(FinishResult::Stale))),
        "{late:?}"
    );
    let stored = detail(&store, run).await;
    assert_eq!(
        (task(&stored, "long").state, task(&stored, "long").attempt),
        (TaskRunState::Succeeded, 2)
    );
    shutdown.cancel();
    within("worker B to stop", serving)
        .await
        .expect("join")
        .expect("worker B");
    consumer.close().await.expect("close the consumer");
}

/// A dispatch publisher that, on its first batch, says so and then waits
/// for `gate` — a publisher stopped inside its sweep's transaction.
struct Stalling {
    inner: RabbitPublisher,
    first: AtomicBool,
    entered: Arc<Notify>,
    gate: Arc<Notify>,
}

impl DispatchPublisher for Stalling {
    async fn publish(&self, batch: &[Dispatch]) -> Vec<Result<(), queue::Error>> {
        if self.first.swap(false, Ordering::SeqCst) {
            self.entered.notify_one();
            self.gate.notified().await;
        }
        self.inner.publish(batch).await
    }

    fn durable(&self) -> bool {
        self.inner.durable()
    }
}

/// A store whose connections carry a short idle-in-transaction bound.
async fn bounded_store(url: &str) -> PgStore {
    PgStore::connect(
        url,
        Arc::new(SystemClock),
        PgOptions {
            idle_in_transaction_timeout: Some(IDLE_BOUND),
            ..pg_options()
        },
    )
    .await
    .expect("open the database")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_stalled_mid_sweep_loses_its_rows_to_another_and_nothing_runs_twice() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "stalledsweep").await;
    let store = db.store().await;
    let queue = broker.declared_queue().await;

    let calls = Arc::new(AtomicUsize::new(0));
    let mut registry = HandlerRegistry::new();
    let counted = Arc::clone(&calls);
    registry.register_fn("counted", move |_ctx: TaskContext| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, HandlerError>(json!({ "call": n })) }
    });
    let mut config = WorkerConfig::new(WorkerId("it-stalledsweep".to_owned()), 1);
    config.lease = LONG_LEASE;
    let worker = Worker::new(
        store.clone(),
        queue,
        Arc::new(DefinitionCache::new(store.clone())),
        Arc::new(registry),
        Default::default(),
        config,
    );
    let def = definition(&json!({
        "name": "stalled-sweep", "version": 1,
        "tasks": [{"key": "once", "task_type": "counted"}]
    }));
    let published = store.publish_definition(&def).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");

    // Publisher A holds the row in its sweep and stops there.
    let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let stalled = OutboxPublisher::new(
        bounded_store(&db.url).await,
        Stalling {
            inner: RabbitPublisher::new(broker.config()).expect("a config"),
            first: AtomicBool::new(true),
            entered: Arc::clone(&entered),
            gate: Arc::clone(&gate),
        },
        PublisherConfig::default(),
    );
    let stalled = Arc::new(stalled);
    let sweeping = {
        let stalled = Arc::clone(&stalled);
        tokio::spawn(async move { stalled.publish_once().await })
    };
    within("publisher A to hold the row", entered.notified()).await;

    // Publisher B gets the row once the server has ended A's session.
    let other = outbox_publisher(store.clone(), &broker);
    eventually("publisher B to publish the row", || async {
        (other.publish_once().await.expect("a sweep").published == 1).then_some(())
    })
    .await;

    // A resumes: it publishes its copy, but cannot mark it — its session
    // is gone; its next sweep works on a fresh connection.
    gate.notify_one();
    let resumed = within("publisher A to resume", sweeping).await.expect("join");
    assert!(resumed.is_err(), "A's commit cannot succeed: {resumed:?}");
    let next = stalled.publish_once().await.expect("A recovers");
    assert_eq!(next.published, 0, "nothing left to publish");
    assert!(outbox(&store).await.iter().all(|row| row.published));

    // Two messages for one dispatch: the task runs once.
    let mut consumer = RabbitQueue::new(broker.config())
        .expect("a config")
        .consumer()
        .await
        .expect("a consumer");
    let mut handled = Vec::new();
    for _ in 0..2 {
        let delivery = within("a delivery", consumer.next())
            .await
            .expect("consume")
            .expect("a delivery");
        handled.push(worker.handle(delivery).await.expect("handled"));
    }
    assert_eq!(
        handled,
        [
            Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded)),
            Handled::Skipped
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(task(&detail(&store, run).await, "once").state, TaskRunState::Succeeded);
    consumer.close().await.expect("close the consumer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_stalled_mid_pass_loses_its_run_to_another_after_the_idle_bound() {
    let Some(postgres) = postgres_url() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let store = db.store().await;
    let def = definition(&json!({
        "name": "stalled-pass", "version": 1,
        "tasks": [
            {"key": "first", "task_type": "noop"},
            {"key": "second", "task_type": "noop", "depends_on": ["first"]}
        ]
    }));
    let published = store.publish_definition(&def).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    // `first` succeeds: the run now needs a pass to make `second` ready.
    let dispatch = outbox(&store).await.remove(0).dispatch;
    let worker = WorkerId("it-stalledpass".to_owned());
    let claim = store
        .claim_task_run(dispatch.task_run_id, dispatch.fencing_token, &worker, LONG_LEASE)
        .await
        .expect("claim")
        .expect("claimed");
    let finished = store
        .finish_task_run(
            claim.task_run_id,
            claim.token,
            &worker,
            TaskOutcome::Succeeded { output: json!({}) },
        )
        .await
        .expect("finish");
    assert_eq!(finished, FinishResult::Recorded(TaskRunState::Succeeded));

    // Scheduler A takes the run's pass and stops there.
    let stalled = bounded_store(&db.url).await;
    let pass = stalled.begin_pass(run).await.expect("begin").expect("the run is free");

    // Scheduler B advances the run once the server has ended A's session.
    let scheduler = Scheduler::new(
        store.clone(),
        Arc::new(DefinitionCache::new(store.clone())),
        Default::default(),
        SchedulerConfig::default(),
    );
    eventually("scheduler B to make `second` ready", || async {
        scheduler.schedule_once().await.expect("a scheduler pass");
        (task(&detail(&store, run).await, "second").state == TaskRunState::Ready).then_some(())
    })
    .await;

    // A resumes: its pass is gone; its store carries on.
    assert!(pass.commit().await.is_err(), "A's session was ended");
    let begun = eventually("A's store to answer again", || async {
        stalled
            .begin_sweep(Scope::All, 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
            .await
            .ok()
    })
    .await;
    assert!(begun.is_some(), "`second`'s dispatch is waiting to be published");
}
