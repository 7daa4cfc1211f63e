//! Workflow definitions as validated value objects
//! (docs/design/definitions.md#value-objects).
//!
//! A [`WorkflowDefinition`] cannot exist unless every rule holds: its
//! constructor builds the dependency graph eagerly, so "forgot to force the
//! graph" is not a state this type can be in.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::concurrency::RunLimit;
use crate::graph::{DependencyGraph, GraphError};

mod document;
mod error;
mod retry;
mod task;

pub use document::{Defaults, TaskDocument, WorkflowDocument};
pub use error::{DefinitionError, DefinitionErrors, LocatedError, StoredDefinitionError};
pub use retry::{RetryPolicy, RetrySpec};
use task::check_settings;
pub(crate) use task::json_kind;
pub use task::{TaskDefinition, depth};

/// The deepest JSON nesting a definition (or a task's config) may have.
pub const MAX_NESTING: usize = 64;
/// The most tasks one definition may declare.
pub const MAX_TASKS: usize = 10_000;
/// The largest definition body, in bytes, accepted wherever bytes are read.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// The largest timeout or delay accepted, in seconds (a year).
pub const MAX_SECONDS: f64 = 31_536_000.0;
/// The most attempts a retry policy may allow.
pub const MAX_ATTEMPTS: u32 = 1_000;
/// The largest backoff multiplier accepted.
pub const MAX_BACKOFF: f64 = 100.0;
/// The default per-attempt timeout (docs/design/handlers.md#timeouts).
pub const DEFAULT_TIMEOUT_SECONDS: f64 = 30.0;

/// A validated workflow definition: forward DAG plus compensators.
#[derive(Debug, Clone)]
pub struct WorkflowDefinition {
    name: String,
    version: u32,
    description: String,
    defaults: Defaults,
    concurrency: Vec<RunLimit>,
    tasks: Vec<TaskDefinition>,
    by_key: HashMap<String, usize>,
    graph: DependencyGraph,
    /// forward key → index of its compensator in `tasks`.
    compensators: BTreeMap<String, usize>,
    /// Whether any task has a `when`, a trigger of its own or a `map`
    /// (any task the scheduler holds): asked by every scheduler pass, so
    /// answered without a walk of the tasks.
    conditional: bool,
    /// Whether the workflow or any forward task has a concurrency limit:
    /// asked by every success's handoff (`plan::handoff`).
    limited: bool,
}

impl PartialEq for WorkflowDefinition {
    fn eq(&self, other: &Self) -> bool {
        self.document() == other.document()
    }
}

impl WorkflowDefinition {
    /// Rebuilds a published definition from a store's rows: validated like
    /// any document, then checked against what was stored beside it, each
    /// task's effective `max_attempts` (`(key, stored)` pairs) and the
    /// fingerprint recorded at publication.
    pub fn from_stored(
        doc: WorkflowDocument,
        max_attempts: &[(String, i64)],
        published: &str,
    ) -> Result<Self, StoredDefinitionError> {
        let def = Self::from_document(doc)?;
        for (key, stored) in max_attempts {
            let effective = def.task(key).map_or(0, |t| def.retry_policy(t).max_attempts);
            if i64::from(effective) != *stored {
                return Err(StoredDefinitionError::MaxAttempts {
                    key: key.clone(),
                    stored: *stored,
                    effective,
                });
            }
        }
        let computed = def.fingerprint();
        if computed != published {
            return Err(StoredDefinitionError::Fingerprint {
                computed,
                published: published.to_owned(),
            });
        }
        Ok(def)
    }

    /// Validates a whole document: every per-task rule, then the graph and
    /// compensation rules. Returns every error found, located.
    pub fn from_document(doc: WorkflowDocument) -> Result<Self, DefinitionErrors> {
        let mut errors = Vec::new();
        if doc.name.trim().is_empty() {
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::BlankName,
            });
        }
        if doc.version == 0 {
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::InvalidVersion,
            });
        }
        if let Some(d) = &doc.defaults {
            let mut found = Vec::new();
            check_settings(None, "defaults", d.timeout_seconds, d.retry.as_ref(), &mut found);
            errors.extend(found.into_iter().map(|error| LocatedError { index: None, error }));
        }
        let mut tasks = Vec::with_capacity(doc.tasks.len());
        for (index, t) in doc.tasks.into_iter().enumerate() {
            match TaskDefinition::new(t) {
                Ok(t) => tasks.push(t),
                Err(es) => errors.extend(es.into_iter().map(|error| LocatedError {
                    index: Some(index),
                    error: match error {
                        DefinitionError::BlankKey { .. } => DefinitionError::BlankKey { index },
                        other => other,
                    },
                })),
            }
        }
        if !errors.is_empty() {
            return Err(DefinitionErrors(errors));
        }
        let mut seen = std::collections::HashSet::new();
        if doc.concurrency.len() > crate::concurrency::MAX_RUN_LIMITS {
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::InvalidConcurrency {
                    task: None,
                    problem: format!(
                        "at most {} limits, not {}",
                        crate::concurrency::MAX_RUN_LIMITS,
                        doc.concurrency.len()
                    ),
                },
            });
        }
        for limit in &doc.concurrency {
            let problem = if let Err(problem) = crate::concurrency::check_limit(&limit.key, limit.max) {
                problem
            } else if !seen.insert(limit.key.as_str()) {
                format!("the key '{}' is limited twice", limit.key)
            } else {
                continue;
            };
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::InvalidConcurrency { task: None, problem },
            });
        }
        if !errors.is_empty() {
            return Err(DefinitionErrors(errors));
        }
        Self::new(
            doc.name,
            doc.version,
            doc.description.unwrap_or_default(),
            doc.defaults.unwrap_or_default(),
            doc.concurrency,
            tasks,
        )
    }

    /// Assembles validated tasks into a definition, checking the rules that
    /// span tasks: unique keys, known and acyclic dependencies, compensators.
    pub fn new(
        name: String,
        version: u32,
        description: String,
        defaults: Defaults,
        concurrency: Vec<RunLimit>,
        tasks: Vec<TaskDefinition>,
    ) -> Result<Self, DefinitionErrors> {
        let mut errors = Vec::new();
        let at = |index: usize, error: DefinitionError| LocatedError {
            index: Some(index),
            error,
        };
        if name.trim().is_empty() {
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::BlankName,
            });
        }
        if version == 0 {
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::InvalidVersion,
            });
        }
        let mut by_key: HashMap<String, usize> = HashMap::with_capacity(tasks.len());
        for (i, t) in tasks.iter().enumerate() {
            if by_key.contains_key(t.key()) {
                errors.push(at(i, GraphError::DuplicateKey(t.key().to_owned()).into()));
            } else {
                by_key.insert(t.key().to_owned(), i);
            }
        }
        let is_comp = |key: &str| by_key.get(key).is_some_and(|&i| tasks[i].is_compensator());
        let mut compensators: BTreeMap<String, usize> = BTreeMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if let Some(target) = t.compensate_for() {
                let task = t.key().to_owned();
                if !t.depends_on().is_empty() {
                    errors.push(at(
                        i,
                        DefinitionError::CompensatorHasDependencies { task: task.clone() },
                    ));
                }
                if target == t.key() {
                    errors.push(at(i, DefinitionError::CompensatesItself { task }));
                } else if !by_key.contains_key(target) {
                    errors.push(at(
                        i,
                        DefinitionError::CompensatesUnknown {
                            task,
                            target: target.to_owned(),
                        },
                    ));
                } else if is_comp(target) {
                    errors.push(at(
                        i,
                        DefinitionError::CompensatesCompensator {
                            task,
                            target: target.to_owned(),
                        },
                    ));
                } else if let Some(&first) = compensators.get(target) {
                    errors.push(at(
                        i,
                        DefinitionError::DuplicateCompensator {
                            task,
                            target: target.to_owned(),
                            first: tasks[first].key().to_owned(),
                        },
                    ));
                } else {
                    compensators.insert(target.to_owned(), i);
                }
            } else {
                for dep in t.depends_on() {
                    if dep == t.key() {
                        errors.push(at(i, GraphError::SelfDependency(t.key().to_owned()).into()));
                    } else if is_comp(dep) {
                        errors.push(at(
                            i,
                            DefinitionError::DependsOnCompensator {
                                task: t.key().to_owned(),
                                dependency: dep.clone(),
                            },
                        ));
                    } else if !by_key.contains_key(dep) {
                        errors.push(at(
                            i,
                            GraphError::UnknownDependency {
                                task: t.key().to_owned(),
                                dependency: dep.clone(),
                            }
                            .into(),
                        ));
                    }
                }
            }
        }
        // A child's key, `task[i]`, must name nothing else.
        for (i, t) in tasks.iter().enumerate() {
            if let Some((parent, _)) = crate::map::child_of(t.key())
                && by_key.get(parent).is_some_and(|&p| tasks[p].map().is_some())
            {
                errors.push(at(
                    i,
                    DefinitionError::InvalidMap {
                        task: t.key().to_owned(),
                        problem: format!("the key is the name of a child of the mapped task '{parent}'"),
                    },
                ));
            }
        }
        if !concurrency.is_empty() {
            for (i, t) in tasks.iter().enumerate().filter(|(_, t)| t.map().is_some()) {
                errors.push(at(
                    i,
                    DefinitionError::InvalidMap {
                        task: t.key().to_owned(),
                        problem: "`map` cannot be used yet in a workflow with concurrency limits".to_owned(),
                    },
                ));
            }
            for (i, t) in tasks.iter().enumerate().filter(|(_, t)| t.is_conditional()) {
                errors.push(at(
                    i,
                    DefinitionError::InvalidCondition {
                        task: t.key().to_owned(),
                        problem: "`when` and `trigger` cannot be used yet in a workflow with concurrency limits"
                            .to_owned(),
                    },
                ));
            }
        }
        if !tasks.iter().any(|t| !t.is_compensator()) {
            errors.push(LocatedError {
                index: None,
                error: DefinitionError::NoForwardTasks,
            });
        }
        if !errors.is_empty() {
            return Err(DefinitionErrors(errors));
        }
        let forward = tasks
            .iter()
            .filter(|t| !t.is_compensator())
            .map(|t| (t.key(), t.depends_on().iter().map(String::as_str)));
        let graph = DependencyGraph::new(forward).map_err(|e| {
            let index = by_key.get(e.task()).copied();
            DefinitionErrors(vec![LocatedError { index, error: e.into() }])
        })?;
        let conditional = tasks.iter().any(TaskDefinition::holds);
        let limited = !concurrency.is_empty() || tasks.iter().any(|t| !t.is_compensator() && t.concurrency().is_some());
        Ok(Self {
            name,
            version,
            description,
            defaults,
            concurrency,
            tasks,
            by_key,
            graph,
            compensators,
            conditional,
            limited,
        })
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its version.
    pub fn version(&self) -> u32 {
        self.version
    }
    /// Its description (empty when absent).
    pub fn description(&self) -> &str {
        &self.description
    }
    /// Its defaults as written.
    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }
    /// Whether any task has a `when`, a trigger of its own or a `map`
    /// (docs/design/conditions.md, docs/design/map.md): only then does a
    /// pass decide or expand tasks.
    pub fn has_conditions(&self) -> bool {
        self.conditional
    }

    /// Whether a run of it is gated: the workflow or one of its forward
    /// tasks has a concurrency limit (docs/design/concurrency.md).
    pub fn has_limits(&self) -> bool {
        self.limited
    }

    /// Its run-level concurrency limits (docs/design/concurrency.md).
    pub fn concurrency(&self) -> &[RunLimit] {
        &self.concurrency
    }
    /// Every task, forward and compensators, in declaration order.
    pub fn tasks(&self) -> &[TaskDefinition] {
        &self.tasks
    }
    /// The forward tasks, in declaration order.
    pub fn forward_tasks(&self) -> impl Iterator<Item = &TaskDefinition> {
        self.tasks.iter().filter(|t| !t.is_compensator())
    }
    /// The task with this key (forward or compensator).
    pub fn task(&self, key: &str) -> Option<&TaskDefinition> {
        self.by_key.get(key).map(|&i| &self.tasks[i])
    }
    /// The task a task run runs, by the run's key: the task of that key,
    /// or for a child `task[i]` of a mapped task, that task and `i`
    /// (docs/design/map.md#children).
    pub fn task_of_run(&self, key: &str) -> Option<(&TaskDefinition, Option<u32>)> {
        if let Some(task) = self.task(key) {
            return Some((task, None));
        }
        let (parent, index) = crate::map::child_of(key)?;
        self.task(parent)
            .filter(|t| t.map().is_some())
            .map(|t| (t, Some(index)))
    }
    /// The declaration index of a task (for JSONPaths).
    pub fn index_of(&self, key: &str) -> Option<usize> {
        self.by_key.get(key).copied()
    }
    /// The forward DAG.
    pub fn graph(&self) -> &DependencyGraph {
        &self.graph
    }
    /// The compensator of forward task `key`, if any.
    pub fn compensator_of(&self, key: &str) -> Option<&TaskDefinition> {
        self.compensators.get(key).map(|&i| &self.tasks[i])
    }
    /// `(forward key, compensator)` pairs, by forward key.
    pub fn compensators(&self) -> impl Iterator<Item = (&str, &TaskDefinition)> {
        self.compensators.iter().map(|(k, &i)| (k.as_str(), &self.tasks[i]))
    }

    /// The effective retry policy of `task`
    /// (docs/design/state-machines.md#attempts-and-retries).
    pub fn retry_policy(&self, task: &TaskDefinition) -> RetryPolicy {
        RetryPolicy::resolve(task.retry(), self.defaults.retry.as_ref())
    }

    /// The effective per-attempt timeout of `task`.
    pub fn timeout(&self, task: &TaskDefinition) -> Duration {
        let secs = task
            .timeout_seconds()
            .or(self.defaults.timeout_seconds)
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        Duration::from_secs_f64(secs)
    }

    /// The definition as a document, exactly as it would be written back.
    pub fn document(&self) -> WorkflowDocument {
        WorkflowDocument {
            name: self.name.clone(),
            version: self.version,
            description: (!self.description.is_empty()).then(|| self.description.clone()),
            defaults: (self.defaults != Defaults::default()).then(|| self.defaults.clone()),
            concurrency: self.concurrency.clone(),
            tasks: self.tasks.iter().map(|t| t.doc.clone()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn doc(v: Value) -> WorkflowDocument {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_stored_definition_must_agree_with_its_columns_and_fingerprint() {
        let stored = doc(json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop", "retry": {"max_attempts": 3}}
        ]}));
        let published = WorkflowDefinition::from_document(stored.clone()).unwrap().fingerprint();
        let limits = [("a".to_owned(), 3)];
        assert!(WorkflowDefinition::from_stored(stored.clone(), &limits, &published).is_ok());
        assert_eq!(
            WorkflowDefinition::from_stored(stored.clone(), &[("a".to_owned(), 5)], &published).unwrap_err(),
            StoredDefinitionError::MaxAttempts {
                key: "a".into(),
                stored: 5,
                effective: 3
            }
        );
        let other = "0".repeat(64);
        assert!(matches!(
            WorkflowDefinition::from_stored(stored.clone(), &limits, &other),
            Err(StoredDefinitionError::Fingerprint { computed, .. }) if computed == published
        ));
        let mut broken = stored;
        broken.tasks[0].depends_on = vec!["ghost".into()];
        assert!(matches!(
            WorkflowDefinition::from_stored(broken, &limits, &published),
            Err(StoredDefinitionError::Invalid(_))
        ));
    }

    fn errors(v: Value) -> Vec<(String, String)> {
        WorkflowDefinition::from_document(doc(v))
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| (e.path(), e.error.to_string()))
            .collect()
    }

    #[test]
    fn a_valid_definition_exposes_its_parts() {
        let d = WorkflowDefinition::from_document(doc(json!({
            "name": "etl", "version": 3,
            "defaults": {"timeout_seconds": 5, "retry": {"max_attempts": 3}},
            "tasks": [
                {"key": "extract", "task_type": "noop"},
                {"key": "load", "task_type": "noop", "depends_on": ["extract"],
                 "retry": {"delay_seconds": 0.5}, "timeout_seconds": 1},
                {"key": "undo", "task_type": "noop", "compensate_for": "extract"}
            ]
        })))
        .unwrap();
        assert_eq!(d.graph().topological_order(), ["extract", "load"]);
        assert_eq!(d.compensator_of("extract").map(TaskDefinition::key), Some("undo"));
        let load = d.task("load").unwrap();
        let p = d.retry_policy(load);
        assert_eq!((p.max_attempts, p.delay_seconds, p.backoff), (3, 0.5, 2.0));
        assert_eq!(d.timeout(load), Duration::from_secs(1));
        assert_eq!(d.timeout(d.task("extract").unwrap()), Duration::from_secs(5));
        assert_eq!(d.forward_tasks().count(), 2);
    }

    #[test]
    fn per_task_rules_name_the_task_and_its_index() {
        assert_eq!(
            errors(json!({"name": "w", "version": 1, "tasks": [
                {"key": "a", "task_type": "noop"},
                {"key": "b", "task_type": " ", "depends_on": ["a", "a"], "config": [1]}
            ]})),
            vec![
                ("$.tasks[1]".into(), "task 'b' has a blank task_type".into()),
                (
                    "$.tasks[1]".into(),
                    "task 'b' lists dependency 'a' more than once".into()
                ),
                (
                    "$.tasks[1]".into(),
                    "task 'b': config must be a JSON object, not an array".into()
                ),
            ]
        );
        assert_eq!(
            errors(json!({"name": "w", "version": 1, "tasks": [{"key": "  ", "task_type": "noop"}]})),
            vec![("$.tasks[0]".into(), "task #0 has a blank key".into())]
        );
    }

    #[test]
    fn graph_rules_point_at_the_task() {
        assert_eq!(
            errors(json!({"name": "w", "version": 1, "tasks": [
                {"key": "a", "task_type": "noop"},
                {"key": "a", "task_type": "noop"},
                {"key": "load", "task_type": "noop", "depends_on": ["ghost"]}
            ]})),
            vec![
                ("$.tasks[1]".into(), "duplicate task key 'a'".into()),
                (
                    "$.tasks[2]".into(),
                    "task 'load' depends on unknown task 'ghost'".into()
                ),
            ]
        );
        assert_eq!(
            errors(json!({"name": "w", "version": 1, "tasks": [
                {"key": "b", "task_type": "noop", "depends_on": ["a"]},
                {"key": "a", "task_type": "noop", "depends_on": ["b"]}
            ]})),
            vec![("$.tasks[1]".into(), "dependency cycle detected: a -> b -> a".into())]
        );
    }

    #[test]
    fn compensation_rules() {
        let e = errors(json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop", "depends_on": ["c1"]},
            {"key": "c1", "task_type": "noop", "compensate_for": "a", "depends_on": ["a"]},
            {"key": "c2", "task_type": "noop", "compensate_for": "c2"},
            {"key": "c3", "task_type": "noop", "compensate_for": "ghost"},
            {"key": "c4", "task_type": "noop", "compensate_for": "c1"},
            {"key": "c5", "task_type": "noop", "compensate_for": "a"}
        ]}));
        assert_eq!(
            e,
            vec![
                ("$.tasks[1]".into(), "task 'b' depends on compensation task 'c1'".into()),
                (
                    "$.tasks[2]".into(),
                    "compensation task 'c1' must not declare depends_on".into()
                ),
                (
                    "$.tasks[3]".into(),
                    "compensation task 'c2' cannot compensate itself".into()
                ),
                (
                    "$.tasks[4]".into(),
                    "compensation task 'c3' compensates unknown task 'ghost'".into()
                ),
                (
                    "$.tasks[5]".into(),
                    "compensation task 'c4' compensates 'c1', which is itself a compensation task".into()
                ),
                (
                    "$.tasks[6]".into(),
                    "task 'a' has two compensation tasks: 'c1' and 'c5'".into()
                ),
            ]
        );
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        let e = errors(json!({"name": "w", "version": 1,
            "defaults": {"retry": {"backoff": 0.5}},
            "tasks": [{"key": "a", "task_type": "noop", "timeout_seconds": 0, "retry": {"max_attempts": 0}}]}));
        assert_eq!(e.len(), 3, "{e:?}");
        assert_eq!(e[0].0, "$");
    }

    #[test]
    fn config_nesting_is_limited() {
        let mut deep = json!({});
        for _ in 0..MAX_NESTING {
            deep = json!({ "x": deep });
        }
        let e =
            errors(json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop", "config": deep}]}));
        assert!(e[0].1.contains("deeper than 64"), "{e:?}");
    }

    #[test]
    fn retry_delays_back_off_and_cap() {
        let p = RetryPolicy {
            max_attempts: 5,
            delay_seconds: 1.0,
            backoff: 2.0,
            max_delay_seconds: Some(5.0),
        };
        let delays: Vec<f64> = (1..=5).map(|k| p.delay_after(k).as_secs_f64()).collect();
        assert_eq!(delays, [1.0, 2.0, 4.0, 5.0, 5.0]);
        assert_eq!(p.next_retry(4, false), Some(Duration::from_secs(5)));
        assert_eq!(p.next_retry(5, false), None);
        assert_eq!(p.next_retry(1, true), None);
        let d = RetryPolicy::default();
        assert_eq!(
            (d.max_attempts, d.delay_seconds, d.backoff, d.max_delay_seconds),
            (1, 1.0, 2.0, None)
        );
        assert_eq!(d.next_retry(1, false), None);
    }

    #[test]
    fn documents_round_trip() {
        let v = json!({"name": "w", "version": 2, "description": "d",
            "tasks": [{"key": "a", "task_type": "echo", "config": {"x": 1}}]});
        let d = WorkflowDefinition::from_document(doc(v.clone())).unwrap();
        assert_eq!(serde_json::to_value(d.document()).unwrap(), v);
    }
}
