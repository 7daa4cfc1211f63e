//! [`RabbitQueue`], [`RabbitConsumer`] and [`RabbitDelivery`]: consuming
//! dispatches with prefetch 1 and manual acknowledgement.

use std::sync::{Arc, Weak};
use std::time::Duration;

use flowforge_ports::{Delivery, Dispatch, DispatchConsumer, DispatchQueue, queue};
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use lapin::{Acker, Channel, Connection};
use tokio::sync::Mutex;

use crate::broker;
use crate::config::{ConfigError, RabbitConfig, Settings};

/// How much of an undecodable payload the error log shows.
const LOGGED_PAYLOAD_BYTES: usize = 512;

/// The dispatch queue: hands out consumers, one per worker slot.
///
/// Its consumers share one connection (one channel each). The connection
/// is opened by the first [`consumer`](DispatchQueue::consumer) call and
/// replaced by the first call after it was lost; every call declares the
/// exchange, the quorum queue and the binding again, so a worker that
/// reconnects after the queue was deleted (migration step 3) recreates it.
#[derive(Debug)]
pub struct RabbitQueue {
    settings: Settings,
    connection: Mutex<Option<Connection>>,
}

impl RabbitQueue {
    /// A queue for `config`. Does not connect yet.
    pub fn new(config: RabbitConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            settings: Settings::from_config(&config)?,
            connection: Mutex::new(None),
        })
    }

    /// Connects (if not connected) and declares the exchange, the queue and
    /// the binding, so a worker can fail fast at start, with
    /// [`queue::Error::QueueTypeMismatch`] when the queue is not a quorum
    /// queue. [`consumer`](DispatchQueue::consumer) does the same by itself.
    pub async fn declare(&self) -> Result<(), queue::Error> {
        let channel = self.open_channel().await?;
        broker::declare_topology(&channel, &self.settings).await?;
        // Closing is a courtesy: dropping the channel closes it as well.
        let _ = broker::bounded(
            self.settings.connect_timeout,
            "closing the declaring channel",
            channel.close(200, "declared".into()),
        )
        .await;
        Ok(())
    }

    async fn open_channel(&self) -> Result<Channel, queue::Error> {
        let mut slot = self.connection.lock().await;
        if !slot.as_ref().is_some_and(|connection| connection.status().connected()) {
            if slot.take().is_some() {
                tracing::warn!(url = %self.settings.display_url, "consumer connection lost; reconnecting");
            }
            *slot = Some(broker::connect(&self.settings).await?);
        }
        let Some(connection) = slot.as_ref() else {
            return Err(queue::Error::Unavailable("consumer connection vanished".to_owned()));
        };
        match broker::open_channel(connection, &self.settings).await {
            Ok(channel) => Ok(channel),
            Err(error) => {
                // A connection that cannot open a channel in time is not
                // worth keeping: the next call starts afresh. Consumers on
                // it keep it alive for as long as they hold their channels.
                *slot = None;
                Err(error)
            }
        }
    }
}

impl DispatchQueue for RabbitQueue {
    type Consumer = RabbitConsumer;

    /// Opens a channel, (re)declares the topology, sets `basic.qos`
    /// prefetch 1 and starts a manual-ack consumer on the queue.
    async fn consumer(&self) -> Result<RabbitConsumer, queue::Error> {
        let settings = &self.settings;
        let channel = self.open_channel().await?;
        broker::declare_topology(&channel, settings).await?;
        broker::bounded(
            settings.connect_timeout,
            "setting prefetch 1",
            channel.basic_qos(1, BasicQosOptions::default()),
        )
        .await?;
        let consumer = broker::bounded(
            settings.connect_timeout,
            "starting the consumer",
            channel.basic_consume(
                settings.queue.clone(),
                // Empty: the broker names the consumer.
                "".into(),
                BasicConsumeOptions {
                    no_ack: false,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await?;
        Ok(RabbitConsumer {
            channel: Arc::new(channel),
            consumer,
            op_timeout: settings.publish_timeout,
            failed: None,
        })
    }
}

/// One consumer on its own channel, holding at most one unacknowledged
/// delivery.
///
/// Dropping it closes its channel: the broker requeues the unacknowledged
/// delivery, and that delivery's `ack` fails.
#[derive(Debug)]
pub struct RabbitConsumer {
    // The only strong reference besides lapin's consumer: deliveries hold a
    // weak one, so they never keep the channel open.
    channel: Arc<Channel>,
    consumer: lapin::Consumer,
    op_timeout: Duration,
    /// Set once the stream failed: every later `next` repeats it.
    failed: Option<queue::Error>,
}

impl RabbitConsumer {
    /// Closes the channel and waits for the broker to confirm it: anything
    /// unacknowledged is requeued, and every ack sent before has been
    /// processed.
    pub async fn close(self) -> Result<(), queue::Error> {
        broker::bounded(
            self.op_timeout,
            "closing the consumer channel",
            self.channel.close(200, "consumer closed".into()),
        )
        .await
    }

    fn fail(&mut self, error: queue::Error) -> queue::Error {
        tracing::warn!(%error, "dispatch consumer failed; reconnect with a new consumer");
        self.failed = Some(error.clone());
        error
    }
}

impl DispatchConsumer for RabbitConsumer {
    type Delivery = RabbitDelivery;

    /// Waits for the next valid dispatch. Never returns `Ok(None)`: the end
    /// of the broker's stream (channel or connection closed, consumer
    /// cancelled because the queue was deleted) is `Err(Unavailable)`, after
    /// which this consumer is dead and a new one must be opened.
    ///
    /// A message whose payload is not a `Dispatch` is logged at error level
    /// and rejected without requeue (dead-lettered if the operator set a
    /// dead-letter policy, dropped otherwise), then the wait goes on.
    ///
    /// Cancel-safe: a valid delivery is returned in the same poll that takes
    /// it off the stream.
    async fn next(&mut self) -> Result<Option<RabbitDelivery>, queue::Error> {
        loop {
            if let Some(error) = &self.failed {
                return Err(error.clone());
            }
            let delivery = match self.consumer.next().await {
                Some(Ok(delivery)) => delivery,
                Some(Err(error)) => return Err(self.fail(broker::unavailable("consuming", &error))),
                None => {
                    return Err(self.fail(queue::Error::Unavailable(
                        "the broker ended the consumer (channel closed or queue deleted)".to_owned(),
                    )));
                }
            };
            match serde_json::from_slice::<Dispatch>(&delivery.data) {
                Ok(dispatch) => {
                    return Ok(Some(RabbitDelivery {
                        dispatch,
                        trace_parent: crate::trace::trace_parent(delivery.properties.headers().as_ref()),
                        redelivered: delivery.redelivered,
                        acker: Some(delivery.acker),
                        channel: Arc::downgrade(&self.channel),
                        op_timeout: self.op_timeout,
                    }));
                }
                Err(error) => {
                    let shown = delivery.data.get(..LOGGED_PAYLOAD_BYTES).unwrap_or(&delivery.data);
                    tracing::error!(
                        %error,
                        delivery_tag = delivery.delivery_tag,
                        redelivered = delivery.redelivered,
                        message_id = ?delivery.properties.message_id(),
                        payload_bytes = delivery.data.len(),
                        payload = %String::from_utf8_lossy(shown),
                        "rejecting a message that is not a dispatch (not requeued)"
                    );
                    let rejected = tokio::time::timeout(
                        self.op_timeout,
                        delivery.acker.reject(BasicRejectOptions { requeue: false }),
                    )
                    .await;
                    match rejected {
                        Ok(Ok(true)) => {}
                        Ok(Ok(false)) => {
                            return Err(self.fail(queue::Error::Unavailable(
                                "the channel closed before an invalid message could be rejected".to_owned(),
                            )));
                        }
                        Ok(Err(error)) => {
                            return Err(self.fail(broker::unavailable("rejecting an invalid message", &error)));
                        }
                        Err(_) => {
                            return Err(self.fail(queue::Error::Timeout(format!(
                                "rejecting an invalid message did not complete within {:?}",
                                self.op_timeout
                            ))));
                        }
                    }
                }
            }
        }
    }
}

/// One received dispatch, unacknowledged until [`ack`](Delivery::ack).
///
/// Dropped without `ack` or `nack_requeue`, it is nacked with requeue, so
/// the broker delivers it again (at-least-once) and the consumer's single
/// prefetch slot is freed.
#[derive(Debug)]
pub struct RabbitDelivery {
    dispatch: Dispatch,
    trace_parent: Option<String>,
    redelivered: bool,
    /// Taken by `ack` or `nack_requeue`; still here on drop means neither.
    acker: Option<Acker>,
    channel: Weak<Channel>,
    op_timeout: Duration,
}

impl RabbitDelivery {
    /// Settles the delivery with `op`; a failure closes the channel (if the
    /// consumer still holds it) so the broker requeues the message rather
    /// than leaving it unacknowledged on a channel in an unknown state.
    ///
    /// `verb` ("acking", "nacking") names the operation in errors, as
    /// "{verb} dispatch {id}"; that text is only built on failure.
    async fn settle<F>(mut self, verb: &'static str, op: impl FnOnce(Acker) -> F) -> Result<(), queue::Error>
    where
        F: std::future::Future<Output = lapin::Result<bool>>,
    {
        let id = self.dispatch.dispatch_id;
        let Some(acker) = self.acker.take() else {
            return Err(queue::Error::Unavailable(format!(
                "{verb} dispatch {id}: delivery already settled"
            )));
        };
        let error = match tokio::time::timeout(self.op_timeout, op(acker)).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => queue::Error::Unavailable(format!(
                "{verb} dispatch {id}: the channel closed first; the broker redelivers the dispatch"
            )),
            Ok(Err(error)) => broker::unavailable(&format!("{verb} dispatch {id}"), &error),
            Err(_) => queue::Error::Timeout(format!(
                "{verb} dispatch {id} did not complete within {:?}",
                self.op_timeout
            )),
        };
        if let Some(channel) = self.channel.upgrade() {
            // The close frame is queued synchronously by the first poll;
            // waiting for the broker's reply could hang on a dead socket.
            let _ = channel.close(200, "settling a delivery failed".into()).now_or_never();
        }
        Err(error)
    }
}

impl Delivery for RabbitDelivery {
    fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    fn redelivered(&self) -> bool {
        self.redelivered
    }

    fn trace_parent(&self) -> Option<&str> {
        self.trace_parent.as_deref()
    }

    /// Acks the delivery. An `Err` means it may not have been acked: the
    /// channel is closed (if it was not already), so the broker requeues
    /// it, and the consumer is dead. The redelivery must then be recognised
    /// as done (its claim matches nothing) and acked without running.
    async fn ack(self) -> Result<(), queue::Error> {
        self.settle(
            "acking",
            |acker| async move { acker.ack(BasicAckOptions::default()).await },
        )
        .await
    }

    /// Nacks the delivery with requeue: the broker delivers it again, with
    /// `redelivered` set.
    async fn nack_requeue(self) -> Result<(), queue::Error> {
        self.settle("nacking", |acker| async move {
            acker
                .nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .await
        })
        .await
    }
}

impl Drop for RabbitDelivery {
    fn drop(&mut self) {
        if let Some(acker) = self.acker.take() {
            // Drop cannot await; the nack command is queued synchronously by
            // the first poll (no runtime needed), and nothing is lost by not
            // waiting for it: if it never reaches the broker, the channel
            // closing requeues the message all the same.
            let _ = acker
                .nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .now_or_never();
            tracing::debug!(dispatch_id = %self.dispatch.dispatch_id, "delivery dropped unsettled; nacked for requeue");
        }
    }
}
