//! The raw shape of a definition document, as deserialised before any
//! rule is checked.

use super::RetrySpec;
use crate::concurrency::{RunLimit, TaskLimit};
use crate::condition::Trigger;
use crate::map::MapSpec;
use crate::priority::Priority;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Workflow-wide defaults, as written. Not folded into tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Default per-attempt timeout, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Default retry policy fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
}

/// One task as written in a definition document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDocument {
    /// Unique, non-blank key.
    pub key: String,
    /// The registered handler that runs it.
    pub task_type: String,
    /// Keys of the forward tasks it waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Handler configuration: a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Per-attempt timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Retry policy fields overriding the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// The forward task this one undoes, making it a compensator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate_for: Option<String>,
    /// Its dispatch priority, over the run's (docs/design/priorities.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Its concurrency limit (docs/design/concurrency.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<TaskLimit>,
    /// Its condition, a CEL expression over `{inputs, run_input}`
    /// (docs/design/conditions.md#when).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Which dependency outcomes let it run; `all_succeeded` when absent
    /// (docs/design/conditions.md#triggers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Runs it once per item of an array a dependency produced
    /// (docs/design/map.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapSpec>,
}

/// A definition document as written (after the shape check).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowDocument {
    /// Non-blank name.
    pub name: String,
    /// Version, ≥ 1. (name, version) is immutable once published.
    pub version: u32,
    /// Free text; part of the fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Workflow-wide defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<Defaults>,
    /// Run-level concurrency limits (docs/design/concurrency.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concurrency: Vec<RunLimit>,
    /// Forward tasks and compensators, in declaration order.
    pub tasks: Vec<TaskDocument>,
}
