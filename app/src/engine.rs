//! The engine: the use cases (publish, start, cancel, report) and the loops
//! (scheduler, outbox publisher, worker) composed over any store and queue.
//! Embedded mode is this engine over SQLite and the in-process queue; the
//! same code drives PostgreSQL.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowforge_domain::{RunState, WorkflowDefinition};
use flowforge_ports::store::{CancelOutcome, Published};
use flowforge_ports::{
    DispatchPublisher, DispatchQueue, Observer, RunEvent, RunId, RunSet, Scope, Store, WorkerId, WorkflowId,
};
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cache::DefinitionCache;
use crate::error::Error;
use crate::observers::Observers;
use crate::publisher::{OutboxPublisher, PublisherConfig};
use crate::registry::HandlerRegistry;
use crate::report::RunReport;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::worker::{Worker, WorkerConfig};

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

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker slots.
    pub concurrency: usize,
    /// Lease length (heartbeat every third).
    pub lease: Duration,
    /// How this process names itself as a worker.
    pub worker_id: WorkerId,
    /// The largest task output, in bytes.
    pub output_limit: usize,
    /// How long a cancelled or timed-out handler gets to stop.
    pub stop_grace: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            concurrency: std::thread::available_parallelism().map_or(2, usize::from),
            lease: Duration::from_secs(30),
            worker_id: WorkerId(format!("embedded-{}", std::process::id())),
            output_limit: crate::worker::DEFAULT_OUTPUT_LIMIT,
            stop_grace: Duration::from_secs(5),
        }
    }
}

/// Wakes the callers waiting for runs to settle.
#[derive(Default)]
struct Waiters(Mutex<HashMap<RunId, Vec<tokio::sync::oneshot::Sender<RunState>>>>);

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Vec<tokio::sync::oneshot::Sender<RunState>>>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Observer for Waiters {
    fn on_workflow_done(&self, event: &RunEvent) {
        for tx in self.lock().remove(&event.run_id).unwrap_or_default() {
            let _ = tx.send(event.state);
        }
    }
}

/// The loops serving one scope; stop them with [`Serving::stop`].
#[derive(Debug)]
pub struct Serving {
    shutdown: CancellationToken,
    tasks: JoinSet<Result<(), Error>>,
}

impl Serving {
    /// Stops consuming, lets in-flight attempts finish, and waits for every
    /// loop. Returns the first loop error, if any.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.shutdown.cancel();
        let mut result = Ok(());
        while let Some(joined) = self.tasks.join_next().await {
            if let Ok(Err(e)) = joined
                && result.is_ok()
            {
                result = Err(e);
            }
        }
        result
    }

    /// Resolves when a loop ends on its own (an unrecoverable error).
    pub async fn failed(&mut self) -> Result<(), Error> {
        match self.tasks.join_next().await {
            Some(Ok(result)) => result,
            Some(Err(e)) => Err(Error::Store(flowforge_ports::StoreError::Other(format!(
                "a loop panicked: {e}"
            )))),
            None => std::future::pending().await,
        }
    }
}

/// The loops [`Engine::run`] shares: started by the first run in flight,
/// stopped after the last. Concurrent runs of one engine so share one
/// scheduler, one outbox publisher and the engine's `concurrency` worker
/// slots, and a store notification wakes the one loop that has the work.
#[derive(Default)]
struct Driver {
    runs: RunSet,
    // One each: `notify_one` wakes a single waiter, and a run that joins
    // may have had its start seen by both loops before it was in scope.
    nudge_scheduler: Arc<Notify>,
    nudge_publisher: Arc<Notify>,
    // Held only for synchronous steps, so joining, leaving and a dropped
    // run's guard each see the set and the loops change together.
    loops: Mutex<Option<Driving>>,
}

struct Driving {
    stop: CancellationToken,
    done: tokio::task::JoinHandle<Result<(), Error>>,
    failed: watch::Receiver<Option<Error>>,
}

impl Driver {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Driving>> {
        self.loops.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `run` out; hands back the loops, told to stop, when it was
    /// the last run.
    fn leave(&self, run: RunId) -> Option<Driving> {
        let mut loops = self.lock();
        self.runs.remove(run);
        let last = if self.runs.is_empty() { loops.take() } else { None };
        if let Some(driving) = &last {
            driving.stop.cancel();
        }
        last
    }
}

impl Driving {
    /// Waits for stopped loops; their error, if they failed.
    async fn stopped(self) -> Result<(), Error> {
        match self.done.await {
            Ok(result) => result,
            Err(e) => Err(Error::Store(flowforge_ports::StoreError::Other(format!(
                "the engine's loops panicked: {e}"
            )))),
        }
    }
}

/// Takes a run out of the driver if [`Engine::run`] is dropped before it
/// finishes (a caller's timeout, say), so its loops do not serve it on.
struct Leave<'a> {
    driver: &'a Driver,
    run: RunId,
    armed: bool,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Told to stop; nobody is left to wait for them.
            drop(self.driver.leave(self.run));
        }
    }
}

fn loops_stopped() -> Error {
    Error::Store(flowforge_ports::StoreError::Other(
        "the engine's loops stopped unexpectedly".into(),
    ))
}

/// A FlowForge engine over a store `S` and a queue `Q`.
pub struct Engine<S: Store, Q> {
    store: S,
    queue: Q,
    defs: Arc<DefinitionCache<S>>,
    registry: Arc<HandlerRegistry>,
    observers: Observers,
    waiters: Arc<Waiters>,
    worker: Arc<Worker<S, Q>>,
    driver: Driver,
    config: EngineConfig,
}

impl<S: Store, Q> std::fmt::Debug for Engine<S, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("registry", &self.registry)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, Q> Engine<S, Q>
where
    S: Store,
    Q: DispatchQueue + DispatchPublisher + Clone,
{
    /// An engine running `registry`'s handlers, telling `observers`.
    pub fn new(
        store: S,
        queue: Q,
        registry: HandlerRegistry,
        observers: Vec<Arc<dyn Observer>>,
        config: EngineConfig,
    ) -> Self {
        let defs = Arc::new(DefinitionCache::new(store.clone()));
        let waiters = Arc::new(Waiters::default());
        let mut set = Observers::default();
        for o in observers {
            set.push(o);
        }
        set.push(waiters.clone());
        let registry = Arc::new(registry);
        let mut worker_config = WorkerConfig::new(config.worker_id.clone(), config.concurrency);
        worker_config.lease = config.lease;
        worker_config.output_limit = config.output_limit;
        worker_config.stop_grace = config.stop_grace;
        let worker = Arc::new(Worker::new(
            store.clone(),
            queue.clone(),
            Arc::clone(&defs),
            Arc::clone(&registry),
            set.clone(),
            worker_config,
        ));
        Self {
            store,
            queue,
            defs,
            registry,
            observers: set,
            waiters,
            worker,
            driver: Driver::default(),
            config,
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The handler registry.
    pub fn registry(&self) -> &HandlerRegistry {
        &self.registry
    }

    /// Publishes a definition whose task types all have handlers here.
    /// Idempotent by content; a different definition under a published
    /// (name, version) is a conflict.
    pub async fn publish(&self, def: &WorkflowDefinition) -> Result<Published, Error> {
        let known: BTreeSet<String> = self.registry.task_types().map(str::to_owned).collect();
        check_task_types(def, &known)?;
        let published = self.store.publish_definition(def).await?;
        self.defs.insert(published.clone());
        Ok(published)
    }

    /// Starts a run of a published definition.
    pub async fn start(&self, workflow: WorkflowId, input: Value) -> Result<RunId, Error> {
        Ok(self.store.start_run(workflow, input).await?)
    }

    /// Requests cancellation of `run` and stops its handlers running here.
    pub async fn cancel(&self, run: RunId) -> Result<CancelOutcome, Error> {
        let outcome = self.store.request_cancel(run).await?.ok_or(Error::RunNotFound(run))?;
        self.worker.cancel_run_locally(run);
        Ok(outcome)
    }

    /// A scheduler over `scope`, sharing this engine's definitions and
    /// observers (for stepping a run by hand, e.g. in tests).
    pub fn scheduler(&self, scope: Scope) -> Scheduler<S> {
        self.scheduler_nudged(scope, None)
    }

    fn scheduler_nudged(&self, scope: Scope, nudge: Option<Arc<Notify>>) -> Scheduler<S> {
        Scheduler::new(
            self.store.clone(),
            Arc::clone(&self.defs),
            self.observers.clone(),
            SchedulerConfig {
                scope,
                nudge,
                ..SchedulerConfig::default()
            },
        )
    }

    /// An outbox publisher over `scope` into this engine's queue.
    pub fn publisher(&self, scope: Scope) -> OutboxPublisher<S, Q> {
        self.publisher_nudged(scope, None)
    }

    fn publisher_nudged(&self, scope: Scope, nudge: Option<Arc<Notify>>) -> OutboxPublisher<S, Q> {
        OutboxPublisher::new(
            self.store.clone(),
            self.queue.clone(),
            PublisherConfig {
                scope,
                nudge,
                ..PublisherConfig::default()
            },
        )
    }

    /// This engine's worker.
    pub fn worker(&self) -> &Arc<Worker<S, Q>> {
        &self.worker
    }

    /// This engine's queue.
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    /// Starts the scheduler, the outbox publisher and the worker slots for
    /// `scope` (`Scope::Run` drives only that run; the worker serves
    /// whatever this engine's publisher dispatches).
    pub fn serve(&self, scope: Scope) -> Serving {
        self.serve_nudged(scope, None, None)
    }

    fn serve_nudged(
        &self,
        scope: Scope,
        scheduler_nudge: Option<Arc<Notify>>,
        publisher_nudge: Option<Arc<Notify>>,
    ) -> Serving {
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let scheduler = self.scheduler_nudged(scope.clone(), scheduler_nudge);
        let token = shutdown.clone();
        tasks.spawn(async move { scheduler.run(token).await });
        let publisher = self.publisher_nudged(scope, publisher_nudge);
        let token = shutdown.clone();
        tasks.spawn(async move { publisher.run(token).await });
        let worker = Arc::clone(&self.worker);
        let token = shutdown.clone();
        tasks.spawn(async move { worker.run(token).await });
        Serving { shutdown, tasks }
    }

    /// Waits until `run` is in a terminal state (served by some loop).
    pub async fn wait(&self, run: RunId) -> Result<RunState, Error> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiters.lock().entry(run).or_default().push(tx);
        // Registered first, then checked: a run that settled in between is
        // seen by the check, one that settles later wakes the channel.
        let detail = self.store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        let state = detail.summary.state;
        if matches!(state, RunState::Succeeded | RunState::Failed | RunState::Cancelled) {
            self.waiters.lock().remove(&run);
            return Ok(state);
        }
        rx.await
            .map_err(|_| Error::Store(flowforge_ports::StoreError::Other("the engine stopped".into())))
    }

    /// The report of `run`.
    pub async fn report(&self, run: RunId) -> Result<RunReport, Error> {
        let detail = self.store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        let published = self.defs.get(detail.summary.workflow_id).await?;
        Ok(RunReport::new(&detail, &published.definition))
    }

    /// Publishes `def`, runs it with `input` to the end in this process, and
    /// returns its report. Only the runs started here are driven; runs
    /// started concurrently through one engine share its loops and its
    /// `concurrency` worker slots.
    pub async fn run(&self, def: &WorkflowDefinition, input: Value) -> Result<RunReport, Error> {
        let published = self.publish(def).await?;
        let run = self.start(published.id, input).await?;
        let mut leave = Leave {
            driver: &self.driver,
            run,
            armed: true,
        };
        let mut failed = self.drive(run);
        let settled = tokio::select! {
            settled = self.wait(run) => settled,
            failed = failed.wait_for(Option::is_some) => {
                Err(failed.ok().and_then(|e| e.clone()).unwrap_or_else(loops_stopped))
            }
        };
        leave.armed = false;
        let stopped = match self.driver.leave(run) {
            Some(driving) => driving.stopped().await,
            None => Ok(()),
        };
        settled?;
        stopped?;
        self.report(run).await
    }

    /// Adds `run` to the shared loops, starting them if none are running
    /// (or the last ones failed); returns where a loop failure shows.
    fn drive(&self, run: RunId) -> watch::Receiver<Option<Error>> {
        let mut loops = self.driver.lock();
        self.driver.runs.insert(run);
        if let Some(driving) = loops.as_ref()
            && driving.failed.borrow().is_none()
        {
            self.driver.nudge_scheduler.notify_one();
            self.driver.nudge_publisher.notify_one();
            return driving.failed.clone();
        }
        let mut serving = self.serve_nudged(
            Scope::Runs(self.driver.runs.clone()),
            Some(Arc::clone(&self.driver.nudge_scheduler)),
            Some(Arc::clone(&self.driver.nudge_publisher)),
        );
        let stop = CancellationToken::new();
        let (report, failed) = watch::channel(None);
        let stopping = stop.clone();
        let done = tokio::spawn(async move {
            tokio::select! {
                () = stopping.cancelled() => {}
                ended = serving.failed() => {
                    let _ = report.send(Some(ended.err().unwrap_or_else(loops_stopped)));
                }
            }
            serving.stop().await
        });
        *loops = Some(Driving {
            stop,
            done,
            failed: failed.clone(),
        });
        failed
    }
}
