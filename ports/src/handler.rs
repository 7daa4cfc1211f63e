//! The Handler port: trusted Rust code registered by task type. Nothing in
//! a dispatch message is ever executed; the message only names the type.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde_json::{Map, Value};
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
    /// Cancelled when the attempt must stop: timeout, run cancelled, lease
    /// lost or shutdown. A handler that ignores it is abandoned.
    pub cancel: CancellationToken,
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
