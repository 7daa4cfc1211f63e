//! Wake-ups over LISTEN/NOTIFY: another process's commit wakes this one's
//! loops, a wake sent while nobody waits is kept, every RunSettled waiter
//! wakes, and a lost listening connection wakes every topic and listens
//! again.
//!
//! That a notification did *not* come is proven, never inferred from a
//! quiet spell (a late one would pass): see [`silent`].

use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_postgres::{PgNotifier, PgStore};
use flowforge_domain::RunTransition;
use flowforge_ports::{DefinitionStore, Notifier, RunPass, RunStore, TaskOutcome, Topic, WorkerId};
use serde_json::json;
use sqlx::PgPool;

use crate::harness::{LONG_LEASE, def, ready};

async fn woken(n: &PgNotifier, topic: Topic, within: Duration) -> bool {
    tokio::time::timeout(within, n.notified(topic)).await.is_ok()
}

const SOON: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(200);

/// Whether `n` has no wake-up on `topic` pending, proven with a marker:
/// a NOTIFY on `marker` sent now, from a connection of its own, reaches
/// `store`'s listener after every notification committed before it, and
/// the listener relays them one at a time, in order. So once a fresh
/// handle has heard the marker, anything sent on `topic` before it has
/// reached `n`, whose pending wake-up then returns at once. `marker` must
/// be a topic nothing notifies in the meantime; `n`'s wake-up from the
/// marker is consumed.
async fn silent(store: &PgStore, raw: &PgPool, n: &PgNotifier, topic: Topic, marker: Topic) -> bool {
    let witness = store.notifier().await.unwrap();
    let channel = match marker {
        Topic::Scheduler => "flowforge_scheduler",
        Topic::Publisher => "flowforge_publisher",
        Topic::RunSettled => "flowforge_run_settled",
    };
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(channel)
        .execute(raw)
        .await
        .unwrap();
    assert!(
        woken(&witness, marker, SOON).await,
        "the {marker:?} marker was not heard"
    );
    let quiet = !woken(n, topic, Duration::ZERO).await;
    // Leave `n` as it was: its kept wake-up from the marker is consumed.
    assert!(
        woken(n, marker, Duration::ZERO).await,
        "the marker reached the witness, not `n`"
    );
    quiet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_stores_commits_wake_this_stores_loops() {
    let db = test_db!();
    let raw = db.raw().await;
    let (listener, _) = db.store().await;
    let (writer, _) = db.store().await;
    let n = listener.notifier().await.unwrap();
    // A second handle: it shows when the notification has arrived.
    let witness = listener.notifier().await.unwrap();
    assert!(
        silent(&listener, &raw, &n, Topic::Publisher, Topic::RunSettled).await,
        "nothing happened yet"
    );

    let wf = writer
        .publish_definition(&def(
            json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        ))
        .await
        .unwrap()
        .id;
    let run = writer.start_run(wf, json!({})).await.unwrap();
    // Arrived while nobody waited on `n`: kept for its next wait, which
    // then returns at once.
    assert!(woken(&witness, Topic::Publisher, SOON).await);
    assert!(
        woken(&n, Topic::Publisher, Duration::ZERO).await,
        "the wake was not kept"
    );
    assert!(woken(&n, Topic::Scheduler, SOON).await);

    let (id, token) = ready(&writer, run, "a").await;
    let me = WorkerId("w".into());
    let claim = writer
        .claim_task_run(id, token, &me, LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    assert!(woken(&n, Topic::Scheduler, SOON).await, "first claim in a pending run");
    writer
        .finish_task_run(id, claim.token, &me, TaskOutcome::Succeeded { output: json!({}) })
        .await
        .unwrap();
    assert!(woken(&n, Topic::Scheduler, SOON).await, "a finish");
    // Nothing has notified the publisher since the start was heard.
    assert!(
        silent(&listener, &raw, &n, Topic::RunSettled, Topic::Publisher).await,
        "a finish does not settle the run"
    );

    // Every waiter of a settled run wakes, not just one.
    let n = Arc::new(n);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let n = Arc::clone(&n);
            tokio::spawn(async move { woken(&n, Topic::RunSettled, SOON).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A handle of its own: a waiter that returned early would have
    // consumed a wake-up of the shared one.
    let before_commit = listener.notifier().await.unwrap();
    let mut pass = writer.begin_pass(run).await.unwrap().unwrap();
    pass.transition_run(RunTransition::Start).await.unwrap();
    pass.transition_run(RunTransition::Succeed).await.unwrap();
    assert!(
        silent(&listener, &raw, &before_commit, Topic::RunSettled, Topic::Publisher).await,
        "nothing is delivered before commit"
    );
    pass.commit().await.unwrap();
    for w in waiters {
        assert!(w.await.unwrap(), "a RunSettled waiter was not woken");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stores_own_commits_wake_its_waiters_directly() {
    let db = test_db!();
    let raw = db.raw().await;
    let (store, _) = db.store().await;
    let n = store.notifier().await.unwrap();
    let wf = store
        .publish_definition(&def(
            json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        ))
        .await
        .unwrap()
        .id;
    store.start_run(wf, json!({})).await.unwrap();
    assert!(woken(&n, Topic::Publisher, SOON).await);
    // Its own NOTIFY echo is skipped: one commit, one wake. (Its echo on
    // the scheduler's channel is skipped too, so the marker is the only
    // scheduler wake-up a fresh handle can hear.)
    assert!(
        silent(&store, &raw, &n, Topic::Publisher, Topic::Scheduler).await,
        "the store's own NOTIFY woke it a second time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listening_connection_wakes_every_topic_and_listens_again() {
    let db = test_db!();
    let (listener, _) = db.store().await;
    let (writer, _) = db.store().await;
    let n = listener.notifier().await.unwrap();
    let raw = db.raw().await;
    // Touches only this test's database: its listener's backend.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'flowforge-listener'",
    )
    .fetch_all(&raw)
    .await
    .unwrap();
    assert_eq!(killed, [true]);
    for topic in [Topic::Scheduler, Topic::Publisher, Topic::RunSettled] {
        assert!(
            woken(&n, topic, SOON).await,
            "{topic:?} was not woken after the connection loss"
        );
    }
    // Listening again: another store's notification arrives.
    let wf = writer
        .publish_definition(&def(
            json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        ))
        .await
        .unwrap()
        .id;
    // Wait for the new listening backend to have sent its LISTENs; the
    // reconnect's wake-all follows at once, so a quiet spell drains it and
    // what wakes the loop afterwards can only be a notification heard.
    let patience = std::time::Instant::now();
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'flowforge-listener'
               AND query LIKE 'LISTEN%'",
        )
        .fetch_one(&raw)
        .await
        .unwrap();
        if listening == 1 {
            break;
        }
        assert!(patience.elapsed() < SOON * 6, "the listener never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while woken(&n, Topic::Publisher, QUIET).await {}
    writer.start_run(wf, json!({})).await.unwrap();
    assert!(
        woken(&n, Topic::Publisher, SOON).await,
        "another store's commit was not heard after the reconnect"
    );
}
