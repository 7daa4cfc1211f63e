//! What is wrong with a definition, each problem located by a JSONPath.

use std::fmt;

use crate::graph::GraphError;

/// A rule a definition broke (docs/design/definitions.md#two-stage-validation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// The workflow name is empty or whitespace.
    #[error("workflow name must not be blank")]
    BlankName,
    /// The version is 0.
    #[error("workflow version must be at least 1")]
    InvalidVersion,
    /// A task key is empty or whitespace.
    #[error("task #{index} has a blank key")]
    BlankKey {
        /// Declaration index of the task.
        index: usize,
    },
    /// A task type is empty or whitespace.
    #[error("task '{task}' has a blank task_type")]
    BlankTaskType {
        /// The task.
        task: String,
    },
    /// `config` is not a JSON object, or nests too deeply.
    #[error("task '{task}': {problem}")]
    InvalidConfig {
        /// The task.
        task: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A timeout or retry field is out of range.
    #[error("{place}: {problem}")]
    InvalidSetting {
        /// The task (`None`: the workflow defaults).
        task: Option<String>,
        /// Where, for the message: "task 'x'" or "defaults".
        place: String,
        /// What is wrong.
        problem: String,
    },
    /// A graph rule (duplicate key, unknown/duplicate/self dependency, cycle).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A forward task depends on a compensator, which is outside the DAG.
    #[error("task '{task}' depends on compensation task '{dependency}'")]
    DependsOnCompensator {
        /// The forward task.
        task: String,
        /// The compensator it names.
        dependency: String,
    },
    /// A compensator declares `depends_on`.
    #[error("compensation task '{task}' must not declare depends_on")]
    CompensatorHasDependencies {
        /// The compensator.
        task: String,
    },
    /// A compensator names itself.
    #[error("compensation task '{task}' cannot compensate itself")]
    CompensatesItself {
        /// The compensator.
        task: String,
    },
    /// A compensator names a key no forward task has.
    #[error("compensation task '{task}' compensates unknown task '{target}'")]
    CompensatesUnknown {
        /// The compensator.
        task: String,
        /// The missing key.
        target: String,
    },
    /// A compensator names another compensator.
    #[error("compensation task '{task}' compensates '{target}', which is itself a compensation task")]
    CompensatesCompensator {
        /// The compensator.
        task: String,
        /// The compensator it names.
        target: String,
    },
    /// Two compensators name the same forward task.
    #[error("task '{target}' has two compensation tasks: '{first}' and '{task}'")]
    DuplicateCompensator {
        /// The second compensator.
        task: String,
        /// The forward task.
        target: String,
        /// The first compensator.
        first: String,
    },
    /// A concurrency limit that cannot work: a key that is not a JSONPath,
    /// one declared twice, or a limit on a compensator.
    #[error("{}concurrency: {problem}", task.as_ref().map(|t| format!("task '{t}': ")).unwrap_or_default())]
    InvalidConcurrency {
        /// The task (`None`: the workflow's limits).
        task: Option<String>,
        /// What is wrong.
        problem: String,
    },
    /// A `when` or `trigger` where the engine cannot honour it.
    #[error("task '{task}': {problem}")]
    InvalidCondition {
        /// The task.
        task: String,
        /// What is wrong.
        problem: String,
    },
    /// A `map` the engine cannot run (docs/design/map.md).
    #[error("task '{task}': {problem}")]
    InvalidMap {
        /// The task.
        task: String,
        /// What is wrong.
        problem: String,
    },
    /// No forward task at all (only compensators).
    #[error("a workflow needs at least one task that is not a compensation task")]
    NoForwardTasks,
}

impl DefinitionError {
    /// The task the error names, if any.
    pub fn task(&self) -> Option<&str> {
        match self {
            Self::BlankName | Self::InvalidVersion | Self::BlankKey { .. } | Self::NoForwardTasks => None,
            Self::InvalidSetting { task, .. } | Self::InvalidConcurrency { task, .. } => task.as_deref(),
            Self::Graph(g) => Some(g.task()),
            Self::BlankTaskType { task }
            | Self::InvalidConfig { task, .. }
            | Self::InvalidCondition { task, .. }
            | Self::InvalidMap { task, .. }
            | Self::DependsOnCompensator { task, .. }
            | Self::CompensatorHasDependencies { task }
            | Self::CompensatesItself { task }
            | Self::CompensatesUnknown { task, .. }
            | Self::CompensatesCompensator { task, .. }
            | Self::DuplicateCompensator { task, .. } => Some(task),
        }
    }
}

/// A [`DefinitionError`] with the declaration index of the task it names,
/// so a report can point at `$.tasks[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedError {
    /// Declaration index of the task (`None`: the workflow itself).
    pub index: Option<usize>,
    /// The rule that was broken.
    pub error: DefinitionError,
}

impl LocatedError {
    /// The JSONPath of the offending element: `$.tasks[i]` or `$`.
    pub fn path(&self) -> String {
        match self.index {
            Some(i) => format!("$.tasks[{i}]"),
            None => "$".to_owned(),
        }
    }
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path(), self.error)
    }
}

/// Every rule a definition broke, in declaration order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DefinitionErrors(pub Vec<LocatedError>);

impl fmt::Display for DefinitionErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for e in &self.0 {
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Why stored rows do not give back the definition that was published
/// (docs/design/definitions.md#loading: rows can go bad without the domain's
/// help).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoredDefinitionError {
    /// The rows no longer make a valid definition.
    #[error(transparent)]
    Invalid(#[from] DefinitionErrors),
    /// A task's stored attempt limit disagrees with its retry policy.
    #[error("task '{key}': stored max_attempts {stored} disagrees with its retry policy's {effective}")]
    MaxAttempts {
        /// The task.
        key: String,
        /// The stored column.
        stored: i64,
        /// What the rebuilt definition's policy gives.
        effective: u32,
    },
    /// The rows give another definition than the one published.
    #[error("its rows give fingerprint {computed}, not the published {published}: a task row was changed or lost")]
    Fingerprint {
        /// The fingerprint of the rebuilt definition.
        computed: String,
        /// The fingerprint stored at publication.
        published: String,
    },
}
