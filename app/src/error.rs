//! The application's error type: what a use case or loop can fail with.

use flowforge_domain::RunState;
use flowforge_domain::concurrency::Unresolved;
use flowforge_domain::limits::Refusal;
use flowforge_domain::retry::RetryRefusal;
use flowforge_ports::{LoadError, PublishError, RunId, queue, store};

/// Why a use case failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The store failed.
    #[error(transparent)]
    Store(store::Error),
    /// A value cannot be stored or breaks a size limit
    /// (docs/design/data-flow.md#limits): the caller's input, not the
    /// infrastructure.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A definition could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A definition could not be published.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] queue::Error),
    /// The definition uses task types nothing here can run.
    #[error("unknown task type(s) {}: {}", .types.join(", "), .known_hint)]
    UnknownTaskTypes {
        /// The types with no handler.
        types: Vec<String>,
        /// What is known instead.
        known_hint: String,
    },
    /// No such run.
    #[error("run {0} not found")]
    RunNotFound(RunId),
    /// No published definition has this name (and version).
    #[error("workflow '{name}'{} is not published", .version.map(|v| format!(" version {v}")).unwrap_or_default())]
    WorkflowNotFound {
        /// The name asked for.
        name: String,
        /// The version asked for (`None`: any).
        version: Option<u32>,
    },
    /// A token request is malformed (its name, its scopes).
    #[error("{0}")]
    InvalidToken(String),
    /// A token name is taken.
    #[error("a token named '{0}' already exists; pick another name")]
    TokenNameTaken(String),
    /// A task's timeout is above what the queue can honour.
    #[error("{0}")]
    TimeoutTooLong(String),
    /// One of the engine's loops panicked: a bug in FlowForge or in code
    /// it calls, not a store or queue failure.
    #[error("the engine's {what} panicked: {message}")]
    LoopPanicked {
        /// Which loop.
        what: &'static str,
        /// The panic's message.
        message: String,
    },
    /// The engine's loops ended without an error while a run still needed
    /// them.
    #[error("the engine's loops stopped before the run ended")]
    LoopStopped,
    /// Only a failed or cancelled run can be retried (docs/design/retry.md).
    #[error("run {run} is {state}; only a failed or cancelled run can be retried")]
    RunNotRetryable {
        /// The run.
        run: RunId,
        /// Its state.
        state: RunState,
    },
    /// The retry set could not be decided as asked.
    #[error("run {run} cannot be retried: {refusal}")]
    RetryRefused {
        /// The run.
        run: RunId,
        /// Why.
        refusal: RetryRefusal,
    },
    /// A concurrency limit's key has no single value in the run input
    /// (docs/design/concurrency.md): the run is not started.
    #[error(transparent)]
    ConcurrencyKeyUnresolved(#[from] Unresolved),
    /// A schedule's field is invalid (docs/design/schedules.md).
    #[error(transparent)]
    InvalidSchedule(#[from] flowforge_domain::schedule::ScheduleError),
    /// A schedule name is taken.
    #[error("a schedule named '{0}' already exists; pick another name or delete it first")]
    ScheduleNameTaken(String),
    /// No such schedule.
    #[error("schedule '{0}' not found")]
    ScheduleNotFound(String),
    /// A backfill's range cannot be started as asked.
    #[error("backfill refused: {0}")]
    BackfillRefused(#[from] flowforge_domain::schedule::BackfillRefusal),
    /// Another retry of the run (or a late write) changed it first.
    #[error("run {0} changed while this retry was being applied (another retry won); read it again")]
    RetryLost(RunId),
}

impl From<store::Error> for Error {
    /// A store's refusal of a value is the caller's problem, whichever
    /// check (the use case's or the store's) found it first.
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::Refused(refusal) => Self::Refused(refusal),
            other => Self::Store(other),
        }
    }
}

impl Error {
    /// Whether the failure is the infrastructure's or the engine's own
    /// (exit code 4) rather than the input's (exit code 2).
    pub fn is_infrastructure(&self) -> bool {
        match self {
            Self::Store(_) | Self::Queue(_) | Self::LoopPanicked { .. } | Self::LoopStopped => true,
            Self::Load(e) => !matches!(e, LoadError::NotFound(_)),
            Self::Publish(e) => matches!(e, PublishError::Store(e) if !matches!(e, store::Error::Refused(_))),
            Self::Refused(_)
            | Self::UnknownTaskTypes { .. }
            | Self::RunNotFound(_)
            | Self::WorkflowNotFound { .. }
            | Self::InvalidToken(_)
            | Self::TokenNameTaken(_)
            | Self::TimeoutTooLong(_)
            | Self::RunNotRetryable { .. }
            | Self::RetryRefused { .. }
            | Self::ConcurrencyKeyUnresolved(_)
            | Self::RetryLost(_)
            | Self::InvalidSchedule(_)
            | Self::ScheduleNameTaken(_)
            | Self::ScheduleNotFound(_)
            | Self::BackfillRefused(_) => false,
        }
    }
}
