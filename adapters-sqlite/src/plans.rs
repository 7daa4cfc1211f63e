//! Every hot statement is served by the index named for it
//! (docs/design/data-model.md#indexes: a scheduler pass costs in proportion to
//! active work, never to history). SQLite picks a partial index only when a
//! query's WHERE implies its condition (names one state of an OR, or restates
//! the condition word for word), so an innocent edit can silently turn an
//! index search into a scan.

use std::sync::Arc;

use flowforge_ports::SystemClock;

use crate::SqliteStore;

async fn plan(store: &SqliteStore, sql: &'static str) -> String {
    let mut query =
        sqlx::query_as::<_, (i64, i64, i64, String)>(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
    // Plans do not depend on the values bound; NULL fills every slot.
    for _ in 0..8 {
        query = query.bind(None::<i64>);
    }
    let mut reader = store.inner.read().await.expect("a reader");
    let rows = query.fetch_all(reader.raw().expect("open")).await.expect("a plan");
    rows.into_iter()
        .map(|(_, _, _, detail)| detail)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A task run found by its key (`uniq_taskrun_run_key`).
const BY_KEY: &str = "USING INDEX sqlite_autoindex_task_run_1 (run_id=? AND task_key=?)";

/// The ready task runs, then each one's outbox row at its token.
const READY_TO_OUTBOX: [&str; 2] = [
    "taskrun_ready_idx",
    "SEARCH outbox USING INDEX sqlite_autoindex_outbox_1 (task_run_id=? AND fencing_token=?)",
];

#[tokio::test]
async fn hot_statements_use_their_indexes() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("connect");
    let cases: [(&str, &'static str, &[&str]); 19] = [
        ("claim", crate::queries::CLAIM_UPDATE, &["INTEGER PRIMARY KEY"]),
        ("reaper", crate::queries::EXPIRED_LEASES, &["taskrun_lease_expiry_idx"]),
        (
            "runs_with_work",
            crate::queries::RUNS_WITH_WORK,
            // Runs are looked up by primary key from the candidates the
            // partial indexes give, so terminal runs are never walked and
            // PostgreSQL's workflowrun_active_idx has no query to serve here.
            &[
                "taskrun_needs_pass_idx",
                "taskrun_retry_due_idx",
                "workflowrun_needs_pass_idx",
                "SEARCH r USING INDEX sqlite_autoindex_workflow_run_1 (id=?)",
            ],
        ),
        (
            "next_deadline",
            crate::queries::NEXT_DEADLINE,
            &["taskrun_retry_due_idx", "taskrun_lease_expiry_idx"],
        ),
        (
            "take_flagged",
            crate::queries::TAKE_FLAGGED,
            &["taskrun_needs_pass_idx"],
        ),
        (
            "lower_pending",
            crate::queries::LOWER_PENDING,
            &["MATERIALIZE", "(run_id=? AND task_key=?)"],
        ),
        (
            "promote_ready",
            crate::queries::PROMOTE_READY,
            &["taskrun_active_idx (run_id=? AND state=? AND pending_deps=?)"],
        ),
        ("promote_due", crate::queries::PROMOTE_DUE, &["taskrun_active_idx"]),
        (
            "cancel_waiting",
            crate::queries::CANCEL_WAITING,
            &["taskrun_active_idx"],
        ),
        ("sweep", crate::queries::SWEEP, &["outbox_pending_order_idx"]),
        ("activity", crate::queries::ACTIVITY, &["taskrun_active_idx"]),
        // Looked up key by key, not by walking the run's pending rows.
        ("pending_counts", crate::queries::PENDING_COUNTS, &[BY_KEY]),
        ("pending_named", crate::queries::PENDING_NAMED, &[BY_KEY]),
        ("hand_off_dependents", crate::queries::HAND_OFF_DEPENDENTS, &[BY_KEY]),
        (
            "run_events",
            crate::queries::RUN_EVENTS,
            &[
                "taskrunevent_run_seq_idx (run_id=? AND seq>?)",
                "workflowrunevent_run_seq_idx (run_id=? AND seq>?)",
            ],
        ),
        (
            "list_runs_page",
            crate::queries::LIST_RUNS_PAGE,
            &["SEARCH r USING INDEX workflowrun_created_id_idx ((created_at,id)<(?,?))"],
        ),
        ("claim_ready", crate::queries::READY_OF_TYPES, &READY_TO_OUTBOX),
        ("rearm_lost_dispatches", crate::queries::REARM_LOST, &READY_TO_OUTBOX),
        (
            "gauges",
            crate::queries::GAUGES,
            &[
                "taskrun_ready_idx",
                "taskrun_lease_expiry_idx",
                "outbox_pending_order_idx",
                "workflowrun_active_idx",
            ],
        ),
    ];
    for (name, sql, indexes) in cases {
        let plan = plan(&store, sql).await;
        for index in indexes {
            assert!(plan.contains(index), "{name} does not use {index}:\n{plan}");
        }
        assert_walks_no_history(name, sql, &plan);
    }
}

/// Every statement of every multi-statement call prepares (its SQL and the
/// names in it are valid) and none walks a table that grows with history:
/// each call's cost follows the rows it touches.
#[tokio::test]
async fn every_call_prepares_and_scans_no_growing_table() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("connect");
    for (name, sql) in crate::queries::multi_statement_calls() {
        for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            if matches!(statement, "BEGIN" | "BEGIN IMMEDIATE" | "COMMIT") {
                continue;
            }
            let statement: &'static str = Box::leak(statement.to_owned().into_boxed_str());
            let plan = plan(&store, statement).await;
            if std::env::var_os("PRINT_PLANS").is_some() {
                println!("== {name}: {statement}\n{plan}");
            }
            assert_walks_no_history(name, statement, &plan);
        }
    }
}

/// Partial indexes hold only live rows (flagged, retrying, running, active,
/// unpublished): walking one costs active work, not history.
const LIVE_INDEXES: [&str; 8] = [
    "taskrun_needs_pass_idx",
    "taskrun_ready_idx",
    "taskrun_retry_due_idx",
    "taskrun_lease_expiry_idx",
    "taskrun_active_idx",
    "workflowrun_needs_pass_idx",
    "workflowrun_active_idx",
    "outbox_pending_order_idx",
];

/// Fails when a plan walks a table that grows with history (or one of
/// the aliases the store's SQL gives them) other than through a partial
/// index of live rows. Subqueries, JSON batches and constant rows are
/// walked freely: their size is the call's own.
fn assert_walks_no_history(name: &str, statement: &str, plan: &str) {
    const HISTORY: [&str; 9] = [
        "task_run",
        "tr",
        "task_run_event",
        "workflow_run",
        "r",
        "outbox",
        "task",
        "t",
        "workflow",
    ];
    // An INSERT … SELECT into a foreign key's parent table compiles a probe
    // of the child table that SQLite runs only while a foreign key
    // violation is outstanding: never here.
    let fk_child = if statement.starts_with("INSERT INTO task_run ") {
        Some("task_run_event")
    } else if statement.starts_with("INSERT INTO workflow ") {
        Some("workflow_run")
    } else {
        None
    };
    for line in plan.lines() {
        let Some(rest) = line.strip_prefix("SCAN ") else {
            continue;
        };
        let table = rest.split_whitespace().next().unwrap_or_default();
        if !HISTORY.contains(&table) || fk_child == Some(table) {
            continue;
        }
        assert!(
            LIVE_INDEXES
                .iter()
                .any(|index| line.contains(&format!("INDEX {index}"))),
            "{name} walks {table} ({line}):\n{statement}\n{plan}"
        );
    }
}

/// How many temporary b-trees `sql` opens (docs/design/data-model.md#constraints-without-lookup-tables).
async fn ephemeral_tables(store: &SqliteStore, sql: &str) -> usize {
    use sqlx::Row as _;
    let mut query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")));
    for _ in 0..8 {
        query = query.bind(None::<i64>);
    }
    let mut reader = store.inner.read().await.expect("a reader");
    let program = query.fetch_all(reader.raw().expect("open")).await.expect("a program");
    program
        .iter()
        .filter(|op| op.get::<String, _>("opcode") == "OpenEphemeral")
        .count()
}

/// Every task transition writes its row's state and an event. The CHECK
/// constraints and `taskrun_active_idx`'s condition those writes evaluate
/// open no temporary b-tree, as `IN` lists of constants would.
#[tokio::test]
async fn a_task_transition_checks_its_row_without_temporary_tables() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("connect");
    for sql in [
        "UPDATE task_run SET state = ?2, pending_deps = ?3, finished_at = ?4, lease_owner = ?5, \
         lease_expires_at = ?6 WHERE id = ?7",
        "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, \
         attempt, fencing_token, worker, at, error, seq) VALUES (?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, NULL, 0, NULL, 1)",
        "INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at, seq, generation) \
         VALUES (?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    ] {
        assert_eq!(ephemeral_tables(&store, sql).await, 0, "{sql}");
    }
}

/// A claim or a finish numbers its events from `run_event_seq`
/// (docs/design/data-model.md#event-numbers): none of the statements that
/// write or count them reads `task_run_event` while writing it, which
/// SQLite would run through a temporary table. A batch's numbering
/// (`ROW_NUMBER()`, a handoff's promotions) takes one per statement,
/// whatever its size, and is left out.
#[tokio::test]
async fn a_claim_or_finish_numbers_its_events_without_temporary_tables() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("connect");
    let mut checked = 0;
    for (name, call) in crate::queries::grouped_writes() {
        for statement in call.split(';').map(str::trim) {
            let writes_events = statement.starts_with("INSERT INTO task_run_event")
                || statement.starts_with("INSERT INTO run_event_seq");
            if writes_events && !statement.contains(" OVER (") {
                assert_eq!(ephemeral_tables(&store, statement).await, 0, "{name}: {statement}");
                checked += 1;
            }
        }
    }
    // At least each of the seven calls' event and its count.
    assert!(checked >= 2 * 7, "only {checked} statements checked");
}
