//! The distributed mode against the real services (issue 5; issue 4's
//! PostgreSQL runs): PostgreSQL at `DATABASE_URL` and RabbitMQ at
//! `AMQP_URL`, else this binary's containers (flowforge-testkit). A service
//! that is neither skips the tests that need it, with a notice, unless
//! `REQUIRE_POSTGRES=1` / `REQUIRE_RABBITMQ=1` makes that a failure.
//!
//! Every test gets its own database (`ff_it_<random>`, migrated, dropped
//! `WITH (FORCE)` when the test ends, even on failure) and its own queue
//! (and, at the app level, its own exchange), deleted at the end. Outages
//! go through a TCP proxy of the test's own, or a container of the test's
//! own ([`containers`]): no test stops, restarts or disturbs the shared
//! services or connections it did not open. Waits poll
//! stored state under a generous deadline; nothing sleeps to synchronise.
//!
//! One file per theme; this module holds the harness, [`cluster`] runs real
//! `flowforge` processes.

pub(crate) mod cluster;
mod concurrency;
mod containers;
mod end_to_end;
mod failures;
mod mixed;
mod outbox;
mod postgres;
mod priorities;
mod sdk;
mod stalls;
mod topology;
mod worker;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_adapters_rabbit::{DispatchWindow, RabbitConfig, RabbitPublisher, RabbitQueue};
use flowforge_app::publisher::{OutboxPublisher, PublisherConfig};
use flowforge_domain::WorkflowDefinition;
use flowforge_ports::{Dispatch, DispatchId, RunDetail, RunId, RunStore, SystemClock, TaskRunId, TaskRunView};
use flowforge_testkit::{TestDatabase, suffix};
pub(crate) use flowforge_testkit::{amqp_url, amqp_url_via, broker_address, pg_address, pg_url_via, postgres_url};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use serde_json::Value;

/// How long any wait for something the system does may take before the
/// test fails: generous, so a slow, loaded machine does not fail a correct
/// system.
pub(crate) const PATIENCE: Duration = Duration::from_secs(90);

/// The lease of every attempt not about reaping: a slow machine never reaps
/// it by accident (docs/design/leases-and-fencing.md#store-time).
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(300);

/// Both services, or `None` to skip (each absent one noticed).
pub(crate) fn both_services() -> Option<(String, String)> {
    let postgres = postgres_url();
    let amqp = amqp_url();
    Some((postgres?, amqp?))
}

/// One test's own PostgreSQL database, dropped `WITH (FORCE)` when this
/// guard is dropped — when the test ends, passed or failed.
pub(crate) struct TestDb {
    /// The database's URL.
    pub(crate) url: String,
    _database: TestDatabase,
}

impl TestDb {
    /// A fresh database with no schema (for `flowforge migrate`).
    pub(crate) async fn empty(admin_url: &str) -> Self {
        let database = TestDatabase::create(admin_url, "ff_it").await;
        Self {
            url: database.url.clone(),
            _database: database,
        }
    }

    /// A fresh database with FlowForge's migrations applied.
    pub(crate) async fn migrated(admin_url: &str) -> Self {
        let db = Self::empty(admin_url).await;
        let store = PgStore::connect_unchecked(&db.url, Arc::new(SystemClock), pg_options())
            .await
            .expect("connect to the test database");
        store.migrate().await.expect("migrate the test database");
        store.pool().close().await;
        db
    }

    /// A store over this database on a small pool of its own (as a
    /// process of its own would have).
    pub(crate) async fn store(&self) -> PgStore {
        PgStore::connect(&self.url, Arc::new(SystemClock), pg_options())
            .await
            .expect("open the test database")
    }
}

/// Small pools: many tests share one server.
pub(crate) fn pg_options() -> PgOptions {
    PgOptions {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(30),
        statement_timeout: Duration::from_secs(60),
        ..PgOptions::default()
    }
}

/// One test's own RabbitMQ names, a raw connection to look at them, and
/// their deletion when this guard is dropped.
pub(crate) struct Broker {
    /// The broker's URL.
    pub(crate) url: String,
    /// The dispatch exchange.
    pub(crate) exchange: String,
    /// The dispatch queue.
    pub(crate) queue: String,
    /// The routing key binding them.
    pub(crate) routing_key: String,
    /// Whether the exchange is this test's own (deleted at the end).
    own_exchange: bool,
    connection: Connection,
}

impl Broker {
    /// An exchange, a queue and a routing key of this test's own.
    pub(crate) async fn own(url: &str, test: &str) -> Self {
        let suffix = suffix();
        let queue = format!("ff-it.{test}.{suffix}.tasks");
        Self::connect(url, format!("ff-it.{test}.{suffix}"), queue.clone(), queue, true).await
    }

    /// A queue of this test's own, for `flowforge` processes: they publish
    /// to the default exchange `flowforge` with the queue's name as the
    /// routing key (`--queue` sets both), so only the queue is ours.
    pub(crate) async fn for_processes(url: &str, test: &str) -> Self {
        let queue = format!("ff-it.{test}.{}.tasks", suffix());
        Self::connect(
            url,
            flowforge_adapters_rabbit::DEFAULT_EXCHANGE.to_owned(),
            queue.clone(),
            queue,
            false,
        )
        .await
    }

    async fn connect(url: &str, exchange: String, queue: String, routing_key: String, own_exchange: bool) -> Self {
        let connection = Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name("flowforge-it-inspector".into()),
        )
        .await
        .expect("connect to RabbitMQ");
        Self {
            url: url.to_owned(),
            exchange,
            queue,
            routing_key,
            own_exchange,
            connection,
        }
    }

    /// The adapter's configuration for these names, with short timeouts and
    /// no dispatch window: these tests check what the outbox publishes, so
    /// every swept row goes out (the window has its own tests, in
    /// `priorities`).
    pub(crate) fn config(&self) -> RabbitConfig {
        self.config_for(&self.url)
    }

    /// The same, connecting to `url` (a proxy).
    pub(crate) fn config_for(&self, url: &str) -> RabbitConfig {
        let mut config = RabbitConfig::new(url);
        config.exchange.clone_from(&self.exchange);
        config.queue.clone_from(&self.queue);
        config.routing_key.clone_from(&self.routing_key);
        config.publish_timeout = Duration::from_secs(5);
        config.confirm_timeout = Duration::from_secs(10);
        config.connect_timeout = Duration::from_secs(5);
        config.connection_name = "flowforge-it".to_owned();
        config.dispatch_window = DispatchWindow::Unbounded;
        config
    }

    /// The worker's queue adapter for these names, with the exchange, the
    /// quorum queue and the binding declared.
    pub(crate) async fn declared_queue(&self) -> RabbitQueue {
        let queue = RabbitQueue::new(self.config()).expect("a valid config");
        queue.declare().await.expect("declare the topology");
        queue
    }

    /// A raw channel of this test's own connection.
    async fn channel(&self) -> lapin::Channel {
        self.connection.create_channel().await.expect("open a channel")
    }

    /// How many messages are ready on the queue (unacknowledged ones not
    /// counted), or `None` when the queue does not exist.
    pub(crate) async fn ready(&self) -> Option<u32> {
        self.counts().await.map(|(ready, _)| ready)
    }

    /// The queue's ready messages and consumers, or `None` when the queue
    /// does not exist. The broker requeues a closed channel's unacked
    /// deliveries as it removes its consumer, so once `consumers` is 0 the
    /// message count includes whatever was never acked.
    pub(crate) async fn counts(&self) -> Option<(u32, u32)> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel()
            .await
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await
            .ok()
            .map(|q| (q.message_count(), q.consumer_count()))
    }

    /// Takes every message off the queue (acknowledged).
    pub(crate) async fn drain(&self) -> Vec<BasicGetMessage> {
        let channel = self.channel().await;
        let mut messages = Vec::new();
        while let Some(message) = channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            messages.push(message);
        }
        messages
    }

    /// Takes every message off the queue and decodes its dispatch.
    pub(crate) async fn drain_dispatches(&self) -> Vec<Dispatch> {
        self.drain()
            .await
            .iter()
            .map(|m| serde_json::from_slice(&m.delivery.data).expect("a dispatch payload"))
            .collect()
    }

    /// Declares the queue as FlowForge would (durable, quorum) but binds it
    /// to nothing: what the exchange routes goes nowhere.
    pub(crate) async fn declare_unbound_queue(&self) {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let mut arguments = FieldTable::default();
        arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        self.channel()
            .await
            .queue_declare(self.queue.as_str().into(), durable, arguments)
            .await
            .expect("declare an unbound quorum queue");
    }

    /// Declares the queue as a durable *classic* queue (what an old
    /// deployment left behind).
    pub(crate) async fn declare_classic_queue(&self) {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.channel()
            .await
            .queue_declare(self.queue.as_str().into(), durable, FieldTable::default())
            .await
            .expect("declare a classic queue");
    }

    /// Declares the exchange as a durable *fanout* exchange (not the direct
    /// exchange FlowForge needs).
    pub(crate) async fn declare_fanout_exchange(&self) {
        assert!(self.own_exchange, "only a test's own exchange may be declared");
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.channel()
            .await
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .expect("declare a fanout exchange");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // On a thread with a runtime of its own, on a connection of its own:
        // the test's runtime may be unwinding.
        let (url, queue) = (self.url.clone(), self.queue.clone());
        let exchange = self.own_exchange.then(|| self.exchange.clone());
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async move {
                let Ok(connection) = Connection::connect(&url, ConnectionProperties::default()).await else {
                    return;
                };
                // Each on its own channel: deleting what does not exist
                // closes the channel.
                if let Ok(channel) = connection.create_channel().await {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                if let Some(exchange) = exchange
                    && let Ok(channel) = connection.create_channel().await
                {
                    let _ = channel
                        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = connection.close(200, "cleaned up".into()).await;
            });
        });
        let _ = cleanup.join();
    }
}

/// An outbox publisher over `store` to `broker`, with the default config.
pub(crate) fn outbox_publisher(store: PgStore, broker: &Broker) -> OutboxPublisher<PgStore, RabbitPublisher> {
    OutboxPublisher::new(
        store,
        RabbitPublisher::new(broker.config()).expect("a valid config"),
        PublisherConfig::default(),
    )
}

/// One outbox row, read with raw SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxRow {
    /// What its dispatch carries.
    pub(crate) dispatch: Dispatch,
    /// Whether it is marked published.
    pub(crate) published: bool,
}

/// Every outbox row, oldest first.
pub(crate) async fn outbox(store: &PgStore) -> Vec<OutboxRow> {
    type Row = (
        i64,
        i64,
        String,
        String,
        String,
        i64,
        chrono::DateTime<chrono::Utc>,
        bool,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, task_run_id, run_id::text, task_key, task_type, fencing_token, created_at, \
         published_at IS NOT NULL FROM outbox ORDER BY id",
    )
    .fetch_all(store.pool())
    .await
    .expect("read the outbox");
    rows.into_iter()
        .map(
            |(id, task_run, run, key, task_type, token, created, published)| OutboxRow {
                dispatch: Dispatch {
                    dispatch_id: DispatchId(id),
                    task_run_id: TaskRunId(task_run),
                    run_id: run.parse().expect("a run id"),
                    task_key: key,
                    task_type,
                    fencing_token: token,
                    ready_at: Some(created),
                    priority: flowforge_domain::Priority::DEFAULT,
                },
                published,
            },
        )
        .collect()
}

/// A validated definition from JSON.
pub(crate) fn definition(value: &Value) -> WorkflowDefinition {
    flowforge::parse_definition(&serde_json::to_vec(value).expect("serialise")).expect("a valid definition")
}

/// A definition of `n` independent `noop` tasks: starting a run of it
/// writes `n` outbox rows at once.
pub(crate) fn independent_tasks(name: &str, n: usize) -> WorkflowDefinition {
    let tasks: Vec<Value> = (0..n)
        .map(|i| serde_json::json!({"key": format!("t{i:03}"), "task_type": "noop"}))
        .collect();
    definition(&serde_json::json!({"name": name, "version": 1, "tasks": tasks}))
}

/// Polls `probe` until it returns `Some`, failing the test after
/// [`PATIENCE`]. Polls stored state: never a fixed sleep standing in for
/// synchronisation.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until a live registered worker serves `task_type` (`submit`
/// refuses a `command` task before then); returns every live type.
pub(crate) async fn served(store: &PgStore, task_type: &str) -> std::collections::BTreeSet<String> {
    use flowforge_ports::WorkerRegistry as _;
    eventually(&format!("a live worker serving {task_type}"), || async {
        let types = store
            .live_task_types(flowforge_app::service::LIVE_WORKER_WINDOW)
            .await
            .expect("live task types");
        types.contains(task_type).then_some(types)
    })
    .await
}

/// Awaits `future`, failing the test after [`PATIENCE`].
pub(crate) async fn within<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?} waiting for {what}"))
}

/// The stored run.
pub(crate) async fn detail(store: &PgStore, run: RunId) -> RunDetail {
    store
        .get_run(run)
        .await
        .expect("get_run")
        .unwrap_or_else(|| panic!("run {run} is not stored"))
}

/// The task run `key` of a stored run.
pub(crate) fn task<'d>(detail: &'d RunDetail, key: &str) -> &'d TaskRunView {
    detail
        .tasks
        .iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no task run '{key}' in {:?}", detail.tasks))
}

/// The transition names of task `key`, in order.
pub(crate) fn transitions(detail: &RunDetail, key: &str) -> Vec<String> {
    detail
        .events
        .iter()
        .filter(|e| e.task.as_deref() == Some(key))
        .map(|e| e.transition.clone())
        .collect()
}

/// Waits until task `key` of `run` is running under the lease of the
/// worker process `pid`; returns the task run as it was then.
pub(crate) async fn running_on(store: &PgStore, run: RunId, key: &str, pid: u32) -> TaskRunView {
    eventually(&format!("task '{key}' to run on the worker with pid {pid}"), || async {
        let stored = detail(store, run).await;
        let t = task(&stored, key).clone();
        (t.state == flowforge_domain::TaskRunState::Running
            && t.lease_owner.as_deref().and_then(cluster::worker_pid) == Some(pid))
        .then_some(t)
    })
    .await
}

/// Waits until `run` is in a terminal state; returns the stored run.
pub(crate) async fn settled(store: &PgStore, run: RunId) -> RunDetail {
    eventually(&format!("run {run} to end"), || async {
        let stored = detail(store, run).await;
        matches!(
            stored.summary.state,
            flowforge::RunState::Succeeded | flowforge::RunState::Failed | flowforge::RunState::Cancelled
        )
        .then_some(stored)
    })
    .await
}

/// A JSON run report (docs/design/cli.md#reports) in the form two runs of the
/// same definition and input must agree on.
pub(crate) fn comparable(report: &Value) -> Value {
    flowforge_app::RunReport::comparable_json(report)
}

/// Asserts two comparable reports are equal, showing both in full when not.
#[track_caller]
pub(crate) fn assert_same_report(distributed: &Value, embedded: &Value, what: &str) {
    assert!(
        distributed == embedded,
        "{what}: the reports differ once ids, times, tokens and workers are dropped\n\
         --- distributed ---\n{distributed:#}\n--- embedded ---\n{embedded:#}"
    );
}
