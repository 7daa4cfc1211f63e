//! The engine: the use cases (publish, start, cancel, report) and the loops
//! (scheduler, outbox publisher, worker) composed over any store and queue.
//! Embedded mode is this engine over SQLite and the in-process queue; the
//! same code drives PostgreSQL.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowforge_domain::limits::Limits;
use flowforge_domain::{Priority, RunState, WorkflowDefinition};
use flowforge_ports::store::{CancelOutcome, Published};
use flowforge_ports::{DispatchPublisher, DispatchQueue, Observer, RunId, RunSet, Scope, Store, WorkerId, WorkflowId};
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::after_commit::AfterCommit;
use crate::cache::DefinitionCache;
use crate::error::Error;
use crate::observers::Observers;
use crate::publisher::{OutboxPublisher, PublisherConfig};
use crate::registry::{HandlerRegistry, panic_message};
use crate::report::RunReport;
use crate::scheduler::{CancelHook, Scheduler, SchedulerConfig};
use crate::service::{Service, TaskTypes};
use crate::worker::{Worker, WorkerConfig};

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker slots.
    pub concurrency: usize,
    /// Lease length (heartbeat every third).
    pub lease: Duration,
    /// How this process names itself as a worker.
    pub worker_id: WorkerId,
    /// The size limits of run inputs, task outputs and task inputs
    /// (docs/design/data-flow.md#limits).
    pub limits: Limits,
    /// How long a cancelled or timed-out handler gets to stop.
    pub stop_grace: Duration,
    /// How long ready work waits to gain one priority level
    /// (docs/design/priorities.md#aging); give the queue the same.
    pub priority_aging: Duration,
    /// Whether the worker pushes the dispatches its finishes hand on into
    /// an in-process queue itself, right after the commit
    /// (docs/design/outbox-and-queues.md#publish-after-commit). `false`
    /// leaves every dispatch to the outbox sweep, so a run can be stepped
    /// by hand: a scheduler pass, a sweep, one delivery at a time.
    pub push_after_commit: bool,
    /// How many tasks in a row a worker slot runs straight from its own
    /// finishes before it takes from the queue again
    /// (docs/design/outbox-and-queues.md#continuing-a-chain); 0 never.
    /// Only with `push_after_commit`.
    pub chain_hops: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            concurrency: std::thread::available_parallelism().map_or(2, usize::from),
            lease: Duration::from_secs(30),
            worker_id: WorkerId(format!("embedded-{}", std::process::id())),
            limits: Limits::default(),
            stop_grace: Duration::from_secs(5),
            priority_aging: flowforge_ports::store::DEFAULT_PRIORITY_AGING,
            push_after_commit: true,
            chain_hops: crate::worker::DEFAULT_CHAIN_HOPS,
        }
    }
}

/// The loops serving one scope; stop them with [`Serving::stop`].
#[derive(Debug)]
pub struct Serving {
    shutdown: CancellationToken,
    tasks: JoinSet<Result<(), Error>>,
    // Which loop each task is, so a panic names the loop that panicked.
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Serving {
    /// Stops consuming, lets in-flight attempts finish, and waits for every
    /// loop. Returns the first loop error, if any.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.shutdown.cancel();
        let mut result = Ok(());
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(e) = self.outcome(joined)
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
            Some(joined) => self.outcome(joined).and(Err(Error::LoopStopped)),
            None => std::future::pending().await,
        }
    }

    fn spawn<F>(&mut self, name: &'static str, run: F)
    where
        F: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let handle = self.tasks.spawn(run);
        self.names.insert(handle.id(), name);
    }

    /// What a loop's end means: its own error, or its panic named.
    fn outcome(&self, joined: Result<Result<(), Error>, tokio::task::JoinError>) -> Result<(), Error> {
        match joined {
            Ok(result) => result,
            Err(e) => Err(Error::LoopPanicked {
                what: self.names.get(&e.id()).copied().unwrap_or("loop"),
                message: if e.is_panic() {
                    panic_message(e.into_panic().as_ref())
                } else {
                    "it was aborted".to_owned()
                },
            }),
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
            Err(e) => Err(Error::LoopPanicked {
                what: "loop supervisor",
                message: if e.is_panic() {
                    panic_message(e.into_panic().as_ref())
                } else {
                    "it was aborted".to_owned()
                },
            }),
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

/// A FlowForge engine over a store `S` and a queue `Q`.
pub struct Engine<S: Store, Q> {
    service: Service<S>,
    store: S,
    queue: Q,
    defs: Arc<DefinitionCache<S>>,
    registry: Arc<HandlerRegistry>,
    observers: Observers,
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
        let mut set = Observers::default();
        for o in observers {
            set.push(o);
        }
        let registry = Arc::new(registry);
        let mut worker_config = WorkerConfig::new(config.worker_id.clone(), config.concurrency);
        worker_config.lease = config.lease;
        worker_config.limits = config.limits;
        worker_config.stop_grace = config.stop_grace;
        worker_config.chain_hops = config.chain_hops;
        // An in-process queue takes a finish's dispatches straight from the
        // finishing slot, so a chain's hop waits for no sweep
        // (docs/design/outbox-and-queues.md#publish-after-commit); a broker's
        // are left to this engine's sweep.
        if config.push_after_commit {
            worker_config.after_commit = AfterCommit::pushing(queue.clone());
        }
        let worker = Arc::new(Worker::new(
            store.clone(),
            queue.clone(),
            Arc::clone(&defs),
            Arc::clone(&registry),
            set.clone(),
            worker_config,
        ));
        Self {
            service: Service::with_cache(store.clone(), Arc::clone(&defs)).with_limits(config.limits),
            store,
            queue,
            defs,
            registry,
            observers: set,
            worker,
            driver: Driver::default(),
            config,
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The use cases over this engine's store (wait, report, list, close
    /// and the rest), sharing its definition cache.
    pub fn service(&self) -> &Service<S> {
        &self.service
    }

    /// The handler registry.
    pub fn registry(&self) -> &HandlerRegistry {
        &self.registry
    }

    /// Publishes a definition whose task types all have handlers here
    /// ([`Service::publish`] with the registered types).
    pub async fn publish(&self, def: &WorkflowDefinition) -> Result<Published, Error> {
        let known = TaskTypes::Registered(self.registry.task_types().map(str::to_owned).collect());
        self.service.publish(def, &known).await
    }

    /// Starts a run of a published definition at the default priority
    /// ([`Service::start`]).
    pub async fn start(&self, workflow: WorkflowId, input: Value) -> Result<RunId, Error> {
        self.service
            .start(workflow, input, Priority::DEFAULT)
            .await
            .map(|run| run.id)
    }

    /// Starts a run of a published definition at `priority`
    /// (docs/design/priorities.md).
    pub async fn start_with_priority(
        &self,
        workflow: WorkflowId,
        input: Value,
        priority: Priority,
    ) -> Result<RunId, Error> {
        self.service.start(workflow, input, priority).await.map(|run| run.id)
    }

    /// Requests cancellation of `run` ([`Service::cancel`]) and stops its
    /// handlers running here at once.
    pub async fn cancel(&self, run: RunId) -> Result<CancelOutcome, Error> {
        let outcome = self.service.cancel(run).await?;
        self.worker.cancel_run_locally(run);
        Ok(outcome)
    }

    /// Retries a failed or cancelled run in place ([`Service::retry`],
    /// docs/design/retry.md); a serving engine then runs its retry set.
    pub async fn retry(&self, run: RunId, from: &[String], dry_run: bool) -> Result<crate::Retry, Error> {
        self.service.retry(run, from, dry_run).await
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
                output_limit: self.config.limits.task_output_bytes,
                on_limit_cancel: Some(CancelHook::new({
                    let worker = Arc::clone(&self.worker);
                    move |run| {
                        worker.cancel_run_locally(run);
                    }
                })),
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
                aging: self.config.priority_aging,
                // This engine's worker holds no rows: it pushes them
                // committed published, or leaves them to this sweep.
                holds: None,
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
        let mut serving = Serving {
            shutdown: shutdown.clone(),
            tasks: JoinSet::new(),
            names: HashMap::new(),
        };
        let scheduler = self.scheduler_nudged(scope.clone(), scheduler_nudge);
        let token = shutdown.clone();
        serving.spawn("scheduler", async move { scheduler.run(token).await });
        let publisher = self.publisher_nudged(scope, publisher_nudge);
        let token = shutdown.clone();
        serving.spawn("outbox publisher", async move { publisher.run(token).await });
        let worker = Arc::clone(&self.worker);
        serving.spawn("worker", async move { worker.run(shutdown).await });
        serving
    }

    /// Waits until `run` is in a terminal state ([`Service::wait`]).
    pub async fn wait(&self, run: RunId) -> Result<RunState, Error> {
        self.service.wait(run).await
    }

    /// The report of `run` ([`Service::report`]).
    pub async fn report(&self, run: RunId) -> Result<RunReport, Error> {
        self.service.report(run).await
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
                Err(failed.ok().and_then(|e| e.clone()).unwrap_or(Error::LoopStopped))
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
                    let _ = report.send(Some(ended.err().unwrap_or(Error::LoopStopped)));
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
