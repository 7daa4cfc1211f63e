//! The store ports: definitions, runs and task runs, the outbox, workers and
//! wake-ups. Written so that SQLite and PostgreSQL implement them alike.
//!
//! Every task-run transition is ONE conditional UPDATE decided by the database,
//! with its event row written in the same transaction only when the UPDATE
//! matched (docs/design/state-machines.md#event-history). All lease, retry and
//! reaper arithmetic uses store time: the database's clock plus the
//! [`Clock`](crate::Clock) offset
//! (docs/design/leases-and-fencing.md#store-time); no method takes a wall-clock
//! argument.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::derive::TaskTally;
use flowforge_domain::{
    CancelReason, RunState, RunTransition, TaskRunState, TaskTransition, WorkflowDefinition, task_machine,
};
use serde_json::{Map, Value};

use crate::ids::{DispatchId, RunId, TaskRunId, WorkerId, WorkflowId};
use crate::queue::Dispatch;

/// A failure of the store itself (not of the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached, or the pool timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The schema is missing or behind this binary.
    #[error("store schema is missing or out of date ({0}); run `flowforge migrate --db …`")]
    Migration(String),
    /// Stored data breaks an invariant (a manual edit, a bug): named, never guessed around.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// Anything else the database reported.
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Whether a caller may retry later (a database that is down may come back).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Why a definition was not published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// (name, version) is taken by different content.
    #[error(
        "workflow '{name}' version {version} is already published with different content \
         (stored fingerprint {existing}, this file {new}); bump the version to publish a change"
    )]
    Conflict {
        /// Workflow name.
        name: String,
        /// Workflow version.
        version: u32,
        /// Fingerprint of the stored definition.
        existing: String,
        /// Fingerprint of the rejected one.
        new: String,
    },
    /// A concurrent first publish of the same (name, version) won the
    /// unique constraint while this one was inserting. Retrying returns the
    /// winner's row (or a `Conflict`).
    #[error("a concurrent publish of workflow '{name}' version {version} won; retry to read its result")]
    LostRace {
        /// Workflow name.
        name: String,
        /// Workflow version.
        version: u32,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a definition could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No such definition.
    #[error("workflow definition {0} not found")]
    NotFound(String),
    /// The stored rows no longer form a valid definition.
    #[error("stored workflow definition {workflow} is invalid: {problem}")]
    Invalid {
        /// Which definition.
        workflow: String,
        /// What re-validation found.
        problem: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a generic transition was refused before any SQL ran, or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// No edge of the TaskRun machine joins these states: a caller bug.
    #[error("illegal task run transition {from} -> {to}: not in the TaskRun machine")]
    Illegal {
        /// Claimed current state.
        from: TaskRunState,
        /// Requested state.
        to: TaskRunState,
    },
    /// The edge spends a lease: only the lease holder may take it.
    #[error("transition '{0}' requires the lease; use finish_task_run with the fencing token")]
    LeaseRequired(TaskTransition),
    /// The edge has its own operation, which writes what the edge needs.
    #[error("transition '{transition}' is not applied generically; use {operation}")]
    Reserved {
        /// The edge.
        transition: TaskTransition,
        /// The operation that applies it.
        operation: &'static str,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Resolves a generic `from → to` request against the TaskRun machine, before
/// any I/O: the caller contract
/// (docs/design/state-machines.md#caller-contract). Stores call this first in
/// `transition_task_run`; `Ok` carries the edge to apply.
pub fn resolve_generic_transition(from: TaskRunState, to: TaskRunState) -> Result<TaskTransition, TransitionError> {
    let mut edges = task_machine().edges_between(from, to).peekable();
    let Some(first) = edges.peek().map(|t| t.name) else {
        return Err(TransitionError::Illegal { from, to });
    };
    if task_machine().requires_lease(first) {
        return Err(TransitionError::LeaseRequired(first));
    }
    let operation = match first {
        TaskTransition::Claim => "claim_task_run",
        TaskTransition::ReapLease | TaskTransition::ReapLeaseFinal => "reap_expired_leases",
        TaskTransition::ScheduleRetry => "finish_task_run (a failure with attempts left)",
        _ => return Ok(first),
    };
    Err(TransitionError::Reserved {
        transition: first,
        operation,
    })
}

/// A published definition, as stored.
#[derive(Debug, Clone)]
pub struct Published {
    /// Its id.
    pub id: WorkflowId,
    /// The validated definition.
    pub definition: Arc<WorkflowDefinition>,
    /// Its fingerprint.
    pub fingerprint: String,
    /// When it was first published.
    pub created_at: DateTime<Utc>,
    /// Whether this call created it (false: it was already there, identical).
    pub created: bool,
}

/// Which runs a loop looks at: all of them (distributed processes), just
/// one, or the runs an embedded engine has in flight (`flowforge run` and
/// the embedding API drive only the runs they started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every run in the store.
    All,
    /// Only this run.
    Run(RunId),
    /// The runs in this set at the moment of each query; its owner adds and
    /// removes runs while the loops keep going.
    Runs(RunSet),
}

impl Scope {
    /// The runs a query is limited to, `None` for every run.
    pub fn run_ids(&self) -> Option<Vec<RunId>> {
        match self {
            Self::All => None,
            Self::Run(run) => Some(vec![*run]),
            Self::Runs(set) => Some(set.snapshot()),
        }
    }
}

/// A set of runs shared between its owner and the loops scoped to it.
/// Clones share the set; two sets are equal when they are the same set.
#[derive(Debug, Clone, Default)]
pub struct RunSet(Arc<RwLock<BTreeSet<RunId>>>);

impl RunSet {
    /// Adds `run`; true if it was not there.
    pub fn insert(&self, run: RunId) -> bool {
        self.0.write().unwrap_or_else(PoisonError::into_inner).insert(run)
    }

    /// Removes `run`; true if it was there.
    pub fn remove(&self, run: RunId) -> bool {
        self.0.write().unwrap_or_else(PoisonError::into_inner).remove(&run)
    }

    /// Whether no run is in the set.
    pub fn is_empty(&self) -> bool {
        self.0.read().unwrap_or_else(PoisonError::into_inner).is_empty()
    }

    /// The runs in the set now, in ascending order.
    pub fn snapshot(&self) -> Vec<RunId> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

impl PartialEq for RunSet {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RunSet {}

/// A won claim: what the worker needs to run the attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The task run.
    pub task_run_id: TaskRunId,
    /// Its run.
    pub run_id: RunId,
    /// The run's definition.
    pub workflow_id: WorkflowId,
    /// The task's key.
    pub task_key: String,
    /// The forward task it undoes, for a compensator.
    pub compensate_for: Option<String>,
    /// 1-based attempt being made.
    pub attempt: u32,
    /// The fencing token this attempt must present to finish.
    pub token: i64,
    /// When the lease runs out unless renewed (store time).
    pub lease_expires_at: DateTime<Utc>,
}

/// What a task's attempt reads: the run input and its dependencies' outputs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskInputs {
    /// The run's input.
    pub run_input: Value,
    /// Outputs by task key (dependencies; for a compensator, the task it undoes).
    pub outputs: Map<String, Value>,
}

/// How an attempt ended, as the worker reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// `succeed`, storing the output.
    Succeeded {
        /// The task's output.
        output: Value,
    },
    /// `fail`; with `retry_in`, also `schedule_retry` in the same transaction
    /// (docs/design/state-machines.md#attempts-and-retries), `retry_at = store
    /// now + retry_in`.
    Failed {
        /// What went wrong.
        error: String,
        /// The wait before the next attempt, when one is allowed.
        retry_in: Option<Duration>,
    },
    /// `cancel_running` (reason `user`): the worker stopped on a cancel request.
    Cancelled,
}

/// The result of presenting an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishResult {
    /// Stored; the row now rests in this state (`retrying` after a retry
    /// was scheduled).
    Recorded(TaskRunState),
    /// The token no longer matches (the lease was reaped and someone else
    /// claimed it, or the row finished): nothing changed except a
    /// `stale_write_rejected` audit event carrying the presented token.
    Stale,
}

/// The result of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStatus {
    /// The lease was extended. `cancel_requested`: the run is being
    /// cancelled, so the worker should stop and apply `cancel_running`.
    Held {
        /// Whether the run has a cancel request.
        cancel_requested: bool,
    },
    /// The token moved on: the lease is lost and the handler must stop.
    Lost,
}

/// One lease the reaper took back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// The task run.
    pub task_run_id: TaskRunId,
    /// Its run.
    pub run_id: RunId,
    /// Its key.
    pub task_key: String,
    /// `reap_lease` (back to ready, re-dispatched) or `reap_lease_final`
    /// (failed for good).
    pub transition: TaskTransition,
    /// Whether it was then cancelled because the run is cancel-requested.
    pub cancelled: bool,
    /// The attempt whose lease expired.
    pub attempt: u32,
    /// The fencing token that attempt held (now stale).
    pub token: i64,
}

/// The outcome of a cancel request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Recorded; the scheduler will cancel what it can
    /// (docs/design/cancellation.md#cancel-requests).
    Requested,
    /// A cancel was already requested.
    AlreadyRequested,
    /// The run is already in a terminal state.
    AlreadyFinished(RunState),
}

/// Whether a run's forward tasks are still moving; see [`RunPass::activity`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// A forward task run is pending, ready, running or retrying.
    pub any_active: bool,
    /// A task run of the run has started (`started_at` is set).
    pub any_started: bool,
}

/// A task run as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassTask {
    /// The task run.
    pub id: TaskRunId,
    /// Its key.
    pub key: String,
    /// Its state when read.
    pub state: TaskRunState,
    /// Its cancel reason (iff cancelled).
    pub cancel_reason: Option<CancelReason>,
    /// The forward task it undoes, for a compensator.
    pub compensate_for: Option<String>,
}

/// The run a pass holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassRun {
    /// The run.
    pub id: RunId,
    /// Its definition.
    pub workflow_id: WorkflowId,
    /// Its stored state.
    pub state: RunState,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
}

/// Summary of a run for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// The run.
    pub id: RunId,
    /// Its definition.
    pub workflow_id: WorkflowId,
    /// Workflow name.
    pub workflow: String,
    /// Workflow version.
    pub version: u32,
    /// Stored state.
    pub state: RunState,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Moved to running.
    pub started_at: Option<DateTime<Utc>>,
    /// Reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
}

/// One task run, for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRunView {
    /// The task run.
    pub id: TaskRunId,
    /// Its key.
    pub key: String,
    /// The forward task it undoes, for a compensator.
    pub compensate_for: Option<String>,
    /// Current state.
    pub state: TaskRunState,
    /// Current attempt.
    pub attempt: u32,
    /// Current fencing token.
    pub token: i64,
    /// Why it was cancelled.
    pub cancel_reason: Option<CancelReason>,
    /// Output, once succeeded.
    pub output: Option<Value>,
    /// Last error.
    pub error: Option<String>,
    /// First claim.
    pub started_at: Option<DateTime<Utc>>,
    /// Reached succeeded, failed or cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// When a retrying row becomes due.
    pub retry_at: Option<DateTime<Utc>>,
    /// The lease holder, while running.
    pub lease_owner: Option<String>,
    /// When its row was created.
    pub created_at: DateTime<Utc>,
}

/// One entry of the event history (a transition, or an audit event).
#[derive(Debug, Clone, PartialEq)]
pub struct EventView {
    /// The task's key (`None`: a run transition).
    pub task: Option<String>,
    /// The transition's name, or `stale_write_rejected`.
    pub transition: String,
    /// Source state (`None` for audit events).
    pub from: Option<String>,
    /// Target state (`None` for audit events).
    pub to: Option<String>,
    /// Attempt at the time.
    pub attempt: Option<u32>,
    /// Token after the transition (for audit: the token presented).
    pub token: Option<i64>,
    /// The worker involved.
    pub worker: Option<String>,
    /// When (store time).
    pub at: DateTime<Utc>,
    /// Error recorded with it.
    pub error: Option<String>,
}

/// A run with its task runs and history.
#[derive(Debug, Clone, PartialEq)]
pub struct RunDetail {
    /// The run.
    pub summary: RunSummary,
    /// The definition's fingerprint.
    pub fingerprint: String,
    /// The run input.
    pub input: Value,
    /// Every task run, in creation order.
    pub tasks: Vec<TaskRunView>,
    /// The history, oldest first.
    pub events: Vec<EventView>,
}

/// A worker's registration (docs/design/handlers.md#worker-registry).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    /// Its id.
    pub id: WorkerId,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Task types it serves.
    pub task_types: Vec<String>,
    /// Concurrency slots.
    pub concurrency: u32,
    /// First registration.
    pub started_at: DateTime<Utc>,
    /// Last heartbeat.
    pub last_seen_at: DateTime<Utc>,
    /// Set when it deregistered on a graceful stop.
    pub stopped_at: Option<DateTime<Utc>>,
}

/// What a worker registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRegistration {
    /// Its id.
    pub id: WorkerId,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Task types it serves.
    pub task_types: Vec<String>,
    /// Concurrency slots.
    pub concurrency: u32,
}

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
    fn start_run(&self, workflow: WorkflowId, input: Value) -> impl Future<Output = Result<RunId, StoreError>> + Send;

    /// Requests cancellation (docs/design/cancellation.md#cancel-requests):
    /// records the request and wakes the scheduler, which cancels what it can.
    /// A claim never succeeds for a cancel-requested run. `Ok(None)`: no such
    /// run.
    fn request_cancel(&self, run: RunId) -> impl Future<Output = Result<Option<CancelOutcome>, StoreError>> + Send;

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
    ) -> impl Future<Output = Result<Option<Claim>, StoreError>> + Send;

    /// Reads what an attempt needs: the run input and the outputs of the
    /// task's dependencies (for a compensator: of the task it undoes).
    fn task_inputs(&self, run: RunId, keys: &[String]) -> impl Future<Output = Result<TaskInputs, StoreError>> + Send;

    /// Extends the lease to store now + `lease` if `token` still holds it.
    /// `cancel_requested` is reported for forward tasks only: a running
    /// compensator finishes its rollback step.
    fn renew_lease(
        &self,
        id: TaskRunId,
        token: i64,
        lease: Duration,
    ) -> impl Future<Output = Result<LeaseStatus, StoreError>> + Send;

    /// Applies a lease-spending edge with the fencing token: `succeed`,
    /// `fail` (plus `schedule_retry` when `retry_in` is set, in the same
    /// transaction) or `cancel_running`. Clears the lease; wakes the
    /// scheduler.
    ///
    /// Contract: a token that no longer matches changes nothing and returns
    /// [`FinishResult::Stale`] after writing a `stale_write_rejected` audit
    /// event with the presented token.
    fn finish_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
    ) -> impl Future<Output = Result<FinishResult, StoreError>> + Send;

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
    /// else `reap_lease_final`; for a forward task of a cancel-requested run,
    /// `reap_lease` then `cancel_ready` in one transaction with no dispatch (a
    /// compensator is re-dispatched: the rollback goes on). A row a worker has
    /// just finished is never touched.
    fn reap_expired_leases(
        &self,
        scope: Scope,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Reaped>, StoreError>> + Send;

    /// Runs that need a scheduler pass: a flagged task run, a due retry, or
    /// an unhandled cancel request. Cost follows active work, not history.
    fn runs_with_work(&self, scope: Scope, limit: u32) -> impl Future<Output = Result<Vec<RunId>, StoreError>> + Send;

    /// How long until the earliest `retry_at` or `lease_expires_at` in scope
    /// (zero if already past), so the scheduler can sleep exactly that long.
    fn next_deadline(&self, scope: Scope) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send;

    /// Opens the scheduler transaction of one run, locking the run (on
    /// PostgreSQL `FOR UPDATE SKIP LOCKED`). `Ok(None)`: another scheduler
    /// holds it, or it is terminal.
    fn begin_pass(&self, run: RunId) -> impl Future<Output = Result<Option<Self::Pass>, StoreError>> + Send;

    /// The run with its task runs and history.
    fn get_run(&self, run: RunId) -> impl Future<Output = Result<Option<RunDetail>, StoreError>> + Send;

    /// The most recent runs, newest first.
    fn list_runs(&self, limit: u32) -> impl Future<Output = Result<Vec<RunSummary>, StoreError>> + Send;

    /// The store's wake-up source (on PostgreSQL this opens a listening
    /// connection).
    fn notifier(&self) -> impl Future<Output = Result<Self::Notifier, StoreError>> + Send;
}

/// One run's scheduler transaction (docs/design/scheduler.md#the-pass). Every
/// method runs inside the transaction; nothing is visible to others until
/// [`RunPass::commit`]; dropping the pass rolls it back. Each change is a
/// conditional UPDATE with its event row, so a row another writer changed
/// meanwhile is simply skipped (and reported as not changed).
pub trait RunPass: Send + 'static {
    /// The locked run.
    fn run(&self) -> &PassRun;

    /// Clears and returns the flags of task runs whose change the scheduler
    /// has not reacted to yet: finished forward tasks and compensators, and
    /// first claims while the run was pending. Read and cleared in one
    /// statement, so a change made after it re-flags the row.
    fn take_flagged(&mut self) -> impl Future<Output = Result<Vec<PassTask>, StoreError>> + Send;

    /// For each `(key, n)`, lowers the pending row's count of unsatisfied
    /// dependencies by `n`; then applies `dependencies_satisfied` to every
    /// pending forward row whose count is zero, with one outbox row each.
    /// Returns the keys made ready.
    fn satisfy_dependencies(
        &mut self,
        done: &[(String, u32)],
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Applies `retry_ready` (with an outbox row) to every retrying row
    /// whose `retry_at ≤ store now`. Returns their keys.
    fn promote_due_retries(&mut self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Applies `cancel_pending` with `reason` to those of `keys` still
    /// pending. Returns the keys cancelled.
    fn cancel_pending(
        &mut self,
        keys: &[String],
        reason: CancelReason,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Applies `cancel_pending`, `cancel_ready` and `cancel_retrying`
    /// (reason `user`) to every forward row in those states. Returns the
    /// keys cancelled.
    fn cancel_waiting(&mut self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Counts the forward task runs by state, as of now in the transaction.
    fn tally(&mut self) -> impl Future<Output = Result<TaskTally, StoreError>> + Send;

    /// Whether any forward task run is still active (pending, ready,
    /// running or retrying) and whether any task run has started, as of now
    /// in the transaction. A pass asks this first and counts with
    /// [`RunPass::tally`] only once nothing is active, so a pass over a wide
    /// run costs index lookups, not a scan of its rows: answer it without
    /// counting.
    fn activity(&mut self) -> impl Future<Output = Result<Activity, StoreError>> + Send;

    /// Keys of the succeeded forward task runs.
    fn succeeded_keys(&mut self) -> impl Future<Output = Result<BTreeSet<String>, StoreError>> + Send;

    /// The compensator rows created so far: `(key, state)`.
    fn compensator_states(&mut self) -> impl Future<Output = Result<Vec<(String, TaskRunState)>, StoreError>> + Send;

    /// Creates the compensator row `key` (undoing `compensate_for`) as
    /// ready, with its outbox row. Creating one that exists is a no-op
    /// returning `false`.
    fn create_compensator(
        &mut self,
        key: &str,
        compensate_for: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Applies a WorkflowRun edge, conditional on the run's stored state,
    /// recording it in the run's history. Illegal edges are refused before
    /// any SQL.
    fn transition_run(&mut self, edge: RunTransition) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Commits; then wakes the publisher if outbox rows were written and
    /// the waiters of a settled run.
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The transactional outbox
/// (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness).
pub trait OutboxStore: Send + Sync + 'static {
    /// A sweep transaction.
    type Sweep: OutboxSweep;

    /// Opens a transaction holding up to `limit` unpublished rows, oldest
    /// first, locked so a concurrent sweeper skips them (`FOR UPDATE SKIP
    /// LOCKED` in a CTE on PostgreSQL). `Ok(None)` when there are none.
    fn begin_sweep(
        &self,
        scope: Scope,
        limit: u32,
    ) -> impl Future<Output = Result<Option<Self::Sweep>, StoreError>> + Send;
}

/// One outbox sweep. Dropping it without commit leaves every row unpublished.
pub trait OutboxSweep: Send + 'static {
    /// The rows held, oldest first.
    fn dispatches(&self) -> &[Dispatch];

    /// Marks these rows published (within the transaction).
    fn mark_published(&mut self, ids: &[DispatchId]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Commits the marks.
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Worker registrations (docs/design/handlers.md#worker-registry).
pub trait WorkerRegistry: Send + Sync + 'static {
    /// Records (or refreshes) a worker and the task types it serves.
    fn register_worker(&self, worker: &WorkerRegistration) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Refreshes `last_seen_at`.
    fn touch_worker(&self, id: &WorkerId) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks a worker stopped (graceful shutdown).
    fn deregister_worker(&self, id: &WorkerId) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every registered worker, most recently seen first.
    fn list_workers(&self) -> impl Future<Output = Result<Vec<WorkerInfo>, StoreError>> + Send;

    /// Task types served by workers seen within `within` and not stopped.
    fn live_task_types(&self, within: Duration) -> impl Future<Output = Result<BTreeSet<String>, StoreError>> + Send;
}

/// Everything a FlowForge store provides.
pub trait Store: DefinitionStore + RunStore + OutboxStore + WorkerRegistry + Clone {}

impl<T: DefinitionStore + RunStore + OutboxStore + WorkerRegistry + Clone> Store for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskRunState::*;

    #[test]
    fn the_generic_path_refuses_before_any_io() {
        assert_eq!(
            resolve_generic_transition(Succeeded, Pending),
            Err(TransitionError::Illegal {
                from: Succeeded,
                to: Pending
            })
        );
        assert_eq!(
            resolve_generic_transition(Running, Succeeded),
            Err(TransitionError::LeaseRequired(TaskTransition::Succeed))
        );
        assert_eq!(
            resolve_generic_transition(Running, Failed),
            Err(TransitionError::LeaseRequired(TaskTransition::Fail))
        );
        assert!(matches!(
            resolve_generic_transition(Running, Ready),
            Err(TransitionError::Reserved {
                transition: TaskTransition::ReapLease,
                ..
            })
        ));
        assert!(matches!(
            resolve_generic_transition(Ready, Running),
            Err(TransitionError::Reserved {
                transition: TaskTransition::Claim,
                ..
            })
        ));
        assert!(matches!(
            resolve_generic_transition(Failed, Retrying),
            Err(TransitionError::Reserved {
                transition: TaskTransition::ScheduleRetry,
                ..
            })
        ));
        assert_eq!(
            resolve_generic_transition(Pending, Ready),
            Ok(TaskTransition::DependenciesSatisfied)
        );
        assert_eq!(
            resolve_generic_transition(Retrying, Cancelled),
            Ok(TaskTransition::CancelRetrying)
        );
    }

    #[test]
    fn lease_errors_point_at_finish() {
        let msg = TransitionError::LeaseRequired(TaskTransition::Succeed).to_string();
        assert!(msg.contains("finish_task_run"), "{msg}");
    }
}
