//! Embed FlowForge in a Rust program: register your own handlers and
//! observers, run definitions in-process over SQLite, and get the report.
//!
//! ```no_run
//! use flowforge::{Embedded, HandlerError, TaskContext, parse_definition};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Embedded::builder()
//!     .database("sqlite://.flowforge/flowforge.db")
//!     .handler_fn("greet", |ctx: TaskContext| async move {
//!         let name = ctx.run_input["name"].as_str().unwrap_or("world").to_owned();
//!         Ok::<_, HandlerError>(json!({ "greeting": format!("hello, {name}") }))
//!     })
//!     .build()
//!     .await?;
//! let def = parse_definition(br#"{"name": "hello", "version": 1,
//!     "tasks": [{"key": "greet", "task_type": "greet"}]}"#)?;
//! let report = engine.run(&def, json!({"name": "Ada"})).await?;
//! assert_eq!(report.state, "succeeded");
//! # Ok(()) }
//! ```
//!
//! The same engine serves PostgreSQL and RabbitMQ in distributed mode
//! through the `flowforge` binary's `scheduler`, `publisher` and `worker`
//! processes; embedding uses the SQLite store and the in-process queue.
//! See `examples/embed.rs` for a complete program.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use flowforge_adapters_inproc::InprocQueue;
pub use flowforge_adapters_sqlite::SqliteStore;
pub use flowforge_app::{
    BUILTIN_TYPES, BuiltinOptions, Closed, Engine, EngineConfig, Error, HandlerRegistry, Retry, RunReport, Service,
    Serving, TaskTypes, to_output,
};
pub use flowforge_domain::limits::{self, Limits, Refusal};
pub use flowforge_domain::schema::{ParseError, parse_definition};
pub use flowforge_domain::{RunState, TaskDefinition, WorkflowDefinition};
use flowforge_ports::{Clock, Store, SystemClock};
pub use flowforge_ports::{Handler, HandlerError, Observer, RunEvent, RunId, TaskContext, TaskEvent, WorkerId};
use serde_json::Value;

mod worker;
pub use flowforge_adapters_http::task::{HTTP_TASK_TYPE, HttpTask, HttpTaskOptions};
pub use flowforge_adapters_postgres::PgOptions;
pub use flowforge_adapters_rabbit::DispatchWindow;
pub use flowforge_ports::handler::Pulse;
pub use worker::{RunningWorker, Worker, WorkerBuilder, WorkerError};

/// An engine over the embedded store and queue.
pub type EmbeddedEngine = Engine<SqliteStore, InprocQueue>;

/// The database an embedded engine uses unless told otherwise: a file in
/// `.flowforge/` under the current folder, created on first use.
pub const DEFAULT_DATABASE: &str = "sqlite://.flowforge/flowforge.db";

/// Builds an [`EmbeddedEngine`].
#[derive(Debug)]
pub struct Embedded;

impl Embedded {
    /// A builder with the built-in task types registered (`command`
    /// allowed: an embedding program runs its own definitions).
    pub fn builder() -> EmbeddedBuilder {
        EmbeddedBuilder {
            database: DEFAULT_DATABASE.to_owned(),
            registry: HandlerRegistry::new(),
            builtins: Some(BuiltinOptions {
                allow_command: true,
                ..BuiltinOptions::default()
            }),
            observers: Vec::new(),
            config: EngineConfig::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Configures an embedded engine; finish with [`EmbeddedBuilder::build`].
pub struct EmbeddedBuilder {
    database: String,
    registry: HandlerRegistry,
    builtins: Option<BuiltinOptions>,
    observers: Vec<Arc<dyn Observer>>,
    config: EngineConfig,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for EmbeddedBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBuilder")
            .field("database", &self.database)
            .field("registry", &self.registry)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EmbeddedBuilder {
    /// The SQLite database: `sqlite://path/to/file.db` (created with its
    /// folder when missing) or `sqlite::memory:`.
    pub fn database(mut self, url: impl Into<String>) -> Self {
        self.database = url.into();
        self
    }

    /// How many tasks run at once (default: the number of CPUs).
    pub fn concurrency(mut self, slots: usize) -> Self {
        self.config.concurrency = slots.max(1);
        self
    }

    /// The lease a running task holds (default 30 s; renewed every third).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// The size limits of run inputs, task outputs and the inputs one task
    /// is given (defaults: 1 MiB, 1 MiB, 16 MiB); a `command` task's stdout
    /// is held to the output limit while it is read.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// How long a cancelled or timed-out handler gets to stop before it is
    /// abandoned (default 5 s).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.config.stop_grace = grace;
        self
    }

    /// How long ready work waits to gain one priority level (default five
    /// minutes): a priority-0 task goes before priority-9 work that became
    /// ready more than nine times this after it (docs/design/priorities.md).
    pub fn priority_aging(mut self, aging: Duration) -> Self {
        self.config.priority_aging = aging;
        self
    }

    /// The folder a `command` task's relative `cwd` is resolved against
    /// (default: the current folder).
    pub fn base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        if let Some(options) = &mut self.builtins {
            options.base_dir = dir.into();
        }
        self
    }

    /// How this engine names itself as a worker in task histories.
    pub fn worker_id(mut self, id: WorkerId) -> Self {
        self.config.worker_id = id;
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

    /// Registers every handler of `registry` (replacing any of the same
    /// task type).
    pub fn handlers(mut self, registry: HandlerRegistry) -> Self {
        self.registry.extend(registry);
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

    /// Adds a lifecycle observer (docs/design/handlers.md#lifecycle-hooks).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Sets how the built-in task types behave (`None`: none registered).
    pub fn builtins(mut self, options: Option<BuiltinOptions>) -> Self {
        self.builtins = options;
        self
    }

    /// Whether the worker pushes the dispatches a success hands on straight
    /// into the in-process queue (the default), or leaves them to the
    /// outbox sweep so a run can be stepped by hand
    /// ([`EngineConfig::push_after_commit`]).
    pub fn push_after_commit(mut self, push: bool) -> Self {
        self.config.push_after_commit = push;
        self
    }

    /// How many tasks in a row a worker slot runs straight from its own
    /// finishes before it takes from the queue again; 0 never
    /// ([`EngineConfig::chain_hops`]).
    pub fn chain_hops(mut self, hops: u32) -> Self {
        self.config.chain_hops = hops;
        self
    }

    /// Shifts store time (tests move leases and retries without sleeping).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Opens the database (applying its migrations) and builds the engine.
    pub async fn build(self) -> Result<EmbeddedEngine, Error> {
        let store = SqliteStore::connect(&self.database, Arc::clone(&self.clock)).await?;
        Ok(self.build_on(store))
    }

    /// Builds the engine over a store already open (any store: `flowforge
    /// run --db postgres://…` drives its run this way); the database and
    /// clock settings are the store's own, not this builder's.
    pub fn build_on<S: Store>(self, store: S) -> Engine<S, InprocQueue> {
        let mut registry = HandlerRegistry::new();
        if let Some(mut options) = self.builtins {
            options.output_limit = self.config.limits.task_output_bytes;
            flowforge_app::register_builtins(&mut registry, options);
        }
        registry.extend(self.registry);
        let queue = InprocQueue::with_aging(self.config.priority_aging);
        Engine::new(store, queue, registry, self.observers, self.config)
    }
}
