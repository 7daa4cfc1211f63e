//! The application's error type: what a use case or loop can fail with.

use flowforge_ports::{LoadError, PublishError, QueueError, RunId, StoreError};

/// Why a use case failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A definition could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A definition could not be published.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
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
    /// A task's timeout is above what the queue can honour.
    #[error("{0}")]
    TimeoutTooLong(String),
    /// A worker slot panicked: the worker no longer serves what it
    /// advertises, so it must end with a failure and be restarted.
    #[error("a worker slot panicked: {0}")]
    SlotPanicked(String),
}

impl Error {
    /// Whether the failure is the infrastructure's (exit code 4) rather than
    /// the input's (exit code 2).
    pub fn is_infrastructure(&self) -> bool {
        match self {
            Self::Store(_) | Self::Queue(_) | Self::SlotPanicked(_) => true,
            Self::Load(e) => !matches!(e, LoadError::NotFound(_)),
            Self::Publish(e) => matches!(e, PublishError::Store(_)),
            Self::UnknownTaskTypes { .. } | Self::RunNotFound(_) | Self::TimeoutTooLong(_) => false,
        }
    }
}
