//! What only the SQLite store has: its URLs, its file handling, its schema's
//! constraints probed with raw SQL, re-validation of rows corrupted behind
//! the store's back, two stores (as two processes would) on one file, and
//! how it keeps its few connections clean and its calls few (transactions
//! failed or abandoned half-way, the flags a pass reads ahead, the task
//! inputs it remembers).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_sqlite::SqliteStore;
use flowforge_domain::{TaskRunState, WorkflowDefinition, WorkflowDocument};
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{Clock, DefinitionStore, LoadError, RunPass, RunStore, SystemClock, WorkerId, store};
use serde_json::{Value, json};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::Barrier;

use crate::SqliteFactory;

fn definition(v: Value) -> WorkflowDefinition {
    let doc: WorkflowDocument = serde_json::from_value(v).expect("a well-formed document");
    WorkflowDefinition::from_document(doc).expect("a valid definition")
}

fn chain() -> Value {
    json!({"name": "chain", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "echo", "depends_on": ["a"], "config": {"x": 1}},
        {"key": "c", "task_type": "noop", "depends_on": ["b"], "retry": {"max_attempts": 2}}
    ]})
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::connect(&format!("sqlite://{}", path.display()), clock())
        .await
        .expect("connect")
}

/// A second connection to the file, outside the store: the manual edit
/// the schema's constraints must withstand.
async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .foreign_keys(true)
        .connect()
        .await
        .expect("a raw connection")
}

async fn exec(conn: &mut SqliteConnection, sql: &'static str) -> Result<u64, String> {
    sqlx::query(sql)
        .execute(&mut *conn)
        .await
        .map(|r| r.rows_affected())
        .map_err(|e| e.to_string())
}

fn refused(result: Result<u64, String>, constraint: &str) {
    match result {
        Err(message) => assert!(message.contains(constraint), "expected {constraint}, got: {message}"),
        Ok(n) => panic!("the edit was accepted ({n} rows) despite {constraint}"),
    }
}

#[tokio::test]
async fn the_database_its_wal_and_shm_and_its_new_folders_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("home/.flowforge/flowforge.db");
    let store = open(&path).await;
    // A write, so that the WAL and its index exist.
    store.publish_definition(&definition(chain())).await.expect("publish");
    let mode = |p: &Path| format!("{:o}", std::fs::metadata(p).expect("stat").permissions().mode() & 0o777);
    for folder in [dir.path().join("home"), dir.path().join("home/.flowforge")] {
        assert_eq!(mode(&folder), "700", "{}", folder.display());
    }
    for file in ["flowforge.db", "flowforge.db-wal", "flowforge.db-shm"] {
        let file = dir.path().join("home/.flowforge").join(file);
        assert_eq!(mode(&file), "600", "{}", file.display());
    }
}

#[tokio::test]
async fn the_schema_refuses_rows_that_break_an_invariant() {
    let factory = SqliteFactory::default();
    let path = factory.path();
    let store = open(&path).await;
    let published = store.publish_definition(&definition(chain())).await.expect("publish");
    store.start_run(published.id, json!({})).await.expect("start");
    let mut conn = raw(&path).await;

    refused(
        exec(&mut conn, "UPDATE task_run SET state = 'running' WHERE task_key = 'a'").await,
        "taskrun_lease_iff_running",
    );
    refused(
        exec(
            &mut conn,
            "UPDATE task_run SET state = 'running', lease_expires_at = 1 WHERE task_key = 'a'",
        )
        .await,
        "taskrun_owner_iff_running",
    );
    refused(
        exec(
            &mut conn,
            "UPDATE task_run SET state = 'cancelled', finished_at = 1 WHERE task_key = 'a'",
        )
        .await,
        "taskrun_cancel_reason_iff_cancelled",
    );
    refused(
        exec(
            &mut conn,
            "UPDATE task_run SET state = 'cancelled', finished_at = 1, cancel_reason = 'bored' WHERE task_key = 'a'",
        )
        .await,
        "taskrun_cancel_reason_valid",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET state = 'retrying' WHERE task_key = 'a'").await,
        "taskrun_retry_at_iff_retrying",
    );
    refused(
        exec(
            &mut conn,
            "UPDATE task_run SET state = 'succeeded' WHERE task_key = 'a'",
        )
        .await,
        "taskrun_finished_iff_finished_state",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET state = 'done' WHERE task_key = 'a'").await,
        "taskrun_state_valid",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET attempt = 0 WHERE task_key = 'a'").await,
        "taskrun_attempt_positive",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET pending_deps = -1 WHERE task_key = 'b'").await,
        "taskrun_pending_deps_nonnegative",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET generation = 0 WHERE task_key = 'a'").await,
        "taskrun_generation_positive",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET attempt_base = 1 WHERE task_key = 'a'").await,
        "taskrun_prior_attempts_below_attempt",
    );
    refused(
        exec(&mut conn, "UPDATE workflow_run SET generation = 0").await,
        "workflowrun_generation_positive",
    );
    refused(
        exec(
            &mut conn,
            "INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at, seq, generation) \
             SELECT id, 'rewind', 'failed', 'running', 0, 1000, 1 FROM workflow_run",
        )
        .await,
        "workflowrunevent_transition_valid",
    );
    refused(
        exec(&mut conn, "UPDATE task_run SET result = '{}' WHERE task_key = 'a'").await,
        "taskrun_result_only_when_succeeded",
    );
    refused(
        exec(&mut conn, "UPDATE workflow_run SET state = 'succeeded'").await,
        "workflowrun_finished_iff_terminal",
    );
    refused(
        exec(&mut conn, "UPDATE workflow_run SET input = 'not json'").await,
        "workflowrun_input_json",
    );
    refused(
        exec(&mut conn, "UPDATE workflow SET fingerprint = 'XYZ'").await,
        "workflow_fingerprint_sha256",
    );
    refused(
        exec(&mut conn, "UPDATE task SET task_type = '  ' WHERE key = 'a'").await,
        "task_type_not_blank",
    );
    refused(
        exec(&mut conn, "UPDATE task SET depends_on = '{}' WHERE key = 'a'").await,
        "task_depends_on_json",
    );
    refused(
        exec(
            &mut conn,
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
             SELECT task_run_id, run_id, task_key, task_type, fencing_token, created_at FROM outbox",
        )
        .await,
        "UNIQUE constraint failed: outbox.task_run_id, outbox.fencing_token",
    );
    refused(
        exec(
            &mut conn,
            "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, attempt, fencing_token, at, seq, \
             generation) SELECT id, run_id, task_key, 'claim', 1, 0, 0, 1000, 1 FROM task_run WHERE task_key = 'a'",
        )
        .await,
        "taskrunevent_states_iff_transition",
    );
    // STRICT tables keep each column to its declared type.
    refused(
        exec(&mut conn, "UPDATE task_run SET attempt = 'two' WHERE task_key = 'a'").await,
        "cannot store TEXT value in INTEGER column",
    );
    // Foreign keys are enforced.
    refused(
        exec(
            &mut conn,
            "INSERT INTO workflow_run (id, workflow_id, state, input, created_at) \
             VALUES ('00000000-0000-0000-0000-000000000000', 999, 'pending', '{}', 0)",
        )
        .await,
        "FOREIGN KEY constraint failed",
    );
}

/// Loading re-validates the rows: an edit the constraints cannot see (or
/// one made with them switched off) is reported, naming the problem.
#[tokio::test]
async fn load_refuses_rows_corrupted_behind_its_back() {
    let cases: [(&'static str, &str); 6] = [
        (
            "UPDATE task SET task_type = '' WHERE key = 'b'",
            "task 'b' has a blank task_type",
        ),
        (
            "UPDATE task SET depends_on = '[\"ghost\"]' WHERE key = 'b'",
            "task 'b' depends on unknown task 'ghost'",
        ),
        (
            "DELETE FROM task WHERE key = 'a'",
            "task 'b' depends on unknown task 'a'",
        ),
        (
            "UPDATE task SET config = '{\"x\": 2}' WHERE key = 'b'",
            "not the published",
        ),
        ("UPDATE task SET max_attempts = 5 WHERE key = 'c'", "max_attempts 5"),
        ("UPDATE task SET retry = '{\"tries\": 3}' WHERE key = 'c'", "retry"),
    ];
    for (edit, problem) in cases {
        let factory = SqliteFactory::default();
        let path = factory.path();
        let store = open(&path).await;
        let published = store.publish_definition(&definition(chain())).await.expect("publish");
        let mut conn = raw(&path).await;
        // A database written before a constraint existed, or edited with
        // checks off: the load is the last line of defence.
        exec(&mut conn, "PRAGMA ignore_check_constraints = ON")
            .await
            .expect("pragma");
        exec(&mut conn, edit).await.expect("the manual edit");
        match store.load_definition(published.id).await {
            Err(LoadError::Invalid { workflow, problem: got }) => {
                assert!(workflow.contains("chain"), "{workflow}");
                assert!(got.contains(problem), "after `{edit}`: expected '{problem}' in '{got}'");
            }
            other => panic!("after `{edit}` the load must be refused, got {other:?}"),
        }
        assert!(
            matches!(store.find_definition("chain", 1).await, Err(LoadError::Invalid { .. })),
            "find re-validates too"
        );
    }
}

/// Settings written as floats come back bit for bit, so the fingerprint of
/// a loaded definition matches for any value.
#[tokio::test]
async fn float_settings_round_trip_exactly() {
    let factory = SqliteFactory::default();
    let store = open(&factory.path()).await;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // In (0, 1]: a fraction with up to 53 significant bits.
        ((seed >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    };
    for version in 1..=50u32 {
        let tasks: Vec<Value> = (0..20)
            .map(|i| {
                json!({"key": format!("t{i}"), "task_type": "noop",
                       "timeout_seconds": next() * 1_000.0,
                       "retry": {"delay_seconds": next() * 100.0, "backoff": 1.0 + next() * 9.0,
                                 "max_delay_seconds": next() * 31_536_000.0}})
            })
            .collect();
        let def = definition(json!({"name": "floats", "version": version, "tasks": tasks}));
        let published = store.publish_definition(&def).await.expect("publish");
        let loaded = store.load_definition(published.id).await.expect("load");
        assert_eq!(*loaded.definition, def);
        assert_eq!(loaded.fingerprint, def.fingerprint());
    }
}

#[tokio::test]
async fn an_in_memory_database_is_shared_by_every_clone() {
    let store = SqliteStore::connect("sqlite::memory:", clock()).await.expect("connect");
    let clone = store.clone();
    let published = store.publish_definition(&definition(chain())).await.expect("publish");
    let run = clone.start_run(published.id, json!({"m": 1})).await.expect("start");
    let detail = store
        .get_run(run)
        .await
        .expect("get_run")
        .expect("visible to every clone");
    assert_eq!(detail.tasks.len(), 3);
    let a = &detail.tasks[0];
    let claim = clone
        .claim_task_run(a.id, a.token, &WorkerId("w".into()), Duration::from_secs(300))
        .await
        .expect("claim")
        .expect("won");
    let mut pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    assert_eq!(pass.take_flagged().await.expect("take_flagged").len(), 1);
    pass.commit().await.expect("commit");
    assert_eq!(claim.run_id, run);
    let other = SqliteStore::connect("sqlite::memory:", clock()).await.expect("connect");
    assert!(
        other.get_run(run).await.expect("get_run").is_none(),
        "each memory store is its own database"
    );
}

#[tokio::test]
async fn a_file_in_a_missing_folder_is_created_with_its_folder() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let nested = dir.path().join("a").join("b").join("flow.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", nested.display()), clock())
        .await
        .expect("connect creates the folder and the file");
    store.publish_definition(&definition(chain())).await.expect("publish");
    assert!(nested.is_file());

    // The `sqlite:` form, and reopening an existing file (migrations again).
    let other = dir.path().join("c").join("flow.db");
    let url = format!("sqlite:{}", other.display());
    SqliteStore::connect(&url, clock()).await.expect("connect");
    let reopened = SqliteStore::connect(&url, clock()).await.expect("reconnect");
    reopened.migrate().await.expect("migrations are idempotent");
    assert!(other.is_file());

    let mut conn = raw(&nested).await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .expect("pragma");
    assert_eq!(mode, "wal");
    // Small pages keep each commit's WAL frames small (see `store.rs`).
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("pragma");
    assert_eq!(page_size, 1024);
    conn.close().await.expect("close");
}

#[tokio::test]
async fn a_schema_from_a_newer_binary_is_a_migration_error() {
    let factory = SqliteFactory::default();
    let path = factory.path();
    let store = open(&path).await;
    store.close().await;
    let mut conn = raw(&path).await;
    exec(
        &mut conn,
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from the future', 1, x'00', 0)",
    )
    .await
    .expect("a migration this binary does not know");
    match SqliteStore::connect(&format!("sqlite://{}", path.display()), clock()).await {
        Err(store::Error::Migration(message)) => assert!(message.contains("99990101000000"), "{message}"),
        other => panic!("expected a migration error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_table_is_a_migration_error() {
    let factory = SqliteFactory::default();
    let path = factory.path();
    let store = open(&path).await;
    let mut conn = raw(&path).await;
    exec(&mut conn, "PRAGMA foreign_keys = OFF").await.expect("pragma");
    exec(&mut conn, "DROP TABLE worker").await.expect("drop");
    conn.close().await.expect("close");
    use flowforge_ports::WorkerRegistry;
    match store.list_workers().await {
        Err(store::Error::Migration(message)) => assert!(message.contains("worker"), "{message}"),
        other => panic!("expected a migration error, got {other:?}"),
    }
}

/// Two stores on one file behave like two processes: their write
/// transactions wait for each other (BEGIN IMMEDIATE + busy timeout)
/// instead of failing, and the database still decides each race once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_serialise_their_writes() {
    const CLAIMERS: usize = 6;
    let factory = SqliteFactory::default();
    let path = factory.path();
    let first = open(&path).await;
    let second = open(&path).await;
    let published = first.publish_definition(&definition(chain())).await.expect("publish");
    let again = second
        .publish_definition(&definition(chain()))
        .await
        .expect("republish");
    assert!(!again.created);
    let run = first.start_run(published.id, json!({})).await.expect("start");
    let a = second.get_run(run).await.expect("get_run").expect("exists").tasks[0].clone();
    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let handles: Vec<_> = (0..CLAIMERS)
        .map(|i| {
            let store = if i % 2 == 0 { first.clone() } else { second.clone() };
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .claim_task_run(a.id, a.token, &WorkerId(format!("w{i}")), Duration::from_secs(300))
                    .await
                    .expect("no busy error reaches the caller")
            })
        })
        .collect();
    let mut wins = 0;
    for h in handles {
        wins += usize::from(h.await.expect("claimer").is_some());
    }
    assert_eq!(wins, 1);
    let state = first.get_run(run).await.expect("get_run").expect("exists").tasks[0].state;
    assert_eq!(state, TaskRunState::Running);
}

/// Store time is SQLite's clock plus the Clock port's offset, in every
/// statement: a lease taken after moving the clock ends that much later.
#[tokio::test]
async fn store_time_follows_the_clock_offset() {
    let factory = SqliteFactory::default();
    let manual = Arc::new(ManualClock::default());
    let store = SqliteStore::connect(&format!("sqlite://{}", factory.path().display()), manual.clone())
        .await
        .expect("connect");
    let published = store.publish_definition(&definition(chain())).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    manual.advance(Duration::from_secs(3 * 86_400));
    let a = store.get_run(run).await.expect("get_run").expect("exists").tasks[0].clone();
    let claim = store
        .claim_task_run(a.id, a.token, &WorkerId("w".into()), Duration::from_secs(60))
        .await
        .expect("claim")
        .expect("won");
    let expected = chrono::Utc::now() + chrono::TimeDelta::days(3) + chrono::TimeDelta::seconds(60);
    assert!(
        (claim.lease_expires_at - expected).num_seconds().abs() < 30,
        "{}",
        claim.lease_expires_at
    );
    assert!(a.created_at < claim.lease_expires_at - chrono::TimeDelta::days(2));
}

async fn run_chain(store: &SqliteStore) -> flowforge_ports::RunId {
    let published = store.publish_definition(&definition(chain())).await.expect("publish");
    store.start_run(published.id, json!({"in": 1})).await.expect("start")
}

async fn task(store: &SqliteStore, run: flowforge_ports::RunId, key: &str) -> flowforge_ports::TaskRunView {
    store
        .get_run(run)
        .await
        .expect("get_run")
        .expect("exists")
        .tasks
        .into_iter()
        .find(|t| t.key == key)
        .expect("the task run")
}

/// `begin_pass` reads and clears the flags in its first call; a pass
/// committed without taking them leaves them set, as if never read.
#[tokio::test]
async fn a_pass_committed_without_taking_its_flags_leaves_them() {
    let factory = SqliteFactory::default();
    let store = open(&factory.path()).await;
    let run = run_chain(&store).await;
    let a = task(&store, run, "a").await;
    let w = WorkerId("w".into());
    let claim = store
        .claim_task_run(a.id, a.token, &w, Duration::from_secs(300))
        .await
        .expect("claim")
        .expect("won");
    store
        .finish_task_run(
            a.id,
            claim.token,
            &w,
            flowforge_ports::TaskOutcome::Succeeded { output: json!(1) },
        )
        .await
        .expect("finish");
    let pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    pass.commit().await.expect("commit");
    assert_eq!(
        store
            .runs_with_work(flowforge_ports::Scope::All, 10)
            .await
            .expect("runs_with_work"),
        [run]
    );
    let mut pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    let flagged = pass.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state),
        ("a", TaskRunState::Succeeded)
    );
    pass.commit().await.expect("commit");
    assert!(
        store
            .runs_with_work(flowforge_ports::Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
}

/// A fan-in's successes lower the join's counter themselves
/// (docs/design/scheduler.md#joins): no success is flagged, and the last
/// one makes the join ready, with its event and dispatch, without a pass.
#[tokio::test]
async fn a_fan_ins_successes_hand_the_join_on_without_a_pass() {
    let factory = SqliteFactory::default();
    let store = open(&factory.path()).await;
    let def = definition(json!({"name": "fan-in", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "noop"},
        {"key": "c", "task_type": "noop"},
        {"key": "j", "task_type": "noop", "depends_on": ["a", "b", "c"]}
    ]}));
    let published = store.publish_definition(&def).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let w = WorkerId("w".into());
    let mut claims = Vec::new();
    for key in ["a", "b", "c"] {
        let t = task(&store, run, key).await;
        claims.push(
            store
                .claim_task_run(t.id, t.token, &w, Duration::from_secs(300))
                .await
                .expect("claim")
                .expect("won"),
        );
    }
    // The first claims' flags, as the pass that starts the run takes them.
    let mut pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    pass.take_flagged().await.expect("take_flagged");
    pass.commit().await.expect("commit");
    for (i, claim) in claims.iter().enumerate() {
        let handoff = flowforge_domain::plan::handoff(&def, &claim.task_key);
        assert_eq!((handoff.joins.as_slice(), handoff.whole), (&["j".to_owned()][..], true));
        let finished = store
            .finish_and_hand_off(
                claim.task_run_id,
                claim.token,
                &w,
                flowforge_ports::TaskOutcome::Succeeded { output: json!(i) },
                &handoff,
                flowforge_ports::Handover::Pushed,
            )
            .await
            .expect("finish");
        assert_eq!(
            finished.result,
            flowforge_ports::FinishResult::Recorded(TaskRunState::Succeeded)
        );
        assert!(
            store
                .runs_with_work(flowforge_ports::Scope::All, 10)
                .await
                .expect("runs_with_work")
                .is_empty(),
            "no success is flagged"
        );
        let (state, handed): (_, &[&str]) = if i == claims.len() - 1 {
            (TaskRunState::Ready, &["j"])
        } else {
            (TaskRunState::Pending, &[])
        };
        assert_eq!(task(&store, run, "j").await.state, state);
        let held: Vec<&str> = finished.held.iter().map(|d| d.task_key.as_str()).collect();
        assert_eq!(held, handed, "the last success hands j on");
    }
    let events = store.run_events(run, 0, 100).await.expect("run_events");
    let satisfied: Vec<_> = events
        .iter()
        .filter(|e| e.transition == "dependencies_satisfied")
        .collect();
    assert_eq!(satisfied.len(), 1, "{events:?}");
    assert_eq!(satisfied[0].task.as_deref(), Some("j"));
}

/// A flagged row that the pass itself changed before `take_flagged` is
/// reported as it is now, not as `begin_pass` read it.
#[tokio::test]
async fn take_flagged_after_a_change_reports_the_rows_as_they_are() {
    let factory = SqliteFactory::default();
    let manual = Arc::new(ManualClock::default());
    let store = SqliteStore::connect(&format!("sqlite://{}", factory.path().display()), manual.clone())
        .await
        .expect("connect");
    let def = definition(json!({"name": "retried", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop", "retry": {"max_attempts": 3}},
        {"key": "b", "task_type": "noop", "depends_on": ["a"]}
    ]}));
    let published = store.publish_definition(&def).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let a = task(&store, run, "a").await;
    // The first claim while the run is pending flags the row; the reaper
    // then puts it back to ready, flag kept.
    store
        .claim_task_run(a.id, a.token, &WorkerId("w".into()), Duration::from_secs(1))
        .await
        .expect("claim")
        .expect("won");
    manual.advance(Duration::from_secs(5));
    let reaped = store
        .reap_expired_leases(flowforge_ports::Scope::All, 10)
        .await
        .expect("reap");
    assert_eq!(reaped.len(), 1);
    let mut pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    assert_eq!(pass.cancel_waiting().await.expect("cancel_waiting"), ["a", "b"]);
    let flagged = pass.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state, flagged[0].cancel_reason),
        ("a", TaskRunState::Cancelled, Some(flowforge_domain::CancelReason::User))
    );
    assert!(pass.take_flagged().await.expect("again").is_empty());
}

/// A statement that fails inside a pass rolls the whole pass back at once:
/// nothing it did survives, later calls and the commit fail, and the
/// writer is free for the next caller.
#[tokio::test]
async fn a_failed_pass_call_rolls_back_and_ends_the_pass() {
    let factory = SqliteFactory::default();
    let path = factory.path();
    let store = open(&path).await;
    let run = run_chain(&store).await;
    let mut conn = raw(&path).await;
    exec(&mut conn, "PRAGMA foreign_keys = OFF").await.expect("pragma");
    exec(&mut conn, "DELETE FROM task WHERE key = 'b'")
        .await
        .expect("the manual edit");
    let mut pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    assert!(
        pass.transition_run(flowforge_domain::RunTransition::Start)
            .await
            .expect("start")
    );
    match pass.satisfy_dependencies(&[("b".into(), 1)]).await {
        Err(store::Error::Corrupt(message)) => assert!(message.contains("no task row"), "{message}"),
        other => panic!("a ready row without a dispatch must not be written, got {other:?}"),
    }
    assert!(pass.activity().await.is_err(), "the pass is over");
    assert!(pass.commit().await.is_err(), "nothing to commit");
    let detail = store.get_run(run).await.expect("get_run").expect("exists");
    assert_eq!(detail.summary.state, flowforge_domain::RunState::Pending, "rolled back");
    assert_eq!(task(&store, run, "b").await.state, TaskRunState::Pending);
    let a = task(&store, run, "a").await;
    assert!(
        store
            .claim_task_run(a.id, a.token, &WorkerId("w".into()), Duration::from_secs(300))
            .await
            .expect("the writer is free")
            .is_some()
    );
}

/// A write abandoned half-way (its future dropped while SQLite runs it)
/// leaves no transaction behind: it happened entirely or not at all, and
/// the next write — this process's or another's — proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_write_is_rolled_back_before_the_next() {
    let factory = SqliteFactory::default();
    let path = factory.path();
    let store = open(&path).await;
    let tasks: Vec<Value> = (0..20)
        .map(|i| json!({"key": format!("t{i}"), "task_type": "noop"}))
        .collect();
    let published = store
        .publish_definition(&definition(json!({"name": "wide", "version": 1, "tasks": tasks})))
        .await
        .expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let rows = store.get_run(run).await.expect("get_run").expect("exists").tasks;
    let w = WorkerId("w".into());
    let mut abandoned = 0;
    for (i, t) in rows.iter().enumerate() {
        // The first claim is sent while another connection holds the
        // file's write lock, so it is certain to be unfinished when it is
        // dropped, however fast the machine; the others are polled once
        // (the call is sent), then dropped while SQLite is at a point that
        // varies with the pause.
        let mut blocker = None;
        if i == 0 {
            let mut conn = raw(&path).await;
            exec(&mut conn, "BEGIN IMMEDIATE").await.expect("the write lock");
            blocker = Some(conn);
        }
        let mut claim = Box::pin(store.claim_task_run(t.id, t.token, &w, Duration::from_secs(300)));
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(claim.as_mut().poll(cx))).await;
        std::thread::sleep(Duration::from_micros(u64::try_from(i).expect("small") * 15));
        abandoned += usize::from(first.is_pending());
        drop(claim);
        if let Some(mut conn) = blocker {
            exec(&mut conn, "COMMIT").await.expect("the lock released");
        }
    }
    assert!(abandoned > 0, "no write was abandoned");
    let detail = store.get_run(run).await.expect("get_run").expect("exists");
    for t in &detail.tasks {
        let claimed = detail
            .events
            .iter()
            .any(|e| e.task.as_deref() == Some(t.key.as_str()) && e.transition == "claim");
        assert_eq!(
            t.state == TaskRunState::Running,
            claimed,
            "{}: a claim is its UPDATE and its event, or nothing",
            t.key
        );
        if t.state == TaskRunState::Ready {
            assert!(
                store
                    .claim_task_run(t.id, t.token, &w, Duration::from_secs(300))
                    .await
                    .expect("claim")
                    .is_some()
            );
        }
    }
    // Another connection can take the write lock: nothing holds it.
    let mut conn = raw(&path).await;
    exec(&mut conn, "BEGIN IMMEDIATE")
        .await
        .expect("the file's write lock is free");
    exec(&mut conn, "COMMIT").await.expect("commit");
}

/// On one in-memory connection, a dropped pass is rolled back before any
/// other use of the connection, reads included.
#[tokio::test]
async fn a_dropped_pass_is_rolled_back_before_a_read_on_a_memory_database() {
    let store = SqliteStore::connect("sqlite::memory:", clock()).await.expect("connect");
    let run = run_chain(&store).await;
    let mut pass = store.begin_pass(run).await.expect("begin_pass").expect("free");
    assert!(
        pass.transition_run(flowforge_domain::RunTransition::Start)
            .await
            .expect("start")
    );
    drop(pass);
    let detail = store.get_run(run).await.expect("get_run").expect("exists");
    assert_eq!(detail.summary.state, flowforge_domain::RunState::Pending);
    assert!(store.begin_pass(run).await.expect("begin_pass").is_some());
}

/// `task_inputs` answers from what this store already wrote or read; a
/// store with nothing in memory reads the database, and both agree.
#[tokio::test]
async fn task_inputs_agree_from_memory_and_from_the_database() {
    let factory = SqliteFactory::default();
    let path = factory.path();
    let store = open(&path).await;
    let run = run_chain(&store).await;
    let w = WorkerId("w".into());
    let a = task(&store, run, "a").await;
    let claim = store
        .claim_task_run(a.id, a.token, &w, Duration::from_secs(300))
        .await
        .expect("claim")
        .expect("won");
    let output = json!({"z": [1.5, -2, "ü"], "a": {"nested": null}});
    store
        .finish_task_run(
            a.id,
            claim.token,
            &w,
            flowforge_ports::TaskOutcome::Succeeded { output: output.clone() },
        )
        .await
        .expect("finish");
    let keys = ["a".to_owned()];
    let remembered = store.task_inputs(run, &keys, usize::MAX).await.expect("task_inputs");
    let fresh = open(&path).await;
    let read = fresh.task_inputs(run, &keys, usize::MAX).await.expect("task_inputs");
    assert_eq!(remembered, read);
    assert_eq!(read.outputs.get("a"), Some(&output));
    assert_eq!(read.run_input, json!({"in": 1}));
    // Its read is remembered too, and still agrees.
    assert_eq!(
        fresh.task_inputs(run, &keys, usize::MAX).await.expect("task_inputs"),
        read
    );
    // Both now answer from memory: an edit behind their backs (no writer
    // makes one: a succeeded output never changes) reaches only a store
    // with nothing in memory.
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE task_run SET result = '{\"edited\": true}' WHERE run_id = ?1 AND task_key = 'a'")
        .bind(run.to_string())
        .execute(&mut conn)
        .await
        .expect("the edit");
    assert_eq!(
        store.task_inputs(run, &keys, usize::MAX).await.expect("task_inputs"),
        read
    );
    assert_eq!(
        fresh.task_inputs(run, &keys, usize::MAX).await.expect("task_inputs"),
        read
    );
    let third = open(&path).await;
    assert_eq!(
        third
            .task_inputs(run, &keys, usize::MAX)
            .await
            .expect("task_inputs")
            .outputs
            .get("a"),
        Some(&json!({"edited": true}))
    );
    let missing = store
        .task_inputs(run, &["b".to_owned()], usize::MAX)
        .await
        .expect("task_inputs");
    assert!(missing.outputs.is_empty(), "b has not succeeded");
}

/// The migrations as released, by version and SHA-384 (sqlx's checksum).
/// sqlx refuses a database whose applied migration has changed since, so
/// editing one would lock every existing database out: change the schema
/// in a new migration instead.
const RELEASED_MIGRATIONS: &[(i64, &str)] = &[(
    20261129000001,
    "b62b6713786b34fe2a862dd29fb633e245d82f83a7d626fc3f7dfd9cf3ab6d197b6411f071a3876fb262eaf2dc0744db",
)];

/// A released migration is never edited, and a database made by the first
/// release (its migration alone) opens and is brought up to date.
#[tokio::test]
async fn a_database_of_the_first_release_opens_and_is_migrated() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let current = sqlx::migrate::Migrator::new(folder.as_path())
        .await
        .expect("the migrations");
    for (version, checksum) in RELEASED_MIGRATIONS {
        let migration = current
            .iter()
            .find(|m| m.version == *version)
            .unwrap_or_else(|| panic!("released migration {version} is gone"));
        let hex: String = migration.checksum.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&hex, checksum, "released migration {version} was edited");
    }

    let dir = tempfile::tempdir().expect("a temp folder");
    let first_release = dir.path().join("migrations");
    std::fs::create_dir(&first_release).expect("a folder");
    let first = "20261129000001_create_schema.sql";
    std::fs::copy(folder.join(first), first_release.join(first)).expect("copy");
    let path = dir.path().join("old.db");
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .expect("a new file");
    sqlx::migrate::Migrator::new(first_release.as_path())
        .await
        .expect("the first release's migrations")
        .run(&mut conn)
        .await
        .expect("applied");
    conn.close().await.expect("close");

    let store = open(&path).await;
    let run = store
        .start_run(
            store
                .publish_definition(&definition(chain()))
                .await
                .expect("publish")
                .id,
            json!({}),
        )
        .await
        .expect("a run on the upgraded schema");
    assert!(store.get_run(run).await.expect("get_run").is_some());
    let mut conn = raw(&path).await;
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'taskrun_%_idx'")
            .fetch_all(&mut conn)
            .await
            .expect("indexes");
    assert!(indexes.iter().any(|i| i == "taskrun_active_idx"), "{indexes:?}");
    assert!(!indexes.iter().any(|i| i == "taskrun_waiting_idx"), "{indexes:?}");
}

/// A database file as an earlier release left it: made by the migrations
/// older than `version` alone. Returns its folder (removed when dropped),
/// its path and a connection to it.
async fn database_before(version: &str) -> (tempfile::TempDir, std::path::PathBuf, SqliteConnection) {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let dir = tempfile::tempdir().expect("a temp folder");
    let before = dir.path().join("migrations");
    std::fs::create_dir(&before).expect("a folder");
    for entry in std::fs::read_dir(&folder).expect("the migrations") {
        let name = entry.expect("an entry").file_name();
        if name.to_string_lossy().as_ref() < version {
            std::fs::copy(folder.join(&name), before.join(&name)).expect("copy");
        }
    }
    let path = dir.path().join("old.db");
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .expect("a new file");
    sqlx::migrate::Migrator::new(before.as_path())
        .await
        .unwrap_or_else(|e| panic!("the migrations before {version}: {e}"))
        .run(&mut conn)
        .await
        .expect("applied");
    (dir, path, conn)
}

/// A database migrated before the event numbers keeps its history: the
/// upgrade numbers each run's events in the order get_run merged them (by
/// id, across both tables), and the next event follows on.
#[tokio::test]
async fn the_upgrade_numbers_the_history_already_written() {
    let (_dir, path, mut conn) = database_before("20261202000001").await;
    sqlx::raw_sql(
        "INSERT INTO workflow VALUES (1, 'w', 1, '', printf('%064d', 0), '{}', 0);
         INSERT INTO task (workflow_id, key, position, task_type, depends_on, max_attempts)
         VALUES (1, 'a', 0, 'noop', '[]', 1);
         INSERT INTO workflow_run (id, workflow_id, state, input, created_at)
         VALUES ('00000000-0000-7000-8000-000000000001', 1, 'running', '{}', 0),
                ('00000000-0000-7000-8000-000000000002', 1, 'running', '{}', 0);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, attempt, fencing_token)
         VALUES (1, '00000000-0000-7000-8000-000000000001', 'a', 'ready', 0, 0, 2, 1);
         INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (1, 1, '00000000-0000-7000-8000-000000000001', 'a', 'claim', 'ready', 'running', 1, 1, 0),
                (4, 1, '00000000-0000-7000-8000-000000000001', 'a', 'reap_lease', 'running', 'ready', 2, 1, 0);
         INSERT INTO workflow_run_event (id, run_id, transition, from_state, to_state, at)
         VALUES (2, '00000000-0000-7000-8000-000000000001', 'start', 'pending', 'running', 0),
                (3, '00000000-0000-7000-8000-000000000002', 'start', 'pending', 'running', 0);",
    )
    .execute(&mut conn)
    .await
    .expect("a history");
    conn.close().await.expect("close");

    let store = open(&path).await;
    let run: flowforge_ports::RunId = "00000000-0000-7000-8000-000000000001".parse().expect("a run id");
    let numbered = |events: &[flowforge_ports::EventView]| -> Vec<(u64, String)> {
        events.iter().map(|e| (e.seq, e.transition.clone())).collect()
    };
    let history = store.run_events(run, 0, 10).await.expect("run_events");
    assert_eq!(
        numbered(&history),
        [
            (1, "claim".to_owned()),
            (2, "start".to_owned()),
            (3, "reap_lease".to_owned())
        ]
    );
    let other: flowforge_ports::RunId = "00000000-0000-7000-8000-000000000002".parse().expect("a run id");
    assert_eq!(
        numbered(&store.run_events(other, 0, 10).await.expect("run_events")),
        [(1, "start".to_owned())]
    );
    let claimed = store
        .claim_task_run(
            flowforge_ports::TaskRunId(1),
            1,
            &WorkerId("w".into()),
            Duration::from_secs(300),
        )
        .await
        .expect("claim")
        .expect("the claim wins");
    assert_eq!(claimed.token, 2);
    let next = store.run_events(run, 3, 10).await.expect("run_events");
    assert_eq!(numbered(&next), [(4, "claim".to_owned())]);
}

/// The upgrade that rebuilds `task_run` for the `skipped` state
/// (docs/design/conditions.md#skipping) keeps every row, its id, its events
/// and its dispatches, leaves no foreign key dangling, and the run goes on.
#[tokio::test]
async fn the_rebuild_for_skipped_task_runs_keeps_every_row_and_reference() {
    let (_dir, path, mut conn) = database_before("20261206000001").await;
    sqlx::raw_sql(
        "INSERT INTO workflow VALUES (1, 'w', 1, '', printf('%064d', 0), '{}', 0);
         INSERT INTO task (workflow_id, key, position, task_type, depends_on, max_attempts)
         VALUES (1, 'a', 0, 'noop', '[]', 1), (1, 'b', 1, 'noop', '[\"a\"]', 1);
         INSERT INTO workflow_run (id, workflow_id, state, input, created_at, started_at)
         VALUES ('00000000-0000-7000-8000-000000000001', 1, 'running', '{}', 0, 0);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, started_at, finished_at, result,
                               attempt, fencing_token)
         VALUES (7, '00000000-0000-7000-8000-000000000001', 'a', 'succeeded', 0, 0, 0, 1, '{\"n\": 1}', 1, 1);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, attempt, fencing_token)
         VALUES (9, '00000000-0000-7000-8000-000000000001', 'b', 'ready', 0, 0, 1, 0);
         INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (1, 7, '00000000-0000-7000-8000-000000000001', 'a', 'claim', 'ready', 'running', 1, 1, 0),
                (2, 7, '00000000-0000-7000-8000-000000000001', 'a', 'succeed', 'running', 'succeeded', 1, 1, 1),
                (3, 9, '00000000-0000-7000-8000-000000000001', 'b', 'dependencies_satisfied', 'pending', 'ready',
                 1, 0, 1);
         INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at)
         VALUES (9, '00000000-0000-7000-8000-000000000001', 'b', 'noop', 0, 1);",
    )
    .execute(&mut conn)
    .await
    .expect("a run half done");
    conn.close().await.expect("close");

    let store = open(&path).await;
    let run: flowforge_ports::RunId = "00000000-0000-7000-8000-000000000001".parse().expect("a run id");
    let detail = store.get_run(run).await.expect("get_run").expect("the run");
    let rows: Vec<(i64, &str, TaskRunState)> = detail.tasks.iter().map(|t| (t.id.0, t.key.as_str(), t.state)).collect();
    assert_eq!(rows, [(7, "a", TaskRunState::Succeeded), (9, "b", TaskRunState::Ready)]);
    assert_eq!(detail.tasks[0].output, Some(json!({"n": 1})));
    assert_eq!(detail.events.len(), 3, "{:?}", detail.events);
    let mut conn = raw(&path).await;
    assert_rebuilt_cleanly(&mut conn).await;
    conn.close().await.expect("close");
    claim_and_finish(&store, 9).await;
}

/// The upgrade that rewrites the per-transition checks as ORs of
/// equalities (docs/design/data-model.md#constraints-without-lookup-tables)
/// keeps every row with its id, its mapped-task columns, events and
/// dispatches; the checks still refuse what they refused, and the run
/// goes on.
#[tokio::test]
async fn the_rebuild_for_checks_as_ors_keeps_every_row_and_still_refuses_bad_ones() {
    let (_dir, path, mut conn) = database_before("20261210000001").await;
    sqlx::raw_sql(
        "INSERT INTO workflow VALUES (1, 'w', 1, '', printf('%064d', 0), '{}', 0);
         INSERT INTO task (workflow_id, key, position, task_type, depends_on, max_attempts)
         VALUES (1, 'a', 0, 'noop', '[]', 1);
         INSERT INTO workflow_run (id, workflow_id, state, input, created_at, started_at)
         VALUES ('00000000-0000-7000-8000-000000000001', 1, 'running', '{}', 0, 0);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, map_size)
         VALUES (7, '00000000-0000-7000-8000-000000000001', 'a', 'pending', 2, 0, 2);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, started_at, finished_at, result,
                               map_of, map_index, attempt, fencing_token)
         VALUES (8, '00000000-0000-7000-8000-000000000001', 'a[0]', 'succeeded', 0, 0, 0, 1, '{\"n\": 0}', 'a', 0,
                 1, 1);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, map_of, map_index)
         VALUES (9, '00000000-0000-7000-8000-000000000001', 'a[1]', 'ready', 0, 0, 'a', 1);
         INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (1, 8, '00000000-0000-7000-8000-000000000001', 'a[0]', 'claim', 'ready', 'running', 1, 1, 0),
                (2, 8, '00000000-0000-7000-8000-000000000001', 'a[0]', 'succeed', 'running', 'succeeded', 1, 1, 1);
         INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at)
         VALUES (9, '00000000-0000-7000-8000-000000000001', 'a[1]', 'noop', 0, 1);",
    )
    .execute(&mut conn)
    .await
    .expect("a map half done");
    conn.close().await.expect("close");

    let store = open(&path).await;
    let mut conn = raw(&path).await;
    /// id, key, state, counter, and the mapped-task columns.
    type Row = (i64, String, String, i64, Option<String>, Option<i64>, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, task_key, state, pending_deps, map_of, map_index, map_size FROM task_run ORDER BY id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("rows");
    assert_eq!(
        rows,
        [
            (7, "a".into(), "pending".into(), 2, None, None, Some(2)),
            (8, "a[0]".into(), "succeeded".into(), 0, Some("a".into()), Some(0), None),
            (9, "a[1]".into(), "ready".into(), 0, Some("a".into()), Some(1), None),
        ]
    );
    let events: Vec<(i64, String, i64)> = sqlx::query_as("SELECT id, transition, seq FROM task_run_event ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .expect("events");
    assert_eq!(events, [(1, "claim".into(), 1), (2, "succeed".into(), 2)]);
    assert_rebuilt_cleanly(&mut conn).await;
    // The upgraded file's checks are the ORs: a state update opens no
    // temporary table (the IN lists it had opened four).
    let mut update = sqlx::query(
        "EXPLAIN UPDATE task_run SET state = ?1, finished_at = ?2, lease_owner = ?3, lease_expires_at = ?4, \
         pending_deps = ?5 WHERE id = ?6",
    );
    for _ in 0..6 {
        update = update.bind(None::<i64>);
    }
    let program = update.fetch_all(&mut conn).await.expect("a program");
    let temporary = program
        .iter()
        .filter(|op| sqlx::Row::get::<String, _>(*op, "opcode") == "OpenEphemeral")
        .count();
    assert_eq!(temporary, 0, "the checks are still IN lists");
    for (bad, constraint) in [
        ("UPDATE task_run SET state = 'done' WHERE id = 7", "taskrun_state_valid"),
        (
            "UPDATE task_run SET state = 'failed' WHERE id = 7",
            "taskrun_finished_iff_finished_state",
        ),
        (
            "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt, \
             fencing_token, at, seq, generation) VALUES (7, '00000000-0000-7000-8000-000000000001', 'a', 'finish', \
             'pending', 'failed', 1, 0, 2, 3, 1)",
            "taskrunevent_transition_valid",
        ),
    ] {
        let error = sqlx::query(bad).execute(&mut conn).await.expect_err(bad).to_string();
        assert!(error.contains(constraint), "{bad}: {error}");
    }
    conn.close().await.expect("close");

    claim_and_finish(&store, 9).await;
}

/// The upgrade after which statements number their events
/// (docs/design/data-model.md#event-numbers) keeps both event tables' rows
/// with their ids, numbers and generations, drops the numbering triggers,
/// refuses an event without its number or generation, and the run's next
/// events follow on from its last number.
#[tokio::test]
async fn the_rebuild_for_events_numbered_by_their_statements_keeps_the_history_and_goes_on() {
    let (_dir, path, mut conn) = database_before("20261211000001").await;
    sqlx::raw_sql(
        "INSERT INTO workflow VALUES (1, 'w', 1, '', printf('%064d', 0), '{}', 0);
         INSERT INTO task (workflow_id, key, position, task_type, depends_on, max_attempts)
         VALUES (1, 'a', 0, 'noop', '[]', 1), (1, 'b', 1, 'noop', '[\"a\"]', 1);
         INSERT INTO workflow_run (id, workflow_id, state, input, created_at, started_at, generation)
         VALUES ('00000000-0000-7000-8000-000000000001', 1, 'running', '{}', 0, 0, 2);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, started_at, finished_at, result,
                               attempt, fencing_token, generation)
         VALUES (7, '00000000-0000-7000-8000-000000000001', 'a', 'succeeded', 0, 0, 0, 1, '{}', 1, 1, 1);
         INSERT INTO task_run (id, run_id, task_key, state, pending_deps, created_at, generation)
         VALUES (9, '00000000-0000-7000-8000-000000000001', 'b', 'ready', 0, 0, 2);
         INSERT INTO workflow_run_event (id, run_id, transition, from_state, to_state, at)
         VALUES (1, '00000000-0000-7000-8000-000000000001', 'start', 'pending', 'running', 0);
         INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (2, 7, '00000000-0000-7000-8000-000000000001', 'a', 'claim', 'ready', 'running', 1, 1, 0),
                (3, 7, '00000000-0000-7000-8000-000000000001', 'a', 'succeed', 'running', 'succeeded', 1, 1, 1);
         UPDATE run_event_seq SET generation = 2;
         INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, at)
         VALUES (4, 9, '00000000-0000-7000-8000-000000000001', 'b', 'dependencies_satisfied', 'pending', 'ready',
                 1, 0, 1);
         INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at)
         VALUES (9, '00000000-0000-7000-8000-000000000001', 'b', 'noop', 0, 1);",
    )
    .execute(&mut conn)
    .await
    .expect("a run numbered by the triggers");
    conn.close().await.expect("close");

    let store = open(&path).await;
    let mut conn = raw(&path).await;
    let events: Vec<(i64, String, i64, i64)> =
        sqlx::query_as("SELECT id, transition, seq, generation FROM task_run_event ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .expect("events");
    assert_eq!(
        events,
        [
            (2, "claim".into(), 2, 1),
            (3, "succeed".into(), 3, 1),
            (4, "dependencies_satisfied".into(), 4, 2)
        ]
    );
    let run_events: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT id, transition, seq FROM workflow_run_event ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .expect("run events");
    assert_eq!(run_events, [(1, "start".into(), 1)]);
    let triggers: Vec<String> = sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        .fetch_all(&mut conn)
        .await
        .expect("triggers");
    assert!(triggers.is_empty(), "{triggers:?}");
    assert_rebuilt_cleanly(&mut conn).await;
    for (bad, refusal) in [
        (
            "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt, \
             fencing_token, at) VALUES (9, '00000000-0000-7000-8000-000000000001', 'b', 'claim', 'ready', \
             'running', 1, 1, 2)",
            "NOT NULL constraint failed: task_run_event.seq",
        ),
        (
            "INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'succeed', 'running', 'succeeded', 2)",
            "NOT NULL constraint failed: workflow_run_event.seq",
        ),
        (
            "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt, \
             fencing_token, at, seq) VALUES (9, '00000000-0000-7000-8000-000000000001', 'b', 'claim', 'ready', \
             'running', 1, 1, 2, 9)",
            "NOT NULL constraint failed: task_run_event.generation",
        ),
        (
            "INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at, seq, generation) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'finish', 'running', 'succeeded', 2, 9, 2)",
            "workflowrunevent_transition_valid",
        ),
    ] {
        let error = sqlx::query(bad).execute(&mut conn).await.expect_err(bad).to_string();
        assert!(error.contains(refusal), "{bad}: {error}");
    }
    conn.close().await.expect("close");

    claim_and_finish(&store, 9).await;
    let run: flowforge_ports::RunId = "00000000-0000-7000-8000-000000000001".parse().expect("a run id");
    let next: Vec<(u64, String, u32)> = store
        .run_events(run, 4, 10)
        .await
        .expect("run_events")
        .into_iter()
        .map(|e| (e.seq, e.transition, e.generation))
        .collect();
    assert_eq!(next, [(5, "claim".to_owned(), 2), (6, "succeed".to_owned(), 2)]);
}

/// A rebuilt file leaves no foreign key dangling and no half-built table
/// behind.
async fn assert_rebuilt_cleanly(conn: &mut SqliteConnection) {
    let dangling: Vec<(String, i64)> = sqlx::query_as("SELECT \"table\", rowid FROM pragma_foreign_key_check")
        .fetch_all(&mut *conn)
        .await
        .expect("foreign_key_check");
    assert!(dangling.is_empty(), "{dangling:?}");
    let left: Vec<String> = sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name LIKE '%_next'")
        .fetch_all(&mut *conn)
        .await
        .expect("tables");
    assert!(left.is_empty(), "{left:?}");
}

/// The run goes on after an upgrade: task run `id`, ready at token 0, is
/// claimed and its success recorded.
async fn claim_and_finish(store: &SqliteStore, id: i64) {
    let claimed = store
        .claim_task_run(
            flowforge_ports::TaskRunId(id),
            0,
            &WorkerId("w".into()),
            Duration::from_secs(300),
        )
        .await
        .expect("claim")
        .expect("the claim wins");
    let done = store
        .finish_task_run(
            claimed.task_run_id,
            claimed.token,
            &WorkerId("w".into()),
            flowforge_ports::TaskOutcome::Succeeded { output: json!({}) },
        )
        .await
        .expect("finish");
    assert_eq!(done, flowforge_ports::FinishResult::Recorded(TaskRunState::Succeeded));
}
