//! The distributed processes: `flowforge scheduler`, `flowforge publisher`
//! and `flowforge worker`. Each runs until SIGTERM/SIGINT, then stops
//! gracefully (a worker finishes and acks its in-flight tasks) and exits 0.

use std::sync::Arc;
use std::time::Duration;

use flowforge::{BuiltinOptions, HTTP_TASK_TYPE, HandlerRegistry, HttpTask, HttpTaskOptions, Service};
use flowforge_adapters_rabbit::{DispatchWindow, RabbitConfig, RabbitPublisher, RabbitQueue};
use flowforge_app::after_commit::{self, AfterCommit, DEFAULT_HOLD};
use flowforge_app::cache::DefinitionCache;
use flowforge_app::process::run_registered;
use flowforge_app::publisher::{OutboxPublisher, PublisherConfig};
use flowforge_app::scheduler::{DEFAULT_PASS_SPACING, Scheduler, SchedulerConfig};
use flowforge_app::worker::{DEFAULT_CHAIN_HOPS, Worker, WorkerConfig};
use flowforge_ports::store::WorkerRegistration;
use flowforge_ports::{Store, WorkerId};
use tokio_util::sync::CancellationToken;

use super::common::{host, interrupted};
use super::store::with_store;
use super::{Exit, Global, fail};

/// Where a process serves its Prometheus metrics.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MetricsArgs {
    /// Serve `GET /metrics` (Prometheus text, no token) on this address.
    #[arg(long, env = "FLOWFORGE_METRICS_LISTEN", value_name = "ADDR")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
}

impl MetricsArgs {
    /// Starts the metrics listener when asked; it stops with `shutdown`.
    pub(crate) async fn expose(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let Some(addr) = self.metrics_listen else {
            return Ok(());
        };
        let handle = flowforge_adapters_http::metrics::install().map_err(anyhow::Error::msg)?;
        let listener = flowforge_adapters_http::bind(addr).await?;
        tracing::info!(listen = %listener.local_addr()?, "serving /metrics");
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = flowforge_adapters_http::metrics::serve_metrics(listener, handle, shutdown).await {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        });
        Ok(())
    }
}

/// Whether a process serves `http` tasks, and where they may go
/// (docs/design/handlers.md#the-http-task-type).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HttpArgs {
    /// Allow `http` tasks, which call URLs from this host. Off by default:
    /// a worker calls out only where its operator allows.
    #[arg(long, env = "FLOWFORGE_ALLOW_HTTP")]
    pub(crate) allow_http: bool,
    /// Only these hosts (repeat, or separate with commas). A link-local or
    /// cloud metadata address is reachable only when named here.
    #[arg(
        long = "http-allow",
        value_name = "HOST",
        value_delimiter = ',',
        requires = "allow_http"
    )]
    pub(crate) http_allow: Vec<String>,
}

impl HttpArgs {
    /// Registers the `http` task type in `registry` when allowed.
    pub(crate) fn register(&self, registry: &mut HandlerRegistry, output_limit: usize) -> anyhow::Result<()> {
        if !self.allow_http {
            return Ok(());
        }
        let task = HttpTask::new(HttpTaskOptions {
            allow_hosts: (!self.http_allow.is_empty()).then(|| self.http_allow.clone()),
            output_limit,
        })?;
        registry.register(HTTP_TASK_TYPE, task);
        Ok(())
    }
}

/// Arguments of `flowforge scheduler`.
#[derive(Debug, clap::Args)]
pub(crate) struct SchedulerArgs {
    /// The least time between the starts of two passes that finishing
    /// tasks ask for: what finishes within it shares one pass, which
    /// trades up to this much of a join's latency for far less work when
    /// busy; 0 passes on every wake-up (docs/design/scheduler.md#pacing).
    #[arg(
        long,
        env = "FLOWFORGE_PASS_SPACING_MS",
        default_value_t = DEFAULT_PASS_SPACING.as_millis() as u64,
        value_name = "MILLISECONDS"
    )]
    pub(crate) pass_spacing_ms: u64,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
}

/// The dispatch window, which the publisher and the workers keep to alike.
#[derive(Debug, clap::Args)]
pub(crate) struct WindowArgs {
    /// How many ready messages to keep in the queue: `consumers` (one per
    /// consumer on it), a number, or `unbounded`. The rest wait in the
    /// outbox, which is published highest priority first
    /// (docs/design/priorities.md#the-broker-window).
    #[arg(
        long,
        env = "FLOWFORGE_DISPATCH_WINDOW",
        default_value = "consumers",
        value_name = "consumers|N|unbounded"
    )]
    pub(crate) dispatch_window: DispatchWindow,
}

/// Arguments of `flowforge publisher`.
#[derive(Debug, clap::Args)]
pub(crate) struct PublisherArgs {
    #[command(flatten)]
    pub(crate) window: WindowArgs,
    /// Publish again, every half of this, the dispatches published this
    /// many seconds ago whose task is still waiting: a queue deleted or
    /// purged lost them. With a window only (duplicates stay within it);
    /// 0: never (docs/design/outbox-and-queues.md#lost-dispatches).
    #[arg(
        long,
        env = "FLOWFORGE_REDISPATCH_AFTER_SECONDS",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub(crate) redispatch_after_seconds: u64,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
}

/// Arguments of `flowforge worker`.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// Concurrency slots (one consumer with prefetch 1 each; default: CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: Option<u32>,
    /// How many tasks in a row a slot runs straight from its own finishes
    /// before it takes from the queue again; 0 never
    /// (docs/design/outbox-and-queues.md#continuing-a-chain).
    #[arg(
        long,
        env = "FLOWFORGE_CHAIN_HOPS",
        default_value_t = DEFAULT_CHAIN_HOPS,
        value_name = "N"
    )]
    pub(crate) chain_hops: u32,
    /// Allow `command` tasks, which run programs on this host. Off by
    /// default: a worker runs only what its operator allows.
    #[arg(long)]
    pub(crate) allow_command: bool,
    /// The window the dispatches this worker publishes right after its
    /// commits keep to (docs/design/outbox-and-queues.md#publish-after-commit):
    /// the publisher's.
    #[command(flatten)]
    pub(crate) window: WindowArgs,
    #[command(flatten)]
    pub(crate) http: HttpArgs,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
}

/// A token cancelled at the first SIGTERM or SIGINT.
pub(crate) fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        interrupted().await;
        tracing::info!("stopping gracefully");
        trigger.cancel();
    });
    token
}

fn rabbit(global: &Global) -> RabbitConfig {
    let mut config = RabbitConfig::new(global.amqp.clone());
    config.queue.clone_from(&global.queue);
    config.routing_key.clone_from(&global.queue);
    config
}

fn finished(result: Result<(), flowforge::Error>) -> Exit {
    match result {
        Ok(()) => Exit::Ok,
        Err(e) => fail(&e),
    }
}

/// `flowforge scheduler`.
pub(crate) async fn scheduler(global: &Global, args: &SchedulerArgs) -> anyhow::Result<Exit> {
    let shutdown = shutdown_on_signal();
    args.metrics.expose(&shutdown).await?;
    with_store!(global, |store| {
        let defs = Arc::new(DefinitionCache::new(store.clone()));
        let scheduler = Scheduler::new(
            store.clone(),
            Arc::clone(&defs),
            Default::default(),
            SchedulerConfig {
                output_limit: global.max_task_output_bytes,
                pass_spacing: std::time::Duration::from_millis(args.pass_spacing_ms),
                ..SchedulerConfig::default()
            },
        );
        // Every scheduler process fires the schedules too: the store
        // decides each fire under a lock, so N of them fire each time once
        // (docs/design/schedules.md#firing).
        let schedules = Service::with_cache(store, defs).with_limits(global.limits());
        tracing::info!("scheduler started");
        let (passes, fires) = tokio::join!(
            scheduler.run(shutdown.clone()),
            schedules.fire_schedules_until(shutdown)
        );
        Ok(finished(passes.and(fires)))
    })
}

/// `flowforge publisher`.
pub(crate) async fn publisher(global: &Global, args: &PublisherArgs) -> anyhow::Result<Exit> {
    let shutdown = shutdown_on_signal();
    args.metrics.expose(&shutdown).await?;
    let mut config = rabbit(global);
    config.dispatch_window = args.window.dispatch_window;
    let queue = match RabbitPublisher::new(config) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Invalid);
        }
    };
    with_store!(global, |store| {
        let windowed = args.window.dispatch_window != DispatchWindow::Unbounded;
        let config = PublisherConfig {
            aging: global.priority_aging(),
            redispatch_after: (windowed && args.redispatch_after_seconds > 0)
                .then(|| std::time::Duration::from_secs(args.redispatch_after_seconds)),
            ..PublisherConfig::default()
        };
        let publisher = OutboxPublisher::new(store, queue, config);
        tracing::info!(queue = %global.queue, "outbox publisher started");
        Ok(finished(publisher.run(shutdown).await))
    })
}

/// `flowforge worker`.
pub(crate) async fn worker(global: &Global, args: &WorkerArgs) -> anyhow::Result<Exit> {
    let config = rabbit(global);
    let max_task_timeout = config.max_task_timeout();
    let mut publishing = config.clone();
    publishing.dispatch_window = args.window.dispatch_window;
    let (queue, publisher) = match (RabbitQueue::new(config), RabbitPublisher::new(publishing)) {
        (Ok(q), Ok(p)) => (q, p),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return Ok(Exit::Invalid);
        }
    };
    with_store!(global, |store| serve_worker(
        store,
        (queue, publisher),
        global,
        args,
        max_task_timeout
    )
    .await)
}

async fn serve_worker<S: Store>(
    store: S,
    (queue, publisher): (RabbitQueue, RabbitPublisher),
    global: &Global,
    args: &WorkerArgs,
    max_task_timeout: Duration,
) -> anyhow::Result<Exit> {
    let mut registry = HandlerRegistry::new();
    flowforge_app::register_builtins(
        &mut registry,
        BuiltinOptions {
            allow_command: args.allow_command,
            base_dir: std::env::current_dir()?,
            output_limit: global.max_task_output_bytes,
            ..BuiltinOptions::default()
        },
    );
    if let Err(e) = args.http.register(&mut registry, global.max_task_output_bytes) {
        eprintln!("error: {e:#}");
        return Ok(Exit::Invalid);
    }
    let id = WorkerId(format!("{}:{}:{:04x}", host(), std::process::id(), fastrand::u16(..)));
    let concurrency = args.concurrency.map_or_else(
        || std::thread::available_parallelism().map_or(2, usize::from),
        |n| n as usize,
    );
    let mut config = WorkerConfig::new(id.clone(), concurrency);
    config.lease = global.lease();
    config.limits = global.limits();
    config.max_task_timeout = Some(max_task_timeout);
    config.chain_hops = args.chain_hops;
    let (after_commit, publishing) = AfterCommit::start(store.clone(), publisher, DEFAULT_HOLD);
    config.after_commit = Some(after_commit);
    let registration = WorkerRegistration {
        id,
        host: host(),
        pid: std::process::id(),
        task_types: registry.task_types().map(str::to_owned).collect(),
        concurrency: concurrency as u32,
    };
    let worker = Arc::new(Worker::new(
        store.clone(),
        queue,
        Arc::new(DefinitionCache::new(store.clone())),
        Arc::new(registry),
        Default::default(),
        config,
    ));
    tracing::info!(worker = %registration.id, concurrency, queue = %global.queue, "worker started");
    let every = global.lease() / 3;
    let shutdown = shutdown_on_signal();
    args.metrics.expose(&shutdown).await?;
    let result = run_registered(worker, store, registration, every, shutdown).await;
    after_commit::flush(publishing).await;
    Ok(finished(result))
}
