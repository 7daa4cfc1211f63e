//! The test harness: a fresh database per test, migrated, and dropped when
//! the test ends — even when it fails — so tests run in parallel against
//! one server: the one `DATABASE_URL` names, else this binary's container
//! (flowforge-testkit). Neither: the test is skipped with a notice, unless
//! `REQUIRE_POSTGRES=1` makes that a failure.

use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_domain::{TaskRunState, WorkflowDefinition};
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{Clock, RunId, RunStore, TaskRunId, TaskRunView};
use flowforge_testkit::{TestDatabase, postgres_url};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Whether there is a server to test against (see the module comment).
pub(crate) fn server_reachable() -> bool {
    postgres_url().is_some()
}

/// One test's own database (dropped with the guard).
pub(crate) struct TestDb {
    pub(crate) url: String,
    _database: TestDatabase,
}

impl TestDb {
    /// A fresh, migrated database; `None` when the server is absent (skip).
    pub(crate) async fn create() -> Option<TestDb> {
        let db = Self::create_empty().await?;
        let store = PgStore::connect_unchecked(&db.url, Arc::new(ManualClock::default()), options())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store.pool().close().await;
        Some(db)
    }

    /// A fresh database with no schema.
    pub(crate) async fn create_empty() -> Option<TestDb> {
        let server = postgres_url()?;
        let database = TestDatabase::create(&server, "ff_test").await;
        Some(TestDb {
            url: database.url.clone(),
            _database: database,
        })
    }

    /// A store on its own pool, with a clock tests move by hand.
    pub(crate) async fn store(&self) -> (PgStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::default());
        (self.store_with(clock.clone()).await, clock)
    }

    /// A store on its own pool with the given clock.
    pub(crate) async fn store_with(&self, clock: Arc<dyn Clock>) -> PgStore {
        PgStore::connect(&self.url, clock, options()).await.unwrap()
    }

    /// A raw pool for SQL the ports do not offer.
    pub(crate) async fn raw(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.url)
            .await
            .unwrap()
    }
}

/// Small pools: many tests share one server with `max_connections = 100`.
pub(crate) fn options() -> PgOptions {
    PgOptions {
        max_connections: 3,
        acquire_timeout: Duration::from_secs(30),
        statement_timeout: Duration::from_secs(60),
        ..PgOptions::default()
    }
}

/// Skips the test (returns) when there is no server.
#[macro_export]
macro_rules! test_db {
    () => {
        match $crate::harness::TestDb::create().await {
            Some(db) => db,
            None => return,
        }
    };
}

/// A validated definition from JSON.
pub(crate) fn def(v: Value) -> WorkflowDefinition {
    WorkflowDefinition::from_document(serde_json::from_value(v).unwrap()).unwrap()
}

/// The current view of one task run.
pub(crate) async fn task(store: &PgStore, run: RunId, key: &str) -> TaskRunView {
    let detail = store.get_run(run).await.unwrap().unwrap();
    detail
        .tasks
        .into_iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no task run '{key}'"))
}

/// The id and current token of a task run (what its dispatch carries when ready).
pub(crate) async fn ready(store: &PgStore, run: RunId, key: &str) -> (TaskRunId, i64) {
    let t = task(store, run, key).await;
    assert_eq!(t.state, TaskRunState::Ready, "task '{key}' should be ready");
    (t.id, t.token)
}

/// Long enough that nothing is reaped by accident on a slow machine.
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(3600);

/// Bounds every race so a deadlock or hang fails instead of hanging CI.
pub(crate) async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 60 s (deadlock?)"))
}
