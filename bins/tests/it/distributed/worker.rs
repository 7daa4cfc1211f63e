//! The worker over PostgreSQL and RabbitMQ, in process
//! (docs/design/outbox-and-queues.md#redelivery): a dispatch delivered again —
//! while its attempt runs on another consumer, or after it finished — claims
//! nothing, is acked without running the handler, and leaves nothing on the
//! queue; an ack lost after the outcome is stored brings a redelivery that is
//! acked without running; an outcome that cannot be stored is nacked for
//! requeue, never acked, and the reaper retries the task once its lease
//! expires. Outages go through the test's own TCP proxy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use flowforge::{HandlerError, HandlerRegistry, TaskContext};
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_adapters_rabbit::{RabbitPublisher, RabbitQueue};
use flowforge_app::cache::DefinitionCache;
use flowforge_app::scheduler::{Scheduler, SchedulerConfig};
use flowforge_app::worker::{Handled, Worker, WorkerConfig};
use flowforge_domain::TaskRunState;
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{
    DefinitionStore, Delivery, DispatchConsumer, DispatchPublisher, DispatchQueue, FinishResult, RunId, RunStore,
    WorkerId, queue,
};
use serde_json::json;
use tokio::sync::Notify;

use super::{
    Broker, LONG_LEASE, TestDb, amqp_url_via, both_services, broker_address, definition, detail, outbox,
    outbox_publisher, pg_address, pg_options, pg_url_via, task, transitions, within,
};
use flowforge_testkit::{Mode, Proxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_is_acked_without_running_the_handler_again() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "duplicate").await;
    let store = db.store().await;
    let queue = broker.declared_queue().await;
    // The consumers the test hands deliveries from (the worker's own loop
    // is not running: each delivery is handled by hand).
    let consumers = RabbitQueue::new(broker.config()).expect("a valid config");

    // A handler that counts its calls; the first waits for the test.
    let calls = Arc::new(AtomicUsize::new(0));
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = long_lease_worker(
        "it-duplicate",
        store.clone(),
        queue,
        gated_registry(&calls, &started, &gate),
    );

    let run = start_counted(&store, "duplicate").await;
    let publisher = outbox_publisher(store.clone(), &broker);
    assert_eq!(publisher.publish_once().await.expect("the sweep").published, 1);
    let dispatch = outbox(&store).await.remove(0).dispatch;
    // The same dispatch again, as a publisher that crashed between the
    // broker's confirm and marking the row would send it.
    let duplicate = RabbitPublisher::new(broker.config()).expect("a valid config");
    assert_eq!(duplicate.publish(std::slice::from_ref(&dispatch)).await, vec![Ok(())]);

    // Two consumers, prefetch 1 each: the first holds the original while
    // its handler runs, the second gets the duplicate meanwhile.
    let mut first = consumers.consumer().await.expect("a consumer");
    let original = next_delivery("the first delivery", &mut first).await;
    assert_eq!(original.dispatch(), &dispatch);
    let handling = {
        let worker = Arc::clone(&worker);
        tokio::spawn(async move { worker.handle(original).await })
    };
    within("the handler to start", started.notified()).await;
    let mut second = consumers.consumer().await.expect("a consumer");
    let copy = next_delivery("the duplicate delivery", &mut second).await;
    assert_eq!(copy.dispatch(), &dispatch);
    assert_eq!(
        worker.handle(copy).await,
        Ok(Handled::Skipped),
        "claims nothing while running"
    );
    assert_eq!(task(&detail(&store, run).await, "once").state, TaskRunState::Running);

    gate.notify_one();
    assert_eq!(
        within("the attempt to finish", handling).await.expect("join"),
        Ok(Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded)))
    );

    // Acked: closing the first consumer requeues nothing.
    first.close().await.expect("close the first consumer");
    assert_eq!(broker.ready().await, Some(0), "the original was acked");

    // And once more after the task finished (a redelivery after a lost ack).
    assert_eq!(duplicate.publish(std::slice::from_ref(&dispatch)).await, vec![Ok(())]);
    let late = next_delivery("the late duplicate", &mut second).await;
    assert_eq!(
        worker.handle(late).await,
        Ok(Handled::Skipped),
        "claims nothing once finished"
    );

    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran exactly once");
    let stored = detail(&store, run).await;
    let once = task(&stored, "once");
    assert_eq!((once.state, once.attempt), (TaskRunState::Succeeded, 1));
    assert_eq!(once.output, Some(json!({"call": 1})));
    assert_eq!(
        transitions(&stored, "once"),
        ["claim", "succeed"],
        "no event for a duplicate"
    );

    // Every delivery was acked: closing the consumer requeues nothing.
    second.close().await.expect("close the second consumer");
    assert_eq!(broker.ready().await, Some(0), "nothing left on the queue");
}

/// A handler type `counted` that counts its calls and, on its first call
/// only, waits for `gate` after telling `started`.
fn gated_registry(calls: &Arc<AtomicUsize>, started: &Arc<Notify>, gate: &Arc<Notify>) -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    let (calls, started, gate) = (Arc::clone(calls), Arc::clone(started), Arc::clone(gate));
    registry.register_fn("counted", move |_ctx: TaskContext| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
        async move {
            if n == 1 {
                started.notify_one();
                gate.notified().await;
            }
            Ok::<_, HandlerError>(json!({ "call": n }))
        }
    });
    registry
}

/// A one-task definition of type `counted` with a second attempt allowed.
fn counted_definition(name: &str) -> flowforge_domain::WorkflowDefinition {
    definition(&json!({
        "name": name, "version": 1,
        "tasks": [{"key": "once", "task_type": "counted", "retry": {"max_attempts": 2, "delay_seconds": 0.1}}]
    }))
}

/// A worker `id` over `store` and `queue` with [`LONG_LEASE`], one slot and
/// `registry`'s handlers (its loop is not run: tests hand it deliveries).
fn long_lease_worker(
    id: &str,
    store: PgStore,
    queue: RabbitQueue,
    registry: HandlerRegistry,
) -> Arc<Worker<PgStore, RabbitQueue>> {
    worker_with_lease(id, store, queue, registry, LONG_LEASE)
}

/// A one-slot worker taking leases of `lease`.
fn worker_with_lease(
    id: &str,
    store: PgStore,
    queue: RabbitQueue,
    registry: HandlerRegistry,
    lease: Duration,
) -> Arc<Worker<PgStore, RabbitQueue>> {
    let mut config = WorkerConfig::new(WorkerId(id.to_owned()), 1);
    config.lease = lease;
    Arc::new(Worker::new(
        store.clone(),
        queue,
        Arc::new(DefinitionCache::new(store)),
        Arc::new(registry),
        Default::default(),
        config,
    ))
}

/// Publishes [`counted_definition`] `name` and starts a run of it.
async fn start_counted(store: &PgStore, name: &str) -> RunId {
    let published = store
        .publish_definition(&counted_definition(name))
        .await
        .expect("publish");
    store.start_run(published.id, json!({})).await.expect("start")
}

/// The consumer's next delivery, failing the test after the patience or
/// when the queue errs or closes.
async fn next_delivery<C: DispatchConsumer>(what: &str, consumer: &mut C) -> C::Delivery {
    within(what, consumer.next())
        .await
        .expect("consume")
        .expect("a delivery")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_lost_after_the_outcome_is_stored_brings_a_redelivery_acked_without_running() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "acklost").await;
    let store = db.store().await;
    broker.declared_queue().await;
    let proxy = Proxy::start(broker_address(&broker.url).expect("the broker's address")).await;
    let through_proxy =
        RabbitQueue::new(broker.config_for(&amqp_url_via(&broker.url, proxy.port()))).expect("a config");
    let direct = RabbitQueue::new(broker.config()).expect("a valid config");

    let calls = Arc::new(AtomicUsize::new(0));
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = long_lease_worker(
        "it-acklost",
        store.clone(),
        RabbitQueue::new(broker.config()).expect("a valid config"),
        gated_registry(&calls, &started, &gate),
    );
    let run = start_counted(&store, "ack-lost").await;
    let publisher = outbox_publisher(store.clone(), &broker);
    assert_eq!(publisher.publish_once().await.expect("the sweep").published, 1);

    let mut consumer = through_proxy.consumer().await.expect("a consumer");
    let delivery = next_delivery("the delivery", &mut consumer).await;
    let dispatch = delivery.dispatch().clone();
    let handling = {
        let worker = Arc::clone(&worker);
        tokio::spawn(async move { worker.handle(delivery).await })
    };
    within("the handler to start", started.notified()).await;
    // The connection dies while the handler runs; the consumer learns it.
    proxy.set(Mode::Cut);
    let next = within("the consumer to see the loss", consumer.next()).await;
    assert!(matches!(next, Err(queue::Error::Unavailable(_))), "{next:?}");

    gate.notify_one();
    let handled = within("the attempt to end", handling).await.expect("join");
    assert!(
        matches!(handled, Err(queue::Error::Unavailable(_) | queue::Error::Timeout(_))),
        "the ack fails and says so: {handled:?}"
    );
    let stored = detail(&store, run).await;
    assert_eq!(
        task(&stored, "once").state,
        TaskRunState::Succeeded,
        "the outcome was stored before the ack"
    );

    // The broker requeued the unacked delivery; its redelivery claims
    // nothing and is acked without running.
    let mut again = direct.consumer().await.expect("a consumer");
    let redelivery = next_delivery("the redelivery", &mut again).await;
    assert_eq!(redelivery.dispatch(), &dispatch);
    assert!(redelivery.redelivered());
    assert_eq!(worker.handle(redelivery).await, Ok(Handled::Skipped));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    let stored = detail(&store, run).await;
    assert_eq!(transitions(&stored, "once"), ["claim", "succeed"]);
    assert_eq!(task(&stored, "once").output, Some(json!({"call": 1})));
    again.close().await.expect("close the consumer");
    assert_eq!(broker.ready().await, Some(0), "nothing left on the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_write_failing_for_a_whole_lease_is_nacked_and_the_reaper_retries_the_task() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "writefails").await;
    // Store time moves by hand, so the lease can expire without waiting.
    let clock = Arc::new(ManualClock::default());
    let store = PgStore::connect(&db.url, clock.clone(), pg_options())
        .await
        .expect("open the database");
    // The worker reaches the database through a proxy the test cuts.
    let proxy = Proxy::start(pg_address(&db.url)).await;
    let worker_store = PgStore::connect(
        &pg_url_via(&db.url, proxy.port()),
        clock.clone(),
        PgOptions {
            max_connections: 2,
            acquire_timeout: Duration::from_secs(3),
            ..pg_options()
        },
    )
    .await
    .expect("open the database through the proxy");
    let queue = broker.declared_queue().await;

    let calls = Arc::new(AtomicUsize::new(0));
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    // The worker retries a write that fails for up to one lease (a
    // database coming back keeps the work); a short one keeps this
    // test's outage past it short.
    let worker = worker_with_lease(
        "it-writefails",
        worker_store,
        RabbitQueue::new(broker.config()).expect("a valid config"),
        gated_registry(&calls, &started, &gate),
        Duration::from_secs(6),
    );
    let run = start_counted(&store, "write-fails").await;
    let publisher = outbox_publisher(store.clone(), &broker);
    assert_eq!(publisher.publish_once().await.expect("the sweep").published, 1);

    let mut consumer = queue.consumer().await.expect("a consumer");
    let delivery = next_delivery("the delivery", &mut consumer).await;
    let handling = {
        let worker = Arc::clone(&worker);
        tokio::spawn(async move { worker.handle(delivery).await })
    };
    within("the handler to start", started.notified()).await;
    // The database becomes unreachable for the worker before it writes.
    proxy.set(Mode::Cut);
    gate.notify_one();
    assert_eq!(
        within("the attempt to end", handling).await.expect("join"),
        Ok(Handled::Requeued),
        "an outcome that is not stored is never acked"
    );
    let stored = detail(&store, run).await;
    assert_eq!(
        task(&stored, "once").state,
        TaskRunState::Running,
        "nothing was written"
    );

    // The nack requeued the dispatch; once the database is back, its
    // redelivery finds the row still running and is acked without running.
    proxy.set(Mode::Forward);
    let redelivery = next_delivery("the redelivery", &mut consumer).await;
    assert!(redelivery.redelivered());
    assert_eq!(worker.handle(redelivery).await, Ok(Handled::Skipped));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The lease expires (store time moves past it): the reaper retries the
    // task with a new dispatch, which runs it again and stores the outcome.
    clock.advance(LONG_LEASE + Duration::from_secs(1));
    let scheduler = Scheduler::new(
        store.clone(),
        Arc::new(DefinitionCache::new(store.clone())),
        Default::default(),
        SchedulerConfig::default(),
    );
    assert_eq!(scheduler.schedule_once().await.expect("a scheduler pass").reaped, 1);
    assert_eq!(publisher.publish_once().await.expect("the sweep").published, 1);
    let retry = next_delivery("the retry's dispatch", &mut consumer).await;
    assert_eq!(
        worker.handle(retry).await,
        Ok(Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded)))
    );
    let stored = detail(&store, run).await;
    let once = task(&stored, "once");
    assert_eq!((once.attempt, once.output.clone()), (2, Some(json!({"call": 2}))));
    assert_eq!(
        transitions(&stored, "once"),
        ["claim", "reap_lease", "claim", "succeed"]
    );
    consumer.close().await.expect("close the consumer");
    assert_eq!(broker.ready().await, Some(0), "nothing left on the queue");
}
