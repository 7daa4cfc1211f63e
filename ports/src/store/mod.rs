//! The store ports: definitions, runs and task runs, the outbox, workers,
//! schedules and wake-ups. Written so that SQLite and PostgreSQL implement them alike.
//!
//! Every task-run transition is ONE conditional UPDATE decided by the database,
//! with its event row written in the same transaction only when the UPDATE
//! matched (docs/design/state-machines.md#event-history). All lease, retry and
//! reaper arithmetic uses store time: the database's clock plus the
//! [`Clock`](crate::Clock) offset
//! (docs/design/leases-and-fencing.md#store-time); no method takes a wall-clock
//! argument.

mod error;
mod schedules;
mod tokens;
mod values;

pub use error::{
    Error, KnownMigration, LoadError, PublishError, TransitionError, check_migrations, resolve_generic_transition,
};
pub use schedules::{Fire, FireCounts, FireStart, FireView, Fired, NewSchedule, ScheduleStore, ScheduleView};
pub use tokens::{NewToken, TokenError, TokenStatus, TokenStore, TokenView};
pub use values::{
    Activity, CancelOutcome, Claim, DefinitionSummary, DependencyOutcomes, EventView, FinishCall, FinishResult,
    Finished, GateCheck, Gauges, Handover, IdempotencyKey, KeyedStart, LeaseStatus, LockedRun, NewRun, NextClaim,
    PassTask, Published, Reaped, RunCursor, RunDetail, RunQuery, RunSet, RunSummary, Scope, StartOptions, TaskInputs,
    TaskOutcome, TaskRunView, Wait, WorkerInfo, WorkerRegistration, mark_blocked,
};

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use flowforge_domain::concurrency::Gate;
use flowforge_domain::derive::TaskTally;
use flowforge_domain::plan::Handoff;
use flowforge_domain::retry::Reset;
use flowforge_domain::{
    CancelReason, RunState, RunTransition, SkipReason, TaskRunState, TaskTransition, WorkflowDefinition,
};
use serde_json::Value;

use crate::ids::{DispatchId, RunId, TaskRunId, WorkerId, WorkflowId};
use crate::queue::Dispatch;

/// How long ready work waits to gain one priority level, by default
/// (docs/design/priorities.md#aging).
pub const DEFAULT_PRIORITY_AGING: Duration =
    Duration::from_micros(flowforge_domain::priority::DEFAULT_AGING_MICROS.unsigned_abs());

/// What a loop waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// A task finished, a run started or a cancel was requested.
    Scheduler,
    /// An outbox row appeared.
    Publisher,
    /// A run reached a terminal state.
    RunSettled,
}

/// Wake-ups sent by the store's writes (in process: a notify handle; on
/// PostgreSQL: LISTEN/NOTIFY).
pub trait Notifier: Send + Sync + 'static {
    /// Resolves at the next notification on `topic`. Notifications coalesce,
    /// and one sent while nobody waits is kept for the next waiter, so a
    /// loop that checks for work and then waits never misses one.
    fn notified(&self, topic: Topic) -> impl Future<Output = ()> + Send;
}

/// Publishing and loading definitions (docs/design/definitions.md#publishing).
pub trait DefinitionStore: Send + Sync + 'static {
    /// Publishes atomically (workflow and tasks together or not at all).
    ///
    /// Contract: identical content under an existing (name, version)
    /// returns the stored row with `created = false`; different content
    /// MUST return [`PublishError::Conflict`] with both fingerprints. Two
    /// concurrent first publishes end with one definition: the loser gets
    /// the winner's row, a `Conflict`, or [`PublishError::LostRace`] —
    /// never a deadlock and never a mixture.
    fn publish_definition(
        &self,
        def: &WorkflowDefinition,
    ) -> impl Future<Output = Result<Published, PublishError>> + Send;

    /// Loads a definition, re-validating the stored rows on the way out.
    ///
    /// Contract: rows that no longer form a valid definition (a manual
    /// edit, a lost task) MUST give [`LoadError::Invalid`] naming the
    /// problem; the result's fingerprint equals the published one.
    fn load_definition(&self, id: WorkflowId) -> impl Future<Output = Result<Published, LoadError>> + Send;

    /// Looks a definition up by (name, version), re-validating it.
    fn find_definition(
        &self,
        name: &str,
        version: u32,
    ) -> impl Future<Output = Result<Option<Published>, LoadError>> + Send;

    /// The published definitions without their tasks: every one, or the
    /// versions of `name`; ordered by name, then version, highest first
    /// (so the first of a name is its latest).
    fn list_definitions(
        &self,
        name: Option<&str>,
    ) -> impl Future<Output = Result<Vec<DefinitionSummary>, Error>> + Send;
}

/// Runs and task runs: the transition protocol
/// (docs/design/state-machines.md#transition-protocol).
pub trait RunStore: Send + Sync + 'static {
    /// The per-run scheduler transaction.
    type Pass: RunPass;
    /// The store's wake-up source.
    type Notifier: Notifier;

    /// Creates a pending run of a published definition with one task run per
    /// forward task (state from `initial_task_run_state`; compensators are not
    /// materialised) and, in the same transaction, one outbox row per task run
    /// created ready
    /// (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness). Wakes
    /// the publisher.
    ///
    /// Contract: an input holding U+0000 MUST be refused with
    /// [`Error::Refused`] naming where, before anything is written (sizes
    /// are the caller's policy, checked before this call).
    fn start_run(&self, workflow: WorkflowId, input: Value) -> impl Future<Output = Result<RunId, Error>> + Send {
        async move {
            self.start_run_with(workflow, input, &StartOptions::default())
                .await
                .map(|run| run.id)
        }
    }

    /// Starts a run as [`RunStore::start_run`] does, with `options`:
    ///
    /// - each task run takes its task's priority when the definition gives
    ///   one, else `options.priority`, and its dispatches carry it
    ///   (docs/design/priorities.md);
    /// - each gate is written as a wait, and what it holds back stays
    ///   pending, counting the gate as one more dependency: a run gate
    ///   holds back the tasks without dependencies, a task gate its task
    ///   (docs/design/concurrency.md#gates). A run with gates is flagged
    ///   for a pass, whose scheduler tries them.
    ///
    /// Returns the run with its creation time as stored, so a caller
    /// answering with both needs no second read.
    fn start_run_with(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
    ) -> impl Future<Output = Result<NewRun, Error>> + Send;

    /// Requests cancellation (docs/design/cancellation.md#cancel-requests):
    /// records the request and wakes the scheduler, which cancels what it can.
    /// A claim never succeeds for a cancel-requested run. `Ok(None)`: no such
    /// run.
    fn request_cancel(&self, run: RunId) -> impl Future<Output = Result<Option<CancelOutcome>, Error>> + Send;

    /// Opens the next generation of a finished run (docs/design/retry.md),
    /// in one transaction: the run takes `resume` from `state` — a
    /// conditional UPDATE on its state and `generation`, so of two
    /// concurrent retries exactly one wins — and each task of `resets`
    /// takes `reset` from its planned state (token + 1, attempt + 1, its
    /// event, a dispatch when it is ready). `gates` (from
    /// `retry::hold_at_gates`, which counted them in the resets) become
    /// the run's waits again, already `tried` so its strategy does not act
    /// a second time, and flag the run for the pass that admits it
    /// (docs/design/concurrency.md#retries); a limit's `cancel_reason` is
    /// cleared. Returns the new generation, or `None`, with nothing
    /// written, when the run or one of the tasks is no longer as planned.
    fn resume_run(
        &self,
        run: RunId,
        state: RunState,
        generation: u32,
        resets: &[Reset],
        gates: &[Gate],
    ) -> impl Future<Output = Result<Option<u32>, Error>> + Send;

    /// Claims a ready task run for a dispatch: `ready → running` WHERE `state =
    /// 'ready' AND fencing_token = token` and, for a forward task, the run is
    /// not cancel-requested (a compensator still claims: a cancel does not
    /// interrupt a rollback,
    /// docs/design/cancellation.md#rollbacks-are-not-interrupted); bumps the
    /// token, sets the lease to store now + `lease`, `started_at =
    /// COALESCE(started_at, now)`.
    ///
    /// Contract: `Ok(None)` when the row is not ready at that token (a
    /// duplicate or stale dispatch, or a lost race): the caller acks
    /// without running. Exactly one of N concurrent claimers wins.
    fn claim_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        lease: Duration,
    ) -> impl Future<Output = Result<Option<Claim>, Error>> + Send;

    /// Claims up to `max` ready task runs whose task type is one of
    /// `task_types`, for a worker that polls instead of consuming
    /// dispatches (docs/design/handlers.md#remote-workers), in dispatch
    /// order as [`OutboxStore::begin_sweep`] takes them: by
    /// [`order_key`](flowforge_domain::priority::order_key) of the
    /// readiness (the outbox row at the token the row is ready at) and its
    /// priority, with one level gained per `aging` of waiting, then by
    /// readiness (docs/design/priorities.md).
    /// Each row is the same `claim` edge as [`RunStore::claim_task_run`] —
    /// token + 1, lease, event, a cancel-requested run's forward tasks
    /// refused — at the token the row holds, so a dispatch of that row
    /// delivered meanwhile finds it claimed and is acked without running.
    ///
    /// Contract: a row is claimed by at most one caller, whether the others
    /// poll or consume dispatches; concurrent callers skip each other's
    /// rows instead of waiting on them.
    fn claim_ready(
        &self,
        task_types: &[String],
        worker: &WorkerId,
        lease: Duration,
        max: u32,
        aging: Duration,
    ) -> impl Future<Output = Result<Vec<Claim>, Error>> + Send;

    /// Whether the task run is still ready at `token`, i.e. whether a
    /// dispatch carrying that token could still be claimed. A worker that
    /// does not serve a dispatch's type asks before returning it to the
    /// queue: one that a polling worker claimed meanwhile is dropped
    /// instead of circling forever.
    fn dispatch_is_current(&self, id: TaskRunId, token: i64) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Stores the attempt's progress (a small JSON value shown with the
    /// task, replaced by each report and cleared by the next claim) and
    /// renews the lease as [`RunStore::renew_lease`] does, if `token` still
    /// holds it.
    ///
    /// Contract: a token that no longer holds the lease changes nothing
    /// and returns [`LeaseStatus::Lost`]; a value holding U+0000 is
    /// refused with [`Error::Refused`].
    fn report_progress(
        &self,
        id: TaskRunId,
        token: i64,
        progress: &Value,
        lease: Duration,
    ) -> impl Future<Output = Result<LeaseStatus, Error>> + Send;

    /// Reads what an attempt needs: the run input and the outputs of the
    /// task's dependencies (for a compensator: of the task it undoes).
    ///
    /// Contract: when the outputs of `keys` add up to more than `limit`
    /// bytes (of their compact JSON text), MUST return [`Error::Refused`]
    /// with [`Refusal::TooLarge`](flowforge_domain::limits::Refusal) of
    /// kind `TaskInputs`, having measured them without reading them into
    /// memory (docs/design/data-flow.md#limits).
    fn task_inputs(
        &self,
        run: RunId,
        keys: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<TaskInputs, Error>> + Send;

    /// Extends the lease to store now + `lease` if `token` still holds it.
    /// `cancel_requested` is reported for forward tasks only: a running
    /// compensator finishes its rollback step.
    fn renew_lease(
        &self,
        id: TaskRunId,
        token: i64,
        lease: Duration,
    ) -> impl Future<Output = Result<LeaseStatus, Error>> + Send;

    /// Applies a lease-spending edge with the fencing token: `succeed`,
    /// `fail` (plus `schedule_retry` when `retry_in` is set, in the same
    /// transaction) or `cancel_running`. Clears the lease; wakes the
    /// scheduler.
    ///
    /// Contract: the outcome is stored as [`TaskOutcome::storable`] makes
    /// it (an output holding U+0000 is stored as a permanent failure). A
    /// token that no longer matches changes nothing and returns
    /// [`FinishResult::Stale`] after writing a `stale_write_rejected` audit
    /// event with the presented token — at most
    /// [`MAX_STALE_AUDITS_PER_TASK_RUN`](flowforge_domain::limits::MAX_STALE_AUDITS_PER_TASK_RUN)
    /// of them per task run; past that the write is still refused, only
    /// not recorded.
    fn finish_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
    ) -> impl Future<Output = Result<FinishResult, Error>> + Send {
        const NOTHING: &Handoff = &Handoff {
            dependents: Vec::new(),
            joins: Vec::new(),
            whole: false,
        };
        async move {
            self.finish_and_hand_off(id, token, worker, outcome, NOTHING, Handover::Sweep)
                .await
                .map(|finished| finished.result)
        }
    }

    /// [`RunStore::finish_task_run`] that hands a success on in its own
    /// transaction (docs/design/scheduler.md#handoff): each of
    /// `handoff.dependents` still pending at a counter of one, in a run
    /// not cancel-requested, takes `dependencies_satisfied` with its event
    /// (after the success's) and its outbox row, and the publisher is
    /// woken. A store may also lower by one the counter of each of
    /// `handoff.joins` still pending, in a run not cancel-requested, when
    /// that and the dependents' promotion are all a pass would do
    /// (`handoff.whole`, every dependent moved, every join is still
    /// pending and the success is not flagged already), and then makes ready
    /// with the same event and outbox row a join that reaches zero
    /// (docs/design/scheduler.md#joins); a store that leaves the joins to
    /// the pass flags the success. When `handoff.whole` and every named
    /// task moved, the success is not flagged for a pass, which would find
    /// nothing to do.
    ///
    /// `handover` says who publishes the dispatches
    /// (docs/design/outbox-and-queues.md#publish-after-commit). With
    /// [`Handover::Held`], their outbox rows are held from the sweep that
    /// long of store time, returned in [`Finished::held`] with whether
    /// other rows wait for the sweep ([`Finished::queued`]), and the
    /// publisher is not woken; the caller then settles them with
    /// [`OutboxStore::settle_held`]. A caller that dies first loses
    /// nothing: once the hold is over, the sweep publishes them. With
    /// [`Handover::Pushed`], the rows are committed published and returned
    /// in [`Finished::held`], and the publisher is not woken.
    ///
    /// Contract: only a recorded success hands on; a stale or duplicate
    /// finish, a failure or a cancel promotes nothing. The rows and events
    /// written equal those of the pass's promotion.
    fn finish_and_hand_off(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
        handoff: &Handoff,
        handover: Handover,
    ) -> impl Future<Output = Result<Finished, Error>> + Send;

    /// [`RunStore::finish_and_hand_off`], then [`RunStore::claim_task_run`]
    /// of `next` for the same worker: a worker slot that already holds its
    /// next delivery when its attempt ends stores the outcome and takes
    /// the next task in one call
    /// (docs/design/leases-and-fencing.md#finish-and-claim-next). A store
    /// may run both in one transaction; the default runs them one after
    /// the other.
    ///
    /// Contract: the rows and events written, and what each answers, equal
    /// those of the two calls in that order; the claim is made whatever the
    /// finish's fate (a stale finish does not refuse it). `Err` means the
    /// finish is not known to be stored and the claim was not made as far
    /// as the caller can tell: it retries the finish alone and claims
    /// `next` the usual way (should the lost answer have been a commit, that
    /// claim finds the row running and the reaper takes its lease back).
    fn finish_and_claim(
        &self,
        finish: FinishCall<'_>,
        next: NextClaim,
    ) -> impl Future<Output = Result<(Finished, Result<Option<Claim>, Error>), Error>> + Send {
        finish_then_claim(self, finish, next)
    }

    /// The generic path for edges without a lease or side data:
    /// `dependencies_satisfied` and `retry_ready` (each writes its outbox
    /// row), `cancel_pending`, `cancel_ready`, `cancel_retrying` (reason
    /// `user`).
    ///
    /// Contract (docs/design/state-machines.md#caller-contract): an edge not in
    /// the machine → [`TransitionError::Illegal`] before any I/O; a
    /// lease-requiring edge → [`TransitionError::LeaseRequired`]; `claim`, the
    /// reaper's edges and `schedule_retry` → [`TransitionError::Reserved`]
    /// naming their operation; a legal edge that another writer beat →
    /// `Ok(false)`.
    fn transition_task_run(
        &self,
        id: TaskRunId,
        from: TaskRunState,
        to: TaskRunState,
    ) -> impl Future<Output = Result<bool, TransitionError>> + Send;

    /// Takes back expired leases
    /// (docs/design/leases-and-fencing.md#the-reaper): for each running row
    /// with `lease_expires_at < store now`, one conditional UPDATE that bumps
    /// the token — `reap_lease` (attempt + 1, outbox row) when attempts remain,
    /// else `reap_lease_final`; for a forward task of a cancel-requested run
    /// (final attempt or not), `reap_lease` then `cancel_ready` in one
    /// transaction with no dispatch (a compensator is re-dispatched: the
    /// rollback goes on). A row a worker has just finished is never touched.
    fn reap_expired_leases(&self, scope: Scope, limit: u32) -> impl Future<Output = Result<Vec<Reaped>, Error>> + Send;

    /// Runs that need a scheduler pass: a flagged task run, a due retry, or
    /// an unhandled cancel request. Cost follows active work, not history.
    fn runs_with_work(&self, scope: Scope, limit: u32) -> impl Future<Output = Result<Vec<RunId>, Error>> + Send;

    /// How long until the earliest `retry_at` or `lease_expires_at` in scope
    /// (zero if already past), so the scheduler can sleep exactly that long.
    fn next_deadline(&self, scope: Scope) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;

    /// Opens the scheduler transaction of one run, locking the run (on
    /// PostgreSQL `FOR NO KEY UPDATE SKIP LOCKED`). `Ok(None)`: another scheduler
    /// holds it, or it is terminal.
    fn begin_pass(&self, run: RunId) -> impl Future<Output = Result<Option<Self::Pass>, Error>> + Send;

    /// The run with its task runs and history.
    fn get_run(&self, run: RunId) -> impl Future<Output = Result<Option<RunDetail>, Error>> + Send;

    /// The most recent runs, newest first.
    fn list_runs(&self, limit: u32) -> impl Future<Output = Result<Vec<RunSummary>, Error>> + Send;

    /// Starts a run as [`RunStore::start_run`] does, unless a run was
    /// already started under `key.key`.
    ///
    /// Contract: the key is unique in the store and recorded in the
    /// run's own transaction, so of two concurrent calls with one key
    /// exactly one starts a run (the other waits for it on the unique
    /// constraint, never on a lock held across calls) and gets
    /// [`KeyedStart::Replayed`] when `key.request_hash` matches the
    /// first call's, else [`KeyedStart::Reused`]; both name the first
    /// run.
    fn start_run_keyed(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<KeyedStart, Error>> + Send;

    /// One page of runs, newest first (by `created_at`, then id, both
    /// descending), filtered as `query` says: each filter's values are
    /// alternatives (OR), filters combine with AND.
    ///
    /// Contract: the page holds the first `query.limit` runs strictly
    /// after `query.after` in that order, so walking pages by the last
    /// row's [`RunCursor`] sees every run that existed when the walk
    /// began exactly once, whatever is started meanwhile.
    fn list_runs_page(&self, query: &RunQuery) -> impl Future<Output = Result<Vec<RunSummary>, Error>> + Send;

    /// One run's summary without its task runs or history.
    fn run_summary(&self, run: RunId) -> impl Future<Output = Result<Option<RunSummary>, Error>> + Send;

    /// The run's events with a sequence number above `after`, ascending,
    /// at most `limit` (docs/design/state-machines.md#event-history).
    ///
    /// Contract: every event of a run (its own and its task runs',
    /// audits included) carries `seq` = the run's previous highest + 1,
    /// assigned in the transaction that writes it, so the numbers are
    /// 1, 2, 3, … in commit order with no gap: a reader that has seen
    /// every `seq ≤ n` and asks for `after = n` misses nothing and
    /// repeats nothing.
    fn run_events(
        &self,
        run: RunId,
        after: u64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<EventView>, Error>> + Send;

    /// What the gauges read from the store: counts of active work.
    fn gauges(&self) -> impl Future<Output = Result<Gauges, Error>> + Send;

    /// Whether the store is reachable and its schema is this binary's:
    /// `Err(Error::Unavailable)` or `Err(Error::Migration)` otherwise.
    fn ready(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// The store's wake-up source (on PostgreSQL this opens a listening
    /// connection).
    fn notifier(&self) -> impl Future<Output = Result<Self::Notifier, Error>> + Send;
}

/// What [`RunPass::collect_map`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collect {
    /// The mapped task succeeded with its children's outputs.
    Collected,
    /// Every child succeeded, but their outputs take this many bytes, more
    /// than the limit: nothing moved.
    TooLarge(u64),
    /// Not every child has succeeded, or the task is no longer pending.
    NotReady,
}

/// One run's scheduler transaction (docs/design/scheduler.md#the-pass). Every
/// method runs inside the transaction; nothing is visible to others until
/// [`RunPass::commit`]; dropping the pass rolls it back. Each change is a
/// conditional UPDATE with its event row, so a row another writer changed
/// meanwhile is simply skipped (and reported as not changed).
pub trait RunPass: Send + 'static {
    /// The locked run.
    fn run(&self) -> &LockedRun;

    /// Clears and returns the flags of task runs whose change the scheduler
    /// has not reacted to yet: finished forward tasks and compensators, and
    /// first claims while the run was pending. Read and cleared in one
    /// statement, so a change made after it re-flags the row.
    fn take_flagged(&mut self) -> impl Future<Output = Result<Vec<PassTask>, Error>> + Send;

    /// For each `(key, n)`, lowers the pending row's count of unsatisfied
    /// dependencies by `n`; then applies `dependencies_satisfied` to every
    /// pending forward row whose count is zero, with one outbox row each.
    /// Returns the keys made ready.
    fn satisfy_dependencies(
        &mut self,
        done: &[(String, u32)],
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Applies `skip` with `reason` to those of `keys` still pending, and
    /// flags each, so that [`RunPass::take_flagged`] in this very pass
    /// returns it and the pass reacts to it in turn. Returns the keys
    /// skipped.
    fn skip_pending(
        &mut self,
        keys: &[String],
        reason: SkipReason,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Applies `edge` (`fail_condition` or `fail_map`, the edges from
    /// pending to failed) to `key` if it is still pending, storing `error`
    /// and flagging it like [`RunPass::skip_pending`]. Returns whether it
    /// moved.
    fn fail_pending(
        &mut self,
        key: &str,
        edge: TaskTransition,
        error: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Expands the mapped task `key`, pending on its hold alone and not
    /// expanded yet, into `size` children `key[0]` … `key[size - 1]`
    /// (docs/design/map.md#expanding): each a pending forward row on one
    /// hold, naming `key` and its index, at the run's generation and the
    /// mapped task's priority. The mapped task records its size, so it is
    /// never decided again, and keeps its hold, so no promotion ever makes
    /// it ready: `collect` or `fail_map` ends it. Returns whether it
    /// expanded; the pass then releases the first children with
    /// [`RunPass::satisfy_dependencies`].
    fn expand_map(&mut self, key: &str, size: u32) -> impl Future<Output = Result<bool, Error>> + Send;

    /// How the children of the mapped task `key` stand, with at most
    /// `waiting` of the held-back ones, lowest index first.
    fn map_children(
        &mut self,
        key: &str,
        waiting: u32,
    ) -> impl Future<Output = Result<flowforge_domain::map::Children, Error>> + Send;

    /// Cancels `upstream_failed` the children of the mapped task `key`
    /// still waiting (pending, ready or retrying), each by its own edge,
    /// once the mapped task failed (docs/design/map.md#collecting). Returns
    /// their keys; running children finish on their own.
    fn cancel_children(&mut self, key: &str) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Applies `collect` to the expanded mapped task `key` if it is still
    /// pending, every child succeeded and their outputs, as one array in
    /// index order, take at most `limit` bytes of compact JSON: that array
    /// is its output. Flags it like [`RunPass::skip_pending`]. Measures the
    /// outputs without reading them into memory.
    fn collect_map(&mut self, key: &str, limit: usize) -> impl Future<Output = Result<Collect, Error>> + Send;

    /// The pending forward rows among `keys`, with their counts of
    /// unsatisfied dependencies; a mapped task once expanded is left out
    /// (it is decided).
    fn pending_counts(&mut self, keys: &[String]) -> impl Future<Output = Result<Vec<(String, u32)>, Error>> + Send;

    /// The run's input and the state and output of each forward row among
    /// `keys`, as of now in the transaction.
    fn dependency_outcomes(
        &mut self,
        keys: &[String],
    ) -> impl Future<Output = Result<DependencyOutcomes, Error>> + Send;

    /// Applies `retry_ready` (with an outbox row) to every retrying row
    /// whose `retry_at ≤ store now`. Returns their keys.
    fn promote_due_retries(&mut self) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Applies `cancel_pending` with `reason` to those of `keys` still
    /// pending. Returns the keys cancelled.
    fn cancel_pending(
        &mut self,
        keys: &[String],
        reason: CancelReason,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Applies `cancel_pending`, `cancel_ready` and `cancel_retrying`
    /// (reason `user`) to every forward row in those states. Returns the
    /// keys cancelled.
    fn cancel_waiting(&mut self) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Counts the forward task runs by state, as of now in the transaction.
    fn tally(&mut self) -> impl Future<Output = Result<TaskTally, Error>> + Send;

    /// Whether any forward task run is still active (pending, ready,
    /// running or retrying) and whether any task run has started, as of now
    /// in the transaction. A pass asks this first and counts with
    /// [`RunPass::tally`] only once nothing is active, so a pass over a wide
    /// run costs index lookups, not a scan of its rows: answer it without
    /// counting.
    fn activity(&mut self) -> impl Future<Output = Result<Activity, Error>> + Send;

    /// Keys of the succeeded forward task runs.
    fn succeeded_keys(&mut self) -> impl Future<Output = Result<BTreeSet<String>, Error>> + Send;

    /// The compensator rows created so far: `(key, state)`.
    fn compensator_states(&mut self) -> impl Future<Output = Result<Vec<(String, TaskRunState)>, Error>> + Send;

    /// Creates the compensator row `key` (undoing `compensate_for`) as
    /// ready, with its outbox row. Creating one that exists is a no-op
    /// returning `false`.
    fn create_compensator(
        &mut self,
        key: &str,
        compensate_for: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The gates this run waits at that are due
    /// (docs/design/concurrency.md#gates): the run's own while it has not
    /// passed them, and a task's once only its gate is left (its
    /// dependencies all succeeded). Run gates first, then by task.
    fn waits(&mut self) -> impl Future<Output = Result<Vec<Wait>, Error>> + Send;

    /// Passes every gate of one holder (`task`, or the run itself when
    /// `None`) at once or none: takes a slot of each pool, lowest free
    /// number below the pool's size, and removes the waits. The slots'
    /// primary key keeps any pool within its size whatever races; a slot
    /// lost to a concurrent holder is looked for again while the pool
    /// has room. On [`GateCheck::Passed`] the caller lowers the held-back
    /// tasks' counts as for a satisfied dependency.
    fn pass_gates(&mut self, task: Option<&str>) -> impl Future<Output = Result<GateCheck, Error>> + Send;

    /// Records that the run met a full pool at its own gates, so its
    /// strategy acts once.
    fn mark_gates_tried(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// For `cancel_in_progress`: requests the cancel of the run holding a
    /// slot of `scope` for longest whose cancel has not been requested,
    /// with reason `concurrency_limit` (its rollback then runs), and
    /// returns it. The commit wakes the schedulers.
    fn cancel_oldest_holder(&mut self, scope: &str) -> impl Future<Output = Result<Option<RunId>, Error>> + Send;

    /// For `cancel_newest`: records this run's cancel request with reason
    /// `concurrency_limit`; the pass then cancels what waits, as for a
    /// user's request.
    fn cancel_for_limit(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Lets go of the slots held by this run's tasks that have finished
    /// (succeeded, failed for good, cancelled) and, when `settled`, of
    /// every slot and wait of the run. Returns how many slots were let
    /// go; when any were, the commit wakes the schedulers, whose runs
    /// may be waiting for them.
    fn release_slots(&mut self, settled: bool) -> impl Future<Output = Result<usize, Error>> + Send;

    /// Applies a WorkflowRun edge, conditional on the run's stored state,
    /// recording it in the run's history. Illegal edges are refused before
    /// any SQL.
    fn transition_run(&mut self, edge: RunTransition) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Commits; then wakes the publisher if outbox rows were written and
    /// the waiters of a settled run.
    fn commit(self) -> impl Future<Output = Result<(), Error>> + Send;
}

/// The transactional outbox
/// (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness).
pub trait OutboxStore: Send + Sync + 'static {
    /// A sweep transaction.
    type Sweep: OutboxSweep;

    /// Opens a transaction holding up to `limit` unpublished rows, locked so
    /// a concurrent sweeper skips them (`FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL). `Ok(None)` when there are none.
    ///
    /// Rows still held for their committer
    /// ([`RunStore::finish_and_hand_off`] with a hold) are left out.
    ///
    /// Contract: the rows are the first `limit` in dispatch order — by
    /// [`order_key`](flowforge_domain::priority::order_key) of their
    /// creation and priority with one level gained per `aging` of waiting,
    /// then by id — and come in that order
    /// (docs/design/priorities.md).
    fn begin_sweep(
        &self,
        scope: Scope,
        limit: u32,
        aging: Duration,
    ) -> impl Future<Output = Result<Option<Self::Sweep>, Error>> + Send;

    /// Marks unpublished again the rows of `scope`'s runs published at least
    /// `age` ago (store time) whose task run is still ready at the row's
    /// token, and returns how many: the dispatches a queue that does not
    /// outlive its process took with it (`age` zero, when the next process
    /// starts), or that a broker lost (docs/design/outbox-and-queues.md#lost-dispatches).
    /// Publishing such a row again is always safe: a dispatch whose task
    /// run was claimed meanwhile claims nothing. Wakes the publisher when
    /// it re-armed any.
    fn rearm_lost_dispatches(&self, scope: Scope, age: Duration) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Settles rows a committer held for itself
    /// ([`RunStore::finish_and_hand_off`] with a hold): marks `published`
    /// published and releases `released` to the sweep at once, waking the
    /// publisher when it released any
    /// (docs/design/outbox-and-queues.md#publish-after-commit). A row
    /// already published stays as it is; marking one the sweep took after
    /// its hold only records the publish twice.
    fn settle_held(
        &self,
        published: &[DispatchId],
        released: &[DispatchId],
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// How long, in store time, until the first row of `scope`'s runs held
    /// for its committer and not yet published is released to the sweep
    /// (zero when one already is); `None` when there is none. The publisher
    /// sleeps no longer than this, so a row whose committer died is
    /// published once its hold is over.
    fn held_for(&self, scope: Scope) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;
}

/// One outbox sweep. Dropping it without commit leaves every row unpublished.
pub trait OutboxSweep: Send + 'static {
    /// The rows held, in dispatch order.
    fn dispatches(&self) -> &[Dispatch];

    /// Marks these rows published (within the transaction).
    fn mark_published(&mut self, ids: &[DispatchId]) -> impl Future<Output = Result<(), Error>> + Send;

    /// Commits the marks.
    fn commit(self) -> impl Future<Output = Result<(), Error>> + Send;
}

/// Worker registrations (docs/design/handlers.md#worker-registry).
pub trait WorkerRegistry: Send + Sync + 'static {
    /// Records (or refreshes) a worker and the task types it serves.
    fn register_worker(&self, worker: &WorkerRegistration) -> impl Future<Output = Result<(), Error>> + Send;

    /// Refreshes `last_seen_at`.
    fn touch_worker(&self, id: &WorkerId) -> impl Future<Output = Result<(), Error>> + Send;

    /// Marks a worker stopped (graceful shutdown).
    fn deregister_worker(&self, id: &WorkerId) -> impl Future<Output = Result<(), Error>> + Send;

    /// Every registered worker, most recently seen first.
    fn list_workers(&self) -> impl Future<Output = Result<Vec<WorkerInfo>, Error>> + Send;

    /// Task types served by workers seen within `within` and not stopped.
    fn live_task_types(&self, within: Duration) -> impl Future<Output = Result<BTreeSet<String>, Error>> + Send;
}

/// Everything a FlowForge store provides.
pub trait Store:
    DefinitionStore + RunStore + OutboxStore + WorkerRegistry + TokenStore + ScheduleStore + Clone
{
}

/// [`RunStore::finish_and_claim`] as two calls, one after the other: its
/// default, for a store with no one-call form.
pub(crate) async fn finish_then_claim<S: RunStore + ?Sized>(
    store: &S,
    finish: FinishCall<'_>,
    next: NextClaim,
) -> Result<(Finished, Result<Option<Claim>, Error>), Error> {
    let finished = store
        .finish_and_hand_off(
            finish.id,
            finish.token,
            finish.worker,
            finish.outcome,
            finish.handoff,
            finish.handover,
        )
        .await?;
    let claimed = store
        .claim_task_run(next.id, next.token, finish.worker, next.lease)
        .await;
    Ok((finished, claimed))
}

impl<T: DefinitionStore + RunStore + OutboxStore + WorkerRegistry + TokenStore + ScheduleStore + Clone> Store for T {}
