//! The use cases every front end shares — publish, start, cancel, wait,
//! report, list and close — so the CLI, the embedding facade and the HTTP
//! API each go through one door per use case, over any store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_domain::concurrency;
use flowforge_domain::limits::{self, Limits, ValueKind};
use flowforge_domain::retry::{Reset, RetryRefusal, hold_at_gates, hold_conditions, reset_set};
use flowforge_domain::{Priority, RunState, TaskRunState, WorkflowDefinition};
use flowforge_ports::store::{
    CancelOutcome, DefinitionSummary, EventView, Gauges, IdempotencyKey, KeyedStart, NewRun, Notifier, Published,
    RunQuery, StartOptions, Topic,
};
use flowforge_ports::{RunId, RunSummary, Scope, Store, WorkerInfo, WorkflowId};
use serde_json::Value;

use crate::builtins::BUILTIN_TYPES;
use crate::cache::DefinitionCache;
use crate::error::Error;
use crate::observers::Observers;
use crate::report::RunReport;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// How recently a worker must have been seen to count as live.
pub const LIVE_WORKER_WINDOW: Duration = Duration::from_secs(90);

/// How often a waiter re-reads a run it was not woken for: a notification
/// can be missed across a reconnect.
const WAIT_RECHECK: Duration = Duration::from_secs(2);

/// Which task types a definition may use when it is published.
#[derive(Debug, Clone)]
pub enum TaskTypes {
    /// These (the handlers registered in this process) and those a live
    /// remote worker serves.
    Registered(BTreeSet<String>),
    /// The built-in types every worker serves (all but `command`) and
    /// those a live worker serves (the distributed mode: the workers run
    /// elsewhere).
    LiveWorkers,
}

/// How [`Service::close`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The run had already ended in this state.
    AlreadyEnded(RunState),
    /// The run ended in this state.
    Ended(RunState),
    /// Cancellation is requested; a task is still running and stops when
    /// its worker sees the request or its lease runs out.
    StillStopping,
}

/// What [`Service::retry`] decided and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// The run's generation after the retry (for a dry run: the one it
    /// would open).
    pub generation: u32,
    /// The retry set, in dependency order, with each task's `reset` edge.
    pub resets: Vec<Reset>,
    /// False for a dry run: nothing was written.
    pub applied: bool,
}

/// The use cases over one store.
#[derive(Debug)]
pub struct Service<S: Store> {
    store: S,
    defs: Arc<DefinitionCache<S>>,
    limits: Limits,
}

impl<S: Store> Clone for Service<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            defs: Arc::clone(&self.defs),
            limits: self.limits,
        }
    }
}

/// Checks that every task type of `def` (compensators included) is in
/// `known`, naming the unknown ones.
pub fn check_task_types(def: &WorkflowDefinition, known: &BTreeSet<String>) -> Result<(), Error> {
    let unknown: BTreeSet<String> = def
        .tasks()
        .iter()
        .map(|t| t.task_type())
        .filter(|t| !known.contains(*t))
        .map(str::to_owned)
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(Error::UnknownTaskTypes {
        types: unknown.into_iter().collect(),
        known_hint: format!(
            "known types are {}",
            known.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
        ),
    })
}

impl<S: Store> Service<S> {
    /// The use cases over `store`, with a definition cache of their own.
    pub fn new(store: S) -> Self {
        let defs = Arc::new(DefinitionCache::new(store.clone()));
        Self::with_cache(store, defs)
    }

    /// The use cases over `store`, sharing `defs` with the loops.
    pub fn with_cache(store: S, defs: Arc<DefinitionCache<S>>) -> Self {
        Self {
            store,
            defs,
            limits: Limits::default(),
        }
    }

    /// The same use cases holding run inputs to `limits`.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The definition cache the use cases and loops share.
    pub fn definitions(&self) -> &Arc<DefinitionCache<S>> {
        &self.defs
    }

    /// Publishes `def` if every task type is one of `types`. Idempotent by
    /// content; a different definition under a published (name, version)
    /// is a conflict.
    pub async fn publish(&self, def: &WorkflowDefinition, types: &TaskTypes) -> Result<Published, Error> {
        self.check_types(def, types).await?;
        let published = self.store.publish_definition(def).await?;
        self.defs.insert(published.clone());
        Ok(published)
    }

    /// Checks that every task type of `def` is one of `types`: registered
    /// here, or (distributed) a built-in or served by a live worker.
    pub async fn check_types(&self, def: &WorkflowDefinition, types: &TaskTypes) -> Result<(), Error> {
        match types {
            TaskTypes::Registered(known) => {
                if check_task_types(def, known).is_ok() {
                    return Ok(());
                }
                // A type no handler here serves may be served by a remote
                // worker polling this store (docs/design/handlers.md#remote-workers).
                let mut known = known.clone();
                known.extend(self.store.live_task_types(LIVE_WORKER_WINDOW).await?);
                check_task_types(def, &known)
            }
            TaskTypes::LiveWorkers => {
                // Every worker serves the built-ins but `command`, which
                // one serves only with `--allow-command`.
                let always = |t: &str| t != "command" && BUILTIN_TYPES.contains(&t);
                if def.tasks().iter().all(|t| always(t.task_type())) {
                    // Nothing to ask the store: any live worker serves them.
                    return Ok(());
                }
                let mut known: BTreeSet<String> = BUILTIN_TYPES
                    .iter()
                    .filter(|t| always(t))
                    .map(|t| (*t).to_owned())
                    .collect();
                known.extend(self.store.live_task_types(LIVE_WORKER_WINDOW).await?);
                check_task_types(def, &known)
            }
        }
    }

    /// Starts a run of a published definition at `priority`
    /// (docs/design/priorities.md). An input that cannot be stored or is
    /// larger than `max_run_input_bytes` is refused ([`Error::Refused`])
    /// before anything is written.
    ///
    /// The definition's concurrency limits are resolved against the input
    /// here (docs/design/concurrency.md): a key without one value refuses
    /// the start ([`Error::ConcurrencyKeyUnresolved`]).
    pub async fn start(&self, workflow: WorkflowId, input: Value, priority: Priority) -> Result<NewRun, Error> {
        let options = self.start_options(workflow, &input, priority).await?;
        let run = self.store.start_run_with(workflow, input, &options).await?;
        self.count_start(workflow).await;
        Ok(run)
    }

    /// Checks the input and resolves what a start of `workflow` needs.
    pub(crate) async fn start_options(
        &self,
        workflow: WorkflowId,
        input: &Value,
        priority: Priority,
    ) -> Result<StartOptions, Error> {
        limits::check_value(ValueKind::RunInput, input, self.limits.run_input_bytes)?;
        let published = self.defs.get(workflow).await?;
        let gates = concurrency::resolve(&published.definition, input)?;
        Ok(StartOptions { priority, gates })
    }

    /// Starts a run under a client's idempotency key: a second call with
    /// the same key starts nothing and names the first run
    /// ([`KeyedStart::Replayed`], or [`KeyedStart::Reused`] when its
    /// request differed). The input is checked first, as in [`Service::start`].
    pub async fn start_keyed(
        &self,
        workflow: WorkflowId,
        input: Value,
        priority: Priority,
        key: &IdempotencyKey,
    ) -> Result<KeyedStart, Error> {
        let options = self.start_options(workflow, &input, priority).await?;
        let started = self.store.start_run_keyed(workflow, input, &options, key).await?;
        if matches!(started, KeyedStart::Started(_)) {
            self.count_start(workflow).await;
        }
        Ok(started)
    }

    /// Counts a start under its workflow's name (from the cache: the
    /// definition was just read to start the run).
    async fn count_start(&self, workflow: WorkflowId) {
        if let Ok(published) = self.defs.get(workflow).await {
            crate::metrics::run_started(published.definition.name());
        }
    }

    /// The published definition `name` at `version`, or its latest version.
    pub async fn find(&self, name: &str, version: Option<u32>) -> Result<Published, Error> {
        // "Latest" can change (another process may publish a version), so
        // it is asked every time; a (name, version) never changes, so what
        // it names is asked once.
        let version = match version {
            Some(v) => v,
            None => self
                .store
                .list_definitions(Some(name))
                .await?
                .first()
                .map(|d| d.version)
                .ok_or_else(|| Error::WorkflowNotFound {
                    name: name.to_owned(),
                    version: None,
                })?,
        };
        if let Some(published) = self.defs.named(name, version) {
            return Ok(published.as_ref().clone());
        }
        let published = self
            .store
            .find_definition(name, version)
            .await?
            .ok_or_else(|| Error::WorkflowNotFound {
                name: name.to_owned(),
                version: Some(version),
            })?;
        self.defs.insert(published.clone());
        Ok(published)
    }

    /// The published definitions (all, or the versions of `name`), by
    /// name then version, newest first.
    pub async fn definitions_list(&self, name: Option<&str>) -> Result<Vec<DefinitionSummary>, Error> {
        Ok(self.store.list_definitions(name).await?)
    }

    /// A page of runs, newest first (keyset: see [`RunQuery`]).
    pub async fn page(&self, query: &RunQuery) -> Result<Vec<RunSummary>, Error> {
        Ok(self.store.list_runs_page(query).await?)
    }

    /// One run's summary.
    pub async fn summary(&self, run: RunId) -> Result<RunSummary, Error> {
        self.store.run_summary(run).await?.ok_or(Error::RunNotFound(run))
    }

    /// The run's events after sequence number `after`, at most `limit`.
    pub async fn events(&self, run: RunId, after: u64, limit: u32) -> Result<Vec<EventView>, Error> {
        Ok(self.store.run_events(run, after, limit).await?)
    }

    /// Every attempt of one task of `run`, oldest first; `Ok(None)` when
    /// the run has no such task.
    pub async fn attempts(&self, run: RunId, task: &str) -> Result<Option<Vec<crate::attempts::Attempt>>, Error> {
        let detail = self.store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        Ok(crate::attempts::attempts(&detail, task))
    }

    /// The registered workers, most recently seen first.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>, Error> {
        Ok(self.store.list_workers().await?)
    }

    /// Counts of active work, for gauges.
    pub async fn gauges(&self) -> Result<Gauges, Error> {
        Ok(self.store.gauges().await?)
    }

    /// Whether the store is reachable and migrated.
    pub async fn ready(&self) -> Result<(), Error> {
        Ok(self.store.ready().await?)
    }

    /// Requests cancellation of `run`: waiting tasks are cancelled by the
    /// next scheduler pass, running ones when their worker sees it.
    pub async fn cancel(&self, run: RunId) -> Result<CancelOutcome, Error> {
        self.store.request_cancel(run).await?.ok_or(Error::RunNotFound(run))
    }

    /// Retries a failed or cancelled run (docs/design/retry.md): decides the
    /// retry set from the run's stored tasks and `from` (empty: every failed
    /// or cancelled task), then, unless `dry_run`, opens the run's next
    /// generation in one store call. The run keeps its id; nothing outside
    /// the set changes. Of two concurrent retries exactly one applies; the
    /// other gets [`Error::RetryLost`] or [`Error::RunNotRetryable`].
    pub async fn retry(&self, run: RunId, from: &[String], dry_run: bool) -> Result<Retry, Error> {
        let detail = self.store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        let state = detail.summary.state;
        if !matches!(state, RunState::Failed | RunState::Cancelled) {
            return Err(Error::RunNotRetryable { run, state });
        }
        let published = self.defs.get(detail.summary.workflow_id).await?;
        let states: BTreeMap<&str, TaskRunState> = detail
            .tasks
            .iter()
            .filter(|t| t.compensate_for.is_none())
            .map(|t| (t.key.as_str(), t.state))
            .collect();
        let compensated: BTreeSet<&str> = crate::report::standing_compensators(&detail.tasks)
            .filter_map(|c| c.compensate_for.as_deref())
            .collect();
        let def = &published.definition;
        let trigger = |key: &str| def.task(key).map(|t| t.trigger()).unwrap_or_default();
        let mut resets = reset_set(def.graph(), trigger, &states, &compensated, from)
            .map_err(|refusal| Error::RetryRefused { run, refusal })?;
        if let Some(mapped) = resets
            .iter()
            .find(|r| def.task_of_run(&r.key).is_some_and(|(t, _)| t.map().is_some()))
        {
            let refusal = RetryRefusal::Mapped(mapped.key.clone());
            return Err(Error::RetryRefused { run, refusal });
        }
        hold_conditions(&mut resets, |key| def.task(key).is_some_and(|t| t.holds()));
        // The input is the one the run started with, so its keys resolve
        // to the pools it held before (docs/design/concurrency.md#retries).
        let gates = hold_at_gates(&mut resets, concurrency::resolve(&published.definition, &detail.input)?);
        let current = detail.summary.generation;
        if dry_run {
            return Ok(Retry {
                generation: current + 1,
                resets,
                applied: false,
            });
        }
        match self.store.resume_run(run, state, current, &resets, &gates).await? {
            Some(generation) => {
                tracing::info!(run_id = %run, generation, tasks = resets.len(), "run retried");
                Ok(Retry {
                    generation,
                    resets,
                    applied: true,
                })
            }
            None => Err(Error::RetryLost(run)),
        }
    }

    /// Waits until `run` is terminal, driven by whichever loops serve it:
    /// woken by the store's run-settled notifications.
    pub async fn wait(&self, run: RunId) -> Result<RunState, Error> {
        // Listening first, then reading: a run that settles in between
        // leaves a kept notification.
        let notifier = self.store.notifier().await?;
        loop {
            let state = self.state(run).await?;
            if state.is_terminal() {
                return Ok(state);
            }
            tokio::select! {
                () = notifier.notified(Topic::RunSettled) => {}
                () = tokio::time::sleep(WAIT_RECHECK) => {}
            }
        }
    }

    /// The report of `run`.
    pub async fn report(&self, run: RunId) -> Result<RunReport, Error> {
        let detail = self.store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        let published = self.defs.get(detail.summary.workflow_id).await?;
        Ok(RunReport::new(&detail, &published.definition))
    }

    /// The `limit` most recent runs, newest first.
    pub async fn list(&self, limit: u32) -> Result<Vec<RunSummary>, Error> {
        Ok(self.store.list_runs(limit).await?)
    }

    /// Cancels `run` and drives it to its end from here, for a run whose
    /// process may be gone: scheduler passes are safe to race with a live
    /// scheduler. Gives up after `patience` (a running task's lease, say)
    /// with [`Closed::StillStopping`].
    pub async fn close(&self, run: RunId, patience: Duration) -> Result<Closed, Error> {
        if let CancelOutcome::AlreadyFinished(state) = self.cancel(run).await? {
            return Ok(Closed::AlreadyEnded(state));
        }
        let scheduler = Scheduler::new(
            self.store.clone(),
            Arc::clone(&self.defs),
            Observers::default(),
            SchedulerConfig {
                scope: Scope::Run(run),
                output_limit: self.limits.task_output_bytes,
                ..SchedulerConfig::default()
            },
        );
        let give_up = Instant::now() + patience;
        loop {
            scheduler.schedule_once().await?;
            let state = self.state(run).await?;
            if state.is_terminal() {
                return Ok(Closed::Ended(state));
            }
            if Instant::now() >= give_up {
                return Ok(Closed::StillStopping);
            }
            let wait = self
                .store
                .next_deadline(Scope::Run(run))
                .await?
                .unwrap_or(Duration::from_secs(1));
            tokio::time::sleep(wait.clamp(Duration::from_millis(100), Duration::from_secs(1))).await;
        }
    }

    async fn state(&self, run: RunId) -> Result<RunState, Error> {
        let detail = self.store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        Ok(detail.summary.state)
    }
}
