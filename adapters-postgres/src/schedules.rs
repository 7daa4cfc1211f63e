//! Schedules and their fires (the schedule store) over PostgreSQL
//! (docs/design/schedules.md#the-store). A fire locks its schedule row
//! (`FOR UPDATE`), reads what the decision needs after the lock, decides
//! with the domain's rule and writes, in one transaction: schedulers that
//! race on a schedule take turns, and the later one finds the cursor moved.

use chrono::{DateTime, Utc};
use flowforge_domain::limits::{self, ValueKind};
use flowforge_domain::schedule::{self, Decision, FireOutcome, Overlap};
use flowforge_ports::store::{self, Fire, FireStart, FireView, Fired, NewSchedule, ScheduleStore, ScheduleView};
use flowforge_ports::{RunId, Topic};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::store_error;
use crate::queries;
use crate::rows::{ScheduleRow, parse_name};
use crate::store::PgStore;

/// What a fire reads of its locked schedule: paused, cursor, overlap
/// policy, waiting fire.
type Locked = (bool, DateTime<Utc>, String, Option<DateTime<Utc>>);

impl PgStore {
    /// Records fire `at` of `schedule` as started by a new run and creates
    /// the run, in `tx`. `None`: the fire time was already recorded.
    async fn start_fire(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        schedule: i64,
        at: DateTime<Utc>,
        backfill: bool,
        missed: i64,
        start: &FireStart,
    ) -> Result<Option<(RunId, [(Topic, bool); 2])>, store::Error> {
        let id = Uuid::now_v7();
        let recorded: Option<i64> = sqlx::query_scalar(queries::FIRE_STARTED)
            .bind(self.offset())
            .bind(schedule)
            .bind(at)
            .bind(id)
            .bind(backfill)
            .bind(missed)
            .fetch_optional(&mut **tx)
            .await
            .map_err(store_error)?;
        if recorded.is_none() {
            return Ok(None);
        }
        self.create_scheduled_run(tx, schedule, id, start).await.map(Some)
    }

    /// Creates run `id` of `start` in `tx`, as `start_run_with` does, marked
    /// as `schedule`'s. Returns it with the wake-ups it owes.
    async fn create_scheduled_run(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        schedule: i64,
        id: Uuid,
        start: &FireStart,
    ) -> Result<(RunId, [(Topic, bool); 2]), store::Error> {
        let (run, owed) = self
            .create_run(&mut **tx, id, start.workflow, &start.input, &start.options)
            .await?;
        sqlx::query(queries::MARK_SCHEDULED_RUN)
            .bind(schedule)
            .bind(id)
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        Ok((run.id, owed))
    }

    /// Whether a run of `schedule` is pending or running, as of now in `tx`.
    async fn schedule_active(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        schedule: i64,
    ) -> Result<bool, store::Error> {
        sqlx::query_scalar(queries::SCHEDULE_ACTIVE)
            .bind(schedule)
            .fetch_one(&mut **tx)
            .await
            .map_err(store_error)
    }
}

impl ScheduleStore for PgStore {
    async fn create_schedule(&self, s: &NewSchedule) -> Result<Option<ScheduleView>, store::Error> {
        let window = i64::try_from(s.catchup_window.as_millis())
            .map_err(|_| store::Error::Other("the catch-up window is out of range".into()))?;
        let version = s
            .version
            .map(i32::try_from)
            .transpose()
            .map_err(|_| store::Error::Other("the version is out of range".into()))?;
        let row: Option<ScheduleRow> = sqlx::query_as(queries::CREATE_SCHEDULE)
            .bind(self.offset())
            .bind(&s.name)
            .bind(&s.workflow)
            .bind(version)
            .bind(&s.cron)
            .bind(&s.timezone)
            .bind(&s.input)
            .bind(s.overlap.as_str())
            .bind(window)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        row.map(ScheduleRow::into_view).transpose()
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleView>, store::Error> {
        let rows: Vec<ScheduleRow> = sqlx::query_as(queries::LIST_SCHEDULES)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(ScheduleRow::into_view).collect()
    }

    async fn get_schedule(&self, name: &str) -> Result<Option<ScheduleView>, store::Error> {
        let row: Option<ScheduleRow> = sqlx::query_as(queries::GET_SCHEDULE)
            .bind(name)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        row.map(ScheduleRow::into_view).transpose()
    }

    async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<Option<ScheduleView>, store::Error> {
        let row: Option<ScheduleRow> = sqlx::query_as(queries::SET_SCHEDULE_PAUSED)
            .bind(self.offset())
            .bind(name)
            .bind(paused)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        let view = row.map(ScheduleRow::into_view).transpose()?;
        // A waiting fire may start now.
        self.announce(&[(Topic::RunSettled, view.as_ref().is_some_and(|s| !s.paused))])
            .await;
        Ok(view)
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, store::Error> {
        let deleted: Option<i64> = sqlx::query_scalar(queries::DELETE_SCHEDULE)
            .bind(name)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.is_some())
    }

    async fn store_now(&self) -> Result<DateTime<Utc>, store::Error> {
        sqlx::query_scalar(queries::STORE_NOW)
            .bind(self.offset())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)
    }

    async fn fire_schedule(&self, fire: &Fire<'_>) -> Result<Fired, store::Error> {
        let Some((first, last)) = fire.span() else {
            return Ok(Fired::NOTHING);
        };
        if let Some((_, start)) = fire.due {
            limits::refuse_nul(ValueKind::RunInput, &start.input)?;
        }
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let locked: Option<Locked> = sqlx::query_as(queries::LOCK_SCHEDULE)
            .bind(fire.schedule)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        let Some((paused, cursor, overlap, buffered)) = locked else {
            return Ok(Fired::Inactive);
        };
        if paused {
            return Ok(Fired::Inactive);
        }
        if first <= cursor {
            return Ok(Fired::Handled);
        }
        let overlap: Overlap = parse_name(&overlap, "schedule.overlap")?;
        let missed: i64 = if fire.missed.is_empty() {
            0
        } else {
            sqlx::query_scalar(queries::FIRE_MISSED)
                .bind(self.offset())
                .bind(fire.schedule)
                .bind(fire.missed)
                .fetch_one(&mut *tx)
                .await
                .map_err(store_error)?
        };
        let recorded = |outcome, run, cancelled| Fired::Recorded {
            outcome,
            run,
            missed: missed.unsigned_abs(),
            cancelled,
        };
        let Some((at, start)) = fire.due else {
            sqlx::query(queries::FIRE_HELD)
                .bind(self.offset())
                .bind(fire.schedule)
                .bind(last)
                .bind(None::<DateTime<Utc>>)
                .bind(None::<String>)
                .bind(missed)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
            tx.commit().await.map_err(store_error)?;
            return Ok(recorded(None, None, 0));
        };
        let active = self.schedule_active(&mut tx, fire.schedule).await?;
        let decision = schedule::decide(overlap, active, buffered.is_some());
        let mut cancelled = 0;
        if decision == Decision::CancelAndStart {
            let ids: Vec<Uuid> = sqlx::query_scalar(queries::FIRE_CANCEL_ACTIVE)
                .bind(self.offset())
                .bind(fire.schedule)
                .fetch_all(&mut *tx)
                .await
                .map_err(store_error)?;
            cancelled = ids.len() as u64;
        }
        match decision {
            Decision::Start | Decision::CancelAndStart => {
                let Some((run, owed)) = self
                    .start_fire(&mut tx, fire.schedule, at, false, missed, start)
                    .await?
                else {
                    return Err(store::Error::Other(format!(
                        "schedule {}'s fire at {at} is recorded beyond its cursor {cursor}",
                        fire.schedule
                    )));
                };
                tx.commit().await.map_err(store_error)?;
                self.announce(&owed).await;
                self.announce(&[(Topic::Scheduler, cancelled > 0)]).await;
                Ok(recorded(Some(FireOutcome::Started), Some(run), cancelled))
            }
            Decision::Skip | Decision::Buffer => {
                sqlx::query(queries::FIRE_HELD)
                    .bind(self.offset())
                    .bind(fire.schedule)
                    .bind(at)
                    .bind(Some(at))
                    .bind(decision.outcome().as_str())
                    .bind(missed)
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
                tx.commit().await.map_err(store_error)?;
                Ok(recorded(Some(decision.outcome()), None, 0))
            }
        }
    }

    async fn start_buffered(
        &self,
        schedule: i64,
        at: DateTime<Utc>,
        start: &FireStart,
    ) -> Result<Option<RunId>, store::Error> {
        limits::refuse_nul(ValueKind::RunInput, &start.input)?;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let locked: Option<(bool, Option<DateTime<Utc>>)> = sqlx::query_as(queries::LOCK_BUFFERED)
            .bind(schedule)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        let waiting = matches!(locked, Some((false, Some(buffered))) if buffered == at);
        if !waiting || self.schedule_active(&mut tx, schedule).await? {
            return Ok(None);
        }
        let id = Uuid::now_v7();
        let (run, owed) = self.create_scheduled_run(&mut tx, schedule, id, start).await?;
        sqlx::query(queries::BUFFERED_STARTED)
            .bind(schedule)
            .bind(at)
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        self.announce(&owed).await;
        Ok(Some(run))
    }

    async fn backfill_fire(
        &self,
        schedule: i64,
        at: DateTime<Utc>,
        start: &FireStart,
    ) -> Result<Option<RunId>, store::Error> {
        limits::refuse_nul(ValueKind::RunInput, &start.input)?;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let Some((run, owed)) = self.start_fire(&mut tx, schedule, at, true, 0, start).await? else {
            return Ok(None);
        };
        tx.commit().await.map_err(store_error)?;
        self.announce(&owed).await;
        Ok(Some(run))
    }

    async fn schedule_fires(
        &self,
        schedule: i64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<FireView>, store::Error> {
        let rows: Vec<(DateTime<Utc>, String, Option<Uuid>, bool)> = sqlx::query_as(queries::SCHEDULE_FIRES)
            .bind(schedule)
            .bind(from)
            .bind(to)
            .bind(i64::from(limit))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter()
            .map(|(at, outcome, run, backfill)| {
                Ok(FireView {
                    at,
                    outcome: parse_name(&outcome, "schedule_fire.outcome")?,
                    run: run.map(RunId),
                    backfill,
                })
            })
            .collect()
    }
}
