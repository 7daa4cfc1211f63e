//! [`PgStore`]: the pool, the clock offset and the wake-up hub every port
//! implementation shares; connecting, and checking or applying migrations.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::TimeDelta;
use flowforge_ports::{Clock, store};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool, Postgres, Transaction};
use tokio::sync::Notify;

use crate::error::store_error;
use crate::notify::Hub;

/// The schema, embedded in the binary.
pub(crate) static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How [`PgStore::connect`] sizes and tunes its pool. Everything about
/// *where* to connect (host, database, user, `sslmode`, certificates) comes
/// from the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// Most connections the pool opens. The notifier uses one more, its own.
    pub max_connections: u32,
    /// Connections kept open while idle.
    pub min_connections: u32,
    /// How long a caller waits for a free connection before `Unavailable`.
    pub acquire_timeout: Duration,
    /// `statement_timeout`, set on every connection: a statement running
    /// longer is cancelled (and reported `Unavailable`).
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout`, when set: a process that
    /// stalls inside a scheduler pass or an outbox sweep loses its session,
    /// and with it its locks, after this long instead of holding them
    /// forever. Set by default; keep it above the broker's publish and
    /// confirm timeouts, which a sweep spends inside its transaction.
    pub idle_in_transaction_timeout: Option<Duration>,
    /// Idle connections above `min_connections` are closed after this long.
    pub idle_timeout: Option<Duration>,
    /// `application_name`, unless the URL sets one (shows in `pg_stat_activity`).
    pub application_name: String,
}

/// A pooled connection idle for less than this is handed out as it is;
/// one idle longer is pinged first, and replaced when the server does not
/// answer (docs/design/cli.md#connection-pool). sqlx pings every
/// connection it takes back, so one in steady use was found alive moments
/// ago; pinging it again on every acquire would add a round trip to every
/// statement. HikariCP skips its check within the same half second.
pub const UNCHECKED_IDLE: Duration = Duration::from_millis(500);

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Some(Duration::from_secs(20)),
            idle_timeout: Some(Duration::from_secs(600)),
            application_name: "flowforge".to_owned(),
        }
    }
}

/// The PostgreSQL store: every store port of `flowforge-ports`. Cheap to
/// clone; clones share the pool, the clock and the wake-up hub.
#[derive(Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) rollbacks: Arc<Rollbacks>,
}

/// Rollbacks of passes and sweeps dropped without commit, still in flight.
///
/// sqlx only queues a dropped transaction's ROLLBACK, so its row locks
/// would outlive the drop by an unknown moment; a `begin_pass` or
/// `begin_sweep` right after the drop would then skip rows that are in fact
/// free. Dropping spawns the rollback, and the next lock-taking call of
/// this store waits for it: "dropping rolls back" holds in program order.
#[derive(Default)]
pub(crate) struct Rollbacks {
    pending: AtomicUsize,
    done: Notify,
}

/// How long a lock-taking call waits for earlier rollbacks before going on
/// (a dead connection fails its rollback well within it).
const ROLLBACK_WAIT: Duration = Duration::from_secs(10);

impl Rollbacks {
    /// Rolls `tx` back in the background, tracked until done.
    pub(crate) fn spawn(self: &Arc<Self>, tx: Transaction<'static, Postgres>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: sqlx rolls back on the connection's
            // next use, as it does for any dropped transaction.
            drop(tx);
            return;
        };
        self.pending.fetch_add(1, Ordering::SeqCst);
        let this = Arc::clone(self);
        runtime.spawn(async move {
            if let Err(e) = tx.rollback().await {
                tracing::warn!(error = %e, "rolling back a dropped transaction failed");
            }
            this.pending.fetch_sub(1, Ordering::SeqCst);
            this.done.notify_waiters();
        });
    }

    /// Waits until every rollback spawned so far has finished.
    pub(crate) async fn settled(&self) {
        let wait = async {
            loop {
                let notified = self.done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.pending.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(ROLLBACK_WAIT, wait).await;
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("pool_size", &self.inner.pool.size())
            .field("clock_offset", &self.inner.clock.offset())
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db?sslmode=…`)
    /// and checks that every embedded migration is applied.
    ///
    /// Errors: `Unavailable` when the server cannot be reached; `Migration`
    /// when the schema is missing or differs from this binary's (this never
    /// migrates: run [`PgStore::migrate`] or `flowforge migrate`); `Other`
    /// for a malformed URL.
    pub async fn connect(url: &str, clock: Arc<dyn Clock>, options: PgOptions) -> Result<Self, store::Error> {
        let store = Self::connect_unchecked(url, clock, options).await?;
        store.check_migrations().await?;
        Ok(store)
    }

    /// Connects without checking the schema: for `flowforge migrate`, which
    /// then calls [`PgStore::migrate`].
    pub async fn connect_unchecked(url: &str, clock: Arc<dyn Clock>, options: PgOptions) -> Result<Self, store::Error> {
        let connect = connect_options(url, &options)?;
        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= UNCHECKED_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .max_connections(options.max_connections.max(1))
            .min_connections(options.min_connections)
            .acquire_timeout(options.acquire_timeout)
            .idle_timeout(options.idle_timeout)
            .connect_with(connect.clone())
            .await
            .map_err(store_error)?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                clock,
                hub: Arc::new(Hub::new(connect)),
                rollbacks: Arc::default(),
            }),
        })
    }

    /// Applies every embedded migration not yet applied (idempotent; safe
    /// to run from several processes at once: sqlx takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), store::Error> {
        MIGRATOR
            .run(&self.inner.pool)
            .await
            .map_err(|e| store::Error::Migration(e.to_string()))
    }

    /// Checks that the database holds exactly this binary's migrations,
    /// applied successfully and unmodified.
    pub async fn check_migrations(&self) -> Result<(), store::Error> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        if !exists {
            return Err(store::Error::Migration(
                "no migrations are applied to this database".to_owned(),
            ));
        }
        let applied: Vec<(i64, bool, Vec<u8>)> =
            sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")
                .fetch_all(&self.inner.pool)
                .await
                .map_err(store_error)?;
        let applied: BTreeMap<i64, (bool, Vec<u8>)> = applied.into_iter().map(|(v, s, c)| (v, (s, c))).collect();
        store::check_migrations(
            MIGRATOR
                .iter()
                .map(|m| (m.version, m.description.as_ref(), m.checksum.as_ref())),
            &applied,
        )
    }

    /// The pool, for tools that need raw SQL (benchmarks, diagnostics).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The Clock port's offset, bound into every statement that reads store
    /// time as `statement_timestamp() + offset`.
    pub(crate) fn offset(&self) -> TimeDelta {
        self.inner.clock.offset()
    }
}

fn connect_options(url: &str, options: &PgOptions) -> Result<PgConnectOptions, store::Error> {
    let mut connect =
        PgConnectOptions::from_str(url).map_err(|e| store::Error::Other(format!("invalid PostgreSQL URL: {e}")))?;
    if connect.get_application_name().is_none() {
        connect = connect.application_name(&options.application_name);
    }
    let mut settings = vec![("statement_timeout", options.statement_timeout.as_millis().to_string())];
    if let Some(idle) = options.idle_in_transaction_timeout {
        settings.push(("idle_in_transaction_session_timeout", idle.as_millis().to_string()));
    }
    Ok(connect.options(settings))
}

/// A priority aging step in microseconds, as the dispatch-order
/// statements bind it (docs/design/priorities.md).
pub(crate) fn micros(aging: Duration) -> f64 {
    aging.as_secs_f64() * 1_000_000.0
}

/// Converts a std duration to the interval bound into SQL, refusing the
/// absurd (more than ~292 000 years) instead of wrapping.
pub(crate) fn interval(d: Duration) -> Result<TimeDelta, store::Error> {
    TimeDelta::from_std(d).map_err(|_| store::Error::Other(format!("duration {d:?} is out of range")))
}
