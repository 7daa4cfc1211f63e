//! The Handler port: trusted Rust code registered by task type. Nothing in
//! a dispatch message is ever executed; the message only names the type.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::ids::RunId;

/// Everything a handler gets for one attempt
/// (docs/design/handlers.md#task-context).
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The run.
    pub run_id: RunId,
    /// The task's key.
    pub task_key: String,
    /// The task's type (what selected this handler).
    pub task_type: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The attempt's fencing token: it grows with every claim, so a
    /// downstream system that keeps the highest token it has seen for
    /// `idempotency_key` can refuse the writes of an attempt that lost its
    /// lease (docs/design/leases-and-fencing.md#fencing-tokens).
    pub token: i64,
    /// `{run_id}:{task_key}`: stable across attempts and redeliveries, so a
    /// handler can make its side effect idempotent.
    pub idempotency_key: String,
    /// The run's input.
    pub run_input: Value,
    /// Outputs of the task's dependencies, keyed by task key. A compensator
    /// gets the output of the task it undoes under that task's key.
    pub inputs: Map<String, Value>,
    /// The task's `config`.
    pub config: Map<String, Value>,
    /// For a child `task[i]` of a mapped task, its item and index
    /// (docs/design/map.md#children); `None` otherwise.
    pub item: Option<MapItem>,
    /// Cancelled when the attempt must stop: timeout, run cancelled, lease
    /// lost or shutdown. A handler that ignores it is abandoned.
    pub cancel: CancellationToken,
    /// The attempt's line back to its worker: progress and heartbeats.
    pub pulse: Pulse,
}

/// The item a child of a mapped task runs for.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MapItem {
    /// The item's index in the source array, 0-based.
    pub index: u32,
    /// The item.
    pub item: Value,
}

impl TaskContext {
    /// Reports how far the attempt has got: a small JSON value (at most
    /// [`MAX_PROGRESS_BYTES`](flowforge_domain::limits::MAX_PROGRESS_BYTES))
    /// shown with the task in `runs get` and the API. See [`Pulse::progress`].
    pub fn progress(&self, value: Value) {
        self.pulse.progress(value);
    }

    /// Renews the lease now. See [`Pulse::heartbeat`].
    pub fn heartbeat(&self) {
        self.pulse.heartbeat();
    }
}

/// What a running handler tells its worker between start and end. The
/// worker renews the attempt's lease on its own every third of a lease;
/// a pulse brings the next renewal forward (to at most one store write a
/// second) and carries the latest progress with it, so a handler busy
/// with long CPU work can show it is alive and how far it is. Cheap to
/// clone; usable from a blocking handler's thread.
#[derive(Debug, Clone, Default)]
pub struct Pulse(Arc<PulseState>);

#[derive(Debug, Default)]
struct PulseState {
    progress: Mutex<Option<Value>>,
    wake: Notify,
}

impl Pulse {
    /// Reports progress: the latest value wins, and it is stored with the
    /// next renewal. A value too large to store is dropped with a warning
    /// in the worker's log.
    pub fn progress(&self, value: Value) {
        *self.0.progress.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
        self.0.wake.notify_one();
    }

    /// Asks the worker to renew the lease now.
    pub fn heartbeat(&self) {
        self.0.wake.notify_one();
    }

    /// For the worker: resolves at the next report or heartbeat (one sent
    /// while nobody waited included).
    pub async fn pulsed(&self) {
        self.0.wake.notified().await;
    }

    /// For the worker: the progress reported since the last take.
    pub fn take_progress(&self) -> Option<Value> {
        self.0.progress.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Whether a failed attempt may be retried
/// (docs/design/state-machines.md#permanent-failures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Another attempt may succeed; the retry policy decides.
    Retryable,
    /// No attempt can succeed (bad config, unknown type, …): skip retries.
    Permanent,
}

/// A failed attempt, as the handler reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    /// What went wrong, for the run report.
    pub message: String,
    /// Retryable or permanent.
    pub kind: FailureKind,
    /// The least wait before the next attempt (an HTTP `Retry-After`, a
    /// rate limit's reset): the retry waits for the longer of this and the
    /// retry policy's backoff. Ignored for a permanent failure.
    pub retry_after: Option<Duration>,
}

impl HandlerError {
    /// A failure another attempt may fix.
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            kind: FailureKind::Retryable,
            retry_after: None,
        }
    }

    /// A failure another attempt may fix, but not before `after`.
    pub fn retryable_after(message: impl fmt::Display, after: Duration) -> Self {
        Self {
            retry_after: Some(after),
            ..Self::retryable(message)
        }
    }

    /// A failure no attempt can fix: the task fails without retrying.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            kind: FailureKind::Permanent,
            retry_after: None,
        }
    }

    /// Whether retries are skipped.
    pub fn is_permanent(&self) -> bool {
        self.kind == FailureKind::Permanent
    }
}

/// An async task handler. Returns the task's JSON output.
///
/// Contract: the handler SHOULD return soon after `ctx.cancel` fires; the
/// engine stops waiting at the timeout either way. It MAY be called more
/// than once for one task (at-least-once), so side effects should use
/// `ctx.idempotency_key`.
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt.
    fn run(&self, ctx: TaskContext) -> impl Future<Output = Result<Value, HandlerError>> + Send;
}
