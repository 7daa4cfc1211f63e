//! FlowForge's pure rules: the two state machines, definitions and their
//! validation, the dependency graph, the fingerprint, run-state derivation,
//! the scheduler pass's decisions, task conditions, retry policy and
//! compensation order, mapped tasks, and when schedules fire.
//!
//! Nothing here performs I/O, reads a clock, draws a random number or runs
//! async code: time and ids come in as arguments. `cargo xtask check-deps`
//! and `cargo deny` enforce that over the whole dependency graph.

pub mod concurrency;
pub mod condition;
pub mod definition;
pub mod derive;
pub mod fingerprint;
pub mod graph;
pub mod json_path;
pub mod limits;
pub mod machine;
pub mod map;
pub mod plan;
pub mod priority;
pub mod retry;
pub mod schedule;
pub mod schema;
pub mod state;

pub use definition::{
    Defaults, DefinitionError, DefinitionErrors, LocatedError, RetryPolicy, RetrySpec, StoredDefinitionError,
    TaskDefinition, TaskDocument, WorkflowDefinition, WorkflowDocument,
};
pub use graph::{DependencyGraph, GraphError};
pub use machine::{MachineError, RetryEdge, StateMachine, Transition};
pub use priority::{Priority, PriorityError};
pub use state::{
    CancelReason, RunState, RunTransition, SkipReason, TaskRunState, TaskTransition, initial_task_run_state,
    run_machine, task_machine,
};
