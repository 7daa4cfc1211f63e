//! Schedules and their fires (the schedule store) over SQLite
//! (docs/design/schedules.md#the-store). A fire takes the one writer with
//! `BEGIN IMMEDIATE`, reads the schedule, decides with the domain's rule
//! and writes in the same transaction, so no other write comes between the
//! read and the decision.

use chrono::{DateTime, Utc};
use flowforge_domain::schedule::{self, Decision, FireOutcome, Overlap};
use flowforge_ports::store::{self, Fire, FireStart, FireView, Fired, NewSchedule, ScheduleStore, ScheduleView};
use flowforge_ports::{RunId, Topic};
use sqlx::sqlite::SqliteRow;

use crate::error::is_unique_violation;
use crate::queries;
use crate::rows::{ScheduleRow, col, decode, duration_ms, name, opt_time, run_id, run_key, time};
use crate::runs::Starting;
use crate::store::{Conn, Failure, Query, SqliteStore, padded, sql};

fn ms(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn view(rows: &[SqliteRow]) -> Result<Option<ScheduleView>, store::Error> {
    rows.first()
        .map(|r| Ok(decode::<ScheduleRow>(r)?.into_view()?))
        .transpose()
}

impl SqliteStore {
    /// The start call of a scheduled run, built before the writer is
    /// taken: building it may read the definition, and a read while this
    /// task holds the writer could wait for the writer itself.
    async fn scheduled_start(&self, start: &FireStart) -> Result<(Query, Starting), store::Error> {
        self.start_call(
            queries::SCHEDULED_START,
            start.workflow,
            start.input.clone(),
            &start.options,
        )
        .await
    }

    /// `text` about fire `at` of `schedule` and its run: `?2`, `?3`, `?4`.
    fn fire_row(&self, text: &'static str, schedule: i64, at: DateTime<Utc>, run: RunId) -> Query {
        padded(
            sql(text)
                .bind(self.inner.offset())
                .bind(schedule)
                .bind(ms(at))
                .bind(run_key(run)),
        )
    }

    /// Runs a scheduled start on the writer whose transaction is open (the
    /// call commits it), marking the run as `schedule`'s.
    async fn run_scheduled_start(
        &self,
        conn: &mut Conn,
        (query, starting): (Query, Starting),
        schedule: i64,
    ) -> Result<RunId, store::Error> {
        let rows = conn.call(padded(query.bind(schedule))).await?;
        Ok(self.started(&starting, &rows)?.id)
    }
}

impl ScheduleStore for SqliteStore {
    async fn create_schedule(&self, s: &NewSchedule) -> Result<Option<ScheduleView>, store::Error> {
        let input = serde_json::to_string(&s.input).map_err(|e| store::Error::Other(e.to_string()))?;
        let called = self
            .inner
            .write()
            .await?
            .call_sqlx(padded(
                sql(queries::CREATE_SCHEDULE)
                    .bind(self.inner.offset())
                    .bind(s.name.clone())
                    .bind(s.workflow.clone())
                    .bind(s.version.map(i64::from))
                    .bind(s.cron.clone())
                    .bind(s.timezone.clone())
                    .bind(input)
                    .bind(s.overlap.as_str())
                    .bind(duration_ms(s.catchup_window)),
            ))
            .await;
        match called {
            Ok(rows) => view(&rows),
            Err(Failure::Sqlx(e)) if is_unique_violation(&e) => Ok(None),
            Err(e) => Err(e.into_store()),
        }
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleView>, store::Error> {
        let rows = self.inner.read().await?.call(sql(queries::LIST_SCHEDULES)).await?;
        rows.iter()
            .map(|r| Ok(decode::<ScheduleRow>(r)?.into_view()?))
            .collect()
    }

    async fn get_schedule(&self, name: &str) -> Result<Option<ScheduleView>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::GET_SCHEDULE).bind(name.to_owned()))
            .await?;
        view(&rows)
    }

    async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<Option<ScheduleView>, store::Error> {
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(queries::SET_SCHEDULE_PAUSED)
                    .bind(self.inner.offset())
                    .bind(name.to_owned())
                    .bind(paused),
            ))
            .await?;
        let resumed = view(&rows)?;
        if resumed.as_ref().is_some_and(|s| !s.paused) {
            // A waiting fire may start now.
            self.inner.wakeups.wake(Topic::RunSettled);
        }
        Ok(resumed)
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, store::Error> {
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(queries::DELETE_SCHEDULE)
                    .bind(self.inner.offset())
                    .bind(name.to_owned()),
            ))
            .await?;
        Ok(!rows.is_empty())
    }

    async fn store_now(&self) -> Result<DateTime<Utc>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::STORE_NOW).bind(self.inner.offset()))
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| store::Error::Other("reading store time returned no row".into()))?;
        Ok(time("store now", col(row, 0)?)?)
    }

    async fn fire_schedule(&self, fire: &Fire<'_>) -> Result<Fired, store::Error> {
        let Some((first, last)) = fire.span() else {
            return Ok(Fired::NOTHING);
        };
        let call = match fire.due {
            Some((_, start)) => Some(self.scheduled_start(start).await?),
            None => None,
        };
        let offset = self.inner.offset();
        let mut conn = self.inner.write().await?;
        let rows = conn
            .open_call(padded(sql(queries::FIRE_BEGIN).bind(offset).bind(fire.schedule)))
            .await?;
        let Some(row) = rows.first() else {
            conn.rollback().await?;
            return Ok(Fired::Inactive);
        };
        let paused: bool = col(row, 0)?;
        let cursor = time("schedule.cursor", col(row, 1)?)?;
        let overlap: Overlap = name("schedule.overlap", &col::<String>(row, 2)?)?;
        let buffered = opt_time("schedule.buffered_at", col(row, 3)?)?;
        let active: bool = col(row, 4)?;
        if paused {
            conn.rollback().await?;
            return Ok(Fired::Inactive);
        }
        if first <= cursor {
            conn.rollback().await?;
            return Ok(Fired::Handled);
        }
        let mut missed = 0;
        if !fire.missed.is_empty() {
            let times: Vec<i64> = fire.missed.iter().copied().map(ms).collect();
            let times = serde_json::to_string(&times).map_err(|e| store::Error::Other(e.to_string()))?;
            missed = conn
                .open_call(padded(
                    sql(queries::FIRE_MISSED).bind(offset).bind(fire.schedule).bind(times),
                ))
                .await?
                .len() as u64;
        }
        let (Some((at, _)), Some(call)) = (fire.due, call) else {
            conn.call(padded(
                sql(queries::FIRE_HELD)
                    .bind(offset)
                    .bind(fire.schedule)
                    .bind(ms(last))
                    .bind(None::<i64>)
                    .bind(None::<String>)
                    .bind(missed as i64),
            ))
            .await?;
            return Ok(Fired::Recorded {
                outcome: None,
                run: None,
                missed,
                cancelled: 0,
            });
        };
        let decision = schedule::decide(overlap, active, buffered.is_some());
        let mut cancelled = 0;
        if decision == Decision::CancelAndStart {
            cancelled = conn
                .open_call(padded(
                    sql(queries::FIRE_CANCEL_ACTIVE).bind(offset).bind(fire.schedule),
                ))
                .await?
                .len() as u64;
        }
        let run = match decision {
            Decision::Start | Decision::CancelAndStart => Some({
                conn.open_call(padded(
                    sql(queries::FIRE_STARTED)
                        .bind(offset)
                        .bind(fire.schedule)
                        .bind(ms(at))
                        .bind(run_key(call.1.run))
                        .bind(missed as i64),
                ))
                .await?;
                self.run_scheduled_start(&mut conn, call, fire.schedule).await?
            }),
            Decision::Skip | Decision::Buffer => {
                conn.call(padded(
                    sql(queries::FIRE_HELD)
                        .bind(offset)
                        .bind(fire.schedule)
                        .bind(ms(at))
                        .bind(ms(at))
                        .bind(decision.outcome().as_str())
                        .bind(missed as i64),
                ))
                .await?;
                None
            }
        };
        if cancelled > 0 {
            self.inner.wakeups.wake(Topic::Scheduler);
        }
        Ok(Fired::Recorded {
            outcome: Some(decision.outcome()),
            run,
            missed,
            cancelled,
        })
    }

    async fn start_buffered(
        &self,
        schedule: i64,
        at: DateTime<Utc>,
        start: &FireStart,
    ) -> Result<Option<RunId>, store::Error> {
        let call = self.scheduled_start(start).await?;
        let mut conn = self.inner.write().await?;
        let rows = conn
            .open_call(padded(
                sql(queries::BUFFERED_BEGIN).bind(self.inner.offset()).bind(schedule),
            ))
            .await?;
        let waiting = match rows.first() {
            Some(row) => {
                let paused: bool = col(row, 0)?;
                let buffered = opt_time("schedule.buffered_at", col(row, 1)?)?;
                let active: bool = col(row, 2)?;
                !paused && !active && buffered == Some(at)
            }
            None => false,
        };
        if !waiting {
            conn.rollback().await?;
            return Ok(None);
        }
        conn.open_call(self.fire_row(queries::BUFFERED_STARTED, schedule, at, call.1.run))
            .await?;
        self.run_scheduled_start(&mut conn, call, schedule).await.map(Some)
    }

    async fn backfill_fire(
        &self,
        schedule: i64,
        at: DateTime<Utc>,
        start: &FireStart,
    ) -> Result<Option<RunId>, store::Error> {
        let call = self.scheduled_start(start).await?;
        let mut conn = self.inner.write().await?;
        let recorded = conn
            .open_call(self.fire_row(queries::BACKFILL_BEGIN, schedule, at, call.1.run))
            .await?;
        if recorded.is_empty() {
            conn.rollback().await?;
            return Ok(None);
        }
        self.run_scheduled_start(&mut conn, call, schedule).await.map(Some)
    }

    async fn schedule_fires(
        &self,
        schedule: i64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<FireView>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::SCHEDULE_FIRES)
                    .bind(schedule)
                    .bind(ms(from))
                    .bind(ms(to))
                    .bind(i64::from(limit)),
            )
            .await?;
        rows.iter()
            .map(|r| {
                let outcome: String = col(r, 1)?;
                let run: Option<String> = col(r, 2)?;
                Ok(FireView {
                    at: time("schedule_fire.fire_time", col(r, 0)?)?,
                    outcome: name::<FireOutcome>("schedule_fire.outcome", &outcome)?,
                    run: run.as_deref().map(run_id).transpose()?,
                    backfill: col(r, 3)?,
                })
            })
            .collect()
    }
}
