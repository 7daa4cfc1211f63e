//! Concurrency limits (docs/design/concurrency.md): what a definition
//! declares, and the gates one run's input resolves them to.
//!
//! A limit names a key — a JSONPath (RFC 9535) into the run input — and a
//! `max`. Every run (or task) whose input gives the same key value draws on
//! one pool of `max` slots. The pool's identity is its [`Gate::scope`]:
//! the workflow's name, the level (the run or one task), the key's path and
//! the value, so versions of a workflow share their pools and two
//! workflows never do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json_path::JsonPath;

use crate::definition::WorkflowDefinition;

/// What a run does when every slot of its key is held
/// (docs/design/concurrency.md#strategies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Wait for a slot.
    #[default]
    Queue,
    /// Cancel the new run (reason `concurrency_limit`).
    CancelNewest,
    /// Cancel the oldest holder, then take its slot once it has let go.
    CancelInProgress,
}

impl Strategy {
    /// The stable snake-case name, as written in a definition and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::CancelNewest => "cancel_newest",
            Self::CancelInProgress => "cancel_in_progress",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "queue" => Ok(Self::Queue),
            "cancel_newest" => Ok(Self::CancelNewest),
            "cancel_in_progress" => Ok(Self::CancelInProgress),
            other => Err(format!("'{other}' is not a concurrency strategy")),
        }
    }
}

/// A run-level limit as written: slots held from the run's admission to
/// its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLimit {
    /// JSONPath into the run input.
    pub key: String,
    /// How many runs may hold a slot of one key value at once.
    pub max: u32,
    /// What a run does when none is free.
    #[serde(default, skip_serializing_if = "is_queue")]
    pub strategy: Strategy,
}

// serde's skip_serializing_if hands the field by reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_queue(s: &Strategy) -> bool {
    *s == Strategy::Queue
}

/// A task-level limit as written: slots held from the task's admission to
/// its end (its retries' waits included); a task waits for one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskLimit {
    /// JSONPath into the run input.
    pub key: String,
    /// How many task runs may hold a slot of one key value at once.
    pub max: u32,
}

/// The limits a stored definition document declares (a store keeps the
/// document as written beside its task rows): the run's, and each task's
/// by key. A rebuilt definition's fingerprint then tells whether they are
/// the ones published.
pub fn stored_limits(document: &Value) -> Result<(Vec<RunLimit>, BTreeMap<String, TaskLimit>), String> {
    let run = match document.get("concurrency") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| format!("the stored concurrency is not valid: {e}"))?
        }
    };
    let mut tasks = BTreeMap::new();
    for task in document.get("tasks").and_then(Value::as_array).into_iter().flatten() {
        if let (Some(key), Some(limit)) = (task.get("key").and_then(Value::as_str), task.get("concurrency")) {
            let limit: TaskLimit = serde_json::from_value(limit.clone())
                .map_err(|e| format!("task '{key}': the stored concurrency is not valid: {e}"))?;
            tasks.insert(key.to_owned(), limit);
        }
    }
    Ok((run, tasks))
}

/// The most run-level limits a definition may declare.
pub const MAX_RUN_LIMITS: usize = 16;
/// The largest pool a limit may ask for.
pub const MAX_POOL: u32 = 10_000;

/// Why a limit cannot work: a key that is not a JSONPath, or a size off
/// 1..=[`MAX_POOL`] (the schema says the same; this holds for documents
/// built without it).
pub fn check_limit(key: &str, max: u32) -> Result<(), String> {
    if !(1..=MAX_POOL).contains(&max) {
        return Err(format!("max must be 1 to {MAX_POOL}, not {max}"));
    }
    check_key(key)
}

/// Why a limit's key is not a usable JSONPath.
pub fn check_key(key: &str) -> Result<(), String> {
    JsonPath::parse(key)
        .map(|_| ())
        .map_err(|e| format!("'{key}' is not a JSONPath: {e}"))
}

/// One limit a run must pass, resolved against its input. Serialised as
/// the stores take it: `{task, scope, label, max, strategy}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gate {
    /// The task it holds back (`None`: the whole run).
    pub task: Option<String>,
    /// The slot pool's identity.
    pub scope: String,
    /// The key's value as a person reads it: a string as it is, anything
    /// else as JSON. A waiting task shows `concurrency:<label>`.
    pub label: String,
    /// The pool's size.
    pub max: u32,
    /// What the run does when the pool is full (always
    /// [`Strategy::Queue`] for a task).
    pub strategy: Strategy,
}

impl Gate {
    /// What a task waiting at this gate reports (`blocked_by`).
    pub fn blocked_by(label: &str) -> String {
        format!("concurrency:{label}")
    }
}

/// A limit whose key the run input does not give one value for: the start
/// is refused (`concurrency_key_unresolved`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("concurrency key {key} at {at}: {problem}")]
pub struct Unresolved {
    /// Where the limit is declared: `$.concurrency[0]` or `$.tasks[2].concurrency`.
    pub at: String,
    /// The key as written.
    pub key: String,
    /// What the input gave instead of one value.
    pub problem: String,
}

/// The gates of a run of `def` with `input`: its run-level limits in
/// declaration order, then each forward task's.
pub fn resolve(def: &WorkflowDefinition, input: &Value) -> Result<Vec<Gate>, Unresolved> {
    let mut gates = Vec::new();
    for (i, limit) in def.concurrency().iter().enumerate() {
        let value = evaluate(&limit.key, input, || format!("$.concurrency[{i}]"))?;
        gates.push(Gate {
            task: None,
            scope: scope(def.name(), None, &limit.key, &value),
            label: label(&value),
            max: limit.max,
            strategy: limit.strategy,
        });
    }
    for (i, task) in def.tasks().iter().enumerate() {
        let Some(limit) = task.concurrency().filter(|_| !task.is_compensator()) else {
            continue;
        };
        let value = evaluate(&limit.key, input, || format!("$.tasks[{i}].concurrency"))?;
        gates.push(Gate {
            task: Some(task.key().to_owned()),
            scope: scope(def.name(), Some(task.key()), &limit.key, &value),
            label: label(&value),
            max: limit.max,
            strategy: Strategy::Queue,
        });
    }
    Ok(gates)
}

fn evaluate(key: &str, input: &Value, at: impl Fn() -> String) -> Result<Value, Unresolved> {
    let unresolved = |problem: String| Unresolved {
        at: at(),
        key: key.to_owned(),
        problem,
    };
    let path = JsonPath::parse(key).map_err(|e| unresolved(format!("not a JSONPath: {e}")))?;
    let nodes = path.query(input);
    match nodes.len() {
        0 => Err(unresolved("the run input has no value there".to_owned())),
        1 => match nodes.exactly_one() {
            Ok(Value::Null) => Err(unresolved("the run input has null there".to_owned())),
            Ok(v @ (Value::Array(_) | Value::Object(_))) => Err(unresolved(format!(
                "the run input has {} there, not a string, number or boolean",
                if v.is_array() { "an array" } else { "an object" }
            ))),
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(unresolved(e.to_string())),
        },
        n => Err(unresolved(format!("the run input has {n} values there, not one"))),
    }
}

/// An unambiguous name for the pool: a JSON array, so no value can make
/// two scopes collide.
fn scope(workflow: &str, task: Option<&str>, key: &str, value: &Value) -> String {
    serde_json::json!([workflow, task, key, value]).to_string()
}

fn label(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::parse_value;
    use proptest::prelude::{any, prop_assert_eq, prop_assert_ne, prop_oneof, proptest};
    use proptest::strategy::Strategy as _;
    use serde_json::json;

    fn def(concurrency: Value, task_limit: Option<Value>) -> WorkflowDefinition {
        let mut task = json!({"key": "a", "task_type": "noop"});
        if let Some(l) = task_limit {
            task["concurrency"] = l;
        }
        parse_value(json!({"name": "w", "version": 1, "concurrency": concurrency, "tasks": [task]}))
            .expect("a valid definition")
    }

    #[test]
    fn a_run_limit_and_a_task_limit_resolve_to_their_gates() {
        let d = def(
            json!([{"key": "$.customer", "max": 2, "strategy": "cancel_in_progress"}]),
            Some(json!({"key": "$.account.id", "max": 1})),
        );
        let gates = resolve(&d, &json!({"customer": "acme", "account": {"id": 7}})).expect("resolves");
        assert_eq!(gates.len(), 2);
        assert_eq!(gates[0].task, None);
        assert_eq!(gates[0].label, "acme");
        assert_eq!(gates[0].strategy, Strategy::CancelInProgress);
        assert_eq!(gates[1].task.as_deref(), Some("a"));
        assert_eq!(gates[1].label, "7");
        assert_eq!(gates[1].max, 1);
        assert_ne!(gates[0].scope, gates[1].scope);
    }

    #[test]
    fn a_key_the_input_does_not_give_once_is_unresolved_with_its_place() {
        let d = def(json!([{"key": "$.customer", "max": 2}]), None);
        for input in [json!({}), json!({"customer": null}), json!({"customer": [1]}), json!(3)] {
            let e = resolve(&d, &input).expect_err("unresolved");
            assert_eq!(e.at, "$.concurrency[0]", "{input}");
        }
        let d = def(json!([{"key": "$.items[*]", "max": 2}]), None);
        let e = resolve(&d, &json!({"items": [1, 2]})).expect_err("two values");
        assert!(e.problem.contains("2 values"), "{e}");
    }

    #[test]
    fn a_key_that_is_not_a_json_path_is_a_definition_error_at_its_path() {
        let e = parse_value(
            json!({"name": "w", "version": 1, "concurrency": [{"key": "customer", "max": 1}],
                                  "tasks": [{"key": "a", "task_type": "noop"}]}),
        )
        .expect_err("invalid");
        assert!(e.to_string().contains("$.concurrency[0].key"), "{e}");
    }

    #[test]
    fn limits_built_without_the_schema_are_checked_too() {
        use crate::definition::WorkflowDocument;
        let doc = |concurrency: Value| -> WorkflowDocument {
            serde_json::from_value(json!({"name": "w", "version": 1, "concurrency": concurrency,
                                          "tasks": [{"key": "a", "task_type": "noop"}]}))
            .expect("a document")
        };
        let e = WorkflowDefinition::from_document(doc(json!([{"key": "$.k", "max": 0}]))).expect_err("max 0");
        assert!(e.to_string().contains("max must be 1 to 10000"), "{e}");
        let many: Vec<Value> = (0..17).map(|i| json!({"key": format!("$.k{i}"), "max": 1})).collect();
        let e = WorkflowDefinition::from_document(doc(Value::Array(many))).expect_err("17 limits");
        assert!(e.to_string().contains("at most 16 limits"), "{e}");
        let e = WorkflowDefinition::from_document(doc(json!([{"key": "$.k", "max": 1}, {"key": "$.k", "max": 2}])))
            .expect_err("twice");
        assert!(e.to_string().contains("limited twice"), "{e}");
    }

    proptest! {
        /// One pool per (level, key value): equal values share a scope,
        /// different values (of any JSON type) never do.
        #[test]
        fn scopes_are_equal_exactly_when_the_values_are(a in any_scalar(), b in any_scalar()) {
            let d = def(json!([{"key": "$.k", "max": 1}]), Some(json!({"key": "$.k", "max": 1})));
            let ga = resolve(&d, &json!({"k": a})).expect("resolves");
            let gb = resolve(&d, &json!({"k": b})).expect("resolves");
            prop_assert_eq!(ga[0].scope == gb[0].scope, a == b);
            prop_assert_ne!(&ga[0].scope, &ga[1].scope);
        }
    }

    fn any_scalar() -> impl proptest::strategy::Strategy<Value = Value> {
        prop_oneof![
            any::<bool>().prop_map(Value::from),
            (-3i64..3).prop_map(Value::from),
            "[a-c\"\\\\,\\]]{0,3}".prop_map(Value::from),
        ]
    }
}
