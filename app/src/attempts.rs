//! A task's attempts, read back from its run's history: each claim opens
//! one, the next finishing or reaping event closes it. Nothing about an
//! attempt is stored apart from the events, so older attempts can never
//! go missing from this view.

use chrono::{DateTime, SecondsFormat, Utc};
use flowforge_ports::RunDetail;
use serde::Serialize;
use serde_json::Value;

/// One attempt of one task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// 1-based attempt number, counted over every generation.
    pub attempt: u32,
    /// The run generation it belongs to (docs/design/retry.md).
    pub generation: u32,
    /// `running`, `succeeded`, `failed`, `cancelled` or `lease_expired`.
    pub state: &'static str,
    /// When the task last became ready before this claim (queued from here).
    pub ready_at: Option<String>,
    /// The claim.
    pub started_at: String,
    /// When it ended, if it has.
    pub finished_at: Option<String>,
    /// The worker that claimed it.
    pub worker: Option<String>,
    /// The fencing token it held.
    pub token: Option<i64>,
    /// Its error, for a failed attempt.
    pub error: Option<String>,
    /// Its output, for the attempt that succeeded.
    pub output: Option<Value>,
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The attempts of `task` in `detail`, oldest first; `None` when the run
/// has no task run with that key.
pub fn attempts(detail: &RunDetail, task: &str) -> Option<Vec<Attempt>> {
    let view = detail.tasks.iter().find(|t| t.key == task)?;
    let mut out: Vec<Attempt> = Vec::new();
    let mut ready_at = Some(view.created_at);
    for event in detail.events.iter().filter(|e| e.task.as_deref() == Some(task)) {
        let open = out.last_mut().filter(|a| a.finished_at.is_none());
        match (event.transition.as_str(), open) {
            ("claim", _) => out.push(Attempt {
                attempt: event.attempt.unwrap_or_default(),
                generation: event.generation,
                state: "running",
                ready_at: ready_at.take().map(time),
                started_at: time(event.at),
                finished_at: None,
                worker: event.worker.clone(),
                token: event.token,
                error: None,
                output: None,
            }),
            ("succeed", Some(a)) => {
                a.state = "succeeded";
                a.finished_at = Some(time(event.at));
                // Only the row's latest success keeps its output: an
                // earlier generation's was replaced when the task reran.
                if a.attempt == view.attempt {
                    a.output.clone_from(&view.output);
                }
            }
            ("fail", Some(a)) => {
                a.state = "failed";
                a.finished_at = Some(time(event.at));
                a.error.clone_from(&event.error);
            }
            ("cancel_running", Some(a)) => {
                a.state = "cancelled";
                a.finished_at = Some(time(event.at));
            }
            ("reap_lease" | "reap_lease_final", Some(a)) => {
                a.state = "lease_expired";
                a.finished_at = Some(time(event.at));
                a.error.clone_from(&event.error);
            }
            _ => {}
        }
        if event.to.as_deref() == Some("ready") {
            ready_at = Some(event.at);
        }
    }
    Some(out)
}
