//! The outbox publisher over PostgreSQL and RabbitMQ, in process
//! (docs/design/outbox-and-queues.md#the-publisher, point by point): a
//! confirmed publish is on the bound queue with the exact payload; an
//! unroutable one is an error and its row stays unpublished; while the broker
//! is unreachable rows stay pending and are drained exactly once each when it
//! is back; rows a crashed publisher never published are delivered by a fresh
//! one; two publishers in parallel publish each row exactly once between them;
//! a worker's handoff is published right after its commit, and swept once its
//! hold is over when the worker died first
//! (docs/design/outbox-and-queues.md#publish-after-commit); one its
//! finishing slot kept is settled published and never published
//! (docs/design/outbox-and-queues.md#continuing-a-chain).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flowforge_adapters_postgres::PgStore;
use flowforge_adapters_rabbit::RabbitPublisher;
use flowforge_app::Error;
use flowforge_app::after_commit::AfterCommit;
use flowforge_app::publisher::{OutboxPublisher, PublisherConfig, SweepReport};
use flowforge_domain::plan::Handoff;
use flowforge_ports::{
    Claim, DefinitionStore, Dispatch, DispatchId, DispatchPublisher, Handover, OutboxStore, OutboxSweep, RunStore,
    Scope, TaskOutcome, WorkerId, queue,
};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

use super::{
    Broker, OutboxRow, TestDb, amqp_url_via, both_services, broker_address, definition, detail, eventually,
    independent_tasks, outbox, outbox_publisher, within,
};
use flowforge_testkit::{Mode, Proxy};

/// A migrated database, this test's own exchange and queue names, and a
/// store over the database.
async fn setup(test: &str) -> Option<(TestDb, Broker, PgStore)> {
    let (postgres, amqp) = both_services()?;
    let db = TestDb::migrated(&postgres).await;
    let broker = Broker::own(&amqp, test).await;
    let store = db.store().await;
    Some((db, broker, store))
}

/// Publishes a definition of `n` independent tasks and starts a run of it:
/// `n` outbox rows, committed.
async fn start_independent(store: &PgStore, name: &str, n: usize) -> flowforge_ports::RunId {
    let published = store
        .publish_definition(&independent_tasks(name, n))
        .await
        .expect("publish the definition");
    store.start_run(published.id, json!({})).await.expect("start a run")
}

/// The wire form of a dispatch: exactly these fields
/// (docs/design/outbox-and-queues.md#dispatch-messages).
fn payload(d: &Dispatch) -> Value {
    json!({
        "dispatch_id": d.dispatch_id.0,
        "task_run_id": d.task_run_id.0,
        "run_id": d.run_id.to_string(),
        "task_key": d.task_key,
        "task_type": d.task_type,
        "fencing_token": d.fencing_token,
        "ready_at": serde_json::to_value(d.ready_at).expect("a time"),
        "priority": d.priority.get(),
    })
}

/// How many times each dispatch id is on the queue (taken off it).
async fn deliveries_by_id(broker: &Broker) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for d in broker.drain_dispatches().await {
        *counts.entry(d.dispatch_id.0).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_publish_is_on_the_bound_queue_with_the_exact_payload() {
    let Some((_db, broker, store)) = setup("confirmed").await else {
        return;
    };
    // The worker's declaration: exchange, quorum queue, binding.
    broker.declared_queue().await;
    start_independent(&store, "confirmed", 3).await;
    let rows = outbox(&store).await;
    assert_eq!(rows.len(), 3, "one outbox row per ready task: {rows:?}");
    assert!(rows.iter().all(|r| !r.published));

    let publisher = outbox_publisher(store.clone(), &broker);
    let report = publisher.publish_once().await.expect("the sweep");
    assert_eq!(
        report,
        SweepReport {
            published: 3,
            failed: 0,
            more: false,
            held_back: false,
        }
    );
    assert!(
        outbox(&store).await.iter().all(|r| r.published),
        "confirmed rows are marked published"
    );

    let mut messages = broker.drain().await;
    assert_eq!(messages.len(), 3, "each confirmed row is on the queue once");
    messages.sort_by_key(|m| {
        serde_json::from_slice::<Value>(&m.delivery.data).expect("JSON")["dispatch_id"]
            .as_i64()
            .expect("an id")
    });
    for (message, row) in messages.iter().zip(&rows) {
        let body: Value = serde_json::from_slice(&message.delivery.data).expect("a JSON payload");
        assert_eq!(body, payload(&row.dispatch), "the exact payload of the row");
        let properties = &message.delivery.properties;
        assert_eq!(
            properties.message_id().as_ref().map(|id| id.to_string()),
            Some(row.dispatch.dispatch_id.to_string()),
            "message_id is the dispatch id"
        );
        assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            properties.content_type().as_ref().map(|t| t.to_string()),
            Some("application/json".to_owned())
        );
    }
    assert_eq!(publisher.publish_once().await.expect("a second sweep").published, 0);
    assert_eq!(broker.ready().await, Some(0), "nothing published twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_publish_is_an_error_and_the_row_stays_unpublished() {
    let Some((_db, broker, store)) = setup("unroutable").await else {
        return;
    };
    // The queue exists but is not bound; the publisher declares only the
    // exchange, so nothing routes there.
    broker.declare_unbound_queue().await;
    start_independent(&store, "unroutable", 1).await;
    let row = outbox(&store).await.remove(0);
    let publisher = outbox_publisher(store.clone(), &broker);
    match publisher.publish_once().await {
        Err(Error::Queue(queue::Error::Unroutable(id))) => assert_eq!(id, row.dispatch.dispatch_id),
        other => panic!("expected the row's Unroutable error, got {other:?}"),
    }
    assert!(
        !outbox(&store).await[0].published,
        "a returned message is acked too, but the row stays unpublished"
    );
    assert_eq!(broker.ready().await, Some(0), "nothing reached the queue");

    // Once the queue is bound, the same row goes out, once.
    broker.declared_queue().await;
    assert_eq!(publisher.publish_once().await.expect("the sweep").published, 1);
    assert!(outbox(&store).await[0].published);
    assert_eq!(
        deliveries_by_id(&broker).await,
        BTreeMap::from([(row.dispatch.dispatch_id.0, 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_stay_pending_while_the_broker_is_unreachable_then_drain_exactly_once_each() {
    let Some((_db, broker, store)) = setup("outage").await else {
        return;
    };
    broker.declared_queue().await;
    let proxy = Proxy::start(broker_address(&broker.url).expect("the broker's address")).await;
    let publisher = Arc::new(OutboxPublisher::new(
        store.clone(),
        RabbitPublisher::new(broker.config_for(&amqp_url_via(&broker.url, proxy.port()))).expect("a valid config"),
        PublisherConfig::default(),
    ));
    // A first row goes out through the proxy: the publisher is connected.
    start_independent(&store, "outage-before", 1).await;
    assert_eq!(publisher.publish_once().await.expect("the first sweep").published, 1);

    // The broker becomes unreachable: the established connection is cut,
    // and reconnecting is refused.
    proxy.set(Mode::Cut);
    start_independent(&store, "outage-during", 5).await;
    for attempt in 1..=2 {
        match publisher.publish_once().await {
            Err(Error::Queue(e)) => assert!(e.is_transient(), "sweep {attempt}: {e:?}"),
            other => panic!("sweep {attempt} while cut: expected a queue error, got {other:?}"),
        }
        let pending = outbox(&store).await.iter().filter(|r| !r.published).count();
        assert_eq!(
            pending, 5,
            "sweep {attempt}: the transaction rolled back, every row stays"
        );
    }

    // The publisher's loop keeps retrying with backoff; the broker returns.
    let shutdown = CancellationToken::new();
    let looping = {
        let (publisher, shutdown) = (Arc::clone(&publisher), shutdown.clone());
        tokio::spawn(async move { publisher.run(shutdown).await })
    };
    proxy.set(Mode::Forward);
    eventually("the loop to drain the outbox once the broker is back", || async {
        outbox(&store).await.iter().all(|r| r.published).then_some(())
    })
    .await;
    shutdown.cancel();
    within("the publisher loop to stop", looping)
        .await
        .expect("join the loop")
        .expect("the loop stops cleanly");

    let expected: BTreeMap<i64, usize> = outbox(&store)
        .await
        .iter()
        .map(|r| (r.dispatch.dispatch_id.0, 1))
        .collect();
    assert_eq!(expected.len(), 6);
    assert_eq!(
        deliveries_by_id(&broker).await,
        expected,
        "deliveries by dispatch id: each row exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_crashed_publisher_never_published_are_delivered_by_a_fresh_one() {
    let Some((db, broker, store)) = setup("crashwindow").await else {
        return;
    };
    broker.declared_queue().await;
    start_independent(&store, "crash-window", 4).await;
    let rows = outbox(&store).await;

    // The crashing process, at the store level: its own pool; its sweep
    // takes the rows, then it dies before publishing anything.
    {
        let doomed = db.store().await;
        let sweep = doomed
            .begin_sweep(Scope::All, 100, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
            .await
            .expect("a sweep")
            .expect("rows to sweep");
        assert_eq!(sweep.dispatches().len(), 4);
        drop(sweep);
        doomed.pool().close().await;
    }
    assert!(outbox(&store).await.iter().all(|r| !r.published), "nothing was marked");
    assert_eq!(broker.ready().await, Some(0), "nothing was published");

    // A fresh publisher (a new process: its own pool, its own connection).
    let fresh = outbox_publisher(db.store().await, &broker);
    assert_eq!(fresh.publish_once().await.expect("the sweep").published, 4);
    assert!(outbox(&store).await.iter().all(|r| r.published));
    let mut delivered = broker.drain_dispatches().await;
    delivered.sort_by_key(|d| d.dispatch_id);
    let expected: Vec<Dispatch> = rows.into_iter().map(|r| r.dispatch).collect();
    assert_eq!(delivered, expected, "each committed row delivered once, as stored");
}

/// A publisher that remembers which dispatches it got confirmed, and holds
/// its first batch at a barrier until the other publisher holds one too.
struct Recording<P> {
    inner: P,
    confirmed: Arc<Mutex<Vec<DispatchId>>>,
    hold_first: Mutex<Option<Arc<Barrier>>>,
}

impl<P: DispatchPublisher> DispatchPublisher for Recording<P> {
    async fn publish(&self, batch: &[Dispatch]) -> Vec<Result<(), queue::Error>> {
        let hold = self.hold_first.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(barrier) = hold {
            // Both sweeps are open at once here, each holding its rows
            // locked: the second could only have got rows by skipping the
            // first's (had it waited on them, this barrier would never
            // open and the test would time out).
            barrier.wait().await;
        }
        let results = self.inner.publish(batch).await;
        let mut confirmed = self.confirmed.lock().unwrap_or_else(PoisonError::into_inner);
        for (d, r) in batch.iter().zip(&results) {
            if r.is_ok() {
                confirmed.push(d.dispatch_id);
            }
        }
        results
    }

    fn durable(&self) -> bool {
        self.inner.durable()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_publishers_in_parallel_publish_each_row_exactly_once() {
    let Some((db, broker, store)) = setup("twopublishers").await else {
        return;
    };
    broker.declared_queue().await;
    const ROWS: usize = 200;
    const BATCH: usize = 10;
    start_independent(&store, "two-publishers", ROWS).await;

    let start = Arc::new(Barrier::new(2));
    let overlap = Arc::new(Barrier::new(2));
    let mut logs = Vec::new();
    let mut sweeping = Vec::new();
    for _ in 0..2 {
        let confirmed = Arc::new(Mutex::new(Vec::new()));
        logs.push(Arc::clone(&confirmed));
        // Each its own process: its own pool and its own broker connection;
        // small batches so the two interleave.
        let publisher = OutboxPublisher::new(
            db.store().await,
            Recording {
                inner: RabbitPublisher::new(broker.config()).expect("a valid config"),
                confirmed,
                hold_first: Mutex::new(Some(Arc::clone(&overlap))),
            },
            PublisherConfig {
                batch: BATCH as u32,
                ..PublisherConfig::default()
            },
        );
        let start = Arc::clone(&start);
        sweeping.push(tokio::spawn(async move {
            start.wait().await;
            loop {
                let report = publisher.publish_once().await.expect("a sweep");
                // Nothing left that the other publisher does not hold.
                if report.published == 0 && !report.more {
                    return;
                }
            }
        }));
    }
    for task in sweeping {
        within("a publisher to finish", task).await.expect("join a publisher");
    }

    let first: BTreeSet<i64> = logs[0].lock().expect("log").iter().map(|d| d.0).collect();
    let second: BTreeSet<i64> = logs[1].lock().expect("log").iter().map(|d| d.0).collect();
    let all: BTreeSet<i64> = outbox(&store).await.iter().map(|r| r.dispatch.dispatch_id.0).collect();
    assert!(
        first.len() >= BATCH && second.len() >= BATCH,
        "both publishers took part: {} and {} rows",
        first.len(),
        second.len()
    );
    assert!(
        first.is_disjoint(&second),
        "published by both: {:?}",
        first.intersection(&second).collect::<Vec<_>>()
    );
    assert_eq!(
        first.union(&second).copied().collect::<BTreeSet<_>>(),
        all,
        "every row published"
    );
    assert_eq!(first.len() + second.len(), ROWS);
    assert!(outbox(&store).await.iter().all(|r| r.published));
    let counts = deliveries_by_id(&broker).await;
    assert_eq!(counts.keys().copied().collect::<BTreeSet<_>>(), all);
    assert!(
        counts.values().all(|&n| n == 1),
        "a dispatch delivered twice: {:?}",
        counts.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
}

/// A chain a → b started, its start's rows published and drained, and a
/// claimed: returns the run and a's claim.
async fn chain_with_a_claimed(store: &PgStore, broker: &Broker, name: &str) -> (flowforge_ports::RunId, Claim) {
    let published = store
        .publish_definition(&definition(&json!({"name": name, "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]}
        ]})))
        .await
        .expect("publish the definition");
    let run = store.start_run(published.id, json!({})).await.expect("start a run");
    outbox_publisher(store.clone(), broker)
        .publish_once()
        .await
        .expect("the start's sweep");
    broker.drain_dispatches().await;
    let a = detail(store, run)
        .await
        .tasks
        .into_iter()
        .find(|t| t.key == "a")
        .expect("a");
    let claim = store
        .claim_task_run(a.id, a.token, &WorkerId("w".into()), Duration::from_secs(300))
        .await
        .expect("claim")
        .expect("a is ready");
    (run, claim)
}

/// a's success handing b on, b's outbox row held for `hold`.
async fn hand_b_on(store: &PgStore, a: &Claim, hold: Duration) -> Vec<Dispatch> {
    let finished = store
        .finish_and_hand_off(
            a.task_run_id,
            a.token,
            &WorkerId("w".into()),
            TaskOutcome::Succeeded { output: json!({}) },
            &Handoff {
                dependents: vec!["b".into()],
                joins: Vec::new(),
                whole: true,
            },
            Handover::Held(hold),
        )
        .await
        .expect("finish_and_hand_off");
    assert_eq!(finished.held.len(), 1, "b's dispatch is held");
    finished.held
}

/// An after-commit publisher into this test's queue, settling in `store`,
/// with an hour's hold.
struct AfterCommitted {
    handle: AfterCommit,
    publishing: tokio::task::JoinHandle<()>,
}

impl AfterCommitted {
    fn start(store: &PgStore, broker: &Broker) -> Self {
        let (handle, publishing) = AfterCommit::start(
            store.clone(),
            RabbitPublisher::new(broker.config()).expect("a valid config"),
            Duration::from_secs(3600),
        );
        Self { handle, publishing }
    }

    /// Drops the handle and waits for the loop to publish and settle what
    /// it was handed.
    async fn end(self) {
        drop(self.handle);
        within("the after-commit publisher", self.publishing)
            .await
            .expect("it ends once its handles are gone");
    }
}

/// b's outbox row.
async fn b_row(store: &PgStore) -> OutboxRow {
    outbox(store)
        .await
        .into_iter()
        .find(|r| r.dispatch.task_key == "b")
        .expect("b's row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_is_published_right_after_its_commit_and_marked() {
    let Some((_db, broker, store)) = setup("aftercommit").await else {
        return;
    };
    broker.declared_queue().await;
    let (_, a) = chain_with_a_claimed(&store, &broker, "after-commit").await;
    let held = hand_b_on(&store, &a, Duration::from_secs(3600)).await;
    let sweeper = outbox_publisher(store.clone(), &broker);
    assert_eq!(
        sweeper.publish_once().await.expect("a sweep").published,
        0,
        "the sweep leaves a held row to its committer"
    );

    let after_commit = AfterCommitted::start(&store, &broker);
    after_commit.handle.hand(held.clone(), false).await;
    after_commit.end().await;
    assert_eq!(broker.drain_dispatches().await, held, "published as stored");
    assert!(b_row(&store).await.published, "and marked published");
    assert_eq!(store.held_for(Scope::All).await.expect("held_for"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_whose_worker_died_before_publishing_is_swept_once_its_hold_is_over() {
    let Some((_db, broker, store)) = setup("afterdeath").await else {
        return;
    };
    broker.declared_queue().await;
    let (_, a) = chain_with_a_claimed(&store, &broker, "after-death").await;
    // The worker commits, then dies before it publishes.
    let held = hand_b_on(&store, &a, Duration::from_secs(1)).await;

    // A publisher whose only wake-up is the hold's end: no notification
    // comes for a held row, and its safety net is an hour away.
    let publisher = OutboxPublisher::new(
        store.clone(),
        RabbitPublisher::new(broker.config()).expect("a valid config"),
        PublisherConfig {
            safety_net: Duration::from_secs(3600),
            ..PublisherConfig::default()
        },
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { publisher.run(shutdown).await }
    });
    let delivered = eventually("b's dispatch, swept once its hold is over", || {
        let broker = &broker;
        async move {
            let got = broker.drain_dispatches().await;
            (!got.is_empty()).then_some(got)
        }
    })
    .await;
    assert_eq!(delivered, held, "delivered once, as stored");
    shutdown.cancel();
    within("the publisher stops", running)
        .await
        .expect("joins")
        .expect("stops cleanly");
    assert!(outbox(&store).await.iter().all(|r| r.published));
}

/// A dispatch its finishing slot kept and claimed itself is settled
/// published and never reaches the broker
/// (docs/design/outbox-and-queues.md#continuing-a-chain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_dispatch_is_settled_published_without_a_publish() {
    let Some((_db, broker, store)) = setup("aftercommitkept").await else {
        return;
    };
    broker.declared_queue().await;
    let (_, a) = chain_with_a_claimed(&store, &broker, "after-commit-kept").await;
    let held = hand_b_on(&store, &a, Duration::from_secs(3600)).await;

    let after_commit = AfterCommitted::start(&store, &broker);
    after_commit.handle.kept(held[0].clone());
    after_commit.end().await;
    assert!(broker.drain_dispatches().await.is_empty(), "nothing was published");
    assert!(b_row(&store).await.published, "b's row is marked published");
    assert_eq!(
        store.held_for(Scope::All).await.expect("held_for"),
        None,
        "and held no more"
    );
    assert_eq!(
        outbox_publisher(store.clone(), &broker)
            .publish_once()
            .await
            .expect("a sweep")
            .published,
        0,
        "so no sweep publishes it either"
    );
}
