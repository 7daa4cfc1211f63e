//! Publishing and loading (docs/design/definitions.md#publishing): idempotent
//! by content, exclusive by (name, version), lossless, re-validated on the way
//! out, and the first-publish race resolved by the unique constraint without
//! deadlock.

use std::sync::Arc;

use flowforge_adapters_postgres::PgStore;
use flowforge_ports::{DefinitionStore, LoadError, PublishError, WorkflowId};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::harness::{bounded, def};

fn etl(version: u32) -> Value {
    json!({
        "name": "etl", "version": version, "description": "nightly load",
        "defaults": {"timeout_seconds": 30, "retry": {"max_attempts": 3, "delay_seconds": 1.0}},
        "tasks": [
            {"key": "extract", "task_type": "command", "config": {"argv": ["./extract.sh"]}},
            {"key": "transform", "task_type": "echo", "depends_on": ["extract"], "timeout_seconds": 10,
             "retry": {"max_attempts": 5, "delay_seconds": 0.5, "backoff": 2.0, "max_delay_seconds": 60}},
            {"key": "load", "task_type": "noop", "depends_on": ["transform"], "config": {}},
            {"key": "undo_extract", "task_type": "command", "compensate_for": "extract",
             "config": {"argv": ["./cleanup.sh"], "ratio": 0.1, "big": 12345678901234567890u64}}
        ]
    })
}

#[tokio::test]
async fn publish_is_idempotent_by_content_and_exclusive_by_version() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let d = def(etl(3));
    let first = store.publish_definition(&d).await.unwrap();
    assert!(first.created);
    assert_eq!(first.fingerprint, d.fingerprint());

    let again = store.publish_definition(&d).await.unwrap();
    assert!(!again.created);
    assert_eq!(
        (again.id, &again.fingerprint, again.created_at),
        (first.id, &first.fingerprint, first.created_at)
    );
    assert_eq!(*again.definition, d);

    let mut changed = etl(3);
    changed["description"] = json!("a new description is new content");
    let changed = def(changed);
    match store.publish_definition(&changed).await {
        Err(PublishError::Conflict {
            name,
            version,
            existing,
            new,
        }) => {
            assert_eq!((name.as_str(), version), ("etl", 3));
            assert_eq!(existing, d.fingerprint());
            assert_eq!(new, changed.fingerprint());
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    // The next version is free.
    assert!(store.publish_definition(&def(etl(4))).await.unwrap().created);
}

#[tokio::test]
async fn load_returns_exactly_what_was_published() {
    let db = test_db!();
    let (store, _) = db.store().await;
    // Declaration order, absent vs empty config and odd numbers all survive.
    let d = def(etl(1));
    let published = store.publish_definition(&d).await.unwrap();
    let loaded = store.load_definition(published.id).await.unwrap();
    assert_eq!(*loaded.definition, d);
    assert_eq!(loaded.definition.document(), d.document());
    assert_eq!(loaded.fingerprint, d.fingerprint());
    assert!(!loaded.created);
    let found = store.find_definition("etl", 1).await.unwrap().unwrap();
    assert_eq!(found.id, published.id);
    assert!(store.find_definition("etl", 2).await.unwrap().is_none());
    assert!(matches!(
        store.load_definition(WorkflowId(9_999)).await,
        Err(LoadError::NotFound(_))
    ));
}

async fn corrupt_and_load(store: &PgStore, id: WorkflowId, sql: &str) -> String {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(store.pool())
        .await
        .unwrap();
    match store.load_definition(id).await {
        Err(LoadError::Invalid { workflow, problem }) => {
            assert!(workflow.contains("'etl' version"), "{workflow}");
            problem
        }
        other => panic!("expected Invalid after `{sql}`, got {other:?}"),
    }
}

#[tokio::test]
async fn load_refuses_rows_that_no_longer_form_a_valid_definition() {
    let db = test_db!();
    let (store, _) = db.store().await;
    for (version, sql, expected) in [
        // The CHECK would stop a blank task_type; a database from before it
        // (or a hand edit that dropped it) must still be caught on load.
        (
            1,
            "ALTER TABLE task DROP CONSTRAINT task_type_not_blank;
             UPDATE task SET task_type = '' WHERE key = 'load' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 1)",
            "task 'load' has a blank task_type",
        ),
        (
            2,
            "UPDATE task SET depends_on = '[\"ghost\"]' WHERE key = 'load' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 2)",
            "task 'load' depends on unknown task 'ghost'",
        ),
        (
            3,
            "UPDATE task SET depends_on = '[1, 2]' WHERE key = 'load' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 3)",
            "task 'load': depends_on is not a list of task keys",
        ),
        (
            4,
            "UPDATE task SET config = '{\"argv\": [\"rm\"]}' WHERE key = 'extract' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 4)",
            "a task row was changed or lost",
        ),
        (
            5,
            "DELETE FROM task WHERE key = 'undo_extract' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 5)",
            "a task row was changed or lost",
        ),
        (
            6,
            "UPDATE task SET max_attempts = 9 WHERE key = 'load' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 6)",
            "task 'load': stored max_attempts 9 disagrees",
        ),
        (
            7,
            "UPDATE task SET depends_on = '[\"load\"]' WHERE key = 'extract' AND workflow_id = (
                 SELECT id FROM workflow WHERE version = 7)",
            "dependency cycle detected",
        ),
    ] {
        let published = store.publish_definition(&def(etl(version))).await.unwrap();
        let problem = corrupt_and_load(&store, published.id, sql).await;
        assert!(problem.contains(expected), "v{version}: {problem:?} lacks {expected:?}");
        // find_definition re-validates too.
        assert!(matches!(
            store.find_definition("etl", version).await,
            Err(LoadError::Invalid { .. })
        ));
    }
}

/// Two first publishes of one (name, version) from separate pools, released
/// together by a barrier, many rounds: one definition, the loser a typed
/// outcome, never a deadlock or a mixture.
async fn race_first_publish(same_content: bool) {
    let db = test_db!();
    let (a, _) = db.store().await;
    let (b, _) = db.store().await;
    let stores = [a, b];
    let mut outcomes = [0usize; 4]; // created, idempotent, conflict, lost race
    for round in 0..25u32 {
        let name = format!("race{round}");
        // Many tasks widen the window between the two inserts.
        let tasks = |variant: &str| -> Vec<Value> {
            (0..200)
                .map(|i| json!({"key": format!("t{i}"), "task_type": "noop", "config": {"v": variant}}))
                .collect()
        };
        let defs = [
            def(json!({"name": name, "version": 1, "tasks": tasks("a")})),
            def(json!({"name": name, "version": 1, "tasks": tasks(if same_content { "a" } else { "b" })})),
        ];
        let barrier = Arc::new(Barrier::new(2));
        let mut handles = Vec::new();
        for (store, d) in stores.iter().cloned().zip(defs.clone()) {
            let barrier = Arc::clone(&barrier);
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                store.publish_definition(&d).await
            }));
        }
        let mut created = 0;
        for (i, h) in handles.into_iter().enumerate() {
            match bounded("publish race", h).await.unwrap() {
                Ok(p) if p.created => {
                    created += 1;
                    outcomes[0] += 1;
                    assert_eq!(*p.definition, defs[i]);
                }
                Ok(p) => {
                    assert!(same_content, "different content must never be returned as stored");
                    assert_eq!(p.fingerprint, defs[i].fingerprint());
                    outcomes[1] += 1;
                }
                Err(PublishError::Conflict { existing, new, .. }) => {
                    assert!(!same_content, "identical content is never a conflict");
                    assert_eq!(new, defs[i].fingerprint());
                    assert_eq!(existing, defs[1 - i].fingerprint());
                    outcomes[2] += 1;
                }
                Err(PublishError::LostRace { .. }) => outcomes[3] += 1,
                Err(other) => panic!("round {round}: an untyped loss (deadlock?): {other:?}"),
            }
        }
        assert_eq!(created, 1, "round {round}: exactly one publish creates");
        let (workflows, tasks): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM workflow WHERE name = $1),
                    (SELECT count(*) FROM task JOIN workflow w ON w.id = task.workflow_id WHERE w.name = $1)",
        )
        .bind(&name)
        .fetch_one(stores[0].pool())
        .await
        .unwrap();
        assert_eq!(
            (workflows, tasks),
            (1, 200),
            "round {round}: one definition, no mixture"
        );
        let stored = stores[0].find_definition(&name, 1).await.unwrap().unwrap();
        assert!(defs.iter().any(|d| *d == *stored.definition));
    }
    assert_eq!(outcomes[0], 25);
    println!("first-publish race outcomes (created, idempotent, conflict, lost race): {outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_publishes_of_the_same_content_end_with_one_definition() {
    race_first_publish(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_publishes_of_different_content_end_with_one_definition() {
    race_first_publish(false).await;
}
