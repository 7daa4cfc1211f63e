//! The schema: every named constraint rejects the row it exists to reject
//! (raw SQL, so nothing but the database stands in the way), and the store
//! refuses a database whose migrations are not applied.

use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{SystemClock, store};

use crate::harness::{TestDb, options};

const SETUP: &str = "
INSERT INTO workflow (id, name, version, description, fingerprint, definition, created_at)
VALUES (1, 'w', 1, '', repeat('a', 64), '{}', now());
INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, max_attempts)
VALUES (1, 'a', 0, 'noop', '[]', '{}', 1);
INSERT INTO workflow_run (id, workflow_id, state, input, created_at)
VALUES ('00000000-0000-0000-0000-000000000001', 1, 'pending', '{}', now());
INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at)
VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'pending', 1, now());
INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at)
VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'noop', 0, now());
";

/// Each statement breaks exactly one constraint, named beside it.
const CASES: &[(&str, &str)] = &[
    // task_run: one row (id 1, pending), moved into every forbidden shape.
    ("UPDATE task_run SET state = 'done' WHERE id = 1", "taskrun_state_valid"),
    (
        "UPDATE task_run SET state = 'running', lease_owner = 'w' WHERE id = 1",
        "taskrun_lease_iff_running",
    ),
    (
        "UPDATE task_run SET lease_expires_at = now() WHERE id = 1",
        "taskrun_lease_iff_running",
    ),
    (
        "UPDATE task_run SET lease_owner = 'w' WHERE id = 1",
        "taskrun_owner_iff_running",
    ),
    (
        "UPDATE task_run SET state = 'running', lease_expires_at = now() WHERE id = 1",
        "taskrun_owner_iff_running",
    ),
    (
        "UPDATE task_run SET state = 'retrying' WHERE id = 1",
        "taskrun_retry_at_iff_retrying",
    ),
    (
        "UPDATE task_run SET retry_at = now() WHERE id = 1",
        "taskrun_retry_at_iff_retrying",
    ),
    (
        "UPDATE task_run SET state = 'cancelled', finished_at = now() WHERE id = 1",
        "taskrun_cancel_reason_iff_cancelled",
    ),
    (
        "UPDATE task_run SET cancel_reason = 'user' WHERE id = 1",
        "taskrun_cancel_reason_iff_cancelled",
    ),
    (
        "UPDATE task_run SET state = 'cancelled', finished_at = now(), cancel_reason = 'bored' WHERE id = 1",
        "taskrun_cancel_reason_valid",
    ),
    (
        "UPDATE task_run SET state = 'succeeded' WHERE id = 1",
        "taskrun_finished_iff_finished_state",
    ),
    (
        "UPDATE task_run SET state = 'failed' WHERE id = 1",
        "taskrun_finished_iff_finished_state",
    ),
    (
        "UPDATE task_run SET finished_at = now() WHERE id = 1",
        "taskrun_finished_iff_finished_state",
    ),
    (
        "UPDATE task_run SET result = '{}' WHERE id = 1",
        "taskrun_result_only_when_succeeded",
    ),
    (
        "UPDATE task_run SET attempt = 0 WHERE id = 1",
        "taskrun_attempt_positive",
    ),
    (
        "UPDATE task_run SET fencing_token = -1 WHERE id = 1",
        "taskrun_token_nonnegative",
    ),
    (
        "UPDATE task_run SET state = 'ready', pending_deps = -1 WHERE id = 1",
        "taskrun_pending_deps_nonnegative",
    ),
    (
        "UPDATE task_run SET pending_deps = 0 WHERE id = 1",
        "taskrun_pending_waits_on_deps",
    ),
    (
        "INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at)
         VALUES (2, '00000000-0000-0000-0000-000000000001', 'a', 'pending', 1, now())",
        "uniq_taskrun_run_key",
    ),
    // workflow_run
    ("UPDATE workflow_run SET state = 'paused'", "workflowrun_state_valid"),
    (
        "UPDATE workflow_run SET state = 'succeeded'",
        "workflowrun_finished_iff_terminal",
    ),
    (
        "UPDATE workflow_run SET finished_at = now()",
        "workflowrun_finished_iff_terminal",
    ),
    // workflow
    (
        "INSERT INTO workflow (id, name, version, description, fingerprint, definition, created_at)
         VALUES (2, 'w', 1, '', repeat('b', 64), '{}', now())",
        "uniq_workflow_name_version",
    ),
    (
        "INSERT INTO workflow (name, version, description, fingerprint, definition, created_at)
         VALUES ('w', 0, '', repeat('b', 64), '{}', now())",
        "workflow_version_positive",
    ),
    (
        "INSERT INTO workflow (name, version, description, fingerprint, definition, created_at)
         VALUES ('  ', 1, '', repeat('b', 64), '{}', now())",
        "workflow_name_not_blank",
    ),
    (
        "INSERT INTO workflow (name, version, description, fingerprint, definition, created_at)
         VALUES ('w', 2, '', 'not-a-sha256', '{}', now())",
        "workflow_fingerprint_sha256",
    ),
    // task
    (
        "INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, max_attempts)
         VALUES (1, 'b', 1, ' ', '[]', '{}', 1)",
        "task_type_not_blank",
    ),
    (
        "INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, max_attempts)
         VALUES (1, '', 1, 'noop', '[]', '{}', 1)",
        "task_key_not_blank",
    ),
    (
        "INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, max_attempts)
         VALUES (1, 'b', 1, 'noop', '[]', '{}', 0)",
        "task_max_attempts_positive",
    ),
    (
        "INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, max_attempts)
         VALUES (1, 'b', 0, 'noop', '[]', '{}', 1)",
        "uniq_task_position",
    ),
    (
        "INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, max_attempts)
         VALUES (1, 'a', 7, 'noop', '[]', '{}', 1)",
        "task_pkey",
    ),
    (
        "UPDATE task SET depends_on = '\"a\"' WHERE key = 'a'",
        "task_depends_on_json",
    ),
    ("UPDATE task SET config = '[]' WHERE key = 'a'", "task_config_json"),
    ("UPDATE task SET retry = '3' WHERE key = 'a'", "task_retry_json"),
    ("UPDATE workflow SET definition = '[]'", "workflow_definition_json"),
    // events
    (
        "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'teleport', 'ready', 'running', 1, 0, now())",
        "taskrunevent_transition_valid",
    ),
    (
        "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'claim', NULL, NULL, 1, 0, now())",
        "taskrunevent_states_iff_transition",
    ),
    (
        "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'stale_write_rejected', 'running', 'running',
                 1, 0, now())",
        "taskrunevent_states_iff_transition",
    ),
    (
        "INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at)
         VALUES ('00000000-0000-0000-0000-000000000001', 'rewind', 'pending', 'running', now())",
        "workflowrunevent_transition_valid",
    ),
    // generations (docs/design/retry.md)
    (
        "UPDATE workflow_run SET generation = 0",
        "workflowrun_generation_positive",
    ),
    (
        "UPDATE task_run SET generation = 0 WHERE id = 1",
        "taskrun_generation_positive",
    ),
    (
        "UPDATE task_run SET attempt_base = 1 WHERE id = 1",
        "taskrun_prior_attempts_below_attempt",
    ),
    // outbox
    (
        "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at)
         VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'noop', 0, now())",
        "uniq_outbox_taskrun_token",
    ),
    (
        "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at)
         VALUES (1, '00000000-0000-0000-0000-000000000001', 'a', 'noop', -1, now())",
        "outbox_token_nonnegative",
    ),
    // worker
    (
        "INSERT INTO worker (id, host, pid, task_types, concurrency, started_at, last_seen_at)
         VALUES ('w1', 'h', 1, '[]', 0, now(), now())",
        "worker_concurrency_positive",
    ),
];

#[tokio::test]
async fn every_named_constraint_rejects_its_bad_row() {
    let db = test_db!();
    let pool = db.raw().await;
    sqlx::raw_sql(SETUP).execute(&pool).await.unwrap();
    let mut wrong = Vec::new();
    for (sql, constraint) in CASES {
        match sqlx::raw_sql(sqlx::AssertSqlSafe(*sql)).execute(&pool).await {
            Err(sqlx::Error::Database(e)) if e.constraint() == Some(*constraint) => {}
            other => wrong.push(format!("{constraint}: {sql}\n  got {other:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "constraints that did not reject:\n{}",
        wrong.join("\n")
    );
    // The fixture itself was valid, and is untouched by the rejected writes.
    let state: String = sqlx::query_scalar("SELECT state FROM task_run WHERE id = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "pending");
}

#[tokio::test]
async fn connect_refuses_an_unmigrated_database_and_migrate_fixes_it() {
    let Some(db) = TestDb::create_empty().await else { return };
    let err = PgStore::connect(&db.url, Arc::new(SystemClock), options())
        .await
        .unwrap_err();
    assert!(matches!(err, store::Error::Migration(_)), "{err:?}");
    assert!(err.to_string().contains("flowforge migrate"), "{err}");

    let store = PgStore::connect_unchecked(&db.url, Arc::new(SystemClock), options())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // idempotent
    PgStore::connect(&db.url, Arc::new(ManualClock::default()), options())
        .await
        .unwrap();

    // A database that has a migration this binary does not know is newer
    // than the binary: refused, not used.
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99991231000000, 'from the future', true, '\\x00', 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let err = PgStore::connect(&db.url, Arc::new(SystemClock), options())
        .await
        .unwrap_err();
    assert!(
        matches!(err, store::Error::Migration(ref m) if m.contains("99991231000000")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_table_dropped_under_the_store_is_a_migration_error() {
    let db = test_db!();
    let (store, _) = db.store().await;
    sqlx::query("DROP TABLE worker").execute(store.pool()).await.unwrap();
    let err = flowforge_ports::WorkerRegistry::list_workers(&store).await.unwrap_err();
    assert!(matches!(err, store::Error::Migration(_)), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    // Port 1 on loopback: nothing listens there.
    let opts = PgOptions {
        acquire_timeout: Duration::from_secs(2),
        ..options()
    };
    let err = PgStore::connect("postgres://postgres@127.0.0.1:1/none", Arc::new(SystemClock), opts)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
}

#[tokio::test]
async fn statement_timeout_is_set_on_every_connection() {
    let db = test_db!();
    let opts = PgOptions {
        statement_timeout: Duration::from_millis(1234),
        ..options()
    };
    let store = PgStore::connect(&db.url, Arc::new(SystemClock), opts).await.unwrap();
    for _ in 0..3 {
        let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(timeout, "1234ms");
    }
    let err = sqlx::query("SELECT pg_sleep(5)")
        .execute(store.pool())
        .await
        .unwrap_err();
    // query_canceled: the store maps it to `Unavailable` (a unit test checks the mapping).
    let sqlx::Error::Database(e) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.code().as_deref(), Some("57014"));
}

#[tokio::test]
async fn every_connection_bounds_idle_transactions_by_default() {
    // Without the bound, a process stopped inside its transaction would
    // hold its rows locked for as long as it stays stopped
    // (docs/design/outbox-and-queues.md#bounded-transactions).
    let db = test_db!();
    let store = PgStore::connect(&db.url, Arc::new(SystemClock), PgOptions::default())
        .await
        .unwrap();
    let idle: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(idle, "20s");

    // A transaction left idle past the bound loses its session.
    let opts = PgOptions {
        idle_in_transaction_timeout: Some(Duration::from_millis(300)),
        ..options()
    };
    let store = PgStore::connect(&db.url, Arc::new(SystemClock), opts).await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    let raw = db.raw().await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let ended = async {
        loop {
            let alive: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(&raw)
                .await
                .unwrap();
            if !alive {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), ended)
        .await
        .expect("the server ends the idle session");
    assert!(tx.commit().await.is_err(), "the transaction is gone");
}

#[tokio::test]
async fn tls_follows_the_urls_sslmode() {
    let db = test_db!();
    let raw = db.raw().await;
    let ssl: String = sqlx::query_scalar("SHOW ssl").fetch_one(&raw).await.unwrap();
    let with_mode = |mode: &str| {
        let sep = if db.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}sslmode={mode}", db.url)
    };
    let required = PgStore::connect(&with_mode("require"), Arc::new(SystemClock), options()).await;
    if ssl == "on" {
        let store = required.unwrap();
        let encrypted: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert!(encrypted, "sslmode=require must encrypt");
    } else {
        let err = required.unwrap_err();
        assert!(err.is_transient() || matches!(err, store::Error::Other(_)), "{err:?}");
    }
    let plain = PgStore::connect(&with_mode("disable"), Arc::new(SystemClock), options())
        .await
        .unwrap();
    let encrypted: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(plain.pool())
        .await
        .unwrap();
    assert!(!encrypted, "sslmode=disable must not encrypt");
}
