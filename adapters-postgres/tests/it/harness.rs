//! The test harness: a fresh database per test on the server named by
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`),
//! migrated, and dropped when the test ends — even when it fails — so tests
//! run in parallel against one server. No server: the test is skipped with
//! a notice, unless `REQUIRE_POSTGRES=1` makes that a failure.

use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_domain::{TaskRunState, WorkflowDefinition};
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{Clock, RunId, RunStore, TaskRunId, TaskRunView};
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

static SERVER: OnceCell<Option<String>> = OnceCell::const_new();

/// The server URL if it answers; panics instead of skipping when
/// `REQUIRE_POSTGRES=1`.
async fn server() -> Option<String> {
    SERVER
        .get_or_init(|| async {
            let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
            let probe = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&url)).await;
            match probe {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    Some(url)
                }
                failure => {
                    let why = match failure {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_owned(),
                    };
                    assert!(
                        std::env::var("REQUIRE_POSTGRES").as_deref() != Ok("1"),
                        "REQUIRE_POSTGRES=1 but PostgreSQL at {url} is unreachable: {why}"
                    );
                    skip_notice(&format!("PostgreSQL at {url} is unreachable ({why})"));
                    None
                }
            }
        })
        .await
        .clone()
}

/// Whether the server accepts TCP connections (a blocking probe, cached),
/// for callers that cannot await; the same skip-or-fail rule as [`server`].
pub(crate) fn server_reachable() -> bool {
    static REACHABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REACHABLE.get_or_init(|| {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
        let reachable = url.parse::<sqlx::postgres::PgConnectOptions>().is_ok_and(|o| {
            if o.get_host().starts_with('/') {
                return std::path::Path::new(o.get_host()).exists();
            }
            use std::net::ToSocketAddrs;
            (o.get_host(), o.get_port()).to_socket_addrs().is_ok_and(|mut addrs| {
                addrs.any(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(3)).is_ok())
            })
        });
        assert!(
            reachable || std::env::var("REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "REQUIRE_POSTGRES=1 but PostgreSQL at {url} is unreachable"
        );
        if !reachable {
            skip_notice(&format!("PostgreSQL at {url} is unreachable"));
        }
        reachable
    })
}

/// Says why tests are skipped, on the real stderr: the test harness
/// captures `eprintln!`, which would hide the notice of a passing test.
fn skip_notice(why: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {why}; set DATABASE_URL (and REQUIRE_POSTGRES=1 to fail instead)"
    );
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    match query {
        Some(q) => format!("{scheme}://{authority}/{name}?{q}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

/// One test's own database.
pub(crate) struct TestDb {
    pub(crate) url: String,
    name: String,
    admin_url: String,
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
        let admin_url = server().await?;
        let name = format!("ff_test_{}", uuid::Uuid::now_v7().simple());
        let mut admin = PgConnection::connect(&admin_url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        Some(TestDb {
            url: with_database(&admin_url, &name),
            name,
            admin_url,
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

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot be blocked on:
        // a thread with its own runtime drops the database (FORCE ends the
        // test's remaining connections).
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let dropper = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut admin = PgConnection::connect(&admin_url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await
                .unwrap();
                let _ = admin.close().await;
            });
        });
        let _ = dropper.join();
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
