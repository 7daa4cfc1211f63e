//! Finding the broker (flowforge-testkit), naming each test's exchange and
//! queue, and raw lapin access to inspect what the adapter did.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowforge_adapters_rabbit::RabbitConfig;
use flowforge_ports::{Dispatch, DispatchId, RunId, TaskRunId};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// The broker's URL, or return from the test (flowforge-testkit has said
/// why, or panicked under `REQUIRE_RABBITMQ=1`).
macro_rules! broker_or_skip {
    () => {
        match flowforge_testkit::amqp_url() {
            Some(url) => url,
            None => return,
        }
    };
}

/// The broker's address, for the proxy.
pub(crate) fn broker_address(url: &str) -> SocketAddr {
    flowforge_testkit::broker_address(url).unwrap_or_else(|| panic!("no address for the broker at {url}"))
}

/// A test's dispatch number `n`.
pub(crate) fn dispatch(n: i64) -> Dispatch {
    Dispatch {
        dispatch_id: DispatchId(n),
        task_run_id: TaskRunId(1000 + n),
        run_id: RunId(uuid::Uuid::from_u128(
            0x0190_0000_0000_7000_8000_0000_0000_0000 | n as u128,
        )),
        task_key: format!("task-{n}"),
        task_type: "noop".to_owned(),
        fencing_token: n % 5 + 1,
        ready_at: None,
        priority: Default::default(),
    }
}

/// One test's own exchange and queue, and a raw connection to look at them.
pub(crate) struct Fixture {
    pub(crate) url: String,
    pub(crate) exchange: String,
    pub(crate) queue: String,
    _connection: Connection,
    /// A confirm-mode channel for raw publishes and inspection.
    channel: Channel,
    connection_for_probes: Connection,
    cleaned: bool,
}

impl Fixture {
    pub(crate) async fn new(url: &str, test: &str) -> Self {
        let suffix = format!("{:016x}", fastrand::u64(..));
        let connection = Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name(format!("flowforge-it-{test}").into()),
        )
        .await
        .unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let connection_for_probes = Connection::connect(url, ConnectionProperties::default()).await.unwrap();
        Self {
            url: url.to_owned(),
            exchange: format!("flowforge-it.{test}.{suffix}"),
            queue: format!("flowforge-it.{test}.{suffix}.tasks"),
            _connection: connection,
            channel,
            connection_for_probes,
            cleaned: false,
        }
    }

    /// The adapter's configuration for this test, with short timeouts.
    pub(crate) fn config(&self) -> RabbitConfig {
        self.config_for(&self.url)
    }

    /// The same, but connecting to `url` (a proxy).
    pub(crate) fn config_for(&self, url: &str) -> RabbitConfig {
        let mut config = RabbitConfig::new(url);
        config.exchange = self.exchange.clone();
        config.queue = self.queue.clone();
        config.routing_key = format!("{}.key", self.queue);
        config.publish_timeout = Duration::from_secs(2);
        config.confirm_timeout = Duration::from_secs(3);
        config.connect_timeout = Duration::from_secs(3);
        config.connection_name = "flowforge-it".to_owned();
        config
    }

    /// Takes the next message off the queue (acknowledged), if any.
    pub(crate) async fn get(&self) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }

    /// Every message on the queue, taken off it.
    pub(crate) async fn drain(&self) -> Vec<Dispatch> {
        let mut dispatches = Vec::new();
        while let Some(message) = self.get().await {
            dispatches.push(serde_json::from_slice(&message.delivery.data).unwrap());
        }
        dispatches
    }

    /// How many messages are ready (not counting unacknowledged ones).
    pub(crate) async fn ready(&self) -> u32 {
        let channel = self.connection_for_probes.create_channel().await.unwrap();
        let queue = channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        queue.message_count()
    }

    /// A fresh raw channel.
    pub(crate) async fn probe_channel(&self) -> Channel {
        self.connection_for_probes.create_channel().await.unwrap()
    }

    /// Declares this test's queue as a durable *classic* queue, on a
    /// throwaway channel (a refusal closes it).
    pub(crate) async fn declare_classic_queue(&self) -> Result<(), lapin::Error> {
        let channel = self.connection_for_probes.create_channel().await?;
        channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|_| ())
    }

    /// Declares this test's queue holding at most `max` messages and
    /// refusing publishes beyond, bound with the adapter's routing key. A
    /// classic queue: a quorum queue applies the limit only approximately.
    pub(crate) async fn declare_full_queue(&self, max: i64) {
        let channel = self.probe_channel().await;
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(max));
        arguments.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(self.queue.as_str().into(), durable, arguments)
            .await
            .unwrap();
        channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                format!("{}.key", self.queue).into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// Publishes raw bytes with the adapter's routing key, confirmed.
    pub(crate) async fn publish_raw(&self, body: &[u8]) {
        let confirmation = self
            .channel
            .basic_publish(
                self.exchange.as_str().into(),
                format!("{}.key", self.queue).into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirmation.is_ack());
        assert!(confirmation.take_message().is_none(), "raw publish was returned");
    }

    /// Deletes the queue and the exchange.
    pub(crate) async fn cleanup(mut self) {
        delete(&self.connection_for_probes, &self.queue, &self.exchange).await;
        self.cleaned = true;
    }
}

impl Drop for Fixture {
    /// A failed test still removes what it declared: on a thread of its own,
    /// since the test's runtime may be unwinding.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let (url, queue, exchange) = (self.url.clone(), self.queue.clone(), self.exchange.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(connection) = Connection::connect(&url, ConnectionProperties::default()).await {
                    delete(&connection, &queue, &exchange).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

async fn delete(connection: &Connection, queue: &str, exchange: &str) {
    // Each on its own channel: deleting what does not exist closes it.
    if let Ok(channel) = connection.create_channel().await {
        let _ = channel.queue_delete(queue.into(), QueueDeleteOptions::default()).await;
    }
    if let Ok(channel) = connection.create_channel().await {
        let _ = channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await;
    }
}

/// Awaits `future`, failing the test if it takes longer than `seconds`.
pub(crate) async fn within<T>(seconds: u64, what: &str, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(seconds), future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not complete within {seconds} s"),
    }
}

/// Captures what this thread logs at error level, while the guard lives.
pub(crate) fn capture_errors() -> (tracing::subscriber::DefaultGuard, Arc<Mutex<Vec<u8>>>) {
    use tracing_subscriber::util::SubscriberInitExt as _;
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let sink = buffer.clone();
    let guard = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::ERROR)
        .with_ansi(false)
        .with_writer(move || Sink(sink.clone()))
        .finish()
        .set_default();
    (guard, buffer)
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
