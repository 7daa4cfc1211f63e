//! Schedules fired through the use cases on SQLite and on PostgreSQL, with
//! time moved through the Clock port (no sleeping): two schedulers, catch-up
//! after downtime, every overlap policy, both daylight-saving transitions
//! of America/New_York, backfills.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Timelike, Utc};
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_app::schedules::{BackfillOutcome, FireTally, ScheduleRequest};
use flowforge_app::{Service, TaskTypes};
use flowforge_domain::RunState;
use flowforge_domain::schedule::Overlap;
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{RunId, Store};
use flowforge_testkit::TestDatabase;
use serde_json::json;

use crate::definition;

/// Runs `$case` once on an in-memory SQLite store and once on a fresh
/// PostgreSQL database, each with a clock of its own.
macro_rules! on_both_stores {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    let clock = std::sync::Arc::new(flowforge_ports::clock::ManualClock::default());
                    let store = crate::store_with(clock.clone()).await;
                    super::$case(store, clock).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some((_db, store, clock)) = super::postgres().await else {
                        return;
                    };
                    super::$case(store, clock).await;
                }
            )*
        }
    };
}

on_both_stores!(
    two_schedulers_fire_each_time_once,
    catch_up_after_three_hours_fires_the_last_hour_and_counts_the_rest_as_missed,
    skip_starts_nothing_while_the_previous_run_is_active,
    buffer_one_keeps_one_fire_until_the_previous_run_ends,
    allow_starts_every_fire,
    cancel_previous_asks_the_active_run_to_cancel,
    spring_forward_fires_a_skipped_time_once_after_the_gap,
    fall_back_fires_a_repeated_time_once,
    backfill_dry_run_starts_nothing_and_a_real_one_starts_each_time_once,
    a_paused_schedule_does_not_fire_and_resumes_from_then,
);

async fn postgres() -> Option<(TestDatabase, PgStore, Arc<ManualClock>)> {
    let admin = flowforge_testkit::postgres_url()?;
    let db = TestDatabase::create(&admin, "schedules").await;
    let clock = Arc::new(ManualClock::default());
    let store = PgStore::connect_unchecked(&db.url, clock.clone(), PgOptions::default())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    Some((db, store, clock))
}

/// A published one-task workflow `nightly` and the use cases over `store`.
async fn service<S: Store>(store: S) -> Service<S> {
    let service = Service::new(store);
    let def = definition(json!({"name": "nightly", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}));
    service
        .publish(&def, &TaskTypes::Registered(["noop".to_owned()].into()))
        .await
        .expect("publish");
    service
}

fn request(name: &str, cron: &str, overlap: Overlap) -> ScheduleRequest {
    ScheduleRequest {
        name: name.to_owned(),
        workflow: "nightly".to_owned(),
        cron: cron.to_owned(),
        overlap: Some(overlap),
        input: Some(json!({"region": "eu"})),
        ..ScheduleRequest::default()
    }
}

/// Moves store time forward to `at` (which must be ahead of it).
async fn move_to<S: Store>(store: &S, clock: &ManualClock, at: DateTime<Utc>) {
    let now = store.store_now().await.expect("store now");
    let by = (at - now).to_std().expect("time only moves forward");
    clock.advance(by);
}

/// Moves store time to one minute past the next hour, so a test's hourly
/// fire times fall where it expects whatever the machine's clock says.
async fn past_next_hour<S: Store>(store: &S, clock: &ManualClock) -> DateTime<Utc> {
    let now = store.store_now().await.expect("store now");
    let hour = now
        .with_minute(0)
        .and_then(|t| t.with_second(0))
        .and_then(|t| t.with_nanosecond(0))
        .expect("a whole hour")
        + TimeDelta::hours(1);
    move_to(store, clock, hour + TimeDelta::minutes(1)).await;
    hour
}

fn advance(clock: &ManualClock, hours: i64, minutes: i64) {
    clock.advance(Duration::from_secs(
        u64::try_from(hours * 3600 + minutes * 60).expect("forward"),
    ));
}

/// The schedule's runs, oldest fire first: (run, scheduled_for).
async fn runs<S: Store>(store: &S) -> Vec<(RunId, DateTime<Utc>)> {
    let mut found = Vec::new();
    for summary in store.list_runs(1000).await.expect("runs") {
        let detail = store.get_run(summary.id).await.expect("get").expect("run");
        let at = detail.input["scheduled_for"]
            .as_str()
            .expect("scheduled_for")
            .to_owned();
        assert!(detail.input["fired_at"].is_string(), "fired_at in {}", detail.input);
        assert_eq!(detail.input["region"], "eu", "the schedule's own input");
        found.push((
            summary.id,
            DateTime::parse_from_rfc3339(&at).expect("RFC 3339").with_timezone(&Utc),
        ));
    }
    found.sort_by_key(|(_, at)| *at);
    found
}

fn times(runs: &[(RunId, DateTime<Utc>)]) -> Vec<DateTime<Utc>> {
    runs.iter().map(|(_, at)| *at).collect()
}

/// Ends a run the way an operator closes an abandoned one.
async fn end<S: Store>(service: &Service<S>, run: RunId) {
    service.close(run, Duration::ZERO).await.expect("close");
    let state = service.summary(run).await.expect("summary").state;
    assert_eq!(state, RunState::Cancelled);
}

async fn two_schedulers_fire_each_time_once<S: Store>(store: S, clock: Arc<ManualClock>) {
    let one = service(store.clone()).await;
    let two = Service::new(store.clone());
    let hour = past_next_hour(&store, &clock).await;
    one.create_schedule(request("etl", "*/20 * * * *", Overlap::Allow))
        .await
        .expect("create");
    advance(&clock, 1, 0);
    for _ in 0..3 {
        let (a, b) = tokio::join!(one.fire_schedules(), two.fire_schedules());
        let (a, b) = (a.expect("fire"), b.expect("fire"));
        assert_eq!(a.failed + b.failed, 0);
    }
    let fired = runs(&store).await;
    let expected: Vec<_> = [20, 40, 60].map(|m| hour + TimeDelta::minutes(m)).into();
    assert_eq!(times(&fired), expected, "each fire time once, whoever fired it");
    let view = one.schedule("etl").await.expect("schedule");
    assert_eq!(view.counts.started, 3);
    assert_eq!(view.counts.missed, 0);
}

async fn catch_up_after_three_hours_fires_the_last_hour_and_counts_the_rest_as_missed<S: Store>(
    store: S,
    clock: Arc<ManualClock>,
) {
    let service = service(store.clone()).await;
    let hour = past_next_hour(&store, &clock).await;
    let mut etl = request("etl", "*/15 * * * *", Overlap::Allow);
    etl.catchup_window = Some(Duration::from_secs(3600));
    service.create_schedule(etl).await.expect("create");
    // No scheduler for three hours.
    advance(&clock, 3, 0);
    let tally = service.fire_schedules().await.expect("fire");
    assert_eq!(
        tally,
        FireTally {
            started: 4,
            missed: 8,
            ..FireTally::default()
        }
    );
    // Inside the window (the last hour), in order: 03:15 … 04:00 past `hour`
    // less one minute; the 8 before it are missed.
    let expected: Vec<_> = [135, 150, 165, 180].map(|m| hour + TimeDelta::minutes(m)).into();
    assert_eq!(times(&runs(&store).await), expected);
    let view = service.schedule("etl").await.expect("schedule");
    assert_eq!((view.counts.started, view.counts.missed), (4, 8));
    // Nothing is fired twice by the next look.
    assert_eq!(service.fire_schedules().await.expect("fire"), FireTally::default());
}

async fn skip_starts_nothing_while_the_previous_run_is_active<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    let hour = past_next_hour(&store, &clock).await;
    service
        .create_schedule(request("etl", "0 * * * *", Overlap::Skip))
        .await
        .expect("create");
    advance(&clock, 1, 0);
    service.fire_schedules().await.expect("fire");
    let first = runs(&store).await;
    assert_eq!(times(&first), vec![hour + TimeDelta::hours(1)]);
    // Nobody runs it: it is still pending at the next fire.
    advance(&clock, 1, 0);
    let tally = service.fire_schedules().await.expect("fire");
    assert_eq!(tally.skipped_overlap, 1);
    assert_eq!(runs(&store).await.len(), 1);
    end(&service, first[0].0).await;
    advance(&clock, 1, 0);
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    assert_eq!(
        times(&runs(&store).await),
        vec![hour + TimeDelta::hours(1), hour + TimeDelta::hours(3)]
    );
    let view = service.schedule("etl").await.expect("schedule");
    assert_eq!((view.counts.started, view.counts.skipped_overlap), (2, 1));
}

async fn buffer_one_keeps_one_fire_until_the_previous_run_ends<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    let hour = past_next_hour(&store, &clock).await;
    service
        .create_schedule(request("etl", "0 * * * *", Overlap::BufferOne))
        .await
        .expect("create");
    advance(&clock, 1, 0);
    service.fire_schedules().await.expect("fire");
    let first = runs(&store).await;
    advance(&clock, 1, 0);
    assert_eq!(service.fire_schedules().await.expect("fire").buffered, 1);
    advance(&clock, 1, 0);
    // One fire already waits: this one is skipped.
    assert_eq!(service.fire_schedules().await.expect("fire").skipped_overlap, 1);
    let view = service.schedule("etl").await.expect("schedule");
    assert_eq!(view.buffered, Some(hour + TimeDelta::hours(2)));
    assert_eq!(runs(&store).await.len(), 1, "the buffered fire waits");
    end(&service, first[0].0).await;
    // The run has ended: the waiting fire starts, as of its own fire time.
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    assert_eq!(
        times(&runs(&store).await),
        vec![hour + TimeDelta::hours(1), hour + TimeDelta::hours(2)]
    );
    let view = service.schedule("etl").await.expect("schedule");
    assert_eq!(view.buffered, None);
    assert_eq!(
        (view.counts.started, view.counts.buffered, view.counts.skipped_overlap),
        (1, 1, 1)
    );
    let fires = store
        .schedule_fires(view.id, hour, hour + TimeDelta::hours(4), 10)
        .await
        .expect("fires");
    assert!(fires[1].run.is_some(), "the buffered fire names the run it started");
}

async fn allow_starts_every_fire<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    let hour = past_next_hour(&store, &clock).await;
    service
        .create_schedule(request("etl", "0 * * * *", Overlap::Allow))
        .await
        .expect("create");
    for _ in 0..2 {
        advance(&clock, 1, 0);
        assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    }
    assert_eq!(
        times(&runs(&store).await),
        vec![hour + TimeDelta::hours(1), hour + TimeDelta::hours(2)]
    );
}

async fn cancel_previous_asks_the_active_run_to_cancel<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    past_next_hour(&store, &clock).await;
    service
        .create_schedule(request("etl", "0 * * * *", Overlap::CancelPrevious))
        .await
        .expect("create");
    advance(&clock, 1, 0);
    service.fire_schedules().await.expect("fire");
    let first = runs(&store).await[0].0;
    advance(&clock, 1, 0);
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    let fired = runs(&store).await;
    assert_eq!(fired.len(), 2);
    assert!(service.summary(first).await.expect("first").cancel_requested);
    assert!(!service.summary(fired[1].0).await.expect("second").cancel_requested);
}

/// 2027-03-14, America/New_York: 02:00 EST becomes 03:00 EDT (07:00 UTC).
async fn spring_forward_fires_a_skipped_time_once_after_the_gap<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    let utc = |d, h, m| Utc.with_ymd_and_hms(2027, 3, d, h, m, 0).single().expect("a time");
    move_to(&store, &clock, utc(14, 5, 0)).await;
    let mut etl = request("etl", "30 2 * * *", Overlap::Allow);
    etl.timezone = Some("America/New_York".to_owned());
    service.create_schedule(etl).await.expect("create");
    move_to(&store, &clock, utc(14, 7, 1)).await;
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    // The next day 02:30 exists again: 06:30 UTC (EDT).
    move_to(&store, &clock, utc(15, 6, 31)).await;
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    assert_eq!(times(&runs(&store).await), vec![utc(14, 7, 0), utc(15, 6, 30)]);
}

/// 2027-11-07, America/New_York: 02:00 EDT becomes 01:00 EST, so 01:30
/// happens at 05:30 and again at 06:30 UTC.
async fn fall_back_fires_a_repeated_time_once<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    let utc = |d, h, m| Utc.with_ymd_and_hms(2027, 11, d, h, m, 0).single().expect("a time");
    move_to(&store, &clock, utc(7, 3, 0)).await;
    let mut etl = request("etl", "30 1 * * *", Overlap::Allow);
    etl.timezone = Some("America/New_York".to_owned());
    service.create_schedule(etl).await.expect("create");
    move_to(&store, &clock, utc(7, 5, 31)).await;
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    move_to(&store, &clock, utc(7, 6, 31)).await;
    assert_eq!(
        service.fire_schedules().await.expect("fire"),
        FireTally::default(),
        "the second 01:30 does not fire"
    );
    move_to(&store, &clock, utc(8, 6, 31)).await;
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    assert_eq!(times(&runs(&store).await), vec![utc(7, 5, 30), utc(8, 6, 30)]);
}

async fn backfill_dry_run_starts_nothing_and_a_real_one_starts_each_time_once<S: Store>(
    store: S,
    clock: Arc<ManualClock>,
) {
    let service = service(store.clone()).await;
    let hour = past_next_hour(&store, &clock).await;
    service
        .create_schedule(request("etl", "0 * * * *", Overlap::Skip))
        .await
        .expect("create");
    let (from, to) = (hour - TimeDelta::hours(3), hour - TimeDelta::hours(1));
    let expected = vec![from, from + TimeDelta::hours(1), to];
    let dry = service.backfill("etl", from, to, true).await.expect("dry run");
    assert_eq!(dry.iter().map(|f| f.at).collect::<Vec<_>>(), expected);
    assert!(dry.iter().all(|f| f.outcome == BackfillOutcome::WouldStart));
    assert!(runs(&store).await.is_empty(), "a dry run starts nothing");
    let real = service.backfill("etl", from, to, false).await.expect("backfill");
    assert!(real.iter().all(|f| matches!(f.outcome, BackfillOutcome::Started(_))));
    // Whatever the overlap policy: all three start at once.
    assert_eq!(times(&runs(&store).await), expected);
    let again = service.backfill("etl", from, to, false).await.expect("again");
    assert!(
        again
            .iter()
            .all(|f| matches!(f.outcome, BackfillOutcome::AlreadyRecorded(_)))
    );
    assert_eq!(runs(&store).await.len(), 3);
    assert_eq!(service.schedule("etl").await.expect("schedule").counts.started, 3);
    let refused = service.backfill("etl", hour - TimeDelta::days(60), hour, false).await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("more than 1000 fire times")),
        "{refused:?}"
    );
}

async fn a_paused_schedule_does_not_fire_and_resumes_from_then<S: Store>(store: S, clock: Arc<ManualClock>) {
    let service = service(store.clone()).await;
    let hour = past_next_hour(&store, &clock).await;
    service
        .create_schedule(request("etl", "0 * * * *", Overlap::Allow))
        .await
        .expect("create");
    service.pause_schedule("etl", true).await.expect("pause");
    advance(&clock, 2, 0);
    assert_eq!(service.fire_schedules().await.expect("fire"), FireTally::default());
    service.pause_schedule("etl", false).await.expect("resume");
    advance(&clock, 1, 0);
    assert_eq!(service.fire_schedules().await.expect("fire").started, 1);
    assert_eq!(times(&runs(&store).await), vec![hour + TimeDelta::hours(3)]);
    let view = service.schedule("etl").await.expect("schedule");
    assert_eq!(view.counts.missed, 0, "a pause's fire times are not missed");
    service.delete_schedule("etl").await.expect("delete");
    assert!(service.schedules().await.expect("list").is_empty());
    assert_eq!(runs(&store).await.len(), 1, "its runs stay");
}
