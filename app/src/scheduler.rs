//! The scheduler (docs/design/scheduler.md#the-pass): reap expired leases, then
//! one transaction per run with work — react to finished tasks, promote,
//! cancel, compensate, derive and store the run state. Its loop sleeps until a
//! store notification or the earliest retry / lease deadline.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_domain::concurrency::Strategy;
use flowforge_domain::derive::{CompensationProgress, TaskTally, Verdict, derive_run_state};
use flowforge_domain::limits::DEFAULT_TASK_OUTPUT_BYTES;
use flowforge_domain::map::{self, Expansion, Progress};
use flowforge_domain::plan::{self, Decision};
use flowforge_domain::{
    CancelReason, RunState, SkipReason, TaskDefinition, TaskRunState, TaskTransition, WorkflowDefinition,
};
use flowforge_ports::store::{Collect, GateCheck, LockedRun, Notifier, PassTask, RunPass, Topic, Wait};
use flowforge_ports::{RunEvent, RunId, Scope, Store, TaskEvent};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::cache::DefinitionCache;
use crate::error::Error;
use crate::observers::Observers;

/// How often the loop looks for expired leases when no deadline woke it.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// The default [`SchedulerConfig::pass_spacing`]: far below a human's
/// notice and a join's usual wait, long enough that a busy fan-out's
/// finishes share a pass (docs/design/scheduler.md#pacing).
pub const DEFAULT_PASS_SPACING: Duration = Duration::from_millis(5);

/// What one pass over one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Task runs made ready (promotions, due retries, a compensator).
    pub dispatched: usize,
    /// Task runs cancelled.
    pub cancelled: usize,
    /// The compensator created, if any.
    pub compensator: Option<String>,
    /// The terminal state the run reached in this pass, if any.
    pub settled: Option<RunState>,
}

/// What deciding a run's conditional tasks did.
#[derive(Debug, Default)]
struct Decided {
    /// Task runs made ready.
    dispatched: usize,
    /// What observers hear once the pass has committed.
    told: Vec<Told>,
    /// Rows were skipped or failed, and flagged for the pass to react to.
    reflagged: bool,
}

/// A change of a pass that observers hear of after its commit (they are
/// told only what is persisted; docs/design/handlers.md#lifecycle-hooks).
#[derive(Debug)]
enum Told {
    /// A skip, with its reason.
    Skipped(TaskEvent, SkipReason),
    /// A task failed before it ran: a condition that could not be
    /// evaluated, a map that could not expand or a failed child.
    Failed(TaskEvent),
    /// A mapped task collected its children's outputs.
    Collected(TaskEvent),
}

/// Logs the tasks a pass skipped; returns what observers hear of them.
fn skips(run: RunId, def: &WorkflowDefinition, keys: &[String], reason: SkipReason) -> Vec<Told> {
    keys.iter()
        .map(|key| {
            tracing::info!(run_id = %run, task_key = %key, %reason, "task skipped");
            let task_type = def.task(key).map(TaskDefinition::task_type).unwrap_or_default();
            Told::Skipped(event(run, task_type, key, None), reason)
        })
        .collect()
}

/// Logs a task the pass failed for good (its condition or its map);
/// returns what observers hear of it.
fn failed(run: RunId, task: &TaskDefinition, key: &str, error: String) -> Told {
    tracing::warn!(run_id = %run, task_key = %key, %error, "task failed before it ran");
    Told::Failed(event(run, task.task_type(), key, Some(error)))
}

/// What observers hear of a forward task the pass moved itself.
fn event(run: RunId, task_type: &str, key: &str, error: Option<String>) -> TaskEvent {
    TaskEvent {
        run_id: run,
        task_key: key.to_owned(),
        task_type: task_type.to_owned(),
        compensate_for: None,
        attempt: 1,
        output: None,
        error,
        retry_in: None,
    }
}

/// What advancing a pass's mapped tasks did.
#[derive(Debug, Default)]
struct Mapped {
    /// Children released from the concurrency limit.
    dispatched: usize,
    /// Waiting children cancelled after a sibling failed.
    cancelled: usize,
    /// What observers hear once the pass has committed.
    told: Vec<Told>,
    /// A mapped task was collected or failed, and flagged for the pass.
    reflagged: bool,
}

/// Advances each mapped task one of whose children just finished
/// (docs/design/map.md#collecting): collects it once every child
/// succeeded, fails it (cancelling its children still waiting) once one
/// failed for good, or releases held-back children into the room its
/// concurrency leaves.
async fn advance_maps<P: RunPass>(
    pass: &mut P,
    def: &WorkflowDefinition,
    flagged: &[PassTask],
    limit: usize,
) -> Result<Mapped, Error> {
    let mut mapped = Mapped::default();
    let parents: BTreeSet<&str> = flagged
        .iter()
        .filter(|t| !t.state.is_active())
        .filter_map(|t| map::child_of(&t.key))
        .map(|(parent, _)| parent)
        .collect();
    let run = pass.run().id;
    for parent in parents {
        let Some((task, spec)) = def.task(parent).and_then(|t| t.map().map(|m| (t, m))) else {
            continue;
        };
        let room = spec.concurrency.unwrap_or(0);
        let children = pass.map_children(parent, room).await?;
        match map::progress(parent, spec, &children) {
            Progress::Collect => match pass.collect_map(parent, limit).await? {
                Collect::Collected => {
                    tracing::info!(run_id = %run, task_key = %parent, "mapped task collected");
                    mapped.reflagged = true;
                    mapped
                        .told
                        .push(Told::Collected(event(run, task.task_type(), parent, None)));
                }
                Collect::TooLarge(bytes) => {
                    let error = format!(
                        "{}: its children's outputs add up to {bytes} bytes of JSON; the limit \
                         (max_task_output_bytes) is {limit} bytes",
                        map::OUTPUT_TOO_LARGE
                    );
                    if pass.fail_pending(parent, TaskTransition::FailMap, &error).await? {
                        mapped.reflagged = true;
                        mapped.told.push(failed(run, task, parent, error));
                    }
                }
                Collect::NotReady => {}
            },
            Progress::Fail(error) => {
                if pass.fail_pending(parent, TaskTransition::FailMap, &error).await? {
                    mapped.reflagged = true;
                    mapped.told.push(failed(run, task, parent, error));
                    mapped.cancelled += pass.cancel_children(parent).await?.len();
                }
            }
            Progress::Release(indexes) => {
                let keys: Vec<(String, u32)> = indexes.into_iter().map(|i| (map::child_key(parent, i), 1)).collect();
                mapped.dispatched += pass.satisfy_dependencies(&keys).await?.len();
            }
            Progress::Wait => {}
        }
    }
    Ok(mapped)
}

/// What one scheduler pass over its scope did.
#[derive(Debug, Clone, Default)]
pub struct ScheduleReport {
    /// Leases taken back.
    pub reaped: usize,
    /// Runs advanced.
    pub passes: usize,
    /// Runs that reached a terminal state.
    pub settled: Vec<(RunId, RunState)>,
    /// Whether a batch limit was hit (call again at once).
    pub more: bool,
}

impl ScheduleReport {
    fn progressed(&self) -> bool {
        self.reaped > 0 || self.passes > 0
    }
}

/// Tuning of the scheduler loop.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Which runs to drive.
    pub scope: Scope,
    /// Most runs (and leases) handled per pass.
    pub batch: u32,
    /// The slow periodic pass that only backs up the notifications.
    pub safety_net: Duration,
    /// Wakes the loop like a store notification does (see
    /// [`Scope::Runs`]: its owner pokes it after adding a run).
    pub nudge: Option<Arc<Notify>>,
    /// Told of each run a concurrency limit cancelled, once the request
    /// is committed, so an engine running its handlers in this process
    /// stops them at once instead of at their next heartbeat.
    pub on_limit_cancel: Option<CancelHook>,
    /// The most bytes of JSON a mapped task's collected output may take:
    /// the task output limit (docs/design/map.md#collecting).
    pub output_limit: usize,
    /// The least time from one pass's start to the next pass a
    /// notification asks for (docs/design/scheduler.md#pacing): what
    /// finishes within it share one pass. A pass the deadline timer starts
    /// does not wait.
    pub pass_spacing: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            scope: Scope::All,
            batch: 500,
            safety_net: Duration::from_secs(30),
            nudge: None,
            on_limit_cancel: None,
            output_limit: DEFAULT_TASK_OUTPUT_BYTES,
            pass_spacing: DEFAULT_PASS_SPACING,
        }
    }
}

/// A callback for runs a concurrency limit cancelled
/// (docs/design/concurrency.md#strategies).
#[derive(Clone)]
pub struct CancelHook(Arc<dyn Fn(RunId) + Send + Sync>);

impl CancelHook {
    /// A hook calling `f`.
    pub fn new(f: impl Fn(RunId) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
}

impl std::fmt::Debug for CancelHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CancelHook")
    }
}

/// What a pass's admission did (docs/design/concurrency.md#gates).
#[derive(Debug, Default)]
struct Admitted {
    /// Task runs made ready past their gates.
    dispatched: usize,
    /// The run `cancel_in_progress` cancelled to make room.
    cancelled_holder: Option<RunId>,
}

/// Passes what gates it can: the run's own first (its tasks without
/// dependencies wait behind them), acting on its strategy the first time
/// a pool is full; then, once the run is past them, each task whose only
/// wait left is its gate.
async fn admit<P: RunPass>(pass: &mut P, def: &WorkflowDefinition) -> Result<Admitted, Error> {
    let mut admitted = Admitted::default();
    let mut waits = pass.waits().await?;
    let run_waits: Vec<&Wait> = waits.iter().filter(|w| w.task.is_none()).collect();
    if !run_waits.is_empty() {
        match pass.pass_gates(None).await? {
            GateCheck::Passed => {
                // The run gate held back the tasks it would have made ready
                // at once: a new run's roots, a retried run's tasks whose
                // dependencies are all kept succeeded. Lowering a task that
                // is not pending changes nothing.
                let succeeded = pass.succeeded_keys().await?;
                let held: Vec<(String, u32)> = def
                    .forward_tasks()
                    .filter(|t| !succeeded.contains(t.key()) && t.depends_on().iter().all(|d| succeeded.contains(d)))
                    .map(|t| (t.key().to_owned(), 1))
                    .collect();
                admitted.dispatched += pass.satisfy_dependencies(&held).await?.len();
                // Past the run's gates, its first tasks' own gates are due.
                waits = pass.waits().await?;
            }
            GateCheck::Full(scope) => {
                // The strategy acts once, when the run first meets a full
                // pool; after that it waits like any queued run.
                if !run_waits.iter().any(|w| w.tried) {
                    pass.mark_gates_tried().await?;
                    match run_waits.iter().find(|w| w.scope == scope).map(|w| w.strategy) {
                        Some(Strategy::CancelNewest) => pass.cancel_for_limit().await?,
                        Some(Strategy::CancelInProgress) => {
                            admitted.cancelled_holder = pass.cancel_oldest_holder(&scope).await?;
                        }
                        Some(Strategy::Queue) | None => {}
                    }
                }
                return Ok(admitted);
            }
        }
    }
    // Past the run's gates: the tasks whose only wait left is their own.
    for task in waits.into_iter().filter_map(|w| w.task) {
        if pass.pass_gates(Some(&task)).await? == GateCheck::Passed {
            admitted.dispatched += pass.satisfy_dependencies(&[(task, 1)]).await?.len();
        }
    }
    Ok(admitted)
}

/// The scheduler of one process.
#[derive(Debug)]
pub struct Scheduler<S: Store> {
    store: S,
    defs: Arc<DefinitionCache<S>>,
    observers: Observers,
    config: SchedulerConfig,
}

impl<S: Store> Scheduler<S> {
    /// A scheduler over `store`.
    pub fn new(store: S, defs: Arc<DefinitionCache<S>>, observers: Observers, config: SchedulerConfig) -> Self {
        Self {
            store,
            defs,
            observers,
            config,
        }
    }

    /// One pass: reap expired leases, then advance every run with work.
    /// A run whose pass fails is logged and left for the next pass; only a
    /// store failure aborts the whole pass.
    pub async fn schedule_once(&self) -> Result<ScheduleReport, Error> {
        self.pass(true).await
    }

    async fn pass(&self, reap: bool) -> Result<ScheduleReport, Error> {
        let scope = &self.config.scope;
        let mut report = ScheduleReport::default();
        let reaped = if reap {
            self.store.reap_expired_leases(scope.clone(), self.config.batch).await?
        } else {
            Vec::new()
        };
        report.reaped = reaped.len();
        crate::metrics::leases_reaped(reaped.len());
        for r in &reaped {
            tracing::warn!(
                run_id = %r.run_id, task_key = %r.task_key, attempt = r.attempt, token = r.token,
                transition = %r.transition, cancelled = r.cancelled, "lease expired; task run reaped"
            );
            if r.transition == TaskTransition::ReapLeaseFinal {
                // The reaper reports what the observer needs: no second read.
                self.observers.task_failed(&TaskEvent {
                    run_id: r.run_id,
                    task_key: r.task_key.clone(),
                    task_type: r.task_type.clone(),
                    compensate_for: r.compensate_for.clone(),
                    attempt: r.attempt,
                    output: None,
                    error: r.error.clone(),
                    retry_in: None,
                });
            }
        }
        let runs = self.store.runs_with_work(scope.clone(), self.config.batch).await?;
        report.more = runs.len() >= self.config.batch as usize || reaped.len() >= self.config.batch as usize;
        for run in runs {
            match self.advance_run(run).await {
                Ok(Some(outcome)) => {
                    report.passes += 1;
                    if let Some(state) = outcome.settled {
                        report.settled.push((run, state));
                    }
                }
                Ok(None) => {}
                Err(Error::Store(e)) => return Err(Error::Store(e)),
                Err(e) => tracing::error!(run_id = %run, error = %e, "scheduler pass failed for this run; will retry"),
            }
        }
        Ok(report)
    }

    /// One run's transaction (docs/design/scheduler.md#the-pass). `Ok(None)`
    /// when another scheduler holds the run or it is already terminal.
    pub async fn advance_run(&self, run: RunId) -> Result<Option<PassOutcome>, Error> {
        let Some(mut pass) = self.store.begin_pass(run).await? else {
            return Ok(None);
        };
        let header: LockedRun = pass.run().clone();
        let published = self.defs.get(header.workflow_id).await?;
        let def = &published.definition;
        let graph = def.graph();
        let mut outcome = PassOutcome::default();

        // React to the changes since the last pass. A skip, or a condition
        // that failed, flags its row, and the pass reacts to that in turn
        // until nothing new is flagged (docs/design/conditions.md#deciding).
        let conditional = def.has_conditions();
        let mut told: Vec<Told> = Vec::new();
        let trigger = |key: &str| def.task(key).map(|t| t.trigger()).unwrap_or_default();
        let mut flagged = pass.take_flagged().await?;
        let mut first_round = true;
        loop {
            let reaction = plan::react(
                graph,
                trigger,
                flagged
                    .iter()
                    .filter(|t| t.compensate_for.is_none())
                    .map(|t| (t.key.as_str(), t.state)),
            );
            let mut released = reaction.satisfied.clone();
            // A failure's cancellation, wave by wave from the rows moved, so
            // a task skipped earlier stops it and `all_done` tasks count
            // each cancellation once. Without triggers every task below a
            // failure is still pending: one statement cancels them all.
            let mut wave: Vec<String> = if conditional {
                reaction.upstream_failed.iter().map(|k| (*k).to_owned()).collect()
            } else {
                let below: BTreeSet<&str> = reaction
                    .upstream_failed
                    .iter()
                    .flat_map(|k| std::iter::once(*k).chain(graph.transitive_dependents_of(k)))
                    .collect();
                below.into_iter().map(str::to_owned).collect()
            };
            while !wave.is_empty() {
                let moved = pass.cancel_pending(&wave, CancelReason::UpstreamFailed).await?;
                outcome.cancelled += moved.len();
                if !conditional {
                    break;
                }
                let (next, more) = plan::failure_wave(graph, trigger, moved.iter().map(String::as_str));
                for (key, n) in more {
                    *released.entry(key).or_default() += n;
                }
                wave = next.into_iter().map(str::to_owned).collect();
            }
            if !reaction.upstream_cancelled.is_empty() {
                let keys: Vec<String> = reaction.upstream_cancelled.iter().map(|k| (*k).to_owned()).collect();
                outcome.cancelled += pass.cancel_pending(&keys, CancelReason::User).await?.len();
            }
            let mut reflagged = false;
            if !reaction.upstream_skipped.is_empty() {
                let keys: Vec<String> = reaction.upstream_skipped.iter().map(|k| (*k).to_owned()).collect();
                let skipped = pass.skip_pending(&keys, SkipReason::UpstreamSkipped).await?;
                reflagged |= !skipped.is_empty();
                told.extend(skips(run, def, &skipped, SkipReason::UpstreamSkipped));
            }
            if header.cancel_requested {
                if first_round {
                    outcome.cancelled += pass.cancel_waiting().await?.len();
                }
            } else {
                if !released.is_empty() {
                    let done: Vec<(String, u32)> = released.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
                    outcome.dispatched += pass.satisfy_dependencies(&done).await?.len();
                }
                if first_round {
                    outcome.dispatched += pass.promote_due_retries().await?.len();
                }
                if conditional {
                    let decided = self.decide_conditions(&mut pass, def).await?;
                    outcome.dispatched += decided.dispatched;
                    reflagged |= decided.reflagged;
                    told.extend(decided.told);
                    let mapped = advance_maps(&mut pass, def, &flagged, self.config.output_limit).await?;
                    outcome.dispatched += mapped.dispatched;
                    outcome.cancelled += mapped.cancelled;
                    reflagged |= mapped.reflagged;
                    told.extend(mapped.told);
                }
            }
            first_round = false;
            if !reflagged {
                break;
            }
            flagged = pass.take_flagged().await?;
        }
        let mut victim = None;
        if header.gated {
            // Slots of finished tasks first, so a sibling may take them
            // in this very pass (docs/design/concurrency.md#gates).
            pass.release_slots(false).await?;
            if !pass.run().cancel_requested {
                let admitted = admit(&mut pass, def).await?;
                outcome.dispatched += admitted.dispatched;
                victim = admitted.cancelled_holder;
                if let Some(victim) = victim {
                    tracing::info!(run_id = %run, cancelled = %victim, "concurrency limit: the oldest holder is cancelled");
                }
                if pass.run().cancel_requested {
                    tracing::info!(run_id = %run, "concurrency limit: the newest run is cancelled");
                    outcome.cancelled += pass.cancel_waiting().await?.len();
                }
            }
        }

        // Derive the run state, compensating first if the run failed. While
        // a forward task is active the run cannot settle: index lookups
        // decide that, and only a settled run's tasks are counted.
        let activity = pass.activity().await?;
        let (tally, mut verdict) = if activity.any_active {
            // Only `any_started` of an unsettled run's tally is ever read.
            let tally = TaskTally {
                any_started: activity.any_started,
                ..TaskTally::default()
            };
            (tally, Verdict::unsettled(activity.any_started))
        } else {
            let tally = pass.tally().await?;
            let verdict = derive_run_state(&tally, CompensationProgress::NotStarted);
            (tally, verdict)
        };
        // A run a concurrency limit cancelled rolls back what it did
        // before it settles as cancelled (docs/design/concurrency.md#strategies).
        let rollback_cancelled = pass.run().limit_cancelled && verdict == Verdict::Settled(RunState::Cancelled);
        if verdict == Verdict::Compensating || rollback_cancelled {
            let succeeded = pass.succeeded_keys().await?;
            let succeeded: BTreeSet<&str> = succeeded.iter().map(String::as_str).collect();
            let rows = pass.compensator_states().await?;
            let states: HashMap<&str, TaskRunState> = rows.iter().map(|(k, s)| (k.as_str(), *s)).collect();
            let next = plan::compensate(def, &succeeded, &states);
            if let Some((forward, key)) = next.start
                && pass.create_compensator(key, forward).await?
            {
                outcome.dispatched += 1;
                outcome.compensator = Some(key.to_owned());
            }
            verdict = if rollback_cancelled {
                match next.progress {
                    CompensationProgress::NotStarted | CompensationProgress::Outstanding => Verdict::Compensating,
                    CompensationProgress::Finished | CompensationProgress::Halted => verdict,
                }
            } else {
                derive_run_state(&tally, next.progress)
            };
        }

        // Store it along legal edges only
        // (docs/design/state-machines.md#deriving-the-run-state).
        let edges = plan::run_edges(header.state, verdict, tally.any_started);
        let mut stored = true;
        for edge in edges {
            if !pass.transition_run(*edge).await? {
                tracing::warn!(run_id = %run, %edge, "run transition lost a race; the next pass will re-derive");
                stored = false;
                break;
            }
        }
        // A run lets go of its slots only once it is stored as settled.
        if header.gated && stored && matches!(verdict, Verdict::Settled(_)) && !edges.is_empty() {
            pass.release_slots(true).await?;
        }
        pass.commit().await?;
        if let (Some(victim), Some(hook)) = (victim, &self.config.on_limit_cancel) {
            (hook.0)(victim);
        }
        for change in told {
            match change {
                Told::Skipped(event, reason) => self.observers.task_skipped(&event, reason),
                Told::Failed(event) => self.observers.task_failed(&event),
                Told::Collected(event) => self.observers.task_succeeded(&event),
            }
        }

        if let Verdict::Settled(state) = verdict
            && !edges.is_empty()
        {
            outcome.settled = Some(state);
            tracing::info!(run_id = %run, workflow = def.name(), %state, "run finished");
            crate::metrics::run_finished(def.name(), state, header.age);
            self.observers.workflow_done(&RunEvent {
                run_id: run,
                workflow: def.name().to_owned(),
                version: def.version(),
                state,
            });
        }
        Ok(Some(outcome))
    }

    /// Decides each conditional task whose dependencies have all finished
    /// (only its hold is left on its counter): runs it, skips it or fails
    /// it (docs/design/conditions.md#deciding).
    async fn decide_conditions<P: RunPass>(&self, pass: &mut P, def: &WorkflowDefinition) -> Result<Decided, Error> {
        let mut decided = Decided::default();
        let keys: Vec<String> = def
            .forward_tasks()
            .filter(|t| t.holds())
            .map(|t| t.key().to_owned())
            .collect();
        let at_hold: Vec<String> = pass
            .pending_counts(&keys)
            .await?
            .into_iter()
            .filter(|(_, n)| *n == 1)
            .map(|(k, _)| k)
            .collect();
        if at_hold.is_empty() {
            return Ok(decided);
        }
        let wanted: Vec<String> = at_hold
            .iter()
            .filter_map(|k| def.task(k))
            .flat_map(|t| t.depends_on().iter().cloned())
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        let outcomes = pass.dependency_outcomes(&wanted).await?;
        let by_key: HashMap<&str, (TaskRunState, &Option<Value>)> =
            outcomes.tasks.iter().map(|(k, s, o)| (k.as_str(), (*s, o))).collect();
        let run = pass.run().id;
        for key in at_hold {
            let Some(task) = def.task(&key) else { continue };
            let dependencies: BTreeMap<String, (TaskRunState, Option<Value>)> = task
                .depends_on()
                .iter()
                .filter_map(|d| by_key.get(d.as_str()).map(|(s, o)| (d.clone(), (*s, (*o).clone()))))
                .collect();
            let decision = match (plan::decide(task, &dependencies, &outcomes.run_input), task.map()) {
                (Decision::Run, Some(spec)) => {
                    let source = spec.source().ok().and_then(|s| dependencies.get(&s.task).cloned());
                    let output = source.and_then(|(_, output)| output).unwrap_or(Value::Null);
                    match map::expand(spec, &output) {
                        Expansion::Children(size) => {
                            if pass.expand_map(&key, size).await? {
                                tracing::info!(run_id = %run, task_key = %key, children = size, "mapped task expanded");
                                let first: Vec<(String, u32)> = (0..map::first_wave(spec, size))
                                    .map(|i| (map::child_key(&key, i), 1))
                                    .collect();
                                decided.dispatched += pass.satisfy_dependencies(&first).await?.len();
                            }
                            continue;
                        }
                        Expansion::Skip(reason) => Decision::Skip(reason),
                        Expansion::Fail(error) => {
                            if pass.fail_pending(&key, TaskTransition::FailMap, &error).await? {
                                decided.reflagged = true;
                                decided.told.push(failed(run, task, &key, error));
                            }
                            continue;
                        }
                    }
                }
                (decision, _) => decision,
            };
            match decision {
                Decision::Run => {
                    decided.dispatched += pass.satisfy_dependencies(&[(key, 1)]).await?.len();
                }
                Decision::Skip(reason) => {
                    let skipped = pass.skip_pending(std::slice::from_ref(&key), reason).await?;
                    decided.reflagged |= !skipped.is_empty();
                    decided.told.extend(skips(run, def, &skipped, reason));
                }
                Decision::Fail(error) => {
                    if pass.fail_pending(&key, TaskTransition::FailCondition, &error).await? {
                        decided.reflagged = true;
                        decided.told.push(failed(run, task, &key, error));
                    }
                }
            }
        }
        Ok(decided)
    }

    /// Runs passes until `shutdown`, sleeping until a notification, the
    /// earliest retry or lease deadline, or the safety-net interval.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        let notifier = self.store.notifier().await?;
        let mut failures = 0u32;
        let mut last_reap = Instant::now();
        // True at first: the first pass reaps.
        let mut timer_fired = true;
        loop {
            // Leases last tens of seconds: looking for expired ones on every
            // wake-up would put a query on every hop for nothing. Reap when
            // the deadline timer fired (a lease may have just expired) and
            // at least every REAP_EVERY otherwise.
            let reap = timer_fired || last_reap.elapsed() >= REAP_EVERY;
            if reap {
                last_reap = Instant::now();
            }
            let idle;
            let started = Instant::now();
            match self.pass(reap).await {
                Ok(report) if report.more => {
                    failures = 0;
                    tokio::task::yield_now().await;
                    continue;
                }
                Ok(report) => {
                    failures = 0;
                    idle = !report.progressed();
                }
                Err(e) => {
                    failures += 1;
                    let wait = crate::backoff(failures);
                    tracing::error!(error = %e, retry_in_ms = wait.as_millis() as u64, "scheduler pass failed");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            }
            // Work already announced (a task finished while this pass ran):
            // go again at once, without asking for the next deadline.
            let mut wake = std::pin::pin!(async {
                tokio::select! {
                    () = notifier.notified(Topic::Scheduler) => {}
                    () = crate::nudged(self.config.nudge.as_deref()) => {}
                }
            });
            if futures_util::FutureExt::now_or_never(wake.as_mut()).is_some() {
                timer_fired = false;
                if !self.spaced(started, &shutdown).await {
                    return Ok(());
                }
                continue;
            }
            let deadline = match self.store.next_deadline(self.config.scope.clone()).await {
                Ok(d) => d.unwrap_or(self.config.safety_net).min(self.config.safety_net),
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the next deadline");
                    self.config.safety_net
                }
            };
            // A deadline already due that the last pass could not act on
            // (e.g. a run whose definition fails to load) must not spin.
            let floor = if idle {
                Duration::from_millis(50)
            } else {
                Duration::from_millis(1)
            };
            // Leases expire strictly after their deadline: wake just past it.
            let sleep = (deadline + Duration::from_millis(2)).max(floor);
            timer_fired = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = wake => false,
                () = tokio::time::sleep(sleep) => true,
            };
            if !timer_fired && !self.spaced(started, &shutdown).await {
                return Ok(());
            }
        }
    }

    /// Waits out the rest of the pass spacing after a pass that started at
    /// `started`; false if the loop is shutting down.
    async fn spaced(&self, started: Instant, shutdown: &CancellationToken) -> bool {
        let Some(rest) = self.config.pass_spacing.checked_sub(started.elapsed()) else {
            return true;
        };
        tokio::select! {
            () = shutdown.cancelled() => false,
            () = tokio::time::sleep(rest) => true,
        }
    }

    /// The store this scheduler drives.
    pub fn store(&self) -> &S {
        &self.store
    }
}
