//! The dispatch queue is a quorum queue
//! (docs/design/outbox-and-queues.md#quorum-queues): over a classic queue of
//! the same name the worker stops at once with the typed mismatch error
//! carrying the migration procedure — in process and as a `flowforge worker`
//! process (exit 4) — and never retries it. The publisher declares only the
//! exchange (docs/design/outbox-and-queues.md#topology), so its typed error is
//! about an exchange of another type: the sweep fails without retrying and the
//! row stays.

use std::sync::Arc;

use flowforge::{BuiltinOptions, HandlerRegistry};
use flowforge_adapters_rabbit::RabbitQueue;
use flowforge_app::Error;
use flowforge_app::cache::DefinitionCache;
use flowforge_app::worker::{Worker, WorkerConfig};
use flowforge_ports::{DefinitionStore, RunStore, WorkerId, queue};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::{Broker, TestDb, both_services, independent_tasks, outbox, outbox_publisher, within};

/// What the mismatch error must tell an operator (the five steps of
/// docs/design/outbox-and-queues.md#quorum-queues).
#[track_caller]
fn assert_carries_the_procedure(message: &str, queue: &str) {
    for needle in [
        &format!("queue '{queue}'") as &str,
        "quorum",
        "PRECONDITION_FAILED",
        "not retried",
        "1. Stop the worker and the publisher",
        "2. Wait for the queue to drain",
        &format!("3. Delete the queue: rabbitmqctl delete_queue '{queue}'"),
        "4. Start the worker",
        "5. Start the publisher",
    ] {
        assert!(message.contains(needle), "missing {needle:?} in:\n{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_over_a_classic_queue_stops_with_the_typed_error_and_does_not_retry() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "classicworker").await;
    broker.declare_classic_queue().await;
    let store = db.store().await;
    let mut registry = HandlerRegistry::new();
    flowforge_app::register_builtins(&mut registry, BuiltinOptions::default());
    let worker = Arc::new(Worker::new(
        store.clone(),
        RabbitQueue::new(broker.config()).expect("a valid config"),
        Arc::new(DefinitionCache::new(store)),
        Arc::new(registry),
        Default::default(),
        WorkerConfig::new(WorkerId("it-classic".to_owned()), 2),
    ));
    let shutdown = CancellationToken::new();
    // A loop that retried would never return: the bound is the proof.
    let ended = within("the worker to give up", worker.run(shutdown.clone())).await;
    match ended {
        Err(Error::Queue(queue::Error::QueueTypeMismatch(message))) => {
            assert!(!queue::Error::QueueTypeMismatch(message.clone()).is_transient());
            assert_carries_the_procedure(&message, &broker.queue);
        }
        other => panic!("expected the queue-type mismatch, got {other:?}"),
    }
    assert_eq!(
        broker.ready().await,
        Some(0),
        "the classic queue is left as it was, for the operator"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flowforge_worker_over_a_classic_queue_exits_4_with_the_procedure() {
    let Some(mut cluster) = Cluster::migrated("classicprocess").await else {
        return;
    };
    cluster.broker.declare_classic_queue().await;
    let worker = cluster.spawn("worker", ["worker", "--concurrency", "2"]);
    // A worker that retried would never exit: exiting at all is the proof.
    let code = cluster.wait_exit(worker).await;
    let stderr = cluster.stderr(worker);
    assert_eq!(code, 4, "an infrastructure error the worker cannot retry: {stderr}");
    assert_carries_the_procedure(&stderr, &cluster.broker.queue);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_over_an_exchange_of_another_type_fails_without_retrying_and_the_row_stays() {
    let Some((postgres, amqp)) = both_services() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, "fanoutexchange").await;
    broker.declare_fanout_exchange().await;
    let store = db.store().await;
    let published = store
        .publish_definition(&independent_tasks("mismatch", 1))
        .await
        .expect("publish");
    store.start_run(published.id, json!({})).await.expect("start");
    let publisher = outbox_publisher(store.clone(), &broker);
    match publisher.publish_once().await {
        Err(Error::Queue(e @ queue::Error::QueueTypeMismatch(_))) => {
            assert!(!e.is_transient());
            let message = e.to_string();
            assert!(
                message.contains(&format!("exchange '{}'", broker.exchange)) && message.contains("not retried"),
                "{message}"
            );
        }
        other => panic!("expected the typed mismatch, got {other:?}"),
    }
    assert!(!outbox(&store).await[0].published, "the row stays unpublished");
    // The loop gives up at once instead of backing off forever.
    let ended = within("the publisher loop to give up", publisher.run(CancellationToken::new())).await;
    assert!(
        matches!(ended, Err(Error::Queue(queue::Error::QueueTypeMismatch(_)))),
        "{ended:?}"
    );
    assert!(!outbox(&store).await[0].published);
}
