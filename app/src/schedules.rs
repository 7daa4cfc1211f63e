//! Schedules (docs/design/schedules.md): the use cases that create, pause,
//! resume, delete and backfill them, and the loop that fires them. The
//! loop reads store time, works out each schedule's missed and due fire
//! times with the domain's rules, and hands them to the store one by one;
//! the store decides each fire under a lock, so any number of loops may
//! run against one store.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use flowforge_domain::Priority;
use flowforge_domain::schedule::{self, CatchUp, Cron, FireOutcome, Overlap};
use flowforge_ports::store::{Fire, FireStart, Fired, NewSchedule, ScheduleView};
use flowforge_ports::{RunId, Store, Topic};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::service::Service;

/// Fire times one catch-up step reads at most: a scheduler away for long
/// works through them a batch at a time, each batch its own transactions.
const CATCH_UP_BATCH: usize = 500;

/// The longest the loop sleeps without looking: schedules created or
/// resumed by another process are seen within it.
const LOOK_EVERY: Duration = Duration::from_secs(15);

/// What a schedule is created from; unset fields take their defaults
/// (time zone UTC, input `{}`, overlap `skip`, a one-hour catch-up window).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScheduleRequest {
    /// Its unique name.
    pub name: String,
    /// The workflow it starts.
    pub workflow: String,
    /// The version it starts (`None`: the latest at each fire).
    pub version: Option<u32>,
    /// The cron pattern (five fields, or `@daily` and the like).
    pub cron: String,
    /// The IANA time zone the pattern is read in.
    pub timezone: Option<String>,
    /// The run input, a JSON object.
    pub input: Option<Value>,
    /// What a fire does while a run of the schedule is active.
    pub overlap: Option<Overlap>,
    /// How far back a scheduler that was away fires what it missed.
    pub catchup_window: Option<Duration>,
}

/// One fire time of a backfill and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillFire {
    /// The fire time.
    pub at: DateTime<Utc>,
    /// What the backfill did, or (dry run) would do.
    pub outcome: BackfillOutcome,
}

/// What a backfill did with one fire time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillOutcome {
    /// Dry run: a run would start.
    WouldStart,
    /// The run started.
    Started(RunId),
    /// The fire time already had this outcome; nothing started.
    AlreadyRecorded(FireOutcome),
}

/// What one look at the schedules did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FireTally {
    /// Runs started, buffered ones included.
    pub started: u64,
    /// Fires that met an active run.
    pub skipped_overlap: u64,
    /// Fires put in the buffer.
    pub buffered: u64,
    /// Fire times counted as missed.
    pub missed: u64,
    /// Schedules that could not be fired (logged; tried again next time).
    pub failed: u64,
}

/// What one look at the schedules did, and how long until the next.
struct Look {
    tally: FireTally,
    /// The schedules that could not fire.
    failed: BTreeSet<i64>,
    /// Until the earliest next fire time of the others (at most
    /// [`LOOK_EVERY`]).
    wait: Duration,
}

/// The next fire time of a schedule, or `None` while it is paused (or
/// its pattern never fires again).
pub fn next_fire(schedule: &ScheduleView) -> Option<DateTime<Utc>> {
    if schedule.paused {
        return None;
    }
    Cron::parse(&schedule.spec.cron, &schedule.spec.timezone)
        .ok()?
        .next_after(schedule.cursor)
}

impl<S: Store> Service<S> {
    /// Creates a schedule, firing from now on. Every field is checked
    /// first ([`Error::InvalidSchedule`] names the one at fault), and the
    /// workflow must be published.
    pub async fn create_schedule(&self, request: ScheduleRequest) -> Result<ScheduleView, Error> {
        schedule::check_name(&request.name)?;
        let timezone = request.timezone.unwrap_or_else(|| "UTC".to_owned());
        Cron::parse(&request.cron, &timezone)?;
        let input = request.input.unwrap_or_else(|| Value::Object(serde_json::Map::new()));
        schedule::check_input(&input)?;
        let window = request.catchup_window.unwrap_or(schedule::DEFAULT_CATCHUP_WINDOW);
        schedule::check_catchup_window(window)?;
        let published = self.find(&request.workflow, request.version).await?;
        // The input must start the workflow as it will be given: checked
        // now, with the two times a fire adds, not at the first fire.
        let sample = schedule::fire_input(&input, DateTime::<Utc>::UNIX_EPOCH, DateTime::<Utc>::UNIX_EPOCH);
        self.start_options(published.id, &sample, Priority::default()).await?;
        let spec = NewSchedule {
            name: request.name,
            workflow: request.workflow,
            version: request.version,
            cron: request.cron,
            timezone,
            input,
            overlap: request.overlap.unwrap_or_default(),
            catchup_window: window,
        };
        self.store()
            .create_schedule(&spec)
            .await?
            .ok_or(Error::ScheduleNameTaken(spec.name))
    }

    /// Every schedule, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleView>, Error> {
        Ok(self.store().list_schedules().await?)
    }

    /// One schedule.
    pub async fn schedule(&self, name: &str) -> Result<ScheduleView, Error> {
        self.store()
            .get_schedule(name)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    }

    /// Pauses (`true`) or resumes a schedule; a resumed one fires from now
    /// on, neither firing nor counting the pause's fire times.
    pub async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleView, Error> {
        self.store()
            .set_schedule_paused(name, paused)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    }

    /// Deletes a schedule and its fire records; its runs stay.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), Error> {
        if self.store().delete_schedule(name).await? {
            Ok(())
        } else {
            Err(Error::ScheduleNotFound(name.to_owned()))
        }
    }

    /// Starts a run for each fire time of `name` from `from` to `to` (both
    /// included) that has no outcome yet, whatever the overlap policy;
    /// with `dry_run`, only says which. At most
    /// [`schedule::MAX_BACKFILL`] fire times.
    pub async fn backfill(
        &self,
        name: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<Vec<BackfillFire>, Error> {
        let view = self.schedule(name).await?;
        let cron = Cron::parse(&view.spec.cron, &view.spec.timezone)?;
        let times = schedule::backfill(&cron, view.cursor, from, to)?;
        let limit = u32::try_from(schedule::MAX_BACKFILL).unwrap_or(u32::MAX);
        let recorded = self.store().schedule_fires(view.id, from, to, limit).await?;
        let now = self.store().store_now().await?;
        let mut fires = Vec::with_capacity(times.len());
        for at in times {
            let known = recorded.iter().find(|f| f.at == at).map(|f| f.outcome);
            let outcome = match (known, dry_run) {
                (Some(outcome), _) => BackfillOutcome::AlreadyRecorded(outcome),
                (None, true) => BackfillOutcome::WouldStart,
                (None, false) => {
                    let start = self.fire_start(&view, at, now).await?;
                    match self.store().backfill_fire(view.id, at, &start).await? {
                        Some(run) => {
                            crate::metrics::schedule_fired(&view.spec.name, FireOutcome::Started, 1);
                            BackfillOutcome::Started(run)
                        }
                        // Another backfill recorded it since the read above.
                        None => {
                            let recorded = self.store().schedule_fires(view.id, at, at, 1).await?;
                            let outcome = recorded.first().map_or(FireOutcome::Started, |f| f.outcome);
                            BackfillOutcome::AlreadyRecorded(outcome)
                        }
                    }
                }
            };
            fires.push(BackfillFire { at, outcome });
        }
        Ok(fires)
    }

    /// The run a fire of `view` at `at` would start, fired at `now`.
    async fn fire_start(&self, view: &ScheduleView, at: DateTime<Utc>, now: DateTime<Utc>) -> Result<FireStart, Error> {
        let published = self.find(&view.spec.workflow, view.spec.version).await?;
        let input = schedule::fire_input(&view.spec.input, at, now);
        let options = self.start_options(published.id, &input, Priority::default()).await?;
        Ok(FireStart {
            workflow: published.id,
            input,
            options,
        })
    }

    /// Fires every active schedule's due fire times as of store now, and
    /// starts buffered fires whose overlap has ended. A schedule that
    /// fails is logged and counted, and the others go on; its cursor stays,
    /// so the next look tries it again.
    pub async fn fire_schedules(&self) -> Result<FireTally, Error> {
        Ok(self.fire_schedules_except(&BTreeSet::new()).await?.tally)
    }

    /// [`Service::fire_schedules`], leaving out the schedules `resting`;
    /// also says which failed and, from the same read, how long until the
    /// next fire time of those that did not.
    async fn fire_schedules_except(&self, resting: &BTreeSet<i64>) -> Result<Look, Error> {
        let now = self.store().store_now().await?;
        let mut tally = FireTally::default();
        let mut failed = BTreeSet::new();
        let mut next: Option<DateTime<Utc>> = None;
        for view in self.store().list_schedules().await? {
            if view.paused || resting.contains(&view.id) {
                continue;
            }
            match self.fire_schedule(&view, now, &mut tally).await {
                // Every fire time up to now is handled: the next is after it.
                Ok(()) => {
                    let own = Cron::parse(&view.spec.cron, &view.spec.timezone)
                        .ok()
                        .and_then(|c| c.next_after(now));
                    next = match (next, own) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Err(e) => {
                    tally.failed += 1;
                    failed.insert(view.id);
                    tracing::error!(schedule = %view.spec.name, error = %e, "could not fire the schedule");
                }
            }
        }
        // Fire times are whole minutes: wake just past one, not before.
        let wait = next.map_or(LOOK_EVERY, |next| {
            ((next - now).to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(5)).min(LOOK_EVERY)
        });
        Ok(Look { tally, failed, wait })
    }

    async fn fire_schedule(&self, view: &ScheduleView, now: DateTime<Utc>, tally: &mut FireTally) -> Result<(), Error> {
        let name = view.spec.name.as_str();
        let cron = Cron::parse(&view.spec.cron, &view.spec.timezone)?;
        if let Some(at) = view.buffered {
            let start = self.fire_start(view, at, now).await?;
            if let Some(run) = self.store().start_buffered(view.id, at, &start).await? {
                tracing::info!(schedule = name, %run, scheduled_for = %at, "started the buffered fire");
                tally.started += 1;
            }
        }
        let mut cursor = view.cursor;
        loop {
            let CatchUp { missed, due } =
                schedule::catch_up(&cron, cursor, now, view.spec.catchup_window, CATCH_UP_BATCH);
            let read = missed.len() + due.len();
            if read == 0 {
                return Ok(());
            }
            let mut missed = missed.as_slice();
            if due.is_empty() {
                let fired = self
                    .store()
                    .fire_schedule(&Fire {
                        schedule: view.id,
                        missed,
                        due: None,
                    })
                    .await?;
                if !self.count(name, &fired, tally) {
                    return Ok(());
                }
                cursor = missed.last().copied().unwrap_or(cursor);
            }
            for at in due {
                let start = self.fire_start(view, at, now).await?;
                let fired = self
                    .store()
                    .fire_schedule(&Fire {
                        schedule: view.id,
                        missed,
                        due: Some((at, &start)),
                    })
                    .await?;
                missed = &[];
                if let Fired::Recorded { run: Some(run), .. } = &fired {
                    tracing::info!(schedule = name, %run, scheduled_for = %at, "schedule fired");
                }
                if !self.count(name, &fired, tally) {
                    return Ok(());
                }
                cursor = at;
            }
            if read < CATCH_UP_BATCH {
                return Ok(());
            }
        }
    }

    /// Counts what a fire recorded; `false` when another scheduler had
    /// handled it or the schedule went inactive, so this one stops there.
    fn count(&self, name: &str, fired: &Fired, tally: &mut FireTally) -> bool {
        let Fired::Recorded {
            outcome,
            missed,
            cancelled,
            ..
        } = fired
        else {
            return false;
        };
        if *missed > 0 {
            tracing::warn!(
                schedule = name,
                missed,
                "fire times fell before the catch-up window: counted as missed"
            );
            crate::metrics::schedule_fired(name, FireOutcome::Missed, *missed);
            tally.missed += missed;
        }
        if *cancelled > 0 {
            tracing::info!(
                schedule = name,
                cancelled,
                "asked the schedule's previous runs to cancel"
            );
        }
        if let Some(outcome) = outcome {
            crate::metrics::schedule_fired(name, *outcome, 1);
            match outcome {
                FireOutcome::Started => tally.started += 1,
                FireOutcome::SkippedOverlap => tally.skipped_overlap += 1,
                FireOutcome::Buffered => tally.buffered += 1,
                FireOutcome::Missed => tally.missed += 1,
            }
        }
        true
    }

    /// Fires schedules until `shutdown`: at each schedule's next fire
    /// time, when a run settles (a buffered fire may start), and at least
    /// every few seconds (schedules created elsewhere).
    pub async fn fire_schedules_until(&self, shutdown: CancellationToken) -> Result<(), Error> {
        let notifier = self.store().notifier().await?;
        let mut failures = 0u32;
        // A schedule that could not fire rests a while before it is tried
        // again (its fire time stays due), without holding the others back.
        let mut resting: BTreeMap<i64, Instant> = BTreeMap::new();
        loop {
            resting.retain(|_, since| since.elapsed() < LOOK_EVERY);
            let skip: BTreeSet<i64> = resting.keys().copied().collect();
            let wait = match self.fire_schedules_except(&skip).await {
                Ok(look) => {
                    failures = 0;
                    resting.extend(look.failed.into_iter().map(|id| (id, Instant::now())));
                    look.wait
                }
                Err(e) => {
                    failures += 1;
                    let wait = crate::backoff(failures);
                    tracing::error!(error = %e, retry_in_ms = wait.as_millis() as u64, "firing schedules failed");
                    wait
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(wait) => {}
                () = flowforge_ports::Notifier::notified(&notifier, Topic::RunSettled) => {}
            }
        }
    }
}
