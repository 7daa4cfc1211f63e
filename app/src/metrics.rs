//! What the loops and use cases count, through the `metrics` facade (a
//! process without a recorder pays next to nothing). Labels are only
//! workflow, task type, schedule and outcome — never a run id
//! (docs/design/server.md#metrics).

use std::time::Duration;

use flowforge_domain::RunState;
use flowforge_domain::TaskRunState;
use flowforge_ports::FinishResult;

/// A run started.
pub(crate) fn run_started(workflow: &str) {
    metrics::counter!("flowforge_runs_started_total", "workflow" => workflow.to_owned()).increment(1);
}

/// A run reached `state`, `took` after it was created.
pub(crate) fn run_finished(workflow: &str, state: RunState, took: Duration) {
    metrics::counter!(
        "flowforge_runs_finished_total",
        "workflow" => workflow.to_owned(),
        "state" => state.to_string()
    )
    .increment(1);
    metrics::histogram!("flowforge_run_duration_seconds", "workflow" => workflow.to_owned()).record(took.as_secs_f64());
}

/// An attempt ended and its outcome was presented to the store.
pub(crate) fn attempt_finished(task_type: &str, result: FinishResult, took: Duration) {
    let outcome = match result {
        FinishResult::Recorded(TaskRunState::Succeeded) => "succeeded",
        FinishResult::Recorded(TaskRunState::Retrying) => "retried",
        FinishResult::Recorded(TaskRunState::Failed) => "failed",
        FinishResult::Recorded(_) => "cancelled",
        FinishResult::Stale => {
            metrics::counter!("flowforge_stale_writes_rejected_total").increment(1);
            "stale"
        }
    };
    metrics::counter!(
        "flowforge_task_attempts_total",
        "task_type" => task_type.to_owned(),
        "outcome" => outcome
    )
    .increment(1);
    metrics::histogram!("flowforge_task_duration_seconds", "task_type" => task_type.to_owned())
        .record(took.as_secs_f64());
}

/// A task of `task_type` was claimed `waited` after it became ready.
pub(crate) fn scheduled(task_type: &str, waited: Duration) {
    metrics::histogram!("flowforge_task_schedule_to_start_seconds", "task_type" => task_type.to_owned())
        .record(waited.as_secs_f64());
}

/// `n` fire times of schedule `schedule` ended in `outcome`
/// (docs/design/schedules.md#outcomes).
pub(crate) fn schedule_fired(schedule: &str, outcome: flowforge_domain::schedule::FireOutcome, n: u64) {
    metrics::counter!(
        "flowforge_schedule_fires_total",
        "schedule" => schedule.to_owned(),
        "outcome" => outcome.as_str()
    )
    .increment(n);
}

/// Leases the reaper took back.
pub(crate) fn leases_reaped(n: usize) {
    if n > 0 {
        metrics::counter!("flowforge_leases_reaped_total").increment(n as u64);
    }
}

/// A worker slot started (`+1`) or stopped (`-1`) running an attempt.
pub(crate) fn slot_busy(delta: f64) {
    metrics::gauge!("flowforge_worker_slots", "state" => "busy").increment(delta);
}

/// How many slots a worker has.
pub(crate) fn slots_total(n: usize) {
    #[allow(clippy::cast_precision_loss)] // slots are at most 1024
    metrics::gauge!("flowforge_worker_slots", "state" => "total").set(n as f64);
}
