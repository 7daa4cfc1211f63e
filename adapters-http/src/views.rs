//! The JSON bodies the API returns, with their OpenAPI schemas.

use chrono::{DateTime, SecondsFormat, Utc};
use flowforge_app::RunReport;
use flowforge_app::report::EventReport;
use flowforge_app::schedules::{BackfillFire, BackfillOutcome, next_fire};
use flowforge_domain::Priority;
use flowforge_domain::schedule::Overlap;
use flowforge_ports::store::{DefinitionSummary, EventView, Published, RunSummary, ScheduleView};
use flowforge_ports::{RunId, WorkerInfo};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A definition without its tasks.
#[derive(Debug, Serialize, ToSchema)]
pub struct DefinitionItem {
    /// Workflow name.
    pub name: String,
    /// Version.
    pub version: u32,
    /// SHA-256 of its canonical form.
    pub fingerprint: String,
    /// Task count (compensators included).
    pub tasks: u32,
    /// First published (RFC 3339).
    pub created_at: String,
}

impl From<&DefinitionSummary> for DefinitionItem {
    fn from(d: &DefinitionSummary) -> Self {
        Self {
            name: d.name.clone(),
            version: d.version,
            fingerprint: d.fingerprint.clone(),
            tasks: d.tasks,
            created_at: time(d.created_at),
        }
    }
}

/// A list of definitions.
#[derive(Debug, Serialize, ToSchema)]
pub struct DefinitionList {
    /// By name, then version (newest first).
    pub items: Vec<DefinitionItem>,
}

/// One published definition.
#[derive(Debug, Serialize, ToSchema)]
pub struct DefinitionBody {
    /// Workflow name.
    pub name: String,
    /// Version.
    pub version: u32,
    /// SHA-256 of its canonical form.
    pub fingerprint: String,
    /// First published (RFC 3339).
    pub created_at: String,
    /// Forward tasks by dependency level (level 0 first).
    pub levels: Vec<Vec<String>>,
    /// The definition as published (normalised).
    #[schema(value_type = Object)]
    pub definition: Value,
}

impl From<&Published> for DefinitionBody {
    fn from(p: &Published) -> Self {
        let def = &p.definition;
        Self {
            name: def.name().to_owned(),
            version: def.version(),
            fingerprint: p.fingerprint.clone(),
            created_at: time(p.created_at),
            levels: def
                .graph()
                .levels()
                .into_iter()
                .map(|level| level.into_iter().map(str::to_owned).collect())
                .collect(),
            definition: serde_json::to_value(def.document()).unwrap_or(Value::Null),
        }
    }
}

/// What `POST /runs` takes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRun {
    /// The workflow's name.
    pub workflow: String,
    /// Its version (default: the latest published).
    #[serde(default)]
    pub version: Option<u32>,
    /// The run input (default `{}`).
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub input: Value,
    /// Its dispatch priority, 0 (lowest) to 9 (highest); default 5. A task
    /// whose definition names a priority keeps its own
    /// (docs/design/priorities.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u8>, minimum = 0, maximum = 9)]
    pub priority: Option<Priority>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// A run in a listing (no inputs or outputs).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunItem {
    /// Run id.
    pub id: String,
    /// Workflow name.
    pub workflow: String,
    /// Workflow version.
    pub version: u32,
    /// `pending`, `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// The priority it was started at, 0 to 9.
    #[schema(value_type = u8)]
    pub priority: Priority,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Moved to running.
    pub started_at: Option<String>,
    /// Ended.
    pub finished_at: Option<String>,
}

impl From<&RunSummary> for RunItem {
    fn from(r: &RunSummary) -> Self {
        Self {
            id: r.id.to_string(),
            workflow: r.workflow.clone(),
            version: r.version,
            state: r.state.to_string(),
            cancel_requested: r.cancel_requested,
            priority: r.priority,
            created_at: time(r.created_at),
            started_at: r.started_at.map(time),
            finished_at: r.finished_at.map(time),
        }
    }
}

/// A page of runs.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunPage {
    /// Newest first.
    pub items: Vec<RunItem>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// A started run, as it was created: the same body answers a replay.
#[derive(Debug, Serialize, ToSchema)]
pub struct Started {
    /// Run id.
    pub id: String,
    /// Workflow name.
    pub workflow: String,
    /// Workflow version.
    pub version: u32,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Where to read it.
    pub links: Links,
}

/// Where to follow a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct Links {
    /// The run report.
    pub run: String,
    /// Its event stream.
    pub events: String,
}

impl Started {
    /// A run of `workflow` at `version`, created at `created_at`.
    pub(crate) fn new(id: RunId, workflow: &str, version: u32, created_at: DateTime<Utc>) -> Self {
        Self {
            id: id.to_string(),
            workflow: workflow.to_owned(),
            version,
            created_at: time(created_at),
            links: Links {
                run: format!("/api/v1/runs/{id}"),
                events: format!("/api/v1/runs/{id}/events"),
            },
        }
    }

    pub(crate) fn of(run: &RunSummary) -> Self {
        Self::new(run.id, &run.workflow, run.version, run.created_at)
    }
}

/// The run report (the same JSON as `flowforge runs get --output json`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(value_type = Object)]
pub struct Report(pub RunReport);

/// What `POST /runs/{id}/retry` takes (docs/design/retry.md). An empty
/// body retries every failed or cancelled task.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRun {
    /// Redo these tasks and all their descendants, succeeded ones too
    /// (default: every failed or cancelled task).
    #[serde(default)]
    pub from: Vec<String>,
    /// Answer with the retry set and change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// One task of a retry set.
#[derive(Debug, Serialize, ToSchema)]
pub struct RetryTask {
    /// The task's key.
    pub key: String,
    /// Its state before the retry.
    pub from: String,
    /// `ready` or `pending` (waiting on tasks of the set).
    pub to: String,
}

/// A retry's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RetryAccepted {
    /// Run id.
    pub id: String,
    /// The generation the retry opened (a dry run: would open).
    pub generation: u32,
    /// Whether anything was written (false for a dry run).
    pub applied: bool,
    /// The retry set, in dependency order.
    pub tasks: Vec<RetryTask>,
}

impl RetryAccepted {
    /// The answer for `retry` of run `id`.
    pub fn new(id: String, retry: &flowforge_app::Retry) -> Self {
        Self {
            id,
            generation: retry.generation,
            applied: retry.applied,
            tasks: retry
                .resets
                .iter()
                .map(|r| RetryTask {
                    key: r.key.clone(),
                    from: r.from.to_string(),
                    to: r.to.to_string(),
                })
                .collect(),
        }
    }
}

/// A cancel request's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelAccepted {
    /// Run id.
    pub id: String,
    /// `requested` or `already_requested`.
    pub cancel: &'static str,
}

/// One event of a run's history, as the run report shows it: `seq` (1, 2,
/// 3, … in commit order), `task` (null: the run's own transition),
/// `transition`, `from`, `to`, `attempt`, `token`, `worker`, `at`, `error`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = Object)]
pub struct Event(pub EventReport);

impl From<&EventView> for Event {
    fn from(e: &EventView) -> Self {
        Self(EventReport::from(e))
    }
}

/// A long-poll answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventBatch {
    /// The events after `after`, ascending.
    pub events: Vec<Event>,
    /// Ask again with this as `after`.
    pub last_seq: u64,
    /// The run has ended and every event up to its end is in `events` or
    /// was before `after`.
    pub finished: bool,
}

/// One attempt of a task.
#[derive(Debug, Serialize, ToSchema)]
#[schema(value_type = Object)]
pub struct AttemptBody(pub flowforge_app::attempts::Attempt);

/// A task's attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptList {
    /// Oldest first; none hidden.
    pub items: Vec<AttemptBody>,
}

/// A registered worker.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerItem {
    /// Its id.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Task types it serves.
    pub task_types: Vec<String>,
    /// Slots.
    pub concurrency: u32,
    /// First registration.
    pub started_at: String,
    /// Last heartbeat.
    pub last_seen_at: String,
    /// Set after a graceful stop.
    pub stopped_at: Option<String>,
}

impl From<&WorkerInfo> for WorkerItem {
    fn from(w: &WorkerInfo) -> Self {
        Self {
            id: w.id.to_string(),
            host: w.host.clone(),
            pid: w.pid,
            task_types: w.task_types.clone(),
            concurrency: w.concurrency,
            started_at: time(w.started_at),
            last_seen_at: time(w.last_seen_at),
            stopped_at: w.stopped_at.map(time),
        }
    }
}

/// The registered workers.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerList {
    /// Most recently seen first.
    pub items: Vec<WorkerItem>,
}

/// What `POST /schedules` takes (docs/design/schedules.md).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// Its unique name.
    pub name: String,
    /// The workflow it starts.
    pub workflow: String,
    /// The version it starts (default: the latest at each fire).
    #[serde(default)]
    pub version: Option<u32>,
    /// Five cron fields, or `@hourly`, `@daily`, `@weekly`, `@monthly`,
    /// `@yearly`.
    pub cron: String,
    /// The IANA time zone the pattern is read in (default `UTC`).
    #[serde(default)]
    pub timezone: Option<String>,
    /// The run input, an object (default `{}`); each fire adds
    /// `scheduled_for` and `fired_at`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// `skip` (default), `buffer_one`, `allow` or `cancel_previous`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub overlap: Option<Overlap>,
    /// How far back a scheduler that was away fires what it missed
    /// (default 3600).
    #[serde(default)]
    pub catchup_window_seconds: Option<u64>,
}

/// How many fire times of a schedule ended in each outcome.
#[derive(Debug, Serialize, ToSchema)]
pub struct FireCountsBody {
    /// Started their run (at the fire or by a backfill).
    pub started: u64,
    /// Met an active run and started nothing.
    pub skipped_overlap: u64,
    /// Waited for the active run to end.
    pub buffered: u64,
    /// Fell before the catch-up window.
    pub missed: u64,
}

/// A schedule.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleBody {
    /// Its unique name.
    pub name: String,
    /// The workflow it starts.
    pub workflow: String,
    /// The version it starts (`null`: the latest at each fire).
    pub version: Option<u32>,
    /// The cron pattern.
    pub cron: String,
    /// The IANA time zone it is read in.
    pub timezone: String,
    /// The run input, before each fire adds its times.
    #[schema(value_type = Object)]
    pub input: Value,
    /// What a fire does while a run of the schedule is active.
    #[schema(value_type = String)]
    pub overlap: Overlap,
    /// How far back a scheduler that was away fires what it missed.
    pub catchup_window_seconds: u64,
    /// Whether it is paused.
    pub paused: bool,
    /// Its next fire time (RFC 3339; `null` while paused).
    pub next_fire: Option<String>,
    /// The fire time waiting for the active run to end (RFC 3339).
    pub buffered: Option<String>,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// Outcomes of its fire times so far.
    pub fires: FireCountsBody,
}

impl From<&ScheduleView> for ScheduleBody {
    fn from(s: &ScheduleView) -> Self {
        Self {
            name: s.spec.name.clone(),
            workflow: s.spec.workflow.clone(),
            version: s.spec.version,
            cron: s.spec.cron.clone(),
            timezone: s.spec.timezone.clone(),
            input: s.spec.input.clone(),
            overlap: s.spec.overlap,
            catchup_window_seconds: s.spec.catchup_window.as_secs(),
            paused: s.paused,
            next_fire: next_fire(s).map(time),
            buffered: s.buffered.map(time),
            created_at: time(s.created_at),
            fires: FireCountsBody {
                started: s.counts.started,
                skipped_overlap: s.counts.skipped_overlap,
                buffered: s.counts.buffered,
                missed: s.counts.missed,
            },
        }
    }
}

/// A list of schedules.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleList {
    /// By name.
    pub items: Vec<ScheduleBody>,
}

/// What `POST /schedules/{name}/backfill` takes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The first instant (RFC 3339), included.
    pub from: DateTime<Utc>,
    /// The last instant (RFC 3339), included.
    pub to: DateTime<Utc>,
    /// Only say what would start.
    #[serde(default)]
    pub dry_run: bool,
}

/// One fire time of a backfill.
#[derive(Debug, Serialize, ToSchema)]
pub struct BackfillItem {
    /// The fire time (RFC 3339).
    pub at: String,
    /// `would_start` (dry run), `started`, or `already_recorded`.
    pub outcome: &'static str,
    /// The run started.
    pub run_id: Option<String>,
    /// The outcome the fire time already had, when `already_recorded`.
    pub recorded: Option<&'static str>,
}

impl From<&BackfillFire> for BackfillItem {
    fn from(f: &BackfillFire) -> Self {
        let (outcome, run_id, recorded) = match f.outcome {
            BackfillOutcome::WouldStart => ("would_start", None, None),
            BackfillOutcome::Started(run) => ("started", Some(run.to_string()), None),
            BackfillOutcome::AlreadyRecorded(o) => ("already_recorded", None, Some(o.as_str())),
        };
        Self {
            at: time(f.at),
            outcome,
            run_id,
            recorded,
        }
    }
}

/// What a backfill did.
#[derive(Debug, Serialize, ToSchema)]
pub struct BackfillBody {
    /// Its fire times, oldest first.
    pub fires: Vec<BackfillItem>,
}
