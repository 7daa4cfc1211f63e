//! What a store call can fail with, and the generic transition path's
//! check that runs before any I/O.

use flowforge_domain::limits::Refusal;
use flowforge_domain::{TaskRunState, TaskTransition, task_machine};

/// A failure of a store call: of the store itself, or a value it refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The caller's value cannot be stored or breaks a size limit
    /// (docs/design/data-flow.md#limits); nothing was written. Not
    /// transient: the same value is refused again.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The database cannot be reached, or the pool timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The schema is missing or behind this binary.
    #[error("store schema is missing or out of date ({0}); run `flowforge migrate --db …`")]
    Migration(String),
    /// Stored data breaks an invariant (a manual edit, a bug): named, never guessed around.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// Anything else the database reported.
    #[error("store error: {0}")]
    Other(String),
}

impl Error {
    /// Whether a caller may retry later (a database that is down may come back).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Why a definition was not published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// (name, version) is taken by different content.
    #[error(
        "workflow '{name}' version {version} is already published with different content \
         (stored fingerprint {existing}, this file {new}); bump the version to publish a change"
    )]
    Conflict {
        /// Workflow name.
        name: String,
        /// Workflow version.
        version: u32,
        /// Fingerprint of the stored definition.
        existing: String,
        /// Fingerprint of the rejected one.
        new: String,
    },
    /// A concurrent first publish of the same (name, version) won the
    /// unique constraint while this one was inserting. Retrying returns the
    /// winner's row (or a `Conflict`).
    #[error("a concurrent publish of workflow '{name}' version {version} won; retry to read its result")]
    LostRace {
        /// Workflow name.
        name: String,
        /// Workflow version.
        version: u32,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] Error),
}

/// Why a definition could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No such definition.
    #[error("workflow definition {0} not found")]
    NotFound(String),
    /// The stored rows no longer form a valid definition.
    #[error("stored workflow definition {workflow} is invalid: {problem}")]
    Invalid {
        /// Which definition.
        workflow: String,
        /// What re-validation found.
        problem: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] Error),
}

/// Why a generic transition was refused before any SQL ran, or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// No edge of the TaskRun machine joins these states: a caller bug.
    #[error("illegal task run transition {from} -> {to}: not in the TaskRun machine")]
    Illegal {
        /// Claimed current state.
        from: TaskRunState,
        /// Requested state.
        to: TaskRunState,
    },
    /// The edge spends a lease: only the lease holder may take it.
    #[error("transition '{0}' requires the lease; use finish_task_run with the fencing token")]
    LeaseRequired(TaskTransition),
    /// The edge has its own operation, which writes what the edge needs.
    #[error("transition '{transition}' is not applied generically; use {operation}")]
    Reserved {
        /// The edge.
        transition: TaskTransition,
        /// The operation that applies it.
        operation: &'static str,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] Error),
}

/// Resolves a generic `from → to` request against the TaskRun machine, before
/// any I/O: the caller contract
/// (docs/design/state-machines.md#caller-contract). Stores call this first in
/// `transition_task_run`; `Ok` carries the edge to apply.
pub fn resolve_generic_transition(from: TaskRunState, to: TaskRunState) -> Result<TaskTransition, TransitionError> {
    let mut edges = task_machine().edges_between(from, to).peekable();
    let Some(first) = edges.peek().map(|t| t.name) else {
        return Err(TransitionError::Illegal { from, to });
    };
    if task_machine().requires_lease(first) {
        return Err(TransitionError::LeaseRequired(first));
    }
    let operation = match first {
        TaskTransition::Claim => "claim_task_run",
        TaskTransition::ReapLease | TaskTransition::ReapLeaseFinal => "reap_expired_leases",
        TaskTransition::ScheduleRetry => "finish_task_run (a failure with attempts left)",
        TaskTransition::Skip => "RunPass::skip_pending (the scheduler deciding a condition)",
        TaskTransition::FailCondition => "RunPass::fail_pending (the scheduler deciding a condition)",
        TaskTransition::Collect => "RunPass::collect_map (the scheduler collecting a mapped task)",
        _ => return Ok(first),
    };
    Err(TransitionError::Reserved {
        transition: first,
        operation,
    })
}

/// One migration this binary carries: version, description, checksum.
pub type KnownMigration<'a> = (i64, &'a str, &'a [u8]);

/// Compares the migrations a database records as applied (version →
/// success, checksum) with those this binary carries: every one applied,
/// successfully and from the same SQL, and none the binary does not know.
/// Both stores read their records and ask this one rule.
pub fn check_migrations<'a>(
    known: impl IntoIterator<Item = KnownMigration<'a>>,
    applied: &std::collections::BTreeMap<i64, (bool, Vec<u8>)>,
) -> Result<(), Error> {
    let mut versions = std::collections::BTreeSet::new();
    for (version, description, checksum) in known {
        versions.insert(version);
        match applied.get(&version) {
            None => {
                return Err(Error::Migration(format!(
                    "migration {version} ({description}) is not applied"
                )));
            }
            Some((false, _)) => {
                return Err(Error::Migration(format!(
                    "migration {version} ({description}) failed part-way; repair the database"
                )));
            }
            Some((true, stored)) if stored.as_slice() != checksum => {
                return Err(Error::Migration(format!(
                    "migration {version} ({description}) was applied from different SQL than this binary carries"
                )));
            }
            Some(_) => {}
        }
    }
    match applied.keys().find(|v| !versions.contains(*v)) {
        Some(unknown) => Err(Error::Migration(format!(
            "the database has migration {unknown}, which this binary does not know: it is older than the schema"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskRunState::*;

    #[test]
    fn the_generic_path_refuses_before_any_io() {
        assert_eq!(
            resolve_generic_transition(Succeeded, Pending),
            Err(TransitionError::Illegal {
                from: Succeeded,
                to: Pending
            })
        );
        assert_eq!(
            resolve_generic_transition(Running, Succeeded),
            Err(TransitionError::LeaseRequired(TaskTransition::Succeed))
        );
        assert_eq!(
            resolve_generic_transition(Running, Failed),
            Err(TransitionError::LeaseRequired(TaskTransition::Fail))
        );
        assert!(matches!(
            resolve_generic_transition(Running, Ready),
            Err(TransitionError::Reserved {
                transition: TaskTransition::ReapLease,
                ..
            })
        ));
        assert!(matches!(
            resolve_generic_transition(Ready, Running),
            Err(TransitionError::Reserved {
                transition: TaskTransition::Claim,
                ..
            })
        ));
        assert!(matches!(
            resolve_generic_transition(Failed, Retrying),
            Err(TransitionError::Reserved {
                transition: TaskTransition::ScheduleRetry,
                ..
            })
        ));
        assert_eq!(
            resolve_generic_transition(Pending, Ready),
            Ok(TaskTransition::DependenciesSatisfied)
        );
        assert_eq!(
            resolve_generic_transition(Retrying, Cancelled),
            Ok(TaskTransition::CancelRetrying)
        );
    }

    #[test]
    fn lease_errors_point_at_finish() {
        let msg = TransitionError::LeaseRequired(TaskTransition::Succeed).to_string();
        assert!(msg.contains("finish_task_run"), "{msg}");
    }
}
