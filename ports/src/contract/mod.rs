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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::{TaskRunState, WorkflowDefinition, WorkflowDocument};
use serde_json::{Value, json};

use crate::clock::ManualClock;
use crate::ids::{DispatchId, RunId, WorkerId};
use crate::queue::Dispatch;
use crate::store::{
    Claim, DEFAULT_PRIORITY_AGING, EventView, FinishResult, Notifier, OutboxSweep, Published, RunPass, Scope, Store,
    TaskOutcome, TaskRunView, Topic,
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
            a_stale_finish_promotes_nothing,
            fencing_rejects_a_worker_whose_lease_was_reaped,
            an_expired_lease_not_yet_reaped_still_finishes_and_the_reaper_then_spares_it,
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
            lost_dispatches_are_rearmed_within_their_scope,
            get_run_and_list_runs_report_runs,
            task_inputs_read_the_run_input_and_outputs,
            worker_registry_tracks_workers_and_live_task_types,
            the_event_history_records_every_transition,
            every_store_writes_the_same_event_rows,
            a_reap_in_a_cancelled_run_writes_the_same_rows,
            unknown_ids_are_answered_alike,
            wide_runs_are_written_in_batches,
            start_run_refuses_an_input_holding_nul,
            an_unstorable_outcome_is_stored_as_the_domain_says,
            task_inputs_past_their_limit_are_refused,
            stale_write_audits_are_capped_per_task_run,
            random_operation_sequences_match_the_model,
            event_seq_numbers_a_runs_history_without_gaps,
            run_events_pages_after_a_sequence_number,
            keyed_starts_replay_the_first_run,
            concurrent_keyed_starts_start_one_run,
            run_pages_filter_by_state_workflow_and_time,
            run_pages_walk_every_earlier_run_once,
            list_definitions_by_name_then_newest_version,
            tokens_are_created_found_expired_and_revoked,
            concurrent_token_creates_with_one_name_make_one,
            gauges_count_active_work_and_the_store_is_ready,
            claim_ready_takes_ready_rows_of_the_asked_types,
            claim_ready_skips_forward_tasks_of_cancel_requested_runs,
            pollers_and_consumers_claim_each_row_once,
            progress_is_fenced_and_cleared_by_the_next_claim,
            a_resumed_run_opens_its_next_generation,
            a_reset_task_is_fenced_and_counts_attempts_per_generation,
            a_stale_retry_plan_applies_nothing,
            concurrent_retries_open_one_generation,
            a_later_rollback_reruns_the_compensators_of_its_generation,
            a_sweep_serves_the_highest_priority_first_and_fifo_within_one,
            a_task_keeps_its_own_priority_over_its_runs,
            a_poll_claims_in_dispatch_order,
            gates_hold_back_what_they_guard_until_a_slot_is_free,
            a_task_gate_is_due_once_only_it_holds_the_task_back,
            racing_passes_never_hold_more_slots_than_the_pool_has,
            the_strategies_cancel_the_newest_or_the_oldest_holder_with_their_reason,
            a_retried_run_waits_at_its_gates_again,
            waiting_work_ages_ahead_of_later_urgent_work,
            a_conditional_task_waits_on_a_hold_and_comes_back_as_written,
            skips_and_condition_failures_flag_what_they_move,
            racing_fires_record_a_fire_time_once,
            overlap_is_decided_under_the_lock_and_a_buffered_fire_starts_later,
            missed_times_pauses_and_resumes_move_the_cursor_as_told,
            a_backfill_starts_each_fire_time_once,
            a_mapped_task_expands_once_into_children_of_its_type,
            a_mapped_task_collects_in_index_order_within_the_limit_or_fails,
            a_success_hands_on_what_it_alone_held_back,
            a_stale_or_failed_finish_hands_on_nothing,
            finish_and_claim_writes_what_the_two_calls_write,
            a_handoff_leaves_what_else_holds_back_to_the_pass,
            a_join_is_counted_once_by_the_success_or_by_the_pass,
            held_dispatches_are_swept_once_their_hold_is_over,
            settling_held_dispatches_marks_or_releases_them,
            pushed_dispatches_are_committed_published_and_rearmed_when_lost,
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

mod api;
mod claims;
mod concurrency;
mod conditions;
mod definitions;
mod finishing;
mod generic;
mod handoff;
mod history;
mod limits;
mod map;
mod model;
mod outbox;
mod pass;
mod polling;
mod priority;
mod queries;
mod reads;
mod reaper;
mod retry;
mod schedules;

pub use api::*;
pub use claims::*;
pub use concurrency::*;
pub use conditions::*;
pub use definitions::*;
pub use finishing::*;
pub use generic::*;
pub use handoff::*;
pub use history::*;
pub use limits::*;
pub use map::*;
pub use model::*;
pub use outbox::*;
pub use pass::*;
pub use polling::*;
pub use priority::*;
pub use queries::*;
pub use reads::*;
pub use reaper::*;
pub use retry::*;
pub use schedules::*;

pub(super) fn definition(v: Value) -> WorkflowDefinition {
    let doc: WorkflowDocument = serde_json::from_value(v).expect("a well-formed test document");
    WorkflowDefinition::from_document(doc).expect("a valid test definition")
}

pub(super) fn worker(name: &str) -> WorkerId {
    WorkerId(name.to_owned())
}

/// a → b → c, plus a compensator for a.
pub(super) fn chain() -> Value {
    json!({"name": "chain", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "echo", "depends_on": ["a"]},
        {"key": "c", "task_type": "noop", "depends_on": ["b"]},
        {"key": "undo_a", "task_type": "undo", "compensate_for": "a"}
    ]})
}

/// a, b → c → d, plus a compensator for a.
pub(super) fn diamond() -> Value {
    json!({"name": "diamond", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "echo"},
        {"key": "c", "task_type": "noop", "depends_on": ["a", "b"]},
        {"key": "d", "task_type": "noop", "depends_on": ["c"]},
        {"key": "undo_a", "task_type": "undo", "compensate_for": "a"}
    ]})
}

/// One root task `t` allowing `attempts` attempts.
pub(super) fn single(name: &str, attempts: u32) -> Value {
    json!({"name": name, "version": 1, "tasks": [
        {"key": "t", "task_type": "flaky", "retry": {"max_attempts": attempts, "delay_seconds": 10}}
    ]})
}

pub(super) async fn fresh<F: StoreFactory>(factory: &F) -> (F::Store, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    (factory.create(clock.clone()).await, clock)
}

pub(super) async fn publish<S: Store>(s: &S, v: Value) -> Published {
    s.publish_definition(&definition(v)).await.expect("publish")
}

pub(super) async fn start<S: Store>(s: &S, v: Value) -> RunId {
    let p = publish(s, v).await;
    s.start_run(p.id, json!({"n": 1})).await.expect("start_run")
}

pub(super) async fn tasks<S: Store>(s: &S, run: RunId) -> Vec<TaskRunView> {
    s.get_run(run).await.expect("get_run").expect("the run exists").tasks
}

pub(super) async fn view<S: Store>(s: &S, run: RunId, key: &str) -> TaskRunView {
    tasks(s, run)
        .await
        .into_iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no task run '{key}'"))
}

/// Task `a` of `run`: claimed by `w1` (the run starts), failed with "flake"
/// and a 5 s retry, then made ready again 6 s later. Returns the first
/// attempt's claim.
pub(super) async fn first_attempt_flakes<S: Store>(s: &S, clock: &ManualClock, run: RunId) -> Claim {
    let first = claim(s, run, "a", "w1", LONG).await;
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(flowforge_domain::RunTransition::Start)
        .await
        .expect("start");
    p.commit().await.expect("commit");
    let retry = crate::store::TaskOutcome::Failed {
        error: "flake".into(),
        retry_in: Some(Duration::from_secs(5)),
    };
    finish(s, &first, "w1", retry).await;
    clock.advance(Duration::from_secs(6));
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.promote_due_retries().await.expect("promote");
    p.commit().await.expect("commit");
    first
}

pub(super) async fn events<S: Store>(s: &S, run: RunId) -> Vec<EventView> {
    s.get_run(run).await.expect("get_run").expect("the run exists").events
}

pub(super) async fn events_of<S: Store>(s: &S, run: RunId, key: &str) -> Vec<EventView> {
    events(s, run)
        .await
        .into_iter()
        .filter(|e| e.task.as_deref() == Some(key))
        .collect()
}

/// One history entry as (task, transition, from, to, attempt).
type Step<'a> = (Option<&'a str>, &'a str, Option<&'a str>, Option<&'a str>, Option<u32>);

pub(super) fn transitions(events: &[EventView]) -> Vec<&str> {
    events.iter().map(|e| e.transition.as_str()).collect()
}

/// The unpublished dispatches in scope, read through a sweep that is then
/// dropped (so they stay unpublished).
pub(super) async fn unpublished<S: Store>(s: &S, scope: Scope) -> Vec<Dispatch> {
    match s
        .begin_sweep(scope, 100_000, DEFAULT_PRIORITY_AGING)
        .await
        .expect("begin_sweep")
    {
        Some(sweep) => sweep.dispatches().to_vec(),
        None => Vec::new(),
    }
}

/// Publishes the first `limit` unpublished rows in dispatch order (an
/// outbox sweep committed as if a queue took them all); returns their ids.
pub(super) async fn sweep_published<S: Store>(s: &S, limit: u32) -> Vec<DispatchId> {
    let mut sweep = s
        .begin_sweep(Scope::All, limit, DEFAULT_PRIORITY_AGING)
        .await
        .expect("sweep")
        .expect("rows");
    let ids: Vec<_> = sweep.dispatches().iter().map(|d| d.dispatch_id).collect();
    sweep.mark_published(&ids).await.expect("mark");
    sweep.commit().await.expect("commit");
    ids
}

pub(super) async fn dispatches_of<S: Store>(s: &S, run: RunId, key: &str) -> Vec<Dispatch> {
    unpublished(s, Scope::Run(run))
        .await
        .into_iter()
        .filter(|d| d.task_key == key)
        .collect()
}

/// Claims a ready task run at its current token (its dispatch's token).
pub(super) async fn claim<S: Store>(s: &S, run: RunId, key: &str, by: &str, lease: Duration) -> Claim {
    let v = view(s, run, key).await;
    assert_eq!(v.state, TaskRunState::Ready, "'{key}' must be ready to claim");
    s.claim_task_run(v.id, v.token, &worker(by), lease)
        .await
        .expect("claim_task_run")
        .unwrap_or_else(|| panic!("the claim of '{key}' must win"))
}

pub(super) async fn finish<S: Store>(s: &S, c: &Claim, by: &str, outcome: TaskOutcome) -> FinishResult {
    s.finish_task_run(c.task_run_id, c.token, &worker(by), outcome)
        .await
        .expect("finish_task_run")
}

pub(super) fn succeeded(output: Value) -> TaskOutcome {
    TaskOutcome::Succeeded { output }
}

/// A failure with no retry left.
pub(super) fn failed_for_good(error: &str) -> TaskOutcome {
    TaskOutcome::Failed {
        error: error.to_owned(),
        retry_in: None,
    }
}

pub(super) async fn pass<S: Store>(s: &S, run: RunId) -> S::Pass {
    s.begin_pass(run).await.expect("begin_pass").expect("the run is free")
}

/// Clears every flag of the run, so a case observes only what follows.
pub(super) async fn drain_flags<S: Store>(s: &S, run: RunId) {
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.commit().await.expect("commit");
}

/// Whether `topic` fires within [`WAKE`].
pub(super) async fn woke<N: Notifier>(n: &N, topic: Topic) -> bool {
    tokio::time::timeout(WAKE, n.notified(topic)).await.is_ok()
}

pub(super) fn millis(a: DateTime<Utc>, b: DateTime<Utc>) -> i64 {
    (a - b).num_milliseconds()
}

/// Asserts `at` is store time: wall time shifted by the clock's offset.
pub(super) fn assert_store_time(at: DateTime<Utc>, offset: chrono::TimeDelta) {
    // The wall clock through std: ports builds chrono without its `clock` feature.
    let expected = DateTime::<Utc>::from(std::time::SystemTime::now()) + offset;
    let drift = (at - expected).num_seconds().abs();
    assert!(
        drift < 120,
        "{at} is not store time (wall + {offset}): off by {drift} s"
    );
}

pub(super) fn near(actual_ms: i64, expected_ms: i64, what: &str) {
    assert!(
        (actual_ms - expected_ms).abs() <= 2_000,
        "{what}: expected about {expected_ms} ms, got {actual_ms} ms"
    );
}
