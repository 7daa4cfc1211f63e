//! The values the store ports take and return: scopes, claims, outcomes,
//! views of runs, task runs, events and workers.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::concurrency::{Gate, Strategy};
use flowforge_domain::limits::{self, Refusal, ValueKind};
use flowforge_domain::{
    CancelReason, Priority, RunState, SkipReason, TaskRunState, TaskTransition, WorkflowDefinition,
};
use serde_json::{Map, Value};

use crate::ids::{RunId, TaskRunId, WorkerId, WorkflowId};

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
    /// 1-based attempt being made, counted over every generation.
    pub attempt: u32,
    /// Attempts made in earlier generations of the run
    /// (docs/design/retry.md): the retry policy counts `attempt - attempt_base`.
    pub attempt_base: u32,
    /// The fencing token this attempt must present to finish.
    pub token: i64,
    /// When the lease runs out unless renewed (store time).
    pub lease_expires_at: DateTime<Utc>,
}

impl Claim {
    /// The attempt's number within the run's current generation: what the
    /// retry policy's `max_attempts` counts (docs/design/retry.md).
    pub fn generation_attempt(&self) -> u32 {
        self.attempt.saturating_sub(self.attempt_base)
    }
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

impl TaskOutcome {
    /// The outcome as every store keeps it
    /// (docs/design/data-flow.md#limits): an output holding U+0000 becomes
    /// a permanent failure naming where, and U+0000 in an error's text is
    /// replaced. Both stores apply it before writing; a worker applies it
    /// first too, so what it reports is what is stored.
    pub fn storable(self) -> Self {
        match self {
            Self::Succeeded { output } => match limits::find_nul(&output) {
                None => Self::Succeeded { output },
                Some(path) => Self::Failed {
                    error: Refusal::Nul {
                        kind: ValueKind::TaskOutput,
                        path,
                    }
                    .to_string(),
                    retry_in: None,
                },
            },
            Self::Failed { error, retry_in } => Self::Failed {
                error: match limits::storable_text(&error) {
                    std::borrow::Cow::Borrowed(_) => error,
                    std::borrow::Cow::Owned(text) => text,
                },
                retry_in,
            },
            Self::Cancelled => Self::Cancelled,
        }
    }
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

/// Who publishes the dispatches a success hands on
/// ([`RunStore::finish_and_hand_off`](crate::RunStore::finish_and_hand_off),
/// docs/design/outbox-and-queues.md#publish-after-commit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Handover {
    /// The outbox sweep: the rows are left unpublished and the publisher
    /// is woken.
    #[default]
    Sweep,
    /// The caller, right after the commit, into a queue that outlives it:
    /// the rows are held from the sweep for this long of store time and
    /// returned; the caller settles them with
    /// [`OutboxStore::settle_held`](crate::OutboxStore::settle_held) once
    /// the queue has confirmed them. If it dies first, the sweep publishes
    /// them when the hold is over.
    Held(Duration),
    /// The caller, right after the commit, into a queue that dies with its
    /// process ([`DispatchPublisher::durable`](crate::DispatchPublisher::durable)
    /// is false): the rows are committed already published and returned,
    /// so nothing is left to settle. A process that dies before pushing
    /// them loses them with its queue, and the next publisher's start
    /// re-arms them
    /// ([`OutboxStore::rearm_lost_dispatches`](crate::OutboxStore::rearm_lost_dispatches)),
    /// as it does every dispatch that queue held.
    Pushed,
}

/// A finish as [`RunStore::finish_and_hand_off`](crate::RunStore::finish_and_hand_off)
/// takes it, for [`RunStore::finish_and_claim`](crate::RunStore::finish_and_claim).
#[derive(Debug, Clone)]
pub struct FinishCall<'a> {
    /// The task run finished.
    pub id: TaskRunId,
    /// The token its claim took.
    pub token: i64,
    /// The worker that ran it, and that claims the next one.
    pub worker: &'a WorkerId,
    /// The attempt's outcome.
    pub outcome: TaskOutcome,
    /// What its success hands on.
    pub handoff: &'a flowforge_domain::plan::Handoff,
    /// Who publishes what it makes ready.
    pub handover: Handover,
}

/// The claim [`RunStore::finish_and_claim`](crate::RunStore::finish_and_claim)
/// makes after its finish, as [`RunStore::claim_task_run`](crate::RunStore::claim_task_run)
/// takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextClaim {
    /// The task run its dispatch names.
    pub id: TaskRunId,
    /// The token its dispatch carries.
    pub token: i64,
    /// The lease to take.
    pub lease: Duration,
}

/// What [`RunStore::finish_and_hand_off`](crate::RunStore::finish_and_hand_off)
/// stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The outcome's fate.
    pub result: FinishResult,
    /// The dispatches of the dependents it made ready, for the caller to
    /// publish right after the commit
    /// (docs/design/outbox-and-queues.md#publish-after-commit); empty with
    /// [`Handover::Sweep`].
    pub held: Vec<crate::queue::Dispatch>,
    /// Whether other rows were waiting for the sweep when it committed
    /// (reported only with [`Handover::Held`]): a caller keeping to the queue's window
    /// then leaves its rows to the sweep, which publishes the backlog in
    /// priority order (docs/design/priorities.md#the-broker-window).
    pub queued: bool,
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
    /// Its task type, so an observer needs no second read.
    pub task_type: String,
    /// The forward task it compensates, when it is a compensator.
    pub compensate_for: Option<String>,
    /// The error it failed with: set for `reap_lease_final` only.
    pub error: Option<String>,
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

/// What the dependencies of conditional tasks did, for the pass to decide
/// them (docs/design/conditions.md#deciding).
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyOutcomes {
    /// The run's input.
    pub run_input: Value,
    /// Each asked-for forward task run: `(key, state, output)`, the output
    /// present iff it succeeded.
    pub tasks: Vec<(String, TaskRunState, Option<Value>)>,
}

/// The run a pass holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedRun {
    /// The run.
    pub id: RunId,
    /// Its definition.
    pub workflow_id: WorkflowId,
    /// Its stored state.
    pub state: RunState,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// Whether the run has concurrency gates
    /// (docs/design/concurrency.md): only then does a pass ask about them.
    pub gated: bool,
    /// Whether a concurrency limit cancelled it: such a cancel rolls back
    /// what succeeded, where a user's does not
    /// (docs/design/concurrency.md#strategies).
    pub limit_cancelled: bool,
    /// How long since the run was created, in store time when the pass
    /// began: a run the pass settles took this long end to end.
    pub age: std::time::Duration,
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
    /// Why it was cancelled when no user asked: `concurrency_limit`
    /// (docs/design/concurrency.md#strategies).
    pub cancel_reason: Option<String>,
    /// 1, plus one per operator retry (docs/design/retry.md).
    pub generation: u32,
    /// The priority it was started at (docs/design/priorities.md).
    pub priority: Priority,
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
    /// The run generation it was last reset in (1: never reset).
    pub generation: u32,
    /// Current fencing token.
    pub token: i64,
    /// Its dispatch priority (docs/design/priorities.md).
    pub priority: Priority,
    /// What a pending task waits for besides its dependencies:
    /// `concurrency:<key>` while its run's or its own concurrency limit
    /// holds it back (docs/design/concurrency.md#blocked-by).
    pub blocked_by: Option<String>,
    /// Why it was cancelled.
    pub cancel_reason: Option<CancelReason>,
    /// Why it was skipped (docs/design/conditions.md#skipping).
    pub skip_reason: Option<SkipReason>,
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
    /// What the running attempt last reported of its progress (cleared by
    /// each claim).
    pub progress: Option<Value>,
    /// When its row was created.
    pub created_at: DateTime<Utc>,
}

/// One entry of the event history (a transition, or an audit event).
#[derive(Debug, Clone, PartialEq)]
pub struct EventView {
    /// Its place in the run's history: 1, 2, 3, … in commit order
    /// (see [`RunStore::run_events`](super::RunStore::run_events)).
    pub seq: u64,
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
    /// The run's generation when it was written (docs/design/retry.md).
    pub generation: u32,
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

/// A published definition without its tasks, for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct DefinitionSummary {
    /// Its id.
    pub id: WorkflowId,
    /// Workflow name.
    pub name: String,
    /// Workflow version.
    pub version: u32,
    /// Its fingerprint.
    pub fingerprint: String,
    /// How many tasks it has (compensators included).
    pub tasks: u32,
    /// When it was first published.
    pub created_at: DateTime<Utc>,
}

/// The key a client starts a run under, so that a retried request starts
/// nothing new.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The client's key.
    pub key: String,
    /// A digest of the request it came with: the same key with another
    /// request is the client's mistake, not a retry.
    pub request_hash: String,
}

/// How a run starts: its priority and the concurrency gates its input
/// resolved to ([`flowforge_domain::concurrency::resolve`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Its priority (docs/design/priorities.md).
    pub priority: Priority,
    /// Its gates (docs/design/concurrency.md).
    pub gates: Vec<Gate>,
}

/// A gate a run or one of its tasks is waiting at
/// (docs/design/concurrency.md#gates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The task it holds back (`None`: the whole run).
    pub task: Option<String>,
    /// The slot pool.
    pub scope: String,
    /// The key's value, as `blocked_by` shows it.
    pub label: String,
    /// The pool's size.
    pub max: u32,
    /// What the run does when the pool is full.
    pub strategy: Strategy,
    /// Whether the run has met the full pool once already.
    pub tried: bool,
}

/// What [`RunPass::pass_gates`](super::RunPass::pass_gates) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateCheck {
    /// Every pool gave a slot; the waits are gone.
    Passed,
    /// This pool (its scope) had no room; nothing was taken.
    Full(String),
}

/// Marks what each pending forward task of a run waits for besides its
/// dependencies, from the run's due [`Wait`]s: every one while the run
/// waits at its own gate (nothing of it runs before), else each task at
/// its own (docs/design/concurrency.md#blocked-by).
pub fn mark_blocked(tasks: &mut [TaskRunView], waits: &[Wait]) {
    let run_gate = waits.iter().find(|w| w.task.is_none());
    for task in tasks
        .iter_mut()
        .filter(|t| t.state == TaskRunState::Pending && t.compensate_for.is_none())
    {
        let gate = run_gate.or_else(|| waits.iter().find(|w| w.task.as_deref() == Some(task.key.as_str())));
        task.blocked_by = gate.map(|w| Gate::blocked_by(&w.label));
    }
}

/// A run just started: its id and its `created_at` as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRun {
    /// The run.
    pub id: RunId,
    /// When it was created (store time), as its summary will say.
    pub created_at: DateTime<Utc>,
}

/// What [`RunStore::start_run_keyed`](super::RunStore::start_run_keyed) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedStart {
    /// This call started the run.
    Started(NewRun),
    /// A call with the same key and request started this run before.
    Replayed(RunId),
    /// The key started this run with a different request.
    Reused(RunId),
}

/// Where a page of runs starts: after the run with this creation time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunCursor {
    /// The last run's creation time.
    pub created_at: DateTime<Utc>,
    /// The last run's id.
    pub id: RunId,
}

/// Which runs [`RunStore::list_runs_page`](super::RunStore::list_runs_page) returns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunQuery {
    /// At most this many.
    pub limit: u32,
    /// Only runs after this one (newest first).
    pub after: Option<RunCursor>,
    /// Only runs in one of these states (empty: any).
    pub states: Vec<RunState>,
    /// Only runs of one of these workflow names (empty: any).
    pub workflows: Vec<String>,
    /// Only runs created at or after this.
    pub created_after: Option<DateTime<Utc>>,
    /// Only runs created before this.
    pub created_before: Option<DateTime<Utc>>,
}

/// Counts of active work, read from the store for gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Gauges {
    /// Task runs ready and waiting for a worker.
    pub ready: u64,
    /// Task runs running (holding a lease).
    pub running: u64,
    /// Outbox rows not yet published.
    pub outbox_unpublished: u64,
    /// Runs pending or running.
    pub active_runs: u64,
}
