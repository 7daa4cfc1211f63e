//! The hot queries use their partial indexes, so a scheduler pass costs in
//! proportion to active work, never to history: planned over a database
//! holding a large finished history and a little active work.

use chrono::TimeDelta;
use flowforge_adapters_postgres::queries;
use flowforge_ports::{DefinitionStore, RunStore};
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::harness::def;

/// The plan of a store query, with its parameters bound as the store binds them.
async fn plan<'q>(
    pool: &PgPool,
    sql: &str,
    bind: impl FnOnce(
        sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> String {
    let query = bind(sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}"))));
    let rows = query.fetch_all(pool).await.unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts the plan uses one index of each group (either partial index
/// over waiting rows serves the retry lookups) and scans no big table.
fn assert_uses(what: &str, plan: &str, groups: &[&[&str]]) {
    for group in groups {
        assert!(
            group.iter().any(|index| plan.contains(index)),
            "{what} uses none of {group:?}:\n{plan}"
        );
    }
    for table in ["task_run", "workflow_run", "outbox"] {
        assert!(
            !plan.contains(&format!("Seq Scan on {table} ")),
            "{what} scans {table}:\n{plan}"
        );
    }
}

#[tokio::test]
async fn hot_queries_use_the_partial_indexes_over_a_large_history() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let wf = store
        .publish_definition(&def(
            json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        ))
        .await
        .unwrap()
        .id;
    let live = store.start_run(wf, json!({})).await.unwrap();
    let pool = db.raw().await;
    // 60 000 finished task runs and published dispatches of 600 old runs.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO workflow_run (id, workflow_id, state, input, created_at, started_at, finished_at)
         SELECT md5(g::text)::uuid, {wf}, 'succeeded', '{{}}', now(), now(), now() FROM generate_series(1, 600) g;
         INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at, started_at, finished_at, result)
         SELECT md5((g % 600 + 1)::text)::uuid, 'h' || g, 'succeeded', 0, now(), now(), now(), '{{}}'
         FROM generate_series(1, 60000) g;
         INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, published_at)
         SELECT id, run_id, task_key, 'noop', 0, now(), now() FROM task_run WHERE task_key LIKE 'h%';
         INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         SELECT id, run_id, task_key, 'claim', 'ready', 'running', 1, 1, now() FROM task_run WHERE task_key LIKE 'h%';
         INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at)
         SELECT id, 'start', 'pending', 'running', now() FROM workflow_run WHERE state = 'succeeded';
         ANALYZE;",
        wf = wf.0
    )))
    .execute(&pool)
    .await
    .unwrap();
    let zero = TimeDelta::zero();
    // Every run (NULL), or the runs of a set (an embedded engine's scope).
    let none = || None::<Vec<uuid::Uuid>>;

    let p = plan(&pool, queries::RUNS_WITH_WORK, |q| {
        q.bind(zero).bind(100_i64).bind(none())
    })
    .await;
    assert_uses(
        "runs_with_work",
        &p,
        &[
            &["taskrun_needs_pass_idx"],
            &["taskrun_retry_due_idx", "taskrun_active_idx"],
            &["workflowrun_needs_pass_idx"],
            &["workflowrun_active_idx", "workflow_run_pkey"],
        ],
    );

    let p = plan(&pool, queries::RUNS_WITH_WORK, |q| {
        q.bind(zero).bind(100_i64).bind(Some(vec![live.0]))
    })
    .await;
    assert_uses(
        "runs_with_work over a run set",
        &p,
        &[&["taskrun_needs_pass_idx"], &["workflowrun_needs_pass_idx"]],
    );

    let p = plan(&pool, queries::REAP, |q| q.bind(zero).bind(100_i64).bind(none())).await;
    assert_uses("reap candidates", &p, &[&["taskrun_lease_expiry_idx"]]);

    let p = plan(&pool, queries::NEXT_DEADLINE, |q| q.bind(zero).bind(none())).await;
    assert_uses(
        "next_deadline",
        &p,
        &[
            &["taskrun_retry_due_idx", "taskrun_active_idx"],
            &["taskrun_lease_expiry_idx"],
        ],
    );

    let p = plan(&pool, queries::SWEEP, |q| {
        q.bind(100_i64).bind(none()).bind(300e6_f64).bind(zero)
    })
    .await;
    assert_uses("outbox sweep", &p, &[&["outbox_pending_order_idx"]]);

    let p = plan(&pool, queries::HELD_FOR, |q| q.bind(zero).bind(none())).await;
    // Either partial index holds unpublished rows only: the planner picks
    // whichever it costs lower while both are nearly empty.
    assert_uses("held_for", &p, &[&["outbox_held_idx", "outbox_pending_order_idx"]]);

    let p = plan(&pool, queries::BEGIN_PASS_TAKING_FLAGS, |q| q.bind(live.0).bind(zero)).await;
    assert_uses(
        "begin_pass (taking the flags)",
        &p,
        &[
            &["workflowrun_active_idx", "workflow_run_pkey"],
            &["taskrun_needs_pass_idx"],
        ],
    );

    let p = plan(&pool, queries::TAKE_FLAGGED, |q| q.bind(live.0)).await;
    assert_uses("take_flagged", &p, &[&["taskrun_needs_pass_idx"]]);

    let p = plan(&pool, queries::ACTIVITY, |q| q.bind(live.0).bind(true)).await;
    assert_uses("activity", &p, &[&["taskrun_active_idx"]]);

    let p = plan(&pool, queries::PROMOTE_RETRIES, |q| {
        q.bind(zero).bind(live.0).bind(wf.0).bind(false)
    })
    .await;
    assert_uses(
        "promote_due_retries (and the activity it reads)",
        &p,
        &[
            &["taskrun_retry_due_idx", "taskrun_active_idx"],
            &["taskrun_active_idx"],
        ],
    );

    let p = plan(&pool, queries::RUN_EVENTS, |q| {
        q.bind(live.0).bind(10_i64).bind(100_i64)
    })
    .await;
    assert_uses(
        "run_events",
        &p,
        &[&["taskrunevent_run_seq_idx"], &["workflowrunevent_run_seq_idx"]],
    );
    assert!(
        !p.contains("Seq Scan on task_run_event"),
        "run_events scans the history:\n{p}"
    );

    let none_time = None::<chrono::DateTime<chrono::Utc>>;
    let none_texts = None::<Vec<String>>;
    for cursor in [
        None,
        Some((
            chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now()),
            live.0,
        )),
    ] {
        let p = plan(&pool, queries::LIST_RUNS_PAGE, |q| {
            q.bind(cursor.map(|c| c.0))
                .bind(cursor.map(|c| c.1))
                .bind(none_texts.clone())
                .bind(none_texts.clone())
                .bind(none_time)
                .bind(none_time)
                .bind(20_i64)
        })
        .await;
        assert_uses("list_runs_page", &p, &[&["workflowrun_created_id_idx"]]);
    }

    let p = plan(&pool, queries::CLAIM_READY, |q| {
        q.bind(zero)
            .bind(vec!["noop".to_owned()])
            .bind(10_i64)
            .bind("w")
            .bind(zero)
            .bind(300_000_000.0_f64)
    })
    .await;
    assert_uses(
        "claim_ready",
        &p,
        &[&["taskrun_ready_idx"], &["uniq_outbox_taskrun_token"]],
    );

    let p = plan(&pool, queries::REARM_LOST, |q| {
        q.bind(zero).bind(None::<Vec<uuid::Uuid>>).bind(0.0_f64)
    })
    .await;
    assert_uses(
        "rearm_lost_dispatches",
        &p,
        &[&["taskrun_ready_idx"], &["uniq_outbox_taskrun_token"]],
    );

    let p = plan(&pool, queries::GAUGES, |q| q).await;
    assert_uses(
        "gauges",
        &p,
        &[
            &["taskrun_ready_idx", "taskrun_active_idx"],
            &["taskrun_lease_expiry_idx"],
            &["outbox_pending_order_idx"],
            &["workflowrun_active_idx"],
        ],
    );
}

/// A wide run started after the planner last looked at `task_run` (its
/// statistics say the table is empty, so the run is estimated at one row)
/// is still promoted by one index probe per key and cancelled without a
/// nested loop over its own rows: either would otherwise be quadratic in
/// the run's width (see `queries::LOWER_AND_PROMOTE`).
#[tokio::test]
async fn wide_batches_are_planned_as_probes_under_stale_statistics() {
    const WIDE: usize = 2_000;
    let db = test_db!();
    let (store, _) = db.store().await;
    let pool = db.raw().await;
    sqlx::raw_sql("ANALYZE task_run").execute(&pool).await.unwrap();
    let mut fan = vec![json!({"key": "root", "task_type": "noop"})];
    fan.extend((1..WIDE).map(|i| json!({"key": format!("f{i:05}"), "task_type": "noop", "depends_on": ["root"]})));
    let wf = store
        .publish_definition(&def(json!({"name": "fan", "version": 1, "tasks": fan})))
        .await
        .unwrap()
        .id;
    let run = store.start_run(wf, json!({})).await.unwrap();
    let keys: Vec<String> = (1..WIDE).map(|i| format!("f{i:05}")).collect();
    let amounts = vec![1_i32; keys.len()];
    let zero = TimeDelta::zero();

    let p = plan(&pool, queries::LOWER_AND_PROMOTE, |q| {
        q.bind(zero).bind(run.0).bind(wf.0).bind(&keys).bind(&amounts)
    })
    .await;
    assert!(
        p.contains("Index Cond: ((run_id = ") && p.contains("(task_key = d.key))"),
        "each key is one probe of uniq_taskrun_run_key:\n{p}"
    );
    assert!(
        p.contains("task_pkey") && !p.contains("uniq_task_position"),
        "each dispatch's task type is one probe of task's primary key:\n{p}"
    );
    let p = plan(&pool, queries::CANCEL_WAITING, |q| q.bind(zero).bind(run.0)).await;
    assert!(!p.contains("Nested Loop"), "no nested loop over the run's rows:\n{p}");
}
