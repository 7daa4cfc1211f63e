//! The store contract suite (feature `test-util`): one set of cases that
//! every [`Store`] adapter must pass, written against the port traits only,
//! so the embedded (SQLite) and distributed (PostgreSQL) modes cannot drift
//! apart (docs/design/testing.md#store-contract-suite).
//!
//! An adapter's integration tests implement [`StoreFactory`] (each call a
//! fresh, empty store with its own database) and invoke
//! [`store_contract_tests!`](crate::store_contract_tests), which expands to
//! one `#[tokio::test]` per case. The adapter's test crate needs `tokio`
//! with the `macros` and `rt-multi-thread` features.
//!
//! Rules the cases follow: races are provoked with barriers, never sleeps;
//! time moves with [`ManualClock`], never by waiting; leases are long
//! (300 s) unless the case is about expiry; tokens are compared by order,
//! never by value (docs/design/state-machines.md#started).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::derive::TaskTally;
use flowforge_domain::{CancelReason, RunState, RunTransition, TaskRunState, WorkflowDefinition, WorkflowDocument};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::clock::{Clock, ManualClock};
use crate::ids::{RunId, TaskRunId, WorkerId, WorkflowId};
use crate::queue::Dispatch;
use crate::store::{
    CancelOutcome, Claim, DefinitionStore, EventView, FinishResult, LeaseStatus, LoadError, Notifier, OutboxStore,
    OutboxSweep, PublishError, Published, RunPass, RunSet, RunStore, Scope, Store, TaskOutcome, TaskRunView, Topic,
    TransitionError, WorkerRegistration, WorkerRegistry,
};

/// Makes fresh stores for the contract cases.
pub trait StoreFactory: Send + Sync {
    /// The store under test.
    type Store: Store;

    /// A fresh, empty store (its own database) whose store time is its
    /// database clock plus `clock`'s offset.
    fn create(&self, clock: Arc<ManualClock>) -> impl Future<Output = Self::Store> + Send;
}

/// Expands to one `#[tokio::test]` per contract case, each running
/// `$crate::contract::<case>(&$factory)` against a fresh store.
///
/// ```text
/// mod contract {
///     flowforge_ports::store_contract_tests!(crate::SqliteFactory::default());
/// }
/// ```
#[macro_export]
macro_rules! store_contract_tests {
    ($factory:expr) => {
        $crate::store_contract_tests!(@cases $factory;
            publish_creates_then_returns_the_stored_row,
            publish_refuses_different_content_naming_both_fingerprints,
            load_round_trips_definitions,
            concurrent_first_publishes_end_with_one_definition,
            start_run_materialises_forward_tasks_only,
            claim_wins_exactly_once_among_concurrent_claimers,
            claim_refuses_stale_duplicate_and_cancelled_dispatches,
            claim_takes_a_lease_in_store_time_and_flags_the_first_start,
            renew_lease_extends_reports_cancel_and_detects_loss,
            finish_succeeded_stores_the_output,
            finish_failed_without_retry_fails_for_good,
            finish_failed_with_retry_schedules_it_in_store_time,
            finish_cancelled_records_the_user_reason,
            a_stale_finish_changes_nothing_and_is_audited,
            fencing_rejects_a_worker_whose_lease_was_reaped,
            reaping_with_attempts_left_redispatches,
            reaping_the_final_attempt_fails_the_task,
            reaping_a_cancel_requested_run_cancels_without_dispatch,
            the_reaper_spares_live_finished_and_out_of_scope_leases,
            illegal_transitions_fail_before_any_io,
            a_lost_race_is_false_not_an_error,
            generic_transitions_record_events_and_dispatch,
            request_cancel_reports_each_outcome,
            runs_with_work_and_next_deadline_follow_active_work,
            take_flagged_reads_and_clears_in_one_step,
            satisfy_dependencies_promotes_at_zero_with_dispatch,
            cancel_pending_applies_the_given_reason,
            cancel_waiting_cancels_waiting_forward_rows_only,
            tally_and_succeeded_keys_count_forward_tasks,
            compensators_are_created_once_and_dispatched,
            a_cancel_request_does_not_stop_a_rollback,
            activity_says_whether_forward_tasks_still_move,
            run_transitions_follow_the_workflow_run_machine,
            begin_pass_skips_a_run_already_held,
            a_pass_is_invisible_until_commit_and_rolls_back_on_drop,
            writes_wake_the_loops_that_wait_for_them,
            outbox_sweeps_oldest_first_within_limit_and_scope,
            concurrent_sweeps_never_share_a_row,
            get_run_and_list_runs_report_runs,
            task_inputs_read_the_run_input_and_outputs,
            worker_registry_tracks_workers_and_live_task_types,
            the_event_history_records_every_transition,
            wide_runs_are_written_in_batches,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::contract::$case(&$factory).await;
            }
        )*
    };
}

/// A lease long enough that no case reaps by accident on a slow machine.
const LONG: Duration = Duration::from_secs(300);
/// How long a case waits for a wake-up before calling it missing.
const WAKE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn definition(v: Value) -> WorkflowDefinition {
    let doc: WorkflowDocument = serde_json::from_value(v).expect("a well-formed test document");
    WorkflowDefinition::from_document(doc).expect("a valid test definition")
}

fn worker(name: &str) -> WorkerId {
    WorkerId(name.to_owned())
}

/// a → b → c, plus a compensator for a.
fn chain() -> Value {
    json!({"name": "chain", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "echo", "depends_on": ["a"]},
        {"key": "c", "task_type": "noop", "depends_on": ["b"]},
        {"key": "undo_a", "task_type": "undo", "compensate_for": "a"}
    ]})
}

/// a, b → c → d, plus a compensator for a.
fn diamond() -> Value {
    json!({"name": "diamond", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "echo"},
        {"key": "c", "task_type": "noop", "depends_on": ["a", "b"]},
        {"key": "d", "task_type": "noop", "depends_on": ["c"]},
        {"key": "undo_a", "task_type": "undo", "compensate_for": "a"}
    ]})
}

/// One root task `t` allowing `attempts` attempts.
fn single(name: &str, attempts: u32) -> Value {
    json!({"name": name, "version": 1, "tasks": [
        {"key": "t", "task_type": "flaky", "retry": {"max_attempts": attempts, "delay_seconds": 10}}
    ]})
}

async fn fresh<F: StoreFactory>(factory: &F) -> (F::Store, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    (factory.create(clock.clone()).await, clock)
}

async fn publish<S: Store>(s: &S, v: Value) -> Published {
    s.publish_definition(&definition(v)).await.expect("publish")
}

async fn start<S: Store>(s: &S, v: Value) -> RunId {
    let p = publish(s, v).await;
    s.start_run(p.id, json!({"n": 1})).await.expect("start_run")
}

async fn tasks<S: Store>(s: &S, run: RunId) -> Vec<TaskRunView> {
    s.get_run(run).await.expect("get_run").expect("the run exists").tasks
}

async fn view<S: Store>(s: &S, run: RunId, key: &str) -> TaskRunView {
    tasks(s, run)
        .await
        .into_iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no task run '{key}'"))
}

async fn events<S: Store>(s: &S, run: RunId) -> Vec<EventView> {
    s.get_run(run).await.expect("get_run").expect("the run exists").events
}

async fn events_of<S: Store>(s: &S, run: RunId, key: &str) -> Vec<EventView> {
    events(s, run)
        .await
        .into_iter()
        .filter(|e| e.task.as_deref() == Some(key))
        .collect()
}

/// One history entry as (task, transition, from, to, attempt).
type Step<'a> = (Option<&'a str>, &'a str, Option<&'a str>, Option<&'a str>, Option<u32>);

fn transitions(events: &[EventView]) -> Vec<&str> {
    events.iter().map(|e| e.transition.as_str()).collect()
}

/// The unpublished dispatches in scope, read through a sweep that is then
/// dropped (so they stay unpublished).
async fn unpublished<S: Store>(s: &S, scope: Scope) -> Vec<Dispatch> {
    match s.begin_sweep(scope, 100_000).await.expect("begin_sweep") {
        Some(sweep) => sweep.dispatches().to_vec(),
        None => Vec::new(),
    }
}

async fn dispatches_of<S: Store>(s: &S, run: RunId, key: &str) -> Vec<Dispatch> {
    unpublished(s, Scope::Run(run))
        .await
        .into_iter()
        .filter(|d| d.task_key == key)
        .collect()
}

/// Claims a ready task run at its current token (its dispatch's token).
async fn claim<S: Store>(s: &S, run: RunId, key: &str, by: &str, lease: Duration) -> Claim {
    let v = view(s, run, key).await;
    assert_eq!(v.state, TaskRunState::Ready, "'{key}' must be ready to claim");
    s.claim_task_run(v.id, v.token, &worker(by), lease)
        .await
        .expect("claim_task_run")
        .unwrap_or_else(|| panic!("the claim of '{key}' must win"))
}

async fn finish<S: Store>(s: &S, c: &Claim, by: &str, outcome: TaskOutcome) -> FinishResult {
    s.finish_task_run(c.task_run_id, c.token, &worker(by), outcome)
        .await
        .expect("finish_task_run")
}

fn succeeded(output: Value) -> TaskOutcome {
    TaskOutcome::Succeeded { output }
}

async fn pass<S: Store>(s: &S, run: RunId) -> S::Pass {
    s.begin_pass(run).await.expect("begin_pass").expect("the run is free")
}

/// Clears every flag of the run, so a case observes only what follows.
async fn drain_flags<S: Store>(s: &S, run: RunId) {
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.commit().await.expect("commit");
}

/// Whether `topic` fires within [`WAKE`].
async fn woke<N: Notifier>(n: &N, topic: Topic) -> bool {
    tokio::time::timeout(WAKE, n.notified(topic)).await.is_ok()
}

fn millis(a: DateTime<Utc>, b: DateTime<Utc>) -> i64 {
    (a - b).num_milliseconds()
}

/// Asserts `at` is store time: wall time shifted by the clock's offset.
fn assert_store_time(at: DateTime<Utc>, offset: chrono::TimeDelta) {
    // The wall clock through std: ports builds chrono without its `clock` feature.
    let expected = DateTime::<Utc>::from(std::time::SystemTime::now()) + offset;
    let drift = (at - expected).num_seconds().abs();
    assert!(
        drift < 120,
        "{at} is not store time (wall + {offset}): off by {drift} s"
    );
}

fn near(actual_ms: i64, expected_ms: i64, what: &str) {
    assert!(
        (actual_ms - expected_ms).abs() <= 2_000,
        "{what}: expected about {expected_ms} ms, got {actual_ms} ms"
    );
}

// ---------------------------------------------------------------------------
// Definitions
// ---------------------------------------------------------------------------

/// Publishing is idempotent by content: the same content returns the stored
/// row (its id, creation time and declaration order) with `created = false`.
pub async fn publish_creates_then_returns_the_stored_row<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let def = definition(chain());
    let first = s.publish_definition(&def).await.expect("publish");
    assert!(first.created);
    assert_eq!(first.fingerprint, def.fingerprint());
    assert_eq!(*first.definition, def);

    let again = s.publish_definition(&def).await.expect("republish");
    assert!(!again.created, "identical content is not created twice");
    assert_eq!((again.id, &again.fingerprint), (first.id, &first.fingerprint));
    assert_eq!(again.created_at, first.created_at);

    // Same content declared in another order: same fingerprint, the stored row.
    let mut reordered = chain();
    reordered["tasks"].as_array_mut().expect("tasks is an array").reverse();
    let reordered = definition(reordered);
    assert_eq!(reordered.fingerprint(), def.fingerprint());
    let stored = s.publish_definition(&reordered).await.expect("republish reordered");
    assert!(!stored.created);
    assert_eq!(stored.id, first.id);
    assert_eq!(
        stored.definition.document(),
        def.document(),
        "the stored declaration order"
    );
}

/// Different content under a published (name, version) is a conflict that
/// names both fingerprints; the stored definition is untouched.
pub async fn publish_refuses_different_content_naming_both_fingerprints<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let original = publish(&s, chain()).await;
    for change in [
        json!({"name": "chain", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        {
            let mut described = chain();
            described["description"] = json!("only the description changed");
            described
        },
    ] {
        let other = definition(change);
        match s.publish_definition(&other).await {
            Err(PublishError::Conflict {
                name,
                version,
                existing,
                new,
            }) => {
                assert_eq!((name.as_str(), version), ("chain", 1));
                assert_eq!(existing, original.fingerprint);
                assert_eq!(new, other.fingerprint());
                assert_ne!(existing, new);
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
    let loaded = s.load_definition(original.id).await.expect("load");
    assert_eq!(*loaded.definition, *original.definition);
}

/// Loading rebuilds exactly what was published (every field, declaration
/// order, float settings), re-validated, with the published fingerprint.
pub async fn load_round_trips_definitions<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let doc = json!({
        "name": "rich", "version": 7, "description": "every field",
        "defaults": {"timeout_seconds": 12.5, "retry": {"max_attempts": 3, "delay_seconds": 0.3}},
        "tasks": [
            {"key": "load", "task_type": "noop", "depends_on": ["transform", "extract"],
             "timeout_seconds": 0.1, "retry": {"max_attempts": 5, "delay_seconds": 0.7, "backoff": 1.7,
             "max_delay_seconds": 12.345}},
            {"key": "extract", "task_type": "command", "config": {"argv": ["./x.sh", "--fast"], "env": {"A": "1"}}},
            {"key": "transform", "task_type": "echo", "depends_on": ["extract"], "config": {}},
            {"key": "undo_extract", "task_type": "command", "compensate_for": "extract",
             "config": {"argv": ["./undo.sh"]}, "retry": {"max_attempts": 2}}
        ]
    });
    let def = definition(doc);
    let published = s.publish_definition(&def).await.expect("publish");
    let loaded = s.load_definition(published.id).await.expect("load");
    assert_eq!(loaded.id, published.id);
    assert!(!loaded.created);
    assert_eq!(*loaded.definition, def, "a load returns the published document");
    assert_eq!(loaded.fingerprint, def.fingerprint());
    assert_eq!(loaded.definition.fingerprint(), published.fingerprint);
    assert_eq!(loaded.created_at, published.created_at);

    let found = s
        .find_definition("rich", 7)
        .await
        .expect("find")
        .expect("found by name and version");
    assert_eq!(found.id, published.id);
    assert_eq!(*found.definition, def);
    assert!(s.find_definition("rich", 8).await.expect("find").is_none());
    assert!(s.find_definition("poor", 7).await.expect("find").is_none());
    assert!(matches!(
        s.load_definition(WorkflowId(i64::MAX)).await,
        Err(LoadError::NotFound(_))
    ));
}

/// Two concurrent first publishes of one (name, version) end with one
/// definition; the loser gets the winner's row, a conflict or `LostRace`.
pub async fn concurrent_first_publishes_end_with_one_definition<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let contents = [
        json!({"name": "race", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        json!({"name": "race", "version": 1, "tasks": [{"key": "b", "task_type": "noop"}]}),
    ];
    let barrier = Arc::new(Barrier::new(contents.len()));
    let handles: Vec<_> = contents
        .iter()
        .map(|c| {
            let (s, barrier, def) = (s.clone(), barrier.clone(), definition(c.clone()));
            tokio::spawn(async move {
                barrier.wait().await;
                (s.publish_definition(&def).await, def)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for h in handles {
        match h.await.expect("publisher task") {
            (Ok(p), def) => {
                assert!(p.created, "different content can only be created, not found");
                winners.push(def);
            }
            (Err(PublishError::Conflict { .. } | PublishError::LostRace { .. }), _) => {}
            (Err(e), _) => panic!("a lost publish race must be a conflict or LostRace, not {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one definition is created");
    let stored = s.find_definition("race", 1).await.expect("find").expect("stored");
    assert_eq!(*stored.definition, winners[0]);

    // Identical content: both get the same row (or the loser is told to retry).
    let def = definition(json!({"name": "same", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (s, barrier, def) = (s.clone(), barrier.clone(), def.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.publish_definition(&def).await
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    let mut created = 0;
    for h in handles {
        match h.await.expect("publisher task") {
            Ok(p) => {
                ids.insert(p.id);
                created += usize::from(p.created);
            }
            Err(PublishError::LostRace { .. }) => {}
            Err(e) => panic!("identical content must not conflict: {e}"),
        }
    }
    assert_eq!(ids.len(), 1, "one row for identical content");
    assert_eq!(created, 1);
}

// ---------------------------------------------------------------------------
// Starting runs and claiming
// ---------------------------------------------------------------------------

/// A run starts pending with one task run per forward task: the roots ready
/// with one dispatch each at their token, the rest pending, compensators
/// not materialised, no history yet.
pub async fn start_run_materialises_forward_tasks_only<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    let input = json!({"date": "2026-11-29", "rows": [1, 2]});
    let run = s.start_run(p.id, input.clone()).await.expect("start_run");

    let detail = s.get_run(run).await.expect("get_run").expect("exists");
    assert_eq!(detail.summary.id, run);
    assert_eq!(detail.summary.workflow_id, p.id);
    assert_eq!(
        (detail.summary.workflow.as_str(), detail.summary.version),
        ("diamond", 1)
    );
    assert_eq!(detail.summary.state, RunState::Pending);
    assert!(!detail.summary.cancel_requested);
    assert!(detail.summary.started_at.is_none() && detail.summary.finished_at.is_none());
    assert_eq!(detail.fingerprint, p.fingerprint);
    assert_eq!(detail.input, input);
    assert!(detail.events.is_empty(), "creating rows is not a transition");

    let got: Vec<(&str, TaskRunState)> = detail.tasks.iter().map(|t| (t.key.as_str(), t.state)).collect();
    assert_eq!(
        got,
        [
            ("a", TaskRunState::Ready),
            ("b", TaskRunState::Ready),
            ("c", TaskRunState::Pending),
            ("d", TaskRunState::Pending)
        ],
        "forward tasks in creation order; the compensator is not materialised"
    );
    for t in &detail.tasks {
        assert_eq!(t.attempt, 1);
        assert!(t.compensate_for.is_none());
        assert!(t.cancel_reason.is_none() && t.output.is_none() && t.error.is_none());
        assert!(t.started_at.is_none() && t.finished_at.is_none() && t.retry_at.is_none());
        assert!(t.lease_owner.is_none());
    }

    let dispatches = unpublished(&s, Scope::Run(run)).await;
    let got: Vec<(&str, &str)> = dispatches
        .iter()
        .map(|d| (d.task_key.as_str(), d.task_type.as_str()))
        .collect();
    assert_eq!(got, [("a", "noop"), ("b", "echo")], "one dispatch per ready root");
    for d in &dispatches {
        let t = detail.tasks.iter().find(|t| t.key == d.task_key).expect("its task run");
        assert_eq!((d.task_run_id, d.run_id, d.fencing_token), (t.id, run, t.token));
    }
    assert!(s.list_runs(10).await.expect("list_runs").iter().any(|r| r.id == run));
    assert!(
        s.start_run(WorkflowId(i64::MAX), json!({})).await.is_err(),
        "no run of an unknown definition"
    );
}

/// Exactly one of N concurrent claimers of one dispatch wins.
pub async fn claim_wins_exactly_once_among_concurrent_claimers<F: StoreFactory>(factory: &F) {
    const CLAIMERS: usize = 8;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = view(&s, run, "a").await;
    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let handles: Vec<_> = (0..CLAIMERS)
        .map(|i| {
            let (s, barrier) = (s.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.claim_task_run(a.id, a.token, &worker(&format!("w{i}")), LONG)
                    .await
                    .expect("claim_task_run")
            })
        })
        .collect();
    let mut wins = Vec::new();
    for h in handles {
        wins.extend(h.await.expect("claimer task"));
    }
    assert_eq!(wins.len(), 1, "exactly one claimer wins");
    let won = &wins[0];
    assert!(won.token > a.token, "a claim bumps the token");
    let now = view(&s, run, "a").await;
    assert_eq!(now.state, TaskRunState::Running);
    assert_eq!(now.token, won.token);
    let claims = events_of(&s, run, "a").await;
    assert_eq!(transitions(&claims), ["claim"], "one claim event");
    assert_eq!(now.lease_owner, claims[0].worker);
}

/// A claim matches only a ready row at the dispatch's token in a run
/// without a cancel request.
pub async fn claim_refuses_stale_duplicate_and_cancelled_dispatches<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = view(&s, run, "a").await;
    let w = worker("w");
    let wrong = s.claim_task_run(a.id, a.token + 1, &w, LONG).await.expect("claim");
    assert!(wrong.is_none(), "a token the row is not at claims nothing");
    assert!(
        s.claim_task_run(a.id, a.token, &w, LONG)
            .await
            .expect("claim")
            .is_some()
    );
    let duplicate = s.claim_task_run(a.id, a.token, &w, LONG).await.expect("claim");
    assert!(duplicate.is_none(), "a redelivered dispatch claims nothing");
    let b = view(&s, run, "b").await;
    assert!(
        s.claim_task_run(b.id, b.token, &w, LONG)
            .await
            .expect("claim")
            .is_none(),
        "a pending row is not claimable"
    );
    assert!(
        s.claim_task_run(TaskRunId(i64::MAX), 0, &w, LONG)
            .await
            .expect("claim")
            .is_none(),
        "an unknown row claims nothing"
    );

    let other = s
        .start_run(
            s.find_definition("chain", 1).await.expect("find").expect("stored").id,
            json!({}),
        )
        .await
        .expect("start_run");
    assert_eq!(
        s.request_cancel(other).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    let ready = view(&s, other, "a").await;
    assert!(
        s.claim_task_run(ready.id, ready.token, &w, LONG)
            .await
            .expect("claim")
            .is_none(),
        "a claim never succeeds for a cancel-requested run"
    );
    assert_eq!(view(&s, other, "a").await.state, TaskRunState::Ready);
}

/// A claim's lease ends at store now + lease; `started_at` is set by the
/// first claim; the first start of a pending run flags it for a pass.
pub async fn claim_takes_a_lease_in_store_time_and_flags_the_first_start<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    clock.advance(Duration::from_secs(86_400));
    let run = start(&s, chain()).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );

    let c = claim(&s, run, "a", "w1", LONG).await;
    assert_eq!((c.run_id, c.task_key.as_str(), c.attempt), (run, "a", 1));
    assert!(c.compensate_for.is_none());
    let p = s.find_definition("chain", 1).await.expect("find").expect("stored");
    assert_eq!(c.workflow_id, p.id);
    let claimed = events_of(&s, run, "a").await;
    let at = claimed[0].at;
    assert_store_time(at, clock.offset());
    near(millis(c.lease_expires_at, at), 300_000, "lease end - claim time");
    let a = view(&s, run, "a").await;
    near(
        millis(a.started_at.expect("started_at"), at),
        0,
        "started_at is the claim's store time",
    );
    assert_eq!(a.lease_owner.as_deref(), Some("w1"));

    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state),
        ("a", TaskRunState::Running)
    );
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    p.commit().await.expect("commit");

    // A later first start in a running run needs no pass.
    finish(&s, &c, "w1", succeeded(json!({}))).await;
    drain_flags(&s, run).await;
    let mut p = pass(&s, run).await;
    p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    claim(&s, run, "b", "w1", LONG).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
}

/// A heartbeat extends the lease while the token holds it, reports a cancel
/// request, and reports `Lost` once the token moved on.
pub async fn renew_lease_extends_reports_cancel_and_detects_loss<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    clock.advance(Duration::from_secs(100));
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token, LONG).await.expect("renew"),
        LeaseStatus::Held {
            cancel_requested: false
        }
    );
    let deadline = s
        .next_deadline(Scope::Run(run))
        .await
        .expect("deadline")
        .expect("a lease");
    near(
        i64::try_from(deadline.as_millis()).unwrap_or(i64::MAX),
        300_000,
        "the renewed lease",
    );
    // Past the original lease, within the renewed one: nothing to reap.
    clock.advance(Duration::from_secs(250));
    assert!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").is_empty());

    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token, LONG).await.expect("renew"),
        LeaseStatus::Held { cancel_requested: true }
    );
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token + 1, LONG).await.expect("renew"),
        LeaseStatus::Lost,
        "another token never holds the lease"
    );
    finish(&s, &c, "w", TaskOutcome::Cancelled).await;
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token, LONG).await.expect("renew"),
        LeaseStatus::Lost,
        "a finished row has no lease"
    );
}

// ---------------------------------------------------------------------------
// Finishing
// ---------------------------------------------------------------------------

/// `succeed` stores the output, clears the lease, sets `finished_at`,
/// records the event and flags the run.
pub async fn finish_succeeded_stores_the_output<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    drain_flags(&s, run).await;
    let output = json!({"rows": 3, "nested": {"ok": true}});
    assert_eq!(
        finish(&s, &c, "w", succeeded(output.clone())).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    let a = view(&s, run, "a").await;
    assert_eq!(a.state, TaskRunState::Succeeded);
    assert_eq!(a.output, Some(output));
    assert!(a.lease_owner.is_none());
    assert!(a.finished_at.is_some());
    assert_eq!(a.token, c.token, "finishing does not move the token");
    let last = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(last.transition, "succeed");
    assert_eq!(
        (last.from.as_deref(), last.to.as_deref()),
        (Some("running"), Some("succeeded"))
    );
    assert_eq!(
        (last.attempt, last.token, last.worker.as_deref()),
        (Some(1), Some(c.token), Some("w"))
    );

    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state),
        ("a", TaskRunState::Succeeded)
    );
}

/// `fail` without a retry rests in failed for good, keeping the error.
pub async fn finish_failed_without_retry_fails_for_good<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    let outcome = TaskOutcome::Failed {
        error: "exit code 3".into(),
        retry_in: None,
    };
    assert_eq!(
        finish(&s, &c, "w", outcome).await,
        FinishResult::Recorded(TaskRunState::Failed)
    );
    let a = view(&s, run, "a").await;
    assert_eq!(a.state, TaskRunState::Failed);
    assert_eq!(a.error.as_deref(), Some("exit code 3"));
    assert!(a.lease_owner.is_none() && a.finished_at.is_some() && a.retry_at.is_none());
    assert!(a.output.is_none());
    let last = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.to.as_deref(), last.error.as_deref()),
        ("fail", Some("failed"), Some("exit code 3"))
    );
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(flagged.iter().any(|t| t.key == "a" && t.state == TaskRunState::Failed));
}

/// A failure with attempts left moves to retrying in the same transaction
/// (`fail` + `schedule_retry`): attempt + 1, `retry_at` = store now + delay,
/// lease and `finished_at` cleared, error kept; it is due only once store
/// time reaches `retry_at`, and `promote_due_retries` re-dispatches it.
pub async fn finish_failed_with_retry_schedules_it_in_store_time<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    clock.advance(Duration::from_secs(86_400));
    let run = start(&s, single("retry", 3)).await;
    let c = claim(&s, run, "t", "w", LONG).await;
    let first_start = view(&s, run, "t").await.started_at;
    let outcome = TaskOutcome::Failed {
        error: "boom".into(),
        retry_in: Some(Duration::from_secs(10)),
    };
    assert_eq!(
        finish(&s, &c, "w", outcome).await,
        FinishResult::Recorded(TaskRunState::Retrying)
    );
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Retrying);
    assert_eq!(t.attempt, 2);
    assert_eq!(t.error.as_deref(), Some("boom"));
    assert!(t.lease_owner.is_none() && t.finished_at.is_none());
    let evs = events_of(&s, run, "t").await;
    assert_eq!(transitions(&evs), ["claim", "fail", "schedule_retry"]);
    assert_eq!((evs[1].attempt, evs[1].to.as_deref()), (Some(1), Some("failed")));
    assert_eq!(evs[1].error.as_deref(), Some("boom"));
    assert_eq!(
        (evs[2].from.as_deref(), evs[2].to.as_deref(), evs[2].attempt),
        (Some("failed"), Some("retrying"), Some(2))
    );
    assert_eq!((evs[1].token, evs[2].token), (Some(c.token), Some(c.token)));
    let scheduled = evs[2].at;
    assert_store_time(scheduled, clock.offset());
    near(
        millis(t.retry_at.expect("retry_at"), scheduled),
        10_000,
        "retry_at - store now",
    );

    drain_flags(&s, run).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty(),
        "a retry is not due before its time"
    );
    let wait = s.next_deadline(Scope::All).await.expect("deadline").expect("the retry");
    assert!(
        wait <= Duration::from_secs(10) && wait >= Duration::from_secs(7),
        "{wait:?}"
    );
    let mut p = pass(&s, run).await;
    assert!(
        p.promote_due_retries().await.expect("promote").is_empty(),
        "not yet due"
    );
    drop(p);

    clock.advance(Duration::from_secs(11));
    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);
    assert_eq!(
        s.next_deadline(Scope::All).await.expect("deadline"),
        Some(Duration::ZERO)
    );
    let mut p = pass(&s, run).await;
    assert_eq!(p.promote_due_retries().await.expect("promote"), ["t"]);
    p.commit().await.expect("commit");
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Ready);
    assert!(t.retry_at.is_none());
    let d = dispatches_of(&s, run, "t").await;
    assert!(
        d.iter().any(|d| d.fencing_token == t.token),
        "the retry is dispatched at its token"
    );
    assert_eq!(
        transitions(&events_of(&s, run, "t").await).last().copied(),
        Some("retry_ready")
    );
    let again = claim(&s, run, "t", "w", LONG).await;
    assert_eq!(again.attempt, 2);
    assert!(again.token > c.token);
    assert_eq!(view(&s, run, "t").await.started_at, first_start, "started_at is kept");
}

/// `cancel_running` (a worker stopping on a cancel request) records the
/// reason `user`.
pub async fn finish_cancelled_records_the_user_reason<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    assert_eq!(
        finish(&s, &c, "w", TaskOutcome::Cancelled).await,
        FinishResult::Recorded(TaskRunState::Cancelled)
    );
    let a = view(&s, run, "a").await;
    assert_eq!(a.state, TaskRunState::Cancelled);
    assert_eq!(a.cancel_reason, Some(CancelReason::User));
    assert!(a.finished_at.is_some() && a.lease_owner.is_none());
    let last = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.from.as_deref(), last.to.as_deref()),
        ("cancel_running", Some("running"), Some("cancelled"))
    );
}

/// A finish with a token that no longer holds the lease changes nothing
/// and leaves a `stale_write_rejected` event with the presented token.
pub async fn a_stale_finish_changes_nothing_and_is_audited<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    let before = view(&s, run, "a").await;
    let stale = c.token + 1;
    let result = s
        .finish_task_run(c.task_run_id, stale, &worker("intruder"), succeeded(json!({"x": 1})))
        .await
        .expect("finish");
    assert_eq!(result, FinishResult::Stale);
    assert_eq!(view(&s, run, "a").await, before, "nothing changed");
    let audit = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(audit.transition, "stale_write_rejected");
    assert_eq!((audit.from.as_deref(), audit.to.as_deref()), (None, None));
    assert_eq!((audit.token, audit.worker.as_deref()), (Some(stale), Some("intruder")));

    // A finished row rejects a second finish with its own token too.
    finish(&s, &c, "w", succeeded(json!({"first": true}))).await;
    let second = finish(&s, &c, "w", succeeded(json!({"second": true}))).await;
    assert_eq!(second, FinishResult::Stale);
    assert_eq!(view(&s, run, "a").await.output, Some(json!({"first": true})));
}

/// Spec 000's fencing sequence: A claims, its lease expires, the reaper
/// takes it back, B claims; A's late finish is stale, B's is recorded.
pub async fn fencing_rejects_a_worker_whose_lease_was_reaped<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("fence", 2)).await;
    let a = claim(&s, run, "t", "A", Duration::from_secs(10)).await;
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    let b = claim(&s, run, "t", "B", LONG).await;
    assert!(b.token > a.token);
    assert_eq!(
        finish(&s, &a, "A", succeeded(json!({"by": "A"}))).await,
        FinishResult::Stale
    );
    assert_eq!(
        finish(&s, &b, "B", succeeded(json!({"by": "B"}))).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    assert_eq!(view(&s, run, "t").await.output, Some(json!({"by": "B"})));
    let evs = events_of(&s, run, "t").await;
    assert_eq!(
        transitions(&evs),
        ["claim", "reap_lease", "claim", "stale_write_rejected", "succeed"]
    );
    let tokens: Vec<i64> = evs.iter().map(|e| e.token.expect("a token")).collect();
    assert_eq!(tokens[0], a.token);
    assert!(tokens[1] > tokens[0] && tokens[2] > tokens[1], "{tokens:?}");
    assert_eq!(tokens[2], b.token);
    assert_eq!((tokens[3], evs[3].worker.as_deref()), (a.token, Some("A")));
    assert_eq!((tokens[4], evs[4].worker.as_deref()), (b.token, Some("B")));
}

// ---------------------------------------------------------------------------
// The reaper
// ---------------------------------------------------------------------------

/// An expired lease with attempts left goes back to ready: attempt + 1,
/// token bumped, lease cleared, a new dispatch at the new token.
pub async fn reaping_with_attempts_left_redispatches<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("reap", 3)).await;
    let dispatched_at = view(&s, run, "t").await.token;
    let c = claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    let notifier = s.notifier().await.expect("notifier");
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    let r = &reaped[0];
    assert_eq!(
        (r.task_run_id, r.run_id, r.task_key.as_str()),
        (c.task_run_id, run, "t")
    );
    assert_eq!(r.transition, flowforge_domain::TaskTransition::ReapLease);
    assert!(!r.cancelled);
    assert_eq!(
        (r.attempt, r.token),
        (c.attempt, c.token),
        "the lost attempt and its token"
    );
    let t = view(&s, run, "t").await;
    assert_eq!((t.state, t.attempt), (TaskRunState::Ready, 2));
    assert!(t.token > c.token);
    assert!(t.lease_owner.is_none());
    let d = dispatches_of(&s, run, "t").await;
    assert!(
        d.iter().any(|d| d.fencing_token == t.token),
        "re-dispatched at the new token"
    );
    assert!(
        woke(&notifier, Topic::Publisher).await,
        "a re-dispatch wakes the publisher"
    );
    let last = events_of(&s, run, "t").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.from.as_deref(), last.to.as_deref()),
        ("reap_lease", Some("running"), Some("ready"))
    );
    assert_eq!((last.attempt, last.token), (Some(2), Some(t.token)));

    let old = s
        .claim_task_run(c.task_run_id, dispatched_at, &worker("late"), LONG)
        .await
        .expect("claim");
    assert!(old.is_none(), "the first dispatch is stale now");
    let again = claim(&s, run, "t", "w2", LONG).await;
    assert_eq!(again.attempt, 2);
}

/// An expired lease on the final attempt fails the task for good
/// (`reap_lease_final`), without a dispatch.
pub async fn reaping_the_final_attempt_fails_the_task<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("final", 1)).await;
    let c = claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    drain_flags(&s, run).await;
    let before = unpublished(&s, Scope::Run(run)).await.len();
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLeaseFinal);
    assert!(!reaped[0].cancelled);
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Failed);
    assert_eq!(t.attempt, 1);
    assert!(t.token > c.token);
    assert!(t.lease_owner.is_none() && t.finished_at.is_some());
    assert!(
        t.error.as_deref().is_some_and(|e| e.contains("lease expired")),
        "{:?}",
        t.error
    );
    assert_eq!(unpublished(&s, Scope::Run(run)).await.len(), before, "no dispatch");
    let last = events_of(&s, run, "t").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.to.as_deref()),
        ("reap_lease_final", Some("failed"))
    );
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(flagged.iter().any(|f| f.key == "t" && f.state == TaskRunState::Failed));
}

/// In a cancel-requested run the reaper applies `reap_lease` then
/// `cancel_ready` (reason user) in one transaction, with no dispatch.
pub async fn reaping_a_cancel_requested_run_cancels_without_dispatch<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("cancelreap", 3)).await;
    claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    let before = unpublished(&s, Scope::Run(run)).await.len();
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLease);
    assert!(reaped[0].cancelled);
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Cancelled);
    assert_eq!(t.cancel_reason, Some(CancelReason::User));
    assert!(t.finished_at.is_some() && t.lease_owner.is_none());
    assert_eq!(
        unpublished(&s, Scope::Run(run)).await.len(),
        before,
        "nothing dispatched"
    );
    let evs = events_of(&s, run, "t").await;
    assert_eq!(transitions(&evs), ["claim", "reap_lease", "cancel_ready"]);
}

/// The reaper takes only expired leases of running rows in scope, up to
/// its limit.
pub async fn the_reaper_spares_live_finished_and_out_of_scope_leases<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let p = publish(&s, single("spare", 3)).await;
    let live = s.start_run(p.id, json!({})).await.expect("start");
    let done = s.start_run(p.id, json!({})).await.expect("start");
    let other = s.start_run(p.id, json!({})).await.expect("start");
    let third = s.start_run(p.id, json!({})).await.expect("start");
    claim(&s, live, "t", "w", LONG).await;
    let finished = claim(&s, done, "t", "w", Duration::from_secs(10)).await;
    claim(&s, other, "t", "w", Duration::from_secs(10)).await;
    claim(&s, third, "t", "w", Duration::from_secs(10)).await;
    finish(&s, &finished, "w", succeeded(json!({}))).await;
    assert!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").is_empty());

    clock.advance(Duration::from_secs(11));
    let scoped = s.reap_expired_leases(Scope::Run(live), 10).await.expect("reap");
    assert!(scoped.is_empty(), "a live lease is not reaped");
    let limited = s.reap_expired_leases(Scope::All, 1).await.expect("reap");
    assert_eq!(limited.len(), 1, "the limit bounds one call");
    let rest = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(rest.len(), 1);
    let reaped: BTreeSet<RunId> = limited.iter().chain(&rest).map(|r| r.run_id).collect();
    assert_eq!(reaped, BTreeSet::from([other, third]));
    assert_eq!(
        view(&s, done, "t").await.state,
        TaskRunState::Succeeded,
        "finished rows are never touched"
    );
    assert_eq!(view(&s, live, "t").await.state, TaskRunState::Running);
}

// ---------------------------------------------------------------------------
// The generic transition path (docs/design/state-machines.md#caller-contract)
// ---------------------------------------------------------------------------

/// An edge not in the machine is `Illegal`, a lease-spending edge is
/// `LeaseRequired`, a reserved edge is `Reserved` — identically whether or
/// not the row exists, so before any I/O.
pub async fn illegal_transitions_fail_before_any_io<F: StoreFactory>(factory: &F) {
    use TaskRunState::*;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let real = view(&s, run, "a").await;
    let ghost = TaskRunId(i64::MAX);
    for (from, to) in [
        (Succeeded, Pending),
        (Pending, Running),
        (Cancelled, Ready),
        (Ready, Ready),
        (Retrying, Failed),
        (Pending, Succeeded),
    ] {
        let expected = TransitionError::Illegal { from, to };
        assert_eq!(s.transition_task_run(ghost, from, to).await, Err(expected.clone()));
        assert_eq!(s.transition_task_run(real.id, from, to).await, Err(expected));
    }
    for (from, to, edge) in [
        (Running, Succeeded, flowforge_domain::TaskTransition::Succeed),
        (Running, Failed, flowforge_domain::TaskTransition::Fail),
        (Running, Cancelled, flowforge_domain::TaskTransition::CancelRunning),
    ] {
        let got = s.transition_task_run(ghost, from, to).await;
        assert_eq!(got, Err(TransitionError::LeaseRequired(edge)));
        let message = got.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("finish_task_run"), "{message}");
    }
    for (from, to, edge, operation) in [
        (Ready, Running, flowforge_domain::TaskTransition::Claim, "claim"),
        (Running, Ready, flowforge_domain::TaskTransition::ReapLease, "reap"),
        (
            Failed,
            Retrying,
            flowforge_domain::TaskTransition::ScheduleRetry,
            "finish",
        ),
    ] {
        match s.transition_task_run(ghost, from, to).await {
            Err(TransitionError::Reserved {
                transition,
                operation: op,
            }) => {
                assert_eq!(transition, edge);
                assert!(op.contains(operation), "{op}");
            }
            other => panic!("{from} -> {to} must be reserved, got {other:?}"),
        }
    }
    assert_eq!(view(&s, run, "a").await, real, "nothing changed");
    assert!(events(&s, run).await.is_empty());
}

/// A legal edge another writer beat is `Ok(false)`, not an error; of N
/// concurrent callers exactly one wins.
pub async fn a_lost_race_is_false_not_an_error<F: StoreFactory>(factory: &F) {
    const RACERS: usize = 6;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = view(&s, run, "a").await;
    assert_eq!(
        s.transition_task_run(a.id, TaskRunState::Pending, TaskRunState::Ready)
            .await,
        Ok(false),
        "a is already ready"
    );
    assert_eq!(
        s.transition_task_run(TaskRunId(i64::MAX), TaskRunState::Pending, TaskRunState::Ready)
            .await,
        Ok(false),
        "no row matched"
    );
    let barrier = Arc::new(Barrier::new(RACERS));
    let handles: Vec<_> = (0..RACERS)
        .map(|_| {
            let (s, barrier) = (s.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.transition_task_run(a.id, TaskRunState::Ready, TaskRunState::Cancelled)
                    .await
            })
        })
        .collect();
    let mut won = 0;
    for h in handles {
        won += usize::from(h.await.expect("racer task").expect("a legal edge"));
    }
    assert_eq!(won, 1, "exactly one cancel wins");
    assert_eq!(
        transitions(&events_of(&s, run, "a").await),
        ["cancel_ready"],
        "one event for one change"
    );
}

/// The generic edges write what they need: `dependencies_satisfied` and
/// `retry_ready` a dispatch, the cancels reason `user` and `finished_at`.
pub async fn generic_transitions_record_events_and_dispatch<F: StoreFactory>(factory: &F) {
    use TaskRunState::*;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let b = view(&s, run, "b").await;
    assert_eq!(s.transition_task_run(b.id, Pending, Ready).await, Ok(true));
    let b = view(&s, run, "b").await;
    assert_eq!(b.state, Ready);
    assert!(
        dispatches_of(&s, run, "b")
            .await
            .iter()
            .any(|d| d.fencing_token == b.token)
    );
    let ev = events_of(&s, run, "b").await;
    assert_eq!(
        (ev[0].transition.as_str(), ev[0].from.as_deref(), ev[0].to.as_deref()),
        ("dependencies_satisfied", Some("pending"), Some("ready"))
    );
    claim(&s, run, "b", "w", LONG).await;

    let c = view(&s, run, "c").await;
    assert_eq!(s.transition_task_run(c.id, Pending, Cancelled).await, Ok(true));
    let c = view(&s, run, "c").await;
    assert_eq!((c.state, c.cancel_reason), (Cancelled, Some(CancelReason::User)));
    assert!(c.finished_at.is_some());
    assert_eq!(transitions(&events_of(&s, run, "c").await), ["cancel_pending"]);

    let a = view(&s, run, "a").await;
    assert_eq!(s.transition_task_run(a.id, Ready, Cancelled).await, Ok(true));
    assert_eq!(view(&s, run, "a").await.cancel_reason, Some(CancelReason::User));
    assert_eq!(transitions(&events_of(&s, run, "a").await), ["cancel_ready"]);

    let retry = json!({"name": "two", "version": 1, "tasks": [
        {"key": "x", "task_type": "flaky", "retry": {"max_attempts": 3}},
        {"key": "y", "task_type": "flaky", "retry": {"max_attempts": 3}}
    ]});
    let run = start(&s, retry).await;
    for key in ["x", "y"] {
        let c = claim(&s, run, key, "w", LONG).await;
        let outcome = TaskOutcome::Failed {
            error: "again".into(),
            retry_in: Some(Duration::from_secs(3_600)),
        };
        assert_eq!(finish(&s, &c, "w", outcome).await, FinishResult::Recorded(Retrying));
    }
    let x = view(&s, run, "x").await;
    assert_eq!(s.transition_task_run(x.id, Retrying, Ready).await, Ok(true));
    let x = view(&s, run, "x").await;
    assert_eq!((x.state, x.retry_at), (Ready, None));
    assert!(
        dispatches_of(&s, run, "x")
            .await
            .iter()
            .any(|d| d.fencing_token == x.token)
    );
    assert_eq!(
        transitions(&events_of(&s, run, "x").await).last().copied(),
        Some("retry_ready")
    );
    let y = view(&s, run, "y").await;
    assert_eq!(s.transition_task_run(y.id, Retrying, Cancelled).await, Ok(true));
    let y = view(&s, run, "y").await;
    assert_eq!(
        (y.state, y.cancel_reason, y.retry_at),
        (Cancelled, Some(CancelReason::User), None)
    );
    assert!(y.finished_at.is_some());
    assert_eq!(
        transitions(&events_of(&s, run, "y").await).last().copied(),
        Some("cancel_retrying")
    );
}

// ---------------------------------------------------------------------------
// Cancel requests, scheduler queries
// ---------------------------------------------------------------------------

/// A cancel request is recorded once, flags the run for a pass, and is
/// refused for a finished run; an unknown run is `None`.
pub async fn request_cancel_reports_each_outcome<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert_eq!(s.request_cancel(RunId(uuid::Uuid::nil())).await.expect("cancel"), None);
    let run = start(&s, chain()).await;
    let notifier = s.notifier().await.expect("notifier");
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    assert!(
        woke(&notifier, Topic::Scheduler).await,
        "a cancel request wakes the scheduler"
    );
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::AlreadyRequested)
    );
    let detail = s.get_run(run).await.expect("get_run").expect("exists");
    assert!(detail.summary.cancel_requested);
    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);

    let mut p = pass(&s, run).await;
    assert!(p.run().cancel_requested);
    p.take_flagged().await.expect("take_flagged");
    let mut cancelled = p.cancel_waiting().await.expect("cancel_waiting");
    cancelled.sort();
    assert_eq!(cancelled, ["a", "b", "c"]);
    assert!(
        p.transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel")
    );
    p.commit().await.expect("commit");
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::AlreadyFinished(RunState::Cancelled))
    );
}

/// `runs_with_work` lists runs with a flagged row, a due retry or an
/// unhandled cancel request, in scope and up to the limit;
/// `next_deadline` is the earliest lease end or retry in scope.
pub async fn runs_with_work_and_next_deadline_follow_active_work<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(s.next_deadline(Scope::All).await.expect("deadline"), None);
    let p = publish(&s, chain()).await;
    let first = s.start_run(p.id, json!({})).await.expect("start");
    let second = s.start_run(p.id, json!({})).await.expect("start");
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );

    claim(&s, first, "a", "w", LONG).await;
    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [first]);
    assert!(
        s.runs_with_work(Scope::Run(second), 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(
        s.runs_with_work(Scope::Run(first), 10).await.expect("runs_with_work"),
        [first]
    );
    // A run set is read at each query: its owner changes it between them.
    let set = RunSet::default();
    let tracked = Scope::Runs(set.clone());
    assert!(
        s.runs_with_work(tracked.clone(), 10)
            .await
            .expect("runs_with_work")
            .is_empty(),
        "an empty set holds no run"
    );
    set.insert(second);
    assert!(
        s.runs_with_work(tracked.clone(), 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    set.insert(first);
    assert_eq!(
        s.runs_with_work(tracked.clone(), 10).await.expect("runs_with_work"),
        [first]
    );
    claim(&s, second, "a", "w", Duration::from_secs(100)).await;
    set.remove(first);
    assert_eq!(
        s.runs_with_work(tracked.clone(), 10).await.expect("runs_with_work"),
        [second]
    );
    // Only the run in the set counts: its 300 s lease, not the other's 100 s.
    set.insert(first);
    set.remove(second);
    let in_set = s.next_deadline(tracked).await.expect("deadline").expect("a lease");
    assert!(in_set <= LONG && in_set >= Duration::from_secs(295), "{in_set:?}");
    let both: BTreeSet<RunId> = s
        .runs_with_work(Scope::All, 10)
        .await
        .expect("runs_with_work")
        .into_iter()
        .collect();
    assert_eq!(both, BTreeSet::from([first, second]));
    assert_eq!(s.runs_with_work(Scope::All, 1).await.expect("runs_with_work").len(), 1);

    let all = s.next_deadline(Scope::All).await.expect("deadline").expect("leases");
    assert!(
        all <= Duration::from_secs(100) && all >= Duration::from_secs(95),
        "{all:?}"
    );
    let one = s
        .next_deadline(Scope::Run(first))
        .await
        .expect("deadline")
        .expect("a lease");
    assert!(
        one <= Duration::from_secs(300) && one >= Duration::from_secs(295),
        "{one:?}"
    );
}

// ---------------------------------------------------------------------------
// The scheduler pass
// ---------------------------------------------------------------------------

/// `take_flagged` returns each flagged row once and clears it; a rolled
/// back pass leaves the flags for the next one.
pub async fn take_flagged_reads_and_clears_in_one_step<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &c, "w", succeeded(json!({}))).await;

    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    let a = &flagged[0];
    assert_eq!(
        (a.id, a.key.as_str(), a.state),
        (c.task_run_id, "a", TaskRunState::Succeeded)
    );
    assert!(a.cancel_reason.is_none() && a.compensate_for.is_none());
    assert!(p.take_flagged().await.expect("take_flagged").is_empty(), "cleared");
    drop(p);

    assert_eq!(
        s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"),
        [run],
        "a dropped pass rolls back"
    );
    let mut p = pass(&s, run).await;
    assert_eq!(p.take_flagged().await.expect("take_flagged").len(), 1);
    p.commit().await.expect("commit");
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );

    // A cancelled row carries its reason.
    let b = view(&s, run, "b").await;
    assert_eq!(
        s.transition_task_run(b.id, TaskRunState::Pending, TaskRunState::Cancelled)
            .await,
        Ok(true)
    );
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(
        flagged
            .iter()
            .any(|t| t.key == "b" && t.cancel_reason == Some(CancelReason::User))
    );
}

/// `satisfy_dependencies` lowers the counts and promotes exactly the rows
/// that reach zero, with one dispatch each.
pub async fn satisfy_dependencies_promotes_at_zero_with_dispatch<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    let mut p = pass(&s, run).await;
    assert!(
        p.satisfy_dependencies(&[("c".into(), 1)])
            .await
            .expect("satisfy")
            .is_empty(),
        "c still waits for one dependency"
    );
    assert_eq!(
        p.satisfy_dependencies(&[("c".into(), 1)]).await.expect("satisfy"),
        ["c"]
    );
    assert!(p.satisfy_dependencies(&[]).await.expect("satisfy").is_empty());
    p.commit().await.expect("commit");
    let c = view(&s, run, "c").await;
    assert_eq!(c.state, TaskRunState::Ready);
    assert_eq!(view(&s, run, "d").await.state, TaskRunState::Pending);
    assert!(
        dispatches_of(&s, run, "c")
            .await
            .iter()
            .any(|d| d.fencing_token == c.token)
    );
    assert_eq!(transitions(&events_of(&s, run, "c").await), ["dependencies_satisfied"]);
    assert!(
        tasks(&s, run).await.iter().all(|t| t.key != "undo_a"),
        "a compensator is never promoted"
    );

    // Several entries for one key add up.
    let run = s
        .start_run(
            s.find_definition("diamond", 1).await.expect("find").expect("stored").id,
            json!({}),
        )
        .await
        .expect("start");
    let mut p = pass(&s, run).await;
    assert_eq!(
        p.satisfy_dependencies(&[("c".into(), 1), ("c".into(), 1)])
            .await
            .expect("satisfy"),
        ["c"]
    );
    p.commit().await.expect("commit");
}

/// `cancel_pending` cancels those of the keys still pending, with the
/// given reason.
pub async fn cancel_pending_applies_the_given_reason<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let mut p = pass(&s, run).await;
    let keys = ["c".to_owned(), "b".to_owned(), "a".to_owned(), "ghost".to_owned()];
    let mut cancelled = p
        .cancel_pending(&keys, CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    cancelled.sort();
    assert_eq!(cancelled, ["b", "c"], "a is ready, not pending");
    p.commit().await.expect("commit");
    for key in ["b", "c"] {
        let t = view(&s, run, key).await;
        assert_eq!(
            (t.state, t.cancel_reason),
            (TaskRunState::Cancelled, Some(CancelReason::UpstreamFailed))
        );
        assert!(t.finished_at.is_some());
        let ev = events_of(&s, run, key).await;
        assert_eq!(transitions(&ev), ["cancel_pending"]);
        assert_eq!(
            (ev[0].from.as_deref(), ev[0].to.as_deref()),
            (Some("pending"), Some("cancelled"))
        );
    }
    assert_eq!(view(&s, run, "a").await.state, TaskRunState::Ready);
}

/// `cancel_waiting` cancels every pending, ready and retrying forward row
/// (reason user), leaving running rows and compensators alone.
pub async fn cancel_waiting_cancels_waiting_forward_rows_only<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let doc = json!({"name": "mixed", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "noop", "depends_on": ["a"]},
        {"key": "r", "task_type": "flaky", "retry": {"max_attempts": 3}},
        {"key": "x", "task_type": "noop"},
        {"key": "s", "task_type": "noop"},
        {"key": "undo_s", "task_type": "undo", "compensate_for": "s"}
    ]});
    let run = start(&s, doc).await;
    claim(&s, run, "x", "w", LONG).await;
    let r = claim(&s, run, "r", "w", LONG).await;
    let retry = TaskOutcome::Failed {
        error: "e".into(),
        retry_in: Some(Duration::from_secs(3_600)),
    };
    finish(&s, &r, "w", retry).await;
    let sc = claim(&s, run, "s", "w", LONG).await;
    finish(&s, &sc, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    assert!(p.create_compensator("undo_s", "s").await.expect("create_compensator"));
    p.commit().await.expect("commit");

    let mut p = pass(&s, run).await;
    let mut cancelled = p.cancel_waiting().await.expect("cancel_waiting");
    cancelled.sort();
    assert_eq!(cancelled, ["a", "b", "r"]);
    p.commit().await.expect("commit");
    for (key, transition) in [("a", "cancel_ready"), ("b", "cancel_pending"), ("r", "cancel_retrying")] {
        let t = view(&s, run, key).await;
        assert_eq!(
            (t.state, t.cancel_reason),
            (TaskRunState::Cancelled, Some(CancelReason::User))
        );
        assert!(t.finished_at.is_some() && t.retry_at.is_none());
        assert_eq!(
            transitions(&events_of(&s, run, key).await).last().copied(),
            Some(transition)
        );
    }
    assert_eq!(view(&s, run, "x").await.state, TaskRunState::Running);
    assert_eq!(view(&s, run, "s").await.state, TaskRunState::Succeeded);
    assert_eq!(
        view(&s, run, "undo_s").await.state,
        TaskRunState::Ready,
        "a cancel does not interrupt a rollback"
    );
}

/// `tally` counts forward rows by state (cancellations by reason, whether
/// anything started); `succeeded_keys` lists the succeeded forward rows.
pub async fn tally_and_succeeded_keys_count_forward_tasks<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let doc = json!({"name": "counts", "version": 1, "tasks": [
        {"key": "ok", "task_type": "noop"},
        {"key": "bad", "task_type": "noop"},
        {"key": "run", "task_type": "noop"},
        {"key": "again", "task_type": "flaky", "retry": {"max_attempts": 2}},
        {"key": "wait", "task_type": "noop"},
        {"key": "p1", "task_type": "noop", "depends_on": ["wait"]},
        {"key": "p2", "task_type": "noop", "depends_on": ["wait"]},
        {"key": "p3", "task_type": "noop", "depends_on": ["wait"]},
        {"key": "undo_ok", "task_type": "undo", "compensate_for": "ok"}
    ]});
    let run = start(&s, doc).await;
    let mut p = pass(&s, run).await;
    let empty = p.tally().await.expect("tally");
    assert_eq!((empty.ready, empty.pending, empty.any_started), (5, 3, false));
    drop(p);

    let ok = claim(&s, run, "ok", "w", LONG).await;
    finish(&s, &ok, "w", succeeded(json!({}))).await;
    let bad = claim(&s, run, "bad", "w", LONG).await;
    let fail = TaskOutcome::Failed {
        error: "no".into(),
        retry_in: None,
    };
    finish(&s, &bad, "w", fail).await;
    claim(&s, run, "run", "w", LONG).await;
    let again = claim(&s, run, "again", "w", LONG).await;
    let retry = TaskOutcome::Failed {
        error: "later".into(),
        retry_in: Some(Duration::from_secs(3_600)),
    };
    finish(&s, &again, "w", retry).await;
    let mut p = pass(&s, run).await;
    p.cancel_pending(&["p1".into()], CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    p.cancel_pending(&["p2".into()], CancelReason::User)
        .await
        .expect("cancel_pending");
    assert!(p.create_compensator("undo_ok", "ok").await.expect("create"));
    let tally = p.tally().await.expect("tally");
    let expected = TaskTally {
        pending: 1,
        ready: 1,
        running: 1,
        retrying: 1,
        succeeded: 1,
        failed: 1,
        cancelled_by_user: 1,
        cancelled_upstream: 1,
        any_started: true,
    };
    assert_eq!(tally, expected, "the compensator is not a forward task");
    assert_eq!(
        p.succeeded_keys().await.expect("succeeded_keys"),
        BTreeSet::from(["ok".to_owned()])
    );
}

/// A compensator row is created ready with its dispatch, once; it carries
/// the task it undoes into its claim and inputs.
pub async fn compensators_are_created_once_and_dispatched<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"made": "x"}))).await;
    let mut p = pass(&s, run).await;
    assert!(p.compensator_states().await.expect("states").is_empty());
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    assert!(
        !p.create_compensator("undo_a", "a").await.expect("create again"),
        "idempotent"
    );
    assert_eq!(
        p.compensator_states().await.expect("states"),
        [("undo_a".to_owned(), TaskRunState::Ready)]
    );
    assert!(p.succeeded_keys().await.expect("succeeded").contains("a"));
    p.commit().await.expect("commit");

    let undo = view(&s, run, "undo_a").await;
    assert_eq!(undo.compensate_for.as_deref(), Some("a"));
    let d = dispatches_of(&s, run, "undo_a").await;
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].task_type.as_str(), d[0].fencing_token), ("undo", undo.token));
    let c = claim(&s, run, "undo_a", "w", LONG).await;
    assert_eq!(c.compensate_for.as_deref(), Some("a"));
    let inputs = s.task_inputs(run, &["a".into()]).await.expect("inputs");
    assert_eq!(inputs.outputs.get("a"), Some(&json!({"made": "x"})));
    finish(&s, &c, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(
        flagged
            .iter()
            .any(|t| t.key == "undo_a" && t.compensate_for.as_deref() == Some("a"))
    );
    assert_eq!(
        p.compensator_states().await.expect("states"),
        [("undo_a".to_owned(), TaskRunState::Succeeded)]
    );
}

/// docs/design/cancellation.md#rollbacks-are-not-interrupted: a cancel that
/// arrives during a rollback does not interrupt it. A compensator of a
/// cancel-requested run still claims, its heartbeat does not ask it to stop,
/// and its expired lease re-dispatches it instead of cancelling it.
pub async fn a_cancel_request_does_not_stop_a_rollback<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let mut def = chain();
    def["tasks"][3]["retry"] = json!({"max_attempts": 2});
    let run = start(&s, def).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    p.commit().await.expect("commit");
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );

    let undo = claim(&s, run, "undo_a", "w1", Duration::from_secs(10)).await;
    assert_eq!(
        s.renew_lease(undo.task_run_id, undo.token, Duration::from_secs(10))
            .await
            .expect("renew"),
        LeaseStatus::Held {
            cancel_requested: false
        },
        "a compensator is not told to stop"
    );
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::Run(run), 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert!(!reaped[0].cancelled, "a compensator's lease is reaped, not cancelled");
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLease);
    let again = view(&s, run, "undo_a").await;
    assert_eq!(again.state, TaskRunState::Ready);
    assert!(again.token > undo.token);
    assert!(
        dispatches_of(&s, run, "undo_a")
            .await
            .iter()
            .any(|d| d.fencing_token == again.token),
        "re-dispatched at the new token"
    );
    let redo = claim(&s, run, "undo_a", "w2", LONG).await;
    finish(&s, &redo, "w2", succeeded(json!({"undone": true}))).await;
    assert_eq!(view(&s, run, "undo_a").await.state, TaskRunState::Succeeded);
}

/// `activity` agrees with `tally`: anything pending, ready, running or
/// retrying among the forward tasks keeps the run moving; compensators do
/// not count; `any_started` follows the first claim.
pub async fn activity_says_whether_forward_tasks_still_move<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, single("one", 1)).await;
    let mut p = pass(&s, run).await;
    let first = p.activity().await.expect("activity");
    assert!(first.any_active && !first.any_started, "{first:?}");
    p.commit().await.expect("commit");

    let c = claim(&s, run, "t", "w", LONG).await;
    let mut p = pass(&s, run).await;
    let running = p.activity().await.expect("activity");
    assert!(running.any_active && running.any_started, "{running:?}");
    p.commit().await.expect("commit");

    finish(&s, &c, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    let done = p.activity().await.expect("activity");
    let tally = p.tally().await.expect("tally");
    assert!(!done.any_active && done.any_started, "{done:?}");
    assert_eq!(tally.active(), 0);
    assert_eq!(tally.succeeded, 1);
    p.commit().await.expect("commit");

    // A ready compensator is not forward work: the rollback does not keep
    // the run's forward tasks "moving".
    let run = start(&s, chain()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let mut cancelled = p
        .cancel_pending(&["b".to_owned(), "c".to_owned()], CancelReason::User)
        .await
        .expect("cancel_pending");
    cancelled.sort();
    assert_eq!(cancelled, ["b", "c"]);
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    let rolling_back = p.activity().await.expect("activity");
    assert!(!rolling_back.any_active && rolling_back.any_started, "{rolling_back:?}");
    assert_eq!(p.tally().await.expect("tally").active(), 0);
    p.commit().await.expect("commit");
}

/// `transition_run` applies WorkflowRun edges legal from the stored state,
/// refuses illegal ones, records history, sets the timestamps; a terminal
/// run gets no more passes.
pub async fn run_transitions_follow_the_workflow_run_machine<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, chain()).await;
    let run = s.start_run(p.id, json!({})).await.expect("start");
    let notifier = s.notifier().await.expect("notifier");
    let mut pass1 = pass(&s, run).await;
    assert_eq!(pass1.run().state, RunState::Pending);
    assert_eq!(pass1.run().workflow_id, p.id);
    assert!(
        pass1.transition_run(RunTransition::Succeed).await.is_err(),
        "pending cannot succeed"
    );
    assert_eq!(pass1.run().state, RunState::Pending);
    assert!(pass1.transition_run(RunTransition::Start).await.expect("start"));
    assert_eq!(pass1.run().state, RunState::Running);
    assert!(
        pass1.transition_run(RunTransition::Start).await.is_err(),
        "running cannot start"
    );
    pass1.commit().await.expect("commit");
    let summary = s.get_run(run).await.expect("get_run").expect("exists").summary;
    assert_eq!(summary.state, RunState::Running);
    assert!(summary.started_at.is_some() && summary.finished_at.is_none());

    let mut pass2 = pass(&s, run).await;
    assert_eq!(pass2.run().state, RunState::Running);
    assert!(pass2.transition_run(RunTransition::Fail).await.expect("fail"));
    pass2.commit().await.expect("commit");
    assert!(
        woke(&notifier, Topic::RunSettled).await,
        "a terminal run wakes its waiters"
    );
    let detail = s.get_run(run).await.expect("get_run").expect("exists");
    assert_eq!(detail.summary.state, RunState::Failed);
    assert!(detail.summary.finished_at.is_some());
    let run_events: Vec<(&str, Option<&str>, Option<&str>)> = detail
        .events
        .iter()
        .filter(|e| e.task.is_none())
        .map(|e| (e.transition.as_str(), e.from.as_deref(), e.to.as_deref()))
        .collect();
    assert_eq!(
        run_events,
        [
            ("start", Some("pending"), Some("running")),
            ("fail", Some("running"), Some("failed"))
        ]
    );
    assert!(
        s.begin_pass(run).await.expect("begin_pass").is_none(),
        "terminal runs get no pass"
    );

    let never = s.start_run(p.id, json!({})).await.expect("start");
    let mut pass3 = pass(&s, never).await;
    assert!(
        pass3
            .transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel")
    );
    pass3.commit().await.expect("commit");
    let summary = s.get_run(never).await.expect("get_run").expect("exists").summary;
    assert_eq!(summary.state, RunState::Cancelled);
    assert!(summary.started_at.is_none() && summary.finished_at.is_some());
}

/// While one pass holds a run, another `begin_pass` on it is `None`; an
/// unknown run is `None` too.
pub async fn begin_pass_skips_a_run_already_held<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    assert!(
        s.begin_pass(RunId(uuid::Uuid::nil()))
            .await
            .expect("begin_pass")
            .is_none()
    );
    let held = pass(&s, run).await;
    assert!(
        s.begin_pass(run).await.expect("begin_pass").is_none(),
        "the run is held"
    );
    drop(held);
    let again = s.begin_pass(run).await.expect("begin_pass");
    assert!(again.is_some(), "free again after the first pass ended");
}

/// Nothing a pass does is visible before commit; dropping it rolls back.
pub async fn a_pass_is_invisible_until_commit_and_rolls_back_on_drop<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    let before = s.get_run(run).await.expect("get_run").expect("exists");
    let mut p = pass(&s, run).await;
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    assert_eq!(
        p.satisfy_dependencies(&[("c".into(), 2)]).await.expect("satisfy"),
        ["c"]
    );
    assert_eq!(
        p.cancel_pending(&["d".into()], CancelReason::User)
            .await
            .expect("cancel"),
        ["d"]
    );
    assert_eq!(
        s.get_run(run).await.expect("get_run").expect("exists"),
        before,
        "uncommitted changes are invisible"
    );
    drop(p);
    assert_eq!(
        s.get_run(run).await.expect("get_run").expect("exists"),
        before,
        "rolled back"
    );
    assert_eq!(unpublished(&s, Scope::Run(run)).await.len(), 2, "no dispatch was kept");

    let mut p = pass(&s, run).await;
    p.satisfy_dependencies(&[("c".into(), 2)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    assert_eq!(view(&s, run, "c").await.state, TaskRunState::Ready);
}

/// Writes wake the loops that wait for them, and a wake-up sent while
/// nobody waits is kept for the next wait.
pub async fn writes_wake_the_loops_that_wait_for_them<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let notifier = s.notifier().await.expect("notifier");
    let second = s.notifier().await.expect("notifier");
    let run = start(&s, chain()).await;
    assert!(woke(&notifier, Topic::Publisher).await, "start_run wakes the publisher");

    let c = claim(&s, run, "a", "w", LONG).await;
    assert!(
        woke(&notifier, Topic::Scheduler).await,
        "a first start wakes the scheduler"
    );
    drain_flags(&s, run).await;
    finish(&s, &c, "w", succeeded(json!({}))).await;
    assert!(woke(&notifier, Topic::Scheduler).await, "a finish wakes the scheduler");

    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    assert_eq!(
        p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy"),
        ["b"]
    );
    p.commit().await.expect("commit");
    assert!(
        woke(&notifier, Topic::Publisher).await,
        "a pass's dispatch wakes the publisher"
    );

    let mut p = pass(&s, run).await;
    p.cancel_waiting().await.expect("cancel_waiting");
    assert!(p.transition_run(RunTransition::Cancel).await.expect("cancel"));
    p.commit().await.expect("commit");
    // Both waiters see the settle, though neither was waiting when it happened.
    assert!(woke(&notifier, Topic::RunSettled).await, "a settle wakes every waiter");
    assert!(woke(&second, Topic::RunSettled).await, "a settle wakes every waiter");
}

// ---------------------------------------------------------------------------
// The outbox
// ---------------------------------------------------------------------------

/// A sweep holds unpublished rows oldest first, bounded by its limit and
/// scope; committed marks publish them, an uncommitted sweep leaves them.
pub async fn outbox_sweeps_oldest_first_within_limit_and_scope<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert!(s.begin_sweep(Scope::All, 10).await.expect("sweep").is_none());
    let p = publish(&s, diamond()).await;
    let first = s.start_run(p.id, json!({})).await.expect("start");
    let second = s.start_run(p.id, json!({})).await.expect("start");

    let sweep = s.begin_sweep(Scope::All, 3).await.expect("sweep").expect("rows");
    let held: Vec<Dispatch> = sweep.dispatches().to_vec();
    assert_eq!(held.len(), 3, "the limit bounds a sweep");
    assert!(
        held.windows(2).all(|w| w[0].dispatch_id < w[1].dispatch_id),
        "oldest first"
    );
    assert_eq!(held[0].run_id, first);
    drop(sweep);

    let only = unpublished(&s, Scope::Run(second)).await;
    assert_eq!(only.len(), 2);
    assert!(only.iter().all(|d| d.run_id == second));
    let set = RunSet::default();
    assert!(unpublished(&s, Scope::Runs(set.clone())).await.is_empty());
    set.insert(second);
    assert_eq!(
        unpublished(&s, Scope::Runs(set)).await,
        only,
        "a run set scopes a sweep"
    );

    // Uncommitted marks are lost.
    let mut sweep = s.begin_sweep(Scope::All, 10).await.expect("sweep").expect("rows");
    let ids: Vec<_> = sweep.dispatches().iter().map(|d| d.dispatch_id).collect();
    sweep.mark_published(&ids).await.expect("mark");
    drop(sweep);
    assert_eq!(unpublished(&s, Scope::All).await.len(), 4, "still unpublished");

    let mut sweep = s.begin_sweep(Scope::All, 2).await.expect("sweep").expect("rows");
    let ids: Vec<_> = sweep.dispatches().iter().map(|d| d.dispatch_id).collect();
    sweep.mark_published(&ids).await.expect("mark");
    sweep.commit().await.expect("commit");
    let rest = unpublished(&s, Scope::All).await;
    assert_eq!(rest.len(), 2);
    assert!(
        rest.iter().all(|d| !ids.contains(&d.dispatch_id)),
        "published rows are gone"
    );

    // Only the marked rows are published.
    let mut sweep = s.begin_sweep(Scope::All, 10).await.expect("sweep").expect("rows");
    let one = sweep.dispatches()[0].dispatch_id;
    sweep.mark_published(&[one]).await.expect("mark");
    sweep.commit().await.expect("commit");
    let left = unpublished(&s, Scope::All).await;
    assert_eq!(left.len(), 1);
    assert_ne!(left[0].dispatch_id, one);
}

/// Two sweeps open at once never hold the same row.
pub async fn concurrent_sweeps_never_share_a_row<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    for _ in 0..3 {
        s.start_run(p.id, json!({})).await.expect("start");
    }
    assert_eq!(unpublished(&s, Scope::All).await.len(), 6);

    let opened = Arc::new(Barrier::new(2));
    let compared = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (s, opened, compared) = (s.clone(), opened.clone(), compared.clone());
            tokio::spawn(async move {
                opened.wait().await;
                let sweep = s.begin_sweep(Scope::All, 3).await.expect("sweep");
                let ids: Vec<_> = sweep
                    .as_ref()
                    .map(|sw| sw.dispatches().iter().map(|d| d.dispatch_id).collect())
                    .unwrap_or_default();
                // Both sweeps stay open until both have chosen their rows.
                compared.wait().await;
                drop(sweep);
                ids
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for h in handles {
        let ids = h.await.expect("sweeper task");
        assert!(!ids.is_empty(), "each sweep finds rows the other does not hold");
        total += ids.len();
        seen.extend(ids);
    }
    assert_eq!(seen.len(), total, "no row was handed to both sweeps");
}

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

/// `get_run` returns the run, its task runs in creation order and its
/// merged history; `list_runs` the newest runs first.
pub async fn get_run_and_list_runs_report_runs<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    assert!(s.get_run(RunId(uuid::Uuid::nil())).await.expect("get_run").is_none());
    assert!(s.list_runs(10).await.expect("list_runs").is_empty());
    let p = publish(&s, chain()).await;
    let older = s.start_run(p.id, json!({"i": 1})).await.expect("start");
    clock.advance(Duration::from_secs(1));
    let newer = s.start_run(p.id, json!({"i": 2})).await.expect("start");
    let listed: Vec<RunId> = s.list_runs(10).await.expect("list_runs").iter().map(|r| r.id).collect();
    assert_eq!(listed, [newer, older], "newest first");
    let top = s.list_runs(1).await.expect("list_runs");
    assert_eq!(top.len(), 1);
    assert_eq!(
        (top[0].id, top[0].workflow.as_str(), top[0].version),
        (newer, "chain", 1)
    );
    assert_eq!(top[0].state, RunState::Pending);

    let a = claim(&s, older, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"out": 1}))).await;
    let mut ps = pass(&s, older).await;
    ps.take_flagged().await.expect("take_flagged");
    ps.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    assert!(ps.create_compensator("undo_a", "a").await.expect("create"));
    // At one instant task events precede the run transition they led to.
    assert!(ps.transition_run(RunTransition::Start).await.expect("start"));
    ps.commit().await.expect("commit");

    let d = s.get_run(older).await.expect("get_run").expect("exists");
    assert_eq!(d.input, json!({"i": 1}));
    assert_eq!(d.summary.state, RunState::Running);
    let keys: Vec<&str> = d.tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c", "undo_a"], "creation order");
    let history: Vec<(Option<&str>, &str)> = d
        .events
        .iter()
        .map(|e| (e.task.as_deref(), e.transition.as_str()))
        .collect();
    assert_eq!(
        history,
        [
            (Some("a"), "claim"),
            (Some("a"), "succeed"),
            (Some("b"), "dependencies_satisfied"),
            (None, "start")
        ]
    );
    let start = &d.events[3];
    assert_eq!((start.attempt, start.token, start.worker.as_ref()), (None, None, None));
    assert!(d.events.windows(2).all(|w| w[0].at <= w[1].at), "oldest first");
}

/// `task_inputs` reads the run input and the outputs of the named tasks
/// that succeeded.
pub async fn task_inputs_read_the_run_input_and_outputs<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    let run = s.start_run(p.id, json!({"day": 3})).await.expect("start");
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"from": "a"}))).await;
    let b = claim(&s, run, "b", "w", LONG).await;
    finish(&s, &b, "w", succeeded(json!(["b", 2]))).await;
    let inputs = s
        .task_inputs(run, &["a".into(), "b".into(), "d".into()])
        .await
        .expect("task_inputs");
    assert_eq!(inputs.run_input, json!({"day": 3}));
    assert_eq!(inputs.outputs.len(), 2, "d has no output");
    assert_eq!(inputs.outputs.get("a"), Some(&json!({"from": "a"})));
    assert_eq!(inputs.outputs.get("b"), Some(&json!(["b", 2])));
    let none = s.task_inputs(run, &[]).await.expect("task_inputs");
    assert!(none.outputs.is_empty());
    assert_eq!(none.run_input, json!({"day": 3}));
}

/// Workers register, refresh and deregister; live task types are those of
/// workers seen recently (store time) and not stopped.
pub async fn worker_registry_tracks_workers_and_live_task_types<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    assert!(s.list_workers().await.expect("list_workers").is_empty());
    let w1 = WorkerRegistration {
        id: worker("host-1-aaaa"),
        host: "host-1".into(),
        pid: 101,
        task_types: vec!["noop".into(), "echo".into()],
        concurrency: 4,
    };
    let w2 = WorkerRegistration {
        id: worker("host-2-bbbb"),
        host: "host-2".into(),
        pid: 202,
        task_types: vec!["command".into()],
        concurrency: 1,
    };
    s.register_worker(&w1).await.expect("register");
    s.register_worker(&w2).await.expect("register");
    let listed = s.list_workers().await.expect("list_workers");
    assert_eq!(listed.len(), 2);
    let info = listed.iter().find(|w| w.id == w1.id).expect("w1");
    let mut types = info.task_types.clone();
    types.sort();
    assert_eq!(types, ["echo", "noop"]);
    assert_eq!((info.host.as_str(), info.pid, info.concurrency), ("host-1", 101, 4));
    assert!(info.stopped_at.is_none());
    assert_store_time(info.started_at, clock.offset());
    let first_start = info.started_at;
    let minute = Duration::from_secs(60);
    assert_eq!(
        s.live_task_types(minute).await.expect("live"),
        BTreeSet::from(["command".into(), "echo".into(), "noop".into()])
    );

    clock.advance(Duration::from_secs(120));
    s.touch_worker(&w1.id).await.expect("touch");
    let listed = s.list_workers().await.expect("list_workers");
    assert_eq!(listed[0].id, w1.id, "most recently seen first");
    assert!(listed[0].last_seen_at > listed[1].last_seen_at);
    assert_eq!(
        s.live_task_types(minute).await.expect("live"),
        BTreeSet::from(["echo".into(), "noop".into()]),
        "w2 was not seen within the window"
    );

    s.deregister_worker(&w1.id).await.expect("deregister");
    let info = s.list_workers().await.expect("list_workers");
    let info = info.iter().find(|w| w.id == w1.id).expect("w1");
    assert!(info.stopped_at.is_some());
    assert!(
        s.live_task_types(minute).await.expect("live").is_empty(),
        "a stopped worker serves nothing"
    );

    s.register_worker(&w1).await.expect("register again");
    let info = s.list_workers().await.expect("list_workers");
    let info = info.iter().find(|w| w.id == w1.id).expect("w1");
    assert!(info.stopped_at.is_none(), "registering again revives it");
    assert_eq!(info.started_at, first_start, "started_at is the first registration");
}

/// Every transition of a run's life is in its history with the right
/// from, to and attempt, tokens rising with each claim, run transitions
/// among them.
pub async fn the_event_history_records_every_transition<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let doc = json!({"name": "life", "version": 1, "tasks": [
        {"key": "a", "task_type": "flaky", "retry": {"max_attempts": 2}},
        {"key": "b", "task_type": "noop", "depends_on": ["a"]}
    ]});
    let run = start(&s, doc).await;
    let first = claim(&s, run, "a", "w1", LONG).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(RunTransition::Start).await.expect("start");
    p.commit().await.expect("commit");
    let retry = TaskOutcome::Failed {
        error: "flake".into(),
        retry_in: Some(Duration::from_secs(5)),
    };
    finish(&s, &first, "w1", retry).await;
    clock.advance(Duration::from_secs(6));
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.promote_due_retries().await.expect("promote");
    p.commit().await.expect("commit");
    let second = claim(&s, run, "a", "w2", LONG).await;
    finish(&s, &second, "w2", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    let b = claim(&s, run, "b", "w1", LONG).await;
    finish(&s, &b, "w1", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(RunTransition::Succeed).await.expect("succeed");
    p.commit().await.expect("commit");

    let history = events(&s, run).await;
    let got: Vec<Step<'_>> = history
        .iter()
        .map(|e| {
            (
                e.task.as_deref(),
                e.transition.as_str(),
                e.from.as_deref(),
                e.to.as_deref(),
                e.attempt,
            )
        })
        .collect();
    let a = Some("a");
    let b_ = Some("b");
    assert_eq!(
        got,
        [
            (a, "claim", Some("ready"), Some("running"), Some(1)),
            (None, "start", Some("pending"), Some("running"), None),
            (a, "fail", Some("running"), Some("failed"), Some(1)),
            (a, "schedule_retry", Some("failed"), Some("retrying"), Some(2)),
            (a, "retry_ready", Some("retrying"), Some("ready"), Some(2)),
            (a, "claim", Some("ready"), Some("running"), Some(2)),
            (a, "succeed", Some("running"), Some("succeeded"), Some(2)),
            (b_, "dependencies_satisfied", Some("pending"), Some("ready"), Some(1)),
            (b_, "claim", Some("ready"), Some("running"), Some(1)),
            (b_, "succeed", Some("running"), Some("succeeded"), Some(1)),
            (None, "succeed", Some("running"), Some("succeeded"), None),
        ]
    );
    let workers: Vec<Option<&str>> = history
        .iter()
        .filter(|e| e.transition == "claim")
        .map(|e| e.worker.as_deref())
        .collect();
    assert_eq!(workers, [Some("w1"), Some("w2"), Some("w1")]);
    let a_tokens: Vec<i64> = history
        .iter()
        .filter(|e| e.task.as_deref() == Some("a"))
        .map(|e| e.token.expect("a token"))
        .collect();
    assert!(
        a_tokens.windows(2).all(|w| w[0] <= w[1]),
        "tokens never go back: {a_tokens:?}"
    );
    assert!(second.token > first.token, "each claim bumps the token");
    assert_eq!((a_tokens[0], a_tokens[5]), (first.token, second.token));
    assert!(history.windows(2).all(|w| w[0].at <= w[1].at));
}

/// Wide runs are written in batches: starting 10 000 ready tasks, cancelling
/// them in one pass, and promoting a 9 999-task fan-out in one pass each
/// take a bounded time, not one round trip per row.
pub async fn wide_runs_are_written_in_batches<F: StoreFactory>(factory: &F) {
    const WIDE: usize = 10_000;
    // Batched, each phase takes a few hundred milliseconds even in a debug
    // build; the bound leaves room for a slow CI machine, while a plan that
    // revisits the batch per row (quadratic: about a minute here) fails it.
    const BOUND: Duration = Duration::from_secs(5);
    let (s, _) = fresh(factory).await;

    let roots: Vec<Value> = (0..WIDE)
        .map(|i| json!({"key": format!("t{i:05}"), "task_type": "noop"}))
        .collect();
    let p = publish(&s, json!({"name": "wide", "version": 1, "tasks": roots})).await;
    let started = std::time::Instant::now();
    let run = s.start_run(p.id, json!({})).await.expect("start_run");
    assert!(
        started.elapsed() < BOUND,
        "start_run of {WIDE} tasks took {:?}",
        started.elapsed()
    );
    assert_eq!(
        unpublished(&s, Scope::Run(run)).await.len(),
        WIDE,
        "one dispatch per root"
    );
    assert!(s.request_cancel(run).await.expect("cancel").is_some());
    let started = std::time::Instant::now();
    let mut ps = pass(&s, run).await;
    assert_eq!(ps.cancel_waiting().await.expect("cancel_waiting").len(), WIDE);
    ps.commit().await.expect("commit");
    assert!(
        started.elapsed() < BOUND,
        "cancelling {WIDE} tasks took {:?}",
        started.elapsed()
    );

    let mut fan = vec![json!({"key": "root", "task_type": "noop"})];
    fan.extend((1..WIDE).map(|i| json!({"key": format!("f{i:05}"), "task_type": "noop", "depends_on": ["root"]})));
    let p = publish(&s, json!({"name": "fan", "version": 1, "tasks": fan})).await;
    let run = s.start_run(p.id, json!({})).await.expect("start_run");
    let root = claim(&s, run, "root", "w", LONG).await;
    finish(&s, &root, "w", succeeded(json!({}))).await;
    let done: Vec<(String, u32)> = (1..WIDE).map(|i| (format!("f{i:05}"), 1)).collect();
    let started = std::time::Instant::now();
    let mut ps = pass(&s, run).await;
    ps.take_flagged().await.expect("take_flagged");
    let promoted = ps.satisfy_dependencies(&done).await.expect("satisfy");
    ps.commit().await.expect("commit");
    let took = started.elapsed();
    assert_eq!(promoted.len(), WIDE - 1);
    assert!(took < BOUND, "promoting {} tasks took {took:?}", WIDE - 1);
    let dispatched = unpublished(&s, Scope::Run(run)).await;
    assert_eq!(dispatched.len(), WIDE, "the root's dispatch and one per promoted task");
    let history = events(&s, run).await;
    assert_eq!(
        history
            .iter()
            .filter(|e| e.transition == "dependencies_satisfied")
            .count(),
        WIDE - 1
    );
}
