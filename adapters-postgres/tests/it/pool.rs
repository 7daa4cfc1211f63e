//! The connection pool: a minimum is kept open from the start and
//! refilled after the server ends its sessions, so a process with a
//! fixed-size pool holds the same connections through a fault; a
//! connection idle past [`UNCHECKED_IDLE`] is checked before it is handed
//! out, one in steady use is not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_adapters_postgres::{PgOptions, PgStore, UNCHECKED_IDLE};
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{RunStore, store};
use sqlx::PgPool;

const APP: &str = "flowforge-pool-test";

/// This test's pool's sessions, counted by the server.
async fn sessions(raw: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
    )
    .bind(APP)
    .fetch_one(raw)
    .await
    .unwrap()
}

/// A store whose pool holds `size` connections from the start.
async fn fixed_pool(url: &str, size: u32) -> PgStore {
    PgStore::connect(
        url,
        Arc::new(ManualClock::default()),
        PgOptions {
            max_connections: size,
            min_connections: size,
            application_name: APP.to_owned(),
            ..crate::harness::options()
        },
    )
    .await
    .expect("connect")
}

/// The server ends every session of this test's pool (a restart, a proxy
/// cut), answering for each whether it did.
async fn end_sessions(raw: &PgPool) -> Vec<bool> {
    sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(APP)
    .fetch_all(raw)
    .await
    .expect("terminate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_size_pool_opens_its_connections_at_once_and_refills_them_after_losing_them() {
    let db = test_db!();
    let raw = db.raw().await;
    let store = fixed_pool(&db.url, 3).await;
    assert_eq!(sessions(&raw).await, 3, "the minimum is opened when the store connects");

    // The server ends every session of the pool (a restart, a proxy cut).
    assert_eq!(end_sessions(&raw).await, [true, true, true]);
    // Idle past the window in which the pool hands a connection out
    // unchecked.
    tokio::time::sleep(UNCHECKED_IDLE).await;

    // The next use finds the dead connections, closes them, and the pool
    // opens new ones up to its minimum without being asked for more.
    let patience = Instant::now();
    loop {
        let mut conn = store.pool().acquire().await.unwrap();
        let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *conn).await.unwrap();
        assert_eq!(one, 1);
        drop(conn);
        if sessions(&raw).await == 3 {
            break;
        }
        assert!(
            patience.elapsed() < Duration::from_secs(30),
            "the pool did not refill to its minimum: {} sessions",
            sessions(&raw).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection in steady use goes out unchecked: if the server ended its
/// session meanwhile, its next statement fails with nothing but
/// `Unavailable` (what every caller retries) — or succeeds, when this
/// machine stalled past the window and the pool checked it after all —
/// and the pool replaces it for the one after, which answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_while_in_steady_use_fails_one_statement_as_unavailable() {
    let db = test_db!();
    let raw = db.raw().await;
    let store = fixed_pool(&db.url, 1).await;
    assert!(store.list_runs(1).await.expect("a read").is_empty());
    assert_eq!(end_sessions(&raw).await, [true]);

    // Unchecked unless this machine stalled past the window meanwhile;
    // either way nothing but `Unavailable` comes back.
    match store.list_runs(1).await {
        Ok(runs) => assert!(runs.is_empty()),
        Err(e) => assert!(matches!(e, store::Error::Unavailable(_)), "{e:?}"),
    }
    assert!(
        store
            .list_runs(1)
            .await
            .expect("the replaced connection answers")
            .is_empty()
    );
}
