//! The schedule store (docs/design/schedules.md#the-store): schedules, the
//! one recorded outcome of each of their fire times, and the fire itself —
//! decided and written in one transaction under a lock on the schedule, so
//! any number of schedulers fire each time exactly once.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::schedule::{FireOutcome, Overlap};
use serde_json::Value;

use super::{Error, StartOptions};
use crate::ids::{RunId, WorkflowId};

/// A schedule as created: the domain has checked every field
/// (`flowforge_domain::schedule`) and the workflow exists.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    /// Its unique name.
    pub name: String,
    /// The workflow it starts.
    pub workflow: String,
    /// The version it starts; `None`: the latest at each fire.
    pub version: Option<u32>,
    /// The cron pattern.
    pub cron: String,
    /// The IANA zone the pattern is read in.
    pub timezone: String,
    /// The run input (an object; each fire adds its times).
    pub input: Value,
    /// What a fire does while a run of the schedule is active.
    pub overlap: Overlap,
    /// How far back a scheduler that was away fires what it missed.
    pub catchup_window: Duration,
}

/// How many of a schedule's fire times ended in each outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FireCounts {
    /// Fires that started their run (at the fire or by a backfill).
    pub started: u64,
    /// Fires that met an active run and started nothing.
    pub skipped_overlap: u64,
    /// Fires that waited for the active run to end (each starts its run
    /// once it has; it stays counted here).
    pub buffered: u64,
    /// Fires before the catch-up window.
    pub missed: u64,
}

impl FireCounts {
    /// The count of `outcome`.
    pub const fn of(&self, outcome: FireOutcome) -> u64 {
        match outcome {
            FireOutcome::Started => self.started,
            FireOutcome::SkippedOverlap => self.skipped_overlap,
            FireOutcome::Buffered => self.buffered,
            FireOutcome::Missed => self.missed,
        }
    }
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleView {
    /// The store's id (never reused).
    pub id: i64,
    /// What it was created with.
    pub spec: NewSchedule,
    /// Paused schedules do not fire; resuming starts from then.
    pub paused: bool,
    /// The last fire time handled: the next fire is the first after it.
    pub cursor: DateTime<Utc>,
    /// The fire time waiting in the buffer for the active run to end.
    pub buffered: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Outcomes so far.
    pub counts: FireCounts,
}

/// The run a fire starts if it starts one: built by the caller from the
/// definition and the fire time, used by the store only when it decides to
/// start.
#[derive(Debug, Clone, PartialEq)]
pub struct FireStart {
    /// The definition's id.
    pub workflow: WorkflowId,
    /// The run input, `scheduled_for` and `fired_at` included.
    pub input: Value,
    /// Priority and gates, as for any start.
    pub options: StartOptions,
}

/// One step of a schedule's catch-up: fire times to record as missed and
/// the next due fire time, all after the cursor the caller read.
#[derive(Debug, Clone, Copy)]
pub struct Fire<'a> {
    /// The schedule's id.
    pub schedule: i64,
    /// Fire times before the catch-up window, oldest first.
    pub missed: &'a [DateTime<Utc>],
    /// The next due fire time and the run it would start.
    pub due: Option<(DateTime<Utc>, &'a FireStart)>,
}

impl Fire<'_> {
    /// The oldest and newest fire times given (the due one is the newest),
    /// or `None` when none is.
    pub fn span(&self) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        let due = self.due.map(|(at, _)| at);
        let first = self.missed.first().copied().or(due)?;
        let last = due.or(self.missed.last().copied()).unwrap_or(first);
        Some((first, last))
    }
}

/// What [`ScheduleStore::fire_schedule`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// The fire times were recorded; the due one (if any) with `outcome`,
    /// its run when one started, and how many active runs were asked to
    /// cancel (`cancel_previous`).
    Recorded {
        /// The due fire's outcome (`None`: only missed times were given).
        outcome: Option<FireOutcome>,
        /// The run started.
        run: Option<RunId>,
        /// Missed fire times recorded by this call (not by another
        /// scheduler before it).
        missed: u64,
        /// Runs asked to cancel.
        cancelled: u64,
    },
    /// The cursor is already at or past these fire times: another
    /// scheduler handled them. Nothing was written.
    Handled,
    /// The schedule is paused or deleted. Nothing was written.
    Inactive,
}

impl Fired {
    /// A call given no fire time: nothing recorded.
    pub const NOTHING: Self = Self::Recorded {
        outcome: None,
        run: None,
        missed: 0,
        cancelled: 0,
    };
}

/// One recorded fire time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireView {
    /// The fire time.
    pub at: DateTime<Utc>,
    /// How it ended.
    pub outcome: FireOutcome,
    /// The run it started (a buffered fire's once it starts).
    pub run: Option<RunId>,
    /// Whether a backfill started it.
    pub backfill: bool,
}

/// Schedules and their fires.
pub trait ScheduleStore: Send + Sync + 'static {
    /// Creates a schedule whose cursor is store now (it fires from then
    /// on). `Ok(None)`: the name is taken; nothing was written.
    fn create_schedule(
        &self,
        schedule: &NewSchedule,
    ) -> impl Future<Output = Result<Option<ScheduleView>, Error>> + Send;

    /// Every schedule, by name.
    fn list_schedules(&self) -> impl Future<Output = Result<Vec<ScheduleView>, Error>> + Send;

    /// One schedule by name.
    fn get_schedule(&self, name: &str) -> impl Future<Output = Result<Option<ScheduleView>, Error>> + Send;

    /// Pauses or resumes a schedule. Resuming moves the cursor to store
    /// now: the fire times of the pause are not fired, nor counted as
    /// missed. `Ok(None)`: no such schedule.
    fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
    ) -> impl Future<Output = Result<Option<ScheduleView>, Error>> + Send;

    /// Deletes a schedule and its fire records; the runs it started stay.
    /// `Ok(false)`: no such schedule.
    fn delete_schedule(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Store time: the database's clock plus the Clock port's offset, the
    /// time schedules fire by.
    fn store_now(&self) -> impl Future<Output = Result<DateTime<Utc>, Error>> + Send;

    /// Records one catch-up step in one transaction, holding the schedule
    /// locked: inserts each missed time as `missed` (one already recorded
    /// is left as it is), then decides the due fire with
    /// [`flowforge_domain::schedule::decide`] from the schedule's policy,
    /// whether a run it started is pending or running, and whether a fire
    /// waits in the buffer; applies the decision — `cancel_previous`
    /// requests the cancel of the active runs, a start creates the run as
    /// [`RunStore::start_run_with`](super::RunStore::start_run_with) does,
    /// a buffered fire becomes the schedule's waiting one — and moves the
    /// cursor to the last time given.
    ///
    /// Contract: each fire time of a schedule is recorded at most once and
    /// starts at most one run, however many callers race: a call whose
    /// times are not all after the stored cursor writes nothing and
    /// returns [`Fired::Handled`].
    fn fire_schedule(&self, fire: &Fire<'_>) -> impl Future<Output = Result<Fired, Error>> + Send;

    /// Starts the run of the fire waiting in the buffer, if it is the one
    /// at `at` and no run of the schedule is pending or running, in one
    /// transaction holding the schedule locked: the fire keeps its outcome
    /// (`buffered`) and names the run; the buffer empties. `Ok(None)`:
    /// nothing started.
    fn start_buffered(
        &self,
        schedule: i64,
        at: DateTime<Utc>,
        start: &FireStart,
    ) -> impl Future<Output = Result<Option<RunId>, Error>> + Send;

    /// Starts the run of fire time `at` for a backfill, recorded `started`
    /// and marked as backfilled, whatever the overlap policy and without
    /// moving the cursor. `Ok(None)`: that fire time already has an
    /// outcome, or is after the cursor (the scheduler's to fire: since the
    /// cursor only moves forward, a fire never meets a backfilled time);
    /// nothing was written.
    fn backfill_fire(
        &self,
        schedule: i64,
        at: DateTime<Utc>,
        start: &FireStart,
    ) -> impl Future<Output = Result<Option<RunId>, Error>> + Send;

    /// The recorded fire times of a schedule from `from` to `to` (both
    /// included), oldest first, at most `limit`.
    fn schedule_fires(
        &self,
        schedule: i64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<FireView>, Error>> + Send;
}
