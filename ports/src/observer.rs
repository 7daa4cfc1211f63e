//! The Observer port: the lifecycle hooks
//! (docs/design/handlers.md#lifecycle-hooks). Called after the change is
//! persisted; a failing or panicking observer is contained and logged, never
//! allowed to affect the run.

use std::time::Duration;

use flowforge_domain::{RunState, SkipReason};
use serde_json::Value;

use crate::ids::RunId;

/// A task's lifecycle moment.
#[derive(Debug, Clone)]
pub struct TaskEvent {
    /// The run.
    pub run_id: RunId,
    /// The task's key.
    pub task_key: String,
    /// The task's type.
    pub task_type: String,
    /// The forward task this one compensates, if it is a compensator.
    pub compensate_for: Option<String>,
    /// 1-based attempt the event is about.
    pub attempt: u32,
    /// The output, on success.
    pub output: Option<Value>,
    /// The error, on failure or retry.
    pub error: Option<String>,
    /// The wait before the next attempt, on retry.
    pub retry_in: Option<Duration>,
}

/// A run reaching a terminal state.
#[derive(Debug, Clone)]
pub struct RunEvent {
    /// The run.
    pub run_id: RunId,
    /// Workflow name.
    pub workflow: String,
    /// Workflow version.
    pub version: u32,
    /// The terminal state.
    pub state: RunState,
}

/// Lifecycle hooks. Every method has an empty default, so an observer
/// implements only what it needs. Hooks run on the engine's threads: keep
/// them quick, hand slow work to a channel.
pub trait Observer: Send + Sync + 'static {
    /// A task entered `running` (its claim is stored).
    fn on_task_start(&self, _event: &TaskEvent) {}
    /// A task succeeded (its output is stored).
    fn on_task_succeeded(&self, _event: &TaskEvent) {}
    /// A task failed for good (no attempt left, or a permanent failure).
    fn on_task_failed(&self, _event: &TaskEvent) {}
    /// An attempt failed and the task waits to retry.
    fn on_task_retry(&self, _event: &TaskEvent) {}
    /// A task was skipped by its `when` or its trigger, for `reason`
    /// (docs/design/conditions.md#skipping); it never ran.
    fn on_task_skipped(&self, _event: &TaskEvent, _reason: SkipReason) {}
    /// A run reached a terminal state (after any rollback).
    fn on_workflow_done(&self, _event: &RunEvent) {}
}
