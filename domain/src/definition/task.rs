//! One validated task of a definition, and the checks of its settings.

use serde_json::{Map, Value};

use super::{DefinitionError, MAX_ATTEMPTS, MAX_BACKOFF, MAX_NESTING, MAX_SECONDS, RetrySpec, TaskDocument};
use crate::concurrency::{self, TaskLimit};
use crate::condition::Trigger;
use crate::graph::GraphError;
use crate::map::MapSpec;
use crate::priority::Priority;

/// One validated task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskDefinition {
    pub(super) doc: TaskDocument,
    pub(super) config: Map<String, Value>,
}

impl TaskDefinition {
    /// Validates one task on its own: non-blank key and type, unique
    /// `depends_on`, object config within the nesting limit, sane numbers.
    pub fn new(doc: TaskDocument) -> Result<Self, Vec<DefinitionError>> {
        let mut errors = Vec::new();
        let task = doc.key.clone();
        if doc.key.trim().is_empty() {
            errors.push(DefinitionError::BlankKey { index: 0 });
        }
        if doc.task_type.trim().is_empty() {
            errors.push(DefinitionError::BlankTaskType { task: task.clone() });
        }
        let mut seen = std::collections::HashSet::new();
        for dep in &doc.depends_on {
            if !seen.insert(dep.as_str()) {
                errors.push(
                    GraphError::DuplicateDependency {
                        task: task.clone(),
                        dependency: dep.clone(),
                    }
                    .into(),
                );
            }
        }
        let config = match doc.config.clone() {
            None => Map::new(),
            Some(Value::Object(map)) => {
                if depth(&Value::Object(map.clone())) > MAX_NESTING {
                    errors.push(DefinitionError::InvalidConfig {
                        task: task.clone(),
                        problem: format!("config nests deeper than {MAX_NESTING} levels"),
                    });
                }
                map
            }
            Some(other) => {
                errors.push(DefinitionError::InvalidConfig {
                    task: task.clone(),
                    problem: format!("config must be a JSON object, not {}", json_kind(&other)),
                });
                Map::new()
            }
        };
        if let Some(limit) = &doc.concurrency {
            if doc.compensate_for.is_some() {
                errors.push(DefinitionError::InvalidConcurrency {
                    task: Some(task.clone()),
                    problem: "a compensation task cannot declare concurrency: a rollback never waits".to_owned(),
                });
            }
            if let Err(problem) = concurrency::check_limit(&limit.key, limit.max) {
                errors.push(DefinitionError::InvalidConcurrency {
                    task: Some(task.clone()),
                    problem,
                });
            }
        }
        if let Some(problem) = doc.when.as_deref().and_then(|w| crate::condition::check(w).err()) {
            errors.push(DefinitionError::InvalidCondition {
                task: task.clone(),
                problem: format!("`when` is not a valid expression: {problem}"),
            });
        }
        if doc.compensate_for.is_some() && (doc.when.is_some() || doc.trigger.is_some()) {
            errors.push(DefinitionError::InvalidCondition {
                task: task.clone(),
                problem: "a compensation task cannot declare `when` or `trigger`: a rollback step always runs"
                    .to_owned(),
            });
        }
        if doc.concurrency.is_some() && (doc.when.is_some() || doc.trigger.is_some()) {
            errors.push(DefinitionError::InvalidCondition {
                task: task.clone(),
                problem: "a task with `when` or `trigger` cannot declare its own concurrency limit yet".to_owned(),
            });
        }
        if let Some(map) = &doc.map {
            let mut bad = |problem: String| {
                errors.push(DefinitionError::InvalidMap {
                    task: task.clone(),
                    problem,
                });
            };
            match map.check() {
                Ok(source) if !doc.depends_on.contains(&source.task) => bad(format!(
                    "map.over reads task '{}', which is not one of its dependencies",
                    source.task
                )),
                Ok(_) => {}
                Err(problem) => bad(problem),
            }
            if doc.compensate_for.is_some() {
                bad("a compensation task cannot be mapped".to_owned());
            }
            if doc.concurrency.is_some() {
                bad(
                    "a mapped task cannot declare its own concurrency limit yet; map.concurrency bounds its children"
                        .to_owned(),
                );
            }
            if doc.trigger.is_some_and(|t| t != Trigger::AllSucceeded) {
                bad("a mapped task runs only once its source succeeded: it cannot declare another trigger".to_owned());
            }
        }
        let place = format!("task '{task}'");
        check_settings(
            Some(&task),
            &place,
            doc.timeout_seconds,
            doc.retry.as_ref(),
            &mut errors,
        );
        if errors.is_empty() {
            Ok(Self { doc, config })
        } else {
            Err(errors)
        }
    }

    /// A task of type `task_type` with no dependencies and an empty config.
    pub fn simple(key: &str, task_type: &str) -> Result<Self, Vec<DefinitionError>> {
        Self::new(TaskDocument {
            key: key.to_owned(),
            task_type: task_type.to_owned(),
            depends_on: Vec::new(),
            config: None,
            timeout_seconds: None,
            retry: None,
            compensate_for: None,
            priority: None,
            concurrency: None,
            when: None,
            trigger: None,
            map: None,
        })
    }

    /// The task's key.
    pub fn key(&self) -> &str {
        &self.doc.key
    }
    /// The handler type that runs it.
    pub fn task_type(&self) -> &str {
        &self.doc.task_type
    }
    /// Its direct dependencies, as written.
    pub fn depends_on(&self) -> &[String] {
        &self.doc.depends_on
    }
    /// Its config (empty when absent).
    pub fn config(&self) -> &Map<String, Value> {
        &self.config
    }
    /// The timeout as written.
    pub fn timeout_seconds(&self) -> Option<f64> {
        self.doc.timeout_seconds
    }
    /// The retry fields as written.
    pub fn retry(&self) -> Option<&RetrySpec> {
        self.doc.retry.as_ref()
    }
    /// The forward task it compensates, if it is a compensator.
    pub fn compensate_for(&self) -> Option<&str> {
        self.doc.compensate_for.as_deref()
    }
    /// Its own priority, when the definition gives one.
    pub fn priority(&self) -> Option<Priority> {
        self.doc.priority
    }

    /// Its concurrency limit, when the definition gives one.
    pub fn concurrency(&self) -> Option<&TaskLimit> {
        self.doc.concurrency.as_ref()
    }

    /// Its `when` expression, as written.
    pub fn when(&self) -> Option<&str> {
        self.doc.when.as_deref()
    }

    /// Its trigger rule (`all_succeeded` when not written).
    pub fn trigger(&self) -> Trigger {
        self.doc.trigger.unwrap_or_default()
    }

    /// Whether the scheduler decides it once its dependencies finish,
    /// rather than promoting it when they all succeed: it has a `when` or
    /// a trigger other than the default (docs/design/conditions.md#deciding).
    pub fn is_conditional(&self) -> bool {
        self.doc.when.is_some() || self.trigger() != Trigger::AllSucceeded
    }
    /// Its `map` field, when it is mapped (docs/design/map.md).
    pub fn map(&self) -> Option<&MapSpec> {
        self.doc.map.as_ref()
    }

    /// Whether the scheduler holds it once its dependencies finish, to
    /// decide it (conditions) or expand it (map): its counter carries one
    /// hold beyond its dependencies (docs/design/conditions.md#deciding).
    pub fn holds(&self) -> bool {
        self.is_conditional() || self.doc.map.is_some()
    }

    /// Whether it is a compensator (outside the forward DAG).
    pub fn is_compensator(&self) -> bool {
        self.doc.compensate_for.is_some()
    }
    /// The task as written.
    pub fn document(&self) -> &TaskDocument {
        &self.doc
    }
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The nesting depth of a JSON value (a scalar is 0, `{}` is 1), computed
/// without recursion.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(items) => {
                deepest = deepest.max(d + 1);
                stack.extend(items.iter().map(|i| (i, d + 1)));
            }
            Value::Object(map) => {
                deepest = deepest.max(d + 1);
                stack.extend(map.values().map(|i| (i, d + 1)));
            }
            _ => {}
        }
    }
    deepest
}

pub(super) fn check_settings(
    task: Option<&str>,
    place: &str,
    timeout: Option<f64>,
    retry: Option<&RetrySpec>,
    errors: &mut Vec<DefinitionError>,
) {
    let mut bad = |problem: String| {
        errors.push(DefinitionError::InvalidSetting {
            task: task.map(str::to_owned),
            place: place.to_owned(),
            problem,
        });
    };
    if let Some(t) = timeout
        && !(t > 0.0 && t <= MAX_SECONDS)
    {
        bad(format!("timeout_seconds must be in (0, {MAX_SECONDS}], not {t}"));
    }
    if let Some(r) = retry {
        if let Some(n) = r.max_attempts
            && !(1..=MAX_ATTEMPTS).contains(&n)
        {
            bad(format!("retry.max_attempts must be in [1, {MAX_ATTEMPTS}], not {n}"));
        }
        for (name, value, min, max) in [
            ("delay_seconds", r.delay_seconds, 0.0, MAX_SECONDS),
            ("backoff", r.backoff, 1.0, MAX_BACKOFF),
            ("max_delay_seconds", r.max_delay_seconds, 0.0, MAX_SECONDS),
        ] {
            if let Some(v) = value
                && !(v >= min && v <= max)
            {
                bad(format!("retry.{name} must be in [{min}, {max}], not {v}"));
            }
        }
    }
}
