//! The distributed worker SDK: a program registers its own handlers — the
//! same [`Handler`]s and [`TaskContext`] the embedded engine runs — and
//! serves them from PostgreSQL and RabbitMQ beside `flowforge worker`
//! processes, with the same claims, leases, fencing tokens, heartbeats,
//! cancellation, timeouts and graceful drain (docs/design/handlers.md#the-worker-sdk).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_adapters_rabbit::{DispatchWindow, RabbitConfig, RabbitPublisher, RabbitQueue};
use flowforge_app::after_commit::{self, AfterCommit, DEFAULT_HOLD};
use flowforge_app::cache::DefinitionCache;
use flowforge_app::observers::Observers;
use flowforge_app::process::run_registered;
use flowforge_app::worker::{DEFAULT_CHAIN_HOPS, Worker as EngineWorker, WorkerConfig};
use flowforge_app::{BuiltinOptions, HandlerRegistry};
use flowforge_domain::limits::Limits;
use flowforge_ports::store::WorkerRegistration;
use flowforge_ports::{Handler, HandlerError, Observer, SystemClock, TaskContext, WorkerId};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why a distributed worker could not be built or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A required setting is missing.
    #[error("the worker needs {0}")]
    Missing(&'static str),
    /// The broker settings are invalid.
    #[error("invalid broker settings: {0}")]
    Broker(String),
    /// The store, the queue or a worker loop failed.
    #[error(transparent)]
    Engine(#[from] flowforge_app::Error),
}

/// Builds a distributed [`RunningWorker`]: `Worker::builder()…build().await?.run_until(shutdown)`.
#[derive(Debug)]
pub struct Worker;

impl Worker {
    /// A builder with the built-in task types registered except `command`
    /// (a worker runs programs only when its operator allows it).
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            database: None,
            broker: None,
            queue: None,
            registry: HandlerRegistry::new(),
            builtins: Some(BuiltinOptions::default()),
            observers: Vec::new(),
            concurrency: std::thread::available_parallelism().map_or(2, usize::from),
            lease: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
            limits: Limits::default(),
            id: None,
            pg: PgOptions::default(),
            window: DispatchWindow::default(),
            chain_hops: DEFAULT_CHAIN_HOPS,
        }
    }
}

/// Configures a distributed worker; finish with [`WorkerBuilder::build`].
pub struct WorkerBuilder {
    database: Option<String>,
    broker: Option<String>,
    queue: Option<String>,
    registry: HandlerRegistry,
    builtins: Option<BuiltinOptions>,
    observers: Vec<Arc<dyn Observer>>,
    concurrency: usize,
    lease: Duration,
    stop_grace: Duration,
    limits: Limits,
    id: Option<WorkerId>,
    pg: PgOptions,
    window: DispatchWindow,
    chain_hops: u32,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("queue", &self.queue)
            .field("registry", &self.registry)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// The PostgreSQL store: `postgres://user@host:5432/db` (required).
    pub fn database(mut self, url: impl Into<String>) -> Self {
        self.database = Some(url.into());
        self
    }

    /// The RabbitMQ broker: `amqp://user:password@host:5672/%2f` (required).
    pub fn broker(mut self, url: impl Into<String>) -> Self {
        self.broker = Some(url.into());
        self
    }

    /// The dispatch queue (default `flowforge.tasks`, as `flowforge worker`).
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = Some(name.into());
        self
    }

    /// How many tasks run at once (default: the number of CPUs).
    pub fn concurrency(mut self, slots: usize) -> Self {
        self.concurrency = slots.max(1);
        self
    }

    /// The lease a running task holds (default 30 s; renewed every third).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a cancelled or timed-out handler gets to stop before it is
    /// abandoned (default 5 s).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The size limits of outputs and inputs (defaults: 1 MiB, 16 MiB).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How this worker names itself in leases and `workers list` (default
    /// `host:pid:random`).
    pub fn worker_id(mut self, id: WorkerId) -> Self {
        self.id = Some(id);
        self
    }

    /// The queue's dispatch window, which what this worker publishes right
    /// after its commits keeps to: set it as the publisher's
    /// (`--dispatch-window`; default one per consumer;
    /// docs/design/outbox-and-queues.md#publish-after-commit).
    pub fn dispatch_window(mut self, window: DispatchWindow) -> Self {
        self.window = window;
        self
    }

    /// How many tasks in a row a slot runs straight from its own finishes
    /// before it takes from the queue again (`--chain-hops`; default 16; 0
    /// never; docs/design/outbox-and-queues.md#continuing-a-chain).
    pub fn chain_hops(mut self, hops: u32) -> Self {
        self.chain_hops = hops;
        self
    }

    /// The PostgreSQL pool's settings.
    pub fn pg_options(mut self, options: PgOptions) -> Self {
        self.pg = options;
        self
    }

    /// Registers a [`Handler`] for `task_type`.
    pub fn handler<H: Handler>(mut self, task_type: impl Into<String>, handler: H) -> Self {
        self.registry.register(task_type, handler);
        self
    }

    /// Registers an async function for `task_type`.
    pub fn handler_fn<F, Fut>(mut self, task_type: impl Into<String>, f: F) -> Self
    where
        F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
    {
        self.registry.register_fn(task_type, f);
        self
    }

    /// Registers a blocking function for `task_type`; it runs on a thread
    /// of its own, never on the async runtime.
    pub fn blocking_handler<F>(mut self, task_type: impl Into<String>, f: F) -> Self
    where
        F: Fn(TaskContext) -> Result<Value, HandlerError> + Send + Sync + 'static,
    {
        self.registry.register_blocking(task_type, f);
        self
    }

    /// Adds a lifecycle observer.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Sets how the built-in task types behave (`None`: none registered).
    pub fn builtins(mut self, options: Option<BuiltinOptions>) -> Self {
        self.builtins = options;
        self
    }

    /// Connects to the store (checking its migrations) and validates the
    /// broker settings; the broker is connected by [`RunningWorker::run_until`],
    /// which reconnects as needed.
    pub async fn build(self) -> Result<RunningWorker, WorkerError> {
        let database = self
            .database
            .ok_or(WorkerError::Missing("a database URL (.database)"))?;
        let broker = self.broker.ok_or(WorkerError::Missing("a broker URL (.broker)"))?;
        let mut rabbit = RabbitConfig::new(broker);
        if let Some(queue) = self.queue {
            rabbit.routing_key.clone_from(&queue);
            rabbit.queue = queue;
        }
        let max_task_timeout = rabbit.max_task_timeout();
        rabbit.dispatch_window = self.window;
        let publisher = RabbitPublisher::new(rabbit.clone()).map_err(|e| WorkerError::Broker(e.to_string()))?;
        let queue = RabbitQueue::new(rabbit).map_err(|e| WorkerError::Broker(e.to_string()))?;
        let store = PgStore::connect(&database, Arc::new(SystemClock), self.pg)
            .await
            .map_err(flowforge_app::Error::from)?;
        let mut registry = HandlerRegistry::new();
        if let Some(mut options) = self.builtins {
            options.output_limit = self.limits.task_output_bytes;
            flowforge_app::register_builtins(&mut registry, options);
        }
        registry.extend(self.registry);
        let host = hostname::get()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".to_owned());
        let id = self
            .id
            .unwrap_or_else(|| WorkerId(format!("{host}:{}:{:04x}", std::process::id(), fastrand::u16(..))));
        let mut config = WorkerConfig::new(id.clone(), self.concurrency);
        config.lease = self.lease;
        config.stop_grace = self.stop_grace;
        config.limits = self.limits;
        config.max_task_timeout = Some(max_task_timeout);
        config.chain_hops = self.chain_hops;
        let (after_commit, publishing) = AfterCommit::start(store.clone(), publisher, DEFAULT_HOLD);
        config.after_commit = Some(after_commit);
        let registration = WorkerRegistration {
            id,
            host,
            pid: std::process::id(),
            task_types: registry.task_types().map(str::to_owned).collect(),
            concurrency: u32::try_from(self.concurrency).unwrap_or(u32::MAX),
        };
        let mut observers = Observers::default();
        for o in self.observers {
            observers.push(o);
        }
        let worker = EngineWorker::new(
            store.clone(),
            queue,
            Arc::new(DefinitionCache::new(store.clone())),
            Arc::new(registry),
            observers,
            config,
        );
        Ok(RunningWorker {
            worker: Arc::new(worker),
            store,
            registration,
            publishing,
        })
    }
}

/// A distributed worker ready to serve.
#[derive(Debug)]
pub struct RunningWorker {
    worker: Arc<EngineWorker<PgStore, RabbitQueue>>,
    store: PgStore,
    registration: WorkerRegistration,
    /// Publishes what the worker's successes made ready right after their
    /// commits (docs/design/outbox-and-queues.md#publish-after-commit).
    publishing: JoinHandle<()>,
}

impl RunningWorker {
    /// How this worker names itself.
    pub fn id(&self) -> &WorkerId {
        &self.registration.id
    }

    /// The task types it serves.
    pub fn task_types(&self) -> &[String] {
        &self.registration.task_types
    }

    /// Registers the worker and serves dispatches until `shutdown`
    /// resolves; then each slot finishes and acknowledges the task it is
    /// running, the worker is marked stopped, and this returns.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), WorkerError> {
        let token = CancellationToken::new();
        let trigger = token.clone();
        let watcher = tokio::spawn(async move {
            shutdown.await;
            trigger.cancel();
        });
        let every = self.worker.config().lease / 3;
        let result = run_registered(self.worker, self.store, self.registration, every, token).await;
        watcher.abort();
        after_commit::flush(self.publishing).await;
        Ok(result?)
    }
}
