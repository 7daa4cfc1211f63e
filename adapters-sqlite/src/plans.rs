//! Every hot statement is served by the index named for it (DESIGN §4: a
//! scheduler pass costs in proportion to active work, never to history).
//! SQLite picks a partial index only when a query restates its condition,
//! so an innocent edit can silently turn an index search into a scan.

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
    let rows = query.fetch_all(&store.inner.reader).await.expect("a plan");
    rows.into_iter()
        .map(|(_, _, _, detail)| detail)
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn hot_statements_use_their_indexes() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("connect");
    let cases: [(&str, &'static str, &[&str]); 11] = [
        ("claim", crate::runs::CLAIM, &["INTEGER PRIMARY KEY"]),
        ("reaper", crate::runs::EXPIRED_LEASES, &["taskrun_lease_expiry_idx"]),
        (
            "runs_with_work",
            crate::runs::RUNS_WITH_WORK,
            &[
                "taskrun_needs_pass_idx",
                "taskrun_retry_due_idx",
                "workflowrun_needs_pass_idx",
            ],
        ),
        (
            "next_deadline",
            crate::runs::NEXT_DEADLINE,
            &["taskrun_retry_due_idx", "taskrun_lease_expiry_idx"],
        ),
        ("take_flagged", crate::pass::TAKE_FLAGGED, &["taskrun_needs_pass_idx"]),
        (
            "lower_pending",
            crate::pass::LOWER_PENDING,
            &["MATERIALIZE", "(run_id=? AND task_key=?)"],
        ),
        ("promote_ready", crate::pass::PROMOTE_READY, &["taskrun_active_idx"]),
        ("promote_due", crate::pass::PROMOTE_DUE, &["taskrun_active_idx"]),
        ("cancel_waiting", crate::pass::CANCEL_WAITING, &["taskrun_active_idx"]),
        ("sweep", crate::outbox::SWEEP, &["outbox_unpublished_idx"]),
        ("activity", crate::pass::ACTIVITY, &["taskrun_active_idx"]),
    ];
    for (name, sql, indexes) in cases {
        let plan = plan(&store, sql).await;
        for index in indexes {
            assert!(plan.contains(index), "{name} does not use {index}:\n{plan}");
        }
        assert!(
            !plan
                .lines()
                .any(|l| l.starts_with("SCAN task_run") && !l.contains("USING INDEX")),
            "{name} scans task_run:\n{plan}"
        );
    }
}
