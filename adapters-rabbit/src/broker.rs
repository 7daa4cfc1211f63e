//! Connecting, declaring the topology, and translating lapin's errors into
//! [`queue::Error`]s.

use std::future::Future;
use std::time::Duration;

use flowforge_ports::queue;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};

use crate::config::Settings;

/// Opens a connection, bounded by the connect timeout. Never retries: the
/// caller's loop owns the backoff.
pub(crate) async fn connect(settings: &Settings) -> Result<Connection, queue::Error> {
    let properties = ConnectionProperties::default().with_connection_name(settings.connection_name.clone().into());
    match tokio::time::timeout(
        settings.connect_timeout,
        Connection::connect_uri(settings.uri.clone(), properties),
    )
    .await
    {
        Ok(Ok(connection)) => {
            tracing::debug!(url = %settings.display_url, "connected to RabbitMQ");
            Ok(connection)
        }
        Ok(Err(error)) => Err(queue::Error::Unavailable(format!(
            "cannot connect to {}: {error}",
            settings.display_url
        ))),
        Err(_) => Err(queue::Error::Unavailable(format!(
            "connecting to {} did not complete within {:?}",
            settings.display_url, settings.connect_timeout
        ))),
    }
}

/// Opens a channel on `connection`, bounded by the connect timeout.
pub(crate) async fn open_channel(connection: &Connection, settings: &Settings) -> Result<Channel, queue::Error> {
    bounded(
        settings.connect_timeout,
        "opening a channel",
        connection.create_channel(),
    )
    .await
}

/// Declares the dispatch exchange: durable, direct.
pub(crate) async fn declare_exchange(channel: &Channel, settings: &Settings) -> Result<(), queue::Error> {
    declare(
        settings,
        "declaring the exchange",
        channel.exchange_declare(
            settings.exchange.clone(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        ),
        exchange_mismatch_message,
    )
    .await
}

/// Declares the exchange, the quorum queue and the binding between them.
pub(crate) async fn declare_topology(channel: &Channel, settings: &Settings) -> Result<(), queue::Error> {
    declare_exchange(channel, settings).await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from("quorum")));
    declare(
        settings,
        "declaring the queue",
        channel.queue_declare(
            settings.queue.clone(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        ),
        queue_type_mismatch_message,
    )
    .await?;
    bounded(
        settings.connect_timeout,
        "binding the queue",
        channel.queue_bind(
            settings.queue.clone(),
            settings.exchange.clone(),
            settings.routing_key.clone(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
}

/// The operator's procedure when the queue exists with another type: spec
/// 000, "The dispatch queue is a quorum queue", step by step.
pub(crate) fn queue_type_mismatch_message(settings: &Settings, broker_text: &str) -> String {
    let queue = settings.queue.as_str();
    let vhost = settings.vhost();
    let vhost_flag = if vhost == "/" {
        String::new()
    } else {
        format!("-p '{vhost}' ")
    };
    format!(
        "queue '{queue}' (vhost '{vhost}') exists with another type or other arguments: FlowForge needs a durable \
         quorum queue (x-queue-type: quorum), and a queue's type cannot be changed in place. The broker said: \
         {broker_text}. This is not retried. To migrate:\n\
         1. Stop the worker and the publisher. The scheduler may keep running: it only writes outbox rows, which \
         are the durable record.\n\
         2. Wait for the queue to drain, or accept the loss of unacked dispatches: the outbox still holds every row \
         that was not confirmed and republishes it; rows already confirmed but unacked are the only ones at risk, \
         and the lease reaper recovers their tasks once their leases expire.\n\
         3. Delete the queue: rabbitmqctl delete_queue {vhost_flag}'{queue}' (or from the management UI, \
         http://<broker>:15672, Queues tab).\n\
         4. Start the worker. It redeclares '{queue}' as a quorum queue and binds it.\n\
         5. Start the publisher. Any row that was pending is delivered normally.\n\
         Doing this while the queue is non-empty is safe for unconfirmed rows (they are still in the outbox) and \
         lossy for unacked ones, which is why step 2 is a decision."
    )
}

/// The operator's procedure when the exchange exists with another type.
fn exchange_mismatch_message(settings: &Settings, broker_text: &str) -> String {
    let exchange = settings.exchange.as_str();
    let vhost = settings.vhost();
    format!(
        "exchange '{exchange}' (vhost '{vhost}') exists with another type or durability: FlowForge needs a durable \
         direct exchange. The broker said: {broker_text}. This is not retried. Stop the worker and the publisher, \
         delete the exchange (rabbitmqadmin --vhost '{vhost}' delete exchange name='{exchange}', or from the \
         management UI), then start the worker (it redeclares and binds) and the publisher. Pending outbox rows are \
         delivered normally."
    )
}

/// The broker's text when `error` is a PRECONDITION_FAILED (406) channel
/// error: a declaration that contradicts what exists.
fn precondition_failed(error: &lapin::Error) -> Option<String> {
    match error.kind() {
        ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)) =>
        {
            Some(amqp.get_message().to_string())
        }
        _ => None,
    }
}

/// Whether `error` is the broker's NOT_FOUND (404): a passive declare of a
/// queue that does not exist.
pub(crate) fn not_found(error: &lapin::Error) -> bool {
    matches!(error.kind(), ErrorKind::ProtocolError(amqp)
        if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}

/// Any other lapin error: the connection or channel is gone or refused us;
/// retrying later may succeed.
pub(crate) fn unavailable(context: &str, error: &lapin::Error) -> queue::Error {
    queue::Error::Unavailable(format!("{context}: {error}"))
}

/// Runs a setup step with a timeout, mapping every failure to `Unavailable`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &str,
    step: impl Future<Output = lapin::Result<T>>,
) -> Result<T, queue::Error> {
    bounded_raw(limit, what, step)
        .await?
        .map_err(|error| unavailable(what, &error))
}

/// Runs a declaration with the connect timeout. A PRECONDITION_FAILED refusal
/// (the entity exists with other properties) is `QueueTypeMismatch`, with
/// the text `mismatch` builds from the broker's; any other failure is
/// `Unavailable`.
async fn declare<T>(
    settings: &Settings,
    what: &str,
    step: impl Future<Output = lapin::Result<T>>,
    mismatch: fn(&Settings, &str) -> String,
) -> Result<T, queue::Error> {
    bounded_raw(settings.connect_timeout, what, step)
        .await?
        .map_err(|error| match precondition_failed(&error) {
            Some(broker_text) => queue::Error::QueueTypeMismatch(mismatch(settings, &broker_text)),
            None => unavailable(what, &error),
        })
}

/// Runs a step with a timeout, leaving its own error to the caller.
pub(crate) async fn bounded_raw<T>(
    limit: Duration,
    what: &str,
    step: impl Future<Output = lapin::Result<T>>,
) -> Result<lapin::Result<T>, queue::Error> {
    tokio::time::timeout(limit, step)
        .await
        .map_err(|_| queue::Error::Unavailable(format!("{what} did not complete within {limit:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RabbitConfig;

    #[test]
    fn the_mismatch_message_carries_the_five_steps_and_names_the_queue() {
        let mut config = RabbitConfig::new("amqp://localhost:5672/%2f");
        config.queue = "jobs".into();
        let settings = Settings::from_config(&config).unwrap();
        let message = queue_type_mismatch_message(&settings, "PRECONDITION_FAILED - inequivalent arg");
        for needle in [
            "queue 'jobs'",
            "PRECONDITION_FAILED - inequivalent arg",
            "1. Stop the worker and the publisher",
            "2. Wait for the queue to drain",
            "3. Delete the queue: rabbitmqctl delete_queue 'jobs'",
            "4. Start the worker",
            "5. Start the publisher",
        ] {
            assert!(message.contains(needle), "missing {needle:?} in {message}");
        }
        config.url = "amqp://localhost:5672/prod".into();
        let settings = Settings::from_config(&config).unwrap();
        assert!(queue_type_mismatch_message(&settings, "x").contains("rabbitmqctl delete_queue -p 'prod' 'jobs'"));
    }
}
