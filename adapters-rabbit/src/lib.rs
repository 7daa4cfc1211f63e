//! FlowForge's dispatch ports over RabbitMQ (lapin): a durable direct
//! exchange, a durable **quorum** queue bound to it, publisher confirms and
//! manual acknowledgement.
//!
//! * [`RabbitPublisher`] implements [`DispatchPublisher`]: confirm mode,
//!   `mandatory`, persistent JSON messages (`message_id` = the dispatch id),
//!   a whole batch in flight at once, a `basic.return` reported as
//!   [`queue::Error::Unroutable`] although the broker also acks it. It
//!   declares the exchange only.
//! * [`RabbitQueue`] implements [`DispatchQueue`]: each
//!   [`consumer`](flowforge_ports::DispatchQueue::consumer) declares exchange, queue
//!   (`x-queue-type: quorum`) and binding, then consumes on its own channel
//!   with prefetch 1 and manual ack. A classic queue of the same name makes
//!   the declaration fail with PRECONDITION_FAILED, reported as
//!   [`queue::Error::QueueTypeMismatch`] carrying the migration procedure.
//!
//! Nothing here retries: a lost connection is [`queue::Error::Unavailable`],
//! and the next publish or `consumer()` call reconnects. The loops above
//! own the backoff. Every broker operation is bounded by a timeout of
//! [`RabbitConfig`]. Both types must be used inside a Tokio runtime.
//!
//! # The consumer timeout
//!
//! RabbitMQ closes a channel whose delivery stays unacknowledged longer
//! than its `consumer_timeout` (30 minutes by default; `consumer_timeout`
//! in `rabbitmq.conf`, in milliseconds). Heartbeats do not reset it: it
//! counts from the delivery, however alive the consumer is. The channel is
//! closed with PRECONDITION_FAILED, the delivery is requeued and handed to
//! another worker, and the first worker's ack then fails. So a task must
//! never be allowed to run, with its claim, outcome write and ack, longer
//! than that: the worker refuses task timeouts above
//! [`RabbitConfig::max_task_timeout`] (the consumer timeout minus
//! [`CONSUMER_TIMEOUT_MARGIN`]). Set [`RabbitConfig::consumer_timeout`] to
//! the broker's value; raising the broker's limit is the only way to run
//! longer tasks. (The broker does not tell its clients this value.)
//!
//! # The dispatch window
//!
//! A quorum queue delivers in arrival order, so priorities
//! (docs/design/priorities.md) are kept by publishing late: before each
//! sweep the publisher asks the queue (a passive declare) how many messages
//! wait ready and how many consumers it has, and takes from the outbox only
//! enough to fill [`RabbitConfig::dispatch_window`] — by default one ready
//! message per consumer. Everything else waits in the outbox, which is
//! swept highest priority first. Urgent work therefore queues behind at
//! most the window, not behind the whole backlog.
//!
//! # Redelivery limits
//!
//! RabbitMQ 4.0 and later give quorum queues a default delivery limit of 20:
//! a message requeued more often is dropped, or dead-lettered if a policy
//! says where. Every nack, dropped delivery and lost consumer counts. The
//! outbox does not republish a confirmed dispatch, so raise the limit with a
//! policy (`delivery-limit`) where tasks may be requeued that often; this
//! adapter declares no `x-delivery-limit` argument, since changing a queue's
//! arguments later makes its declaration fail.
//!
//! [`DispatchPublisher`]: flowforge_ports::DispatchPublisher
//! [`DispatchQueue`]: flowforge_ports::DispatchQueue
//! [`queue::Error::Unroutable`]: flowforge_ports::queue::Error::Unroutable
//! [`queue::Error::QueueTypeMismatch`]: flowforge_ports::queue::Error::QueueTypeMismatch
//! [`queue::Error::Unavailable`]: flowforge_ports::queue::Error::Unavailable

mod broker;
mod config;
mod consumer;
mod publisher;
mod trace;

pub use config::{
    CONSUMER_TIMEOUT_MARGIN, ConfigError, DEFAULT_CONSUMER_TIMEOUT, DEFAULT_EXCHANGE, DEFAULT_FRAME_MAX, DEFAULT_QUEUE,
    DEFAULT_ROUTING_KEY, DispatchWindow, RabbitConfig,
};
pub use consumer::{RabbitConsumer, RabbitDelivery, RabbitQueue};
pub use publisher::RabbitPublisher;
