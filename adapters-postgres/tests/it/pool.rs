//! The connection pool's size options: a minimum is kept open from the
//! start and refilled after the server ends its sessions, so a process
//! with a fixed-size pool holds the same connections through a fault.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_ports::clock::ManualClock;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_size_pool_opens_its_connections_at_once_and_refills_them_after_losing_them() {
    let db = test_db!();
    let raw = db.raw().await;
    let store = PgStore::connect(
        &db.url,
        Arc::new(ManualClock::default()),
        PgOptions {
            max_connections: 3,
            min_connections: 3,
            application_name: APP.to_owned(),
            ..crate::harness::options()
        },
    )
    .await
    .unwrap();
    assert_eq!(sessions(&raw).await, 3, "the minimum is opened when the store connects");

    // The server ends every session of the pool (a restart, a proxy cut).
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(APP)
    .fetch_all(&raw)
    .await
    .unwrap();
    assert_eq!(ended, [true, true, true]);

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
