//! The run report (docs/design/cli.md#reports): a stable JSON shape (its schema
//! is committed beside the binary) built from a stored run and its definition.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, SecondsFormat, Utc};
use flowforge_domain::derive::compensation_order;
use flowforge_domain::{Priority, RunState, TaskRunState, WorkflowDefinition};
use flowforge_ports::store::{EventView, RunDetail, TaskRunView};
use serde::Serialize;
use serde_json::Value;

/// The workflow a run executed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowRef {
    /// Name.
    pub name: String,
    /// Version.
    pub version: u32,
    /// Fingerprint of the executed definition.
    pub fingerprint: String,
}

/// The compensator rows that stand for the run as it is: each one ran
/// after its task's last reset. One that ran before a retry redid its task
/// undid an effect that has been made again, so it is history (the events
/// and attempts keep it), not part of the run's rollback
/// (docs/design/retry.md#compensated-runs).
pub(crate) fn standing_compensators(tasks: &[TaskRunView]) -> impl Iterator<Item = &TaskRunView> {
    let forward: HashMap<&str, u32> = tasks
        .iter()
        .filter(|t| t.compensate_for.is_none())
        .map(|t| (t.key.as_str(), t.generation))
        .collect();
    tasks.iter().filter(move |c| {
        c.compensate_for
            .as_deref()
            .and_then(|f| forward.get(f))
            .is_some_and(|g| c.generation >= *g)
    })
}

/// One forward task in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskReport {
    /// Key.
    pub key: String,
    /// Type.
    pub task_type: String,
    /// State (lower-case machine name).
    pub state: String,
    /// Attempts made (1-based; the current one), over every generation.
    pub attempt: u32,
    /// The run generation it last ran in (docs/design/retry.md).
    pub generation: u32,
    /// The priority it is dispatched at (docs/design/priorities.md).
    pub priority: Priority,
    /// What it waits for besides its dependencies, while pending:
    /// `concurrency:<key>` (docs/design/concurrency.md#blocked-by).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// `user` or `upstream_failed` when cancelled.
    pub cancel_reason: Option<String>,
    /// `condition_false` or `upstream_skipped` when skipped
    /// (docs/design/conditions.md#skipping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    /// Output when succeeded.
    pub output: Option<Value>,
    /// Last error.
    pub error: Option<String>,
    /// First claim (RFC 3339 UTC).
    pub started_at: Option<String>,
    /// End (RFC 3339 UTC).
    pub finished_at: Option<String>,
    /// What the latest attempt last reported of its progress, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// One compensator in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompensationReport {
    /// Compensator key.
    pub key: String,
    /// The forward task it undoes.
    pub compensate_for: String,
    /// State, or `not_run` for one the rollback never reached.
    pub state: String,
    /// Attempts made (0 when not run), over every generation.
    pub attempt: u32,
    /// The run generation whose rollback it last ran in (the run's current
    /// one when not run): a retried run's later rollback runs it again
    /// (docs/design/retry.md#compensated-runs).
    pub generation: u32,
    /// Output when succeeded.
    pub output: Option<Value>,
    /// Last error.
    pub error: Option<String>,
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventReport {
    /// Its place in the run's history (1, 2, 3, … in commit order).
    pub seq: u64,
    /// Task key (`null`: a run transition).
    pub task: Option<String>,
    /// Transition name or `stale_write_rejected`.
    pub transition: String,
    /// Source state.
    pub from: Option<String>,
    /// Target state.
    pub to: Option<String>,
    /// Attempt.
    pub attempt: Option<u32>,
    /// Fencing token.
    pub token: Option<i64>,
    /// Worker.
    pub worker: Option<String>,
    /// When (RFC 3339 UTC).
    pub at: String,
    /// Error recorded with it.
    pub error: Option<String>,
    /// The run's generation when it was written (docs/design/retry.md).
    pub generation: u32,
}

impl From<&EventView> for EventReport {
    fn from(e: &EventView) -> Self {
        Self {
            seq: e.seq,
            task: e.task.clone(),
            transition: e.transition.clone(),
            from: e.from.clone(),
            to: e.to.clone(),
            attempt: e.attempt,
            token: e.token,
            worker: e.worker.clone(),
            at: e.at.to_rfc3339_opts(SecondsFormat::Millis, true),
            error: e.error.clone(),
            generation: e.generation,
        }
    }
}

/// The report of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// Run id.
    pub run_id: String,
    /// What ran.
    pub workflow: WorkflowRef,
    /// Run state.
    pub state: String,
    /// 1, plus one per retry (docs/design/retry.md).
    pub generation: u32,
    /// The priority it was started at (docs/design/priorities.md).
    pub priority: Priority,
    /// Why it was cancelled when no user asked: `concurrency_limit`
    /// (docs/design/concurrency.md#strategies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    /// Run input.
    pub input: Value,
    /// When it moved to running.
    pub started_at: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// Forward tasks, in topological order.
    pub tasks: Vec<TaskReport>,
    /// Compensators in the order they ran, then those never run.
    pub compensations: Vec<CompensationReport>,
    /// The history, oldest first.
    pub events: Vec<EventReport>,
}

fn time(t: Option<DateTime<Utc>>) -> Option<String> {
    t.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

impl RunReport {
    /// Builds the report of `detail`, a run of `def`.
    pub fn new(detail: &RunDetail, def: &WorkflowDefinition) -> Self {
        let by_key: HashMap<&str, &TaskRunView> = detail.tasks.iter().map(|t| (t.key.as_str(), t)).collect();
        let tasks = def
            .graph()
            .topological_order()
            .into_iter()
            .filter_map(|key| by_key.get(key).map(|t| (key, *t)))
            .map(|(key, t)| TaskReport {
                key: key.to_owned(),
                task_type: def.task(key).map(|d| d.task_type().to_owned()).unwrap_or_default(),
                state: t.state.to_string(),
                attempt: t.attempt,
                generation: t.generation,
                priority: t.priority,
                blocked_by: t.blocked_by.clone(),
                cancel_reason: t.cancel_reason.map(|r| r.to_string()),
                skip_reason: t.skip_reason.map(|r| r.to_string()),
                output: t.output.clone(),
                error: t.error.clone(),
                started_at: time(t.started_at),
                finished_at: time(t.finished_at),
                progress: t.progress.clone(),
            })
            .collect();

        let mut ran: Vec<&TaskRunView> = standing_compensators(&detail.tasks).collect();
        ran.sort_by_key(|t| (t.created_at, t.id));
        let mut compensations: Vec<CompensationReport> = ran
            .iter()
            .map(|t| CompensationReport {
                key: t.key.clone(),
                compensate_for: t.compensate_for.clone().unwrap_or_default(),
                state: t.state.to_string(),
                attempt: t.attempt,
                generation: t.generation,
                output: t.output.clone(),
                error: t.error.clone(),
            })
            .collect();
        if detail.summary.state == RunState::Failed {
            let succeeded: BTreeSet<&str> = detail
                .tasks
                .iter()
                .filter(|t| t.compensate_for.is_none() && t.state == TaskRunState::Succeeded)
                .map(|t| t.key.as_str())
                .collect();
            let created: BTreeSet<&str> = ran.iter().map(|t| t.key.as_str()).collect();
            for (forward, key) in compensation_order(def, &succeeded) {
                if !created.contains(key) {
                    compensations.push(CompensationReport {
                        key: key.to_owned(),
                        compensate_for: forward.to_owned(),
                        state: "not_run".to_owned(),
                        attempt: 0,
                        generation: detail.summary.generation,
                        output: None,
                        error: None,
                    });
                }
            }
        }

        let events = detail.events.iter().map(EventReport::from).collect();

        Self {
            run_id: detail.summary.id.to_string(),
            workflow: WorkflowRef {
                name: def.name().to_owned(),
                version: def.version(),
                fingerprint: detail.fingerprint.clone(),
            },
            state: detail.summary.state.to_string(),
            generation: detail.summary.generation,
            priority: detail.summary.priority,
            cancel_reason: detail.summary.cancel_reason.clone(),
            input: detail.input.clone(),
            started_at: time(detail.summary.started_at),
            finished_at: time(detail.summary.finished_at),
            tasks,
            compensations,
            events,
        }
    }

    /// The run state.
    pub fn run_state(&self) -> Option<RunState> {
        self.state.parse().ok()
    }

    /// The report with ids, times, tokens and worker names removed: what two
    /// runs of the same definition and input must agree on
    /// (docs/design/cli.md#reports). Events are grouped by task, because tasks
    /// that run in parallel may interleave differently; each task's own
    /// sequence is kept.
    pub fn comparable(&self) -> Value {
        Self::comparable_json(&serde_json::to_value(self).unwrap_or(Value::Null))
    }

    /// [`RunReport::comparable`] of a report read back as JSON (what
    /// `flowforge run --output json` and `runs get --output json` print).
    pub fn comparable_json(report: &Value) -> Value {
        let mut v = report.clone();
        if let Some(map) = v.as_object_mut()
            && let Some(Value::Array(events)) = map.remove("events")
        {
            let mut by_task: serde_json::Map<String, Value> = serde_json::Map::new();
            for e in events {
                let task = e.get("task").and_then(Value::as_str).unwrap_or("(run)").to_owned();
                if let Value::Array(list) = by_task.entry(task).or_insert_with(|| Value::Array(Vec::new())) {
                    list.push(e);
                }
            }
            map.insert("events".to_owned(), Value::Object(by_task));
        }
        strip(&mut v);
        v
    }
}

fn strip(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for key in ["run_id", "started_at", "finished_at", "at", "token", "worker", "seq"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use flowforge_domain::{TaskRunState, WorkflowDocument};
    use flowforge_ports::store::{RunDetail, RunSummary, TaskRunView};
    use flowforge_ports::{RunId, TaskRunId, WorkflowId};
    use serde_json::json;

    use super::*;

    fn row(id: i64, key: &str, undoes: Option<&str>, state: TaskRunState, generation: u32) -> TaskRunView {
        TaskRunView {
            id: TaskRunId(id),
            key: key.to_owned(),
            compensate_for: undoes.map(str::to_owned),
            state,
            attempt: generation,
            generation,
            token: 1,
            priority: Priority::DEFAULT,
            blocked_by: None,
            cancel_reason: None,
            skip_reason: None,
            output: (state == TaskRunState::Succeeded).then(|| json!({})),
            error: (state == TaskRunState::Failed).then(|| "boom".to_owned()),
            started_at: None,
            finished_at: None,
            retry_at: None,
            lease_owner: None,
            progress: None,
            created_at: DateTime::UNIX_EPOCH + chrono::TimeDelta::seconds(id),
        }
    }

    /// Generation 2 redid a and b, failed again, and its rollback stopped at
    /// undo_b: undo_a's row from generation 1's rollback undid an effect
    /// that has been made again, so the report shows undo_a not run, as the
    /// retry that decides what is compensated sees it.
    #[test]
    fn a_compensator_from_before_its_task_was_redone_is_not_reported_as_run() {
        let doc: WorkflowDocument = serde_json::from_value(json!({"name": "saga", "version": 1, "tasks": [
            {"key": "a", "task_type": "echo"},
            {"key": "b", "task_type": "echo", "depends_on": ["a"]},
            {"key": "c", "task_type": "fail", "depends_on": ["b"]},
            {"key": "undo_a", "task_type": "echo", "compensate_for": "a"},
            {"key": "undo_b", "task_type": "echo", "compensate_for": "b"}
        ]}))
        .expect("a document");
        let def = WorkflowDefinition::from_document(doc).expect("a definition");
        let detail = RunDetail {
            summary: RunSummary {
                id: RunId("01a22735-3630-7019-bc12-97b04f3d9d90".parse().expect("a uuid")),
                workflow_id: WorkflowId(1),
                workflow: "saga".into(),
                version: 1,
                state: RunState::Failed,
                cancel_requested: false,
                cancel_reason: None,
                generation: 2,
                priority: Priority::DEFAULT,
                created_at: DateTime::UNIX_EPOCH,
                started_at: None,
                finished_at: None,
            },
            fingerprint: def.fingerprint(),
            input: json!({}),
            tasks: vec![
                row(1, "a", None, TaskRunState::Succeeded, 2),
                row(2, "b", None, TaskRunState::Succeeded, 2),
                row(3, "c", None, TaskRunState::Failed, 2),
                row(4, "undo_a", Some("a"), TaskRunState::Succeeded, 1),
                row(5, "undo_b", Some("b"), TaskRunState::Failed, 2),
            ],
            events: Vec::new(),
        };
        let report = RunReport::new(&detail, &def);
        let seen: Vec<(&str, &str, u32, u32)> = report
            .compensations
            .iter()
            .map(|c| (c.key.as_str(), c.state.as_str(), c.attempt, c.generation))
            .collect();
        assert_eq!(seen, [("undo_b", "failed", 2, 2), ("undo_a", "not_run", 0, 2)]);
        let standing: Vec<&str> = standing_compensators(&detail.tasks).map(|c| c.key.as_str()).collect();
        assert_eq!(standing, ["undo_b"]);
    }
}
