//! The dispatch ports: publishing outbox rows to a queue and consuming
//! them with manual acknowledgement (at-least-once).

use std::future::Future;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use flowforge_domain::Priority;

use crate::ids::{DispatchId, RunId, TaskRunId};

/// One dispatch: "task run X is ready at token T". The payload every queue
/// carries, byte for byte, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispatch {
    /// The outbox row.
    pub dispatch_id: DispatchId,
    /// The task run to claim.
    pub task_run_id: TaskRunId,
    /// Its run.
    pub run_id: RunId,
    /// Its task key (for logs; the store is the authority).
    pub task_key: String,
    /// Its task type (for routing and logs; the store is the authority).
    pub task_type: String,
    /// The token the claim must match: a stale dispatch claims nothing.
    pub fencing_token: i64,
    /// When the task run became ready at this token, in store time (its
    /// outbox row's creation): the claim's store time minus this is the
    /// task's schedule-to-start latency. Absent from dispatches written
    /// before it was carried, so a message already queued still parses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<DateTime<Utc>>,
    /// The task run's priority, which an in-process queue orders by
    /// (docs/design/priorities.md). Dispatches written before it was
    /// carried parse as the default.
    #[serde(default)]
    pub priority: Priority,
}

impl Dispatch {
    /// The W3C trace context (`traceparent`) a broker header carries with
    /// this dispatch: the trace is the run's (its id's 128 bits, so every
    /// process agrees on it without talking) and the parent span is the
    /// dispatch (docs/design/server.md#traces).
    pub fn trace_parent(&self) -> String {
        // A span id of zero is invalid; outbox ids start at 1.
        let span = self.dispatch_id.0.max(1);
        format!("00-{}-{span:016x}-01", self.run_id.0.simple())
    }
}

/// Why a queue operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The broker cannot be reached or the connection dropped. Retry later.
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    /// The broker returned the message: no queue is bound to route it.
    #[error("dispatch {0} was returned unroutable: no queue is bound")]
    Unroutable(DispatchId),
    /// A publish or confirm did not complete in time.
    #[error("queue operation timed out: {0}")]
    Timeout(String),
    /// The broker refused the publish (nack).
    #[error("broker refused dispatch {0}")]
    Nacked(DispatchId),
    /// The queue exists with another type. Never retried: an operator must
    /// migrate it; the message carries the procedure.
    #[error("{0}")]
    QueueTypeMismatch(String),
    /// The queue was closed (shutdown).
    #[error("queue closed")]
    Closed,
}

impl Error {
    /// Whether retrying the same operation later can succeed.
    pub fn is_transient(&self) -> bool {
        !matches!(self, Self::QueueTypeMismatch(_))
    }
}

/// Publishes dispatches.
pub trait DispatchPublisher: Send + Sync + 'static {
    /// Publishes every dispatch of `batch` and waits for each outcome, with
    /// many in flight at once. Returns one result per dispatch, in order.
    ///
    /// Contract: `Ok` means the broker confirmed the message *and* routed
    /// it to a queue; an unroutable message is `Err(Unroutable)` even
    /// though the broker also acknowledges it. Every wait is bounded by a
    /// timeout. Publishing the same dispatch twice is allowed (consumers
    /// de-duplicate by claim).
    fn publish(&self, batch: &[Dispatch]) -> impl Future<Output = Vec<Result<(), Error>>> + Send;

    /// How many more dispatches the queue should take now, or `None` when
    /// it takes any number. A queue that cannot order by priority itself
    /// keeps a small window of ready messages and leaves the rest in the
    /// outbox, which is swept in priority order
    /// (docs/design/priorities.md#the-broker-window). Advisory: two
    /// publishers may both fill the same room.
    fn room(&self) -> impl Future<Output = Result<Option<u32>, Error>> + Send {
        std::future::ready(Ok(None))
    }

    /// Whether this queue holds a dispatch it would deliver before
    /// `dispatch`, were that published now. A slot that would run
    /// `dispatch` itself, straight from its own finish, leaves it to the
    /// queue then, so it jumps no more urgent work
    /// (docs/design/outbox-and-queues.md#continuing-a-chain). A queue that
    /// cannot tell answers `false`.
    fn holds_more_urgent(&self, dispatch: &Dispatch) -> bool {
        let _ = dispatch;
        false
    }

    /// Whether a published dispatch outlives this process. A broker's
    /// queue keeps it; an in-process queue loses what it held when its
    /// process ends, so its publisher first re-arms those rows
    /// ([`OutboxStore::rearm_lost_dispatches`](crate::OutboxStore::rearm_lost_dispatches)).
    fn durable(&self) -> bool;
}

/// A queue that hands out consumers.
pub trait DispatchQueue: Send + Sync + 'static {
    /// A consumer.
    type Consumer: DispatchConsumer;

    /// Opens a consumer holding at most one unacknowledged delivery
    /// (prefetch 1) while it waits for one: a worker opens one per
    /// concurrency slot. A slot holds a second only when
    /// [`DispatchConsumer::try_next`] finds it already waiting.
    fn consumer(&self) -> impl Future<Output = Result<Self::Consumer, Error>> + Send;
}

/// Receives dispatches one at a time.
pub trait DispatchConsumer: Send + 'static {
    /// A delivery to acknowledge.
    type Delivery: Delivery;

    /// Waits for the next delivery. `Ok(None)` means the queue closed.
    ///
    /// Contract: a delivery that is dropped, nacked, or whose consumer is
    /// dropped before `ack` is delivered again (at-least-once).
    fn next(&mut self) -> impl Future<Output = Result<Option<Self::Delivery>, Error>> + Send;

    /// A delivery already waiting for this consumer, without waiting, even
    /// while an earlier one is not yet acknowledged: a worker slot takes
    /// its next task before storing the last one's outcome, and stores the
    /// one and claims the other together
    /// (docs/design/leases-and-fencing.md#finish-and-claim-next). `None`
    /// when nothing waits, or when the queue hands a consumer one
    /// unacknowledged delivery at a time (a broker's prefetch of one); the
    /// default.
    ///
    /// Contract: as [`DispatchConsumer::next`]'s deliveries, one taken
    /// here that is dropped or nacked, or whose consumer is dropped before
    /// `ack`, is delivered again.
    fn try_next(&mut self) -> Option<Self::Delivery> {
        None
    }
}

/// One received dispatch.
pub trait Delivery: Send + 'static {
    /// The dispatch it carries.
    fn dispatch(&self) -> &Dispatch;
    /// Whether the queue delivered it before.
    fn redelivered(&self) -> bool;
    /// The W3C `traceparent` that travelled with it, when the queue
    /// carries headers (see [`Dispatch::trace_parent`]).
    fn trace_parent(&self) -> Option<&str> {
        None
    }
    /// Acknowledges it: it will not be delivered again. Call only after the
    /// outcome is stored.
    fn ack(self) -> impl Future<Output = Result<(), Error>> + Send;
    /// Returns it to the queue for another delivery.
    fn nack_requeue(self) -> impl Future<Output = Result<(), Error>> + Send;
}
