//! Contract cases: schedules (docs/design/schedules.md#the-store): each
//! fire time recorded once and starting at most one run whoever races, the
//! overlap decision taken under the store's lock, buffered fires, backfills
//! and pauses.

use std::sync::Arc;

use chrono::TimeDelta;
use flowforge_domain::RunTransition;
use flowforge_domain::schedule::{FireOutcome, Overlap};
use serde_json::json;
use tokio::sync::Barrier;

use crate::store::{Fire, FireStart, Fired, NewSchedule, RunPass, RunStore, ScheduleStore, ScheduleView, StartOptions};

use super::*;

/// A schedule `name` of the published workflow `nightly`, created now.
async fn schedule<S: Store>(s: &S, name: &str, overlap: Overlap) -> (ScheduleView, FireStart) {
    let published = publish(
        s,
        json!({"name": "nightly", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
    )
    .await;
    let view = s
        .create_schedule(&NewSchedule {
            name: name.to_owned(),
            workflow: "nightly".to_owned(),
            version: Some(1),
            cron: "0 * * * *".to_owned(),
            timezone: "UTC".to_owned(),
            input: json!({}),
            overlap,
            catchup_window: Duration::from_secs(3600),
        })
        .await
        .expect("create")
        .expect("a new name");
    let start = FireStart {
        workflow: published.id,
        input: json!({"n": 1}),
        options: StartOptions::default(),
    };
    (view, start)
}

fn due<'a>(view: &ScheduleView, hours: i64, start: &'a FireStart) -> Fire<'a> {
    Fire {
        schedule: view.id,
        missed: &[],
        due: Some((view.cursor + TimeDelta::hours(hours), start)),
    }
}

/// Two callers firing the same fire time at once: one records it and
/// starts its run, the other finds it handled; a name is unique.
pub async fn racing_fires_record_a_fire_time_once<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (view, start) = schedule(&s, "race", Overlap::Allow).await;
    assert!(
        s.create_schedule(&view.spec).await.expect("create again").is_none(),
        "a taken name creates nothing"
    );
    let barrier = Arc::new(Barrier::new(2));
    let fire = |s: F::Store, barrier: Arc<Barrier>, view: ScheduleView, start: FireStart| async move {
        barrier.wait().await;
        s.fire_schedule(&due(&view, 1, &start)).await.expect("fire")
    };
    let (a, b) = tokio::join!(
        tokio::spawn(fire(s.clone(), barrier.clone(), view.clone(), start.clone())),
        tokio::spawn(fire(s.clone(), barrier, view.clone(), start.clone())),
    );
    let mut results = [a.expect("join"), b.expect("join")];
    results.sort_by_key(|r| matches!(r, Fired::Handled));
    assert!(
        matches!(
            &results[0],
            Fired::Recorded {
                outcome: Some(FireOutcome::Started),
                run: Some(_),
                ..
            }
        ),
        "{results:?}"
    );
    assert_eq!(results[1], Fired::Handled);
    assert_eq!(s.list_runs(10).await.expect("runs").len(), 1);
    let after = s.get_schedule("race").await.expect("get").expect("exists");
    assert_eq!(after.cursor, view.cursor + TimeDelta::hours(1));
    assert_eq!(after.counts.started, 1);
}

/// The store decides a due fire from what it holds: a pending run of the
/// schedule makes `skip` skip and `buffer_one` buffer (once; a second
/// fire is skipped while one waits); a buffered fire starts once nothing
/// is active, keeping its outcome and naming its run.
pub async fn overlap_is_decided_under_the_lock_and_a_buffered_fire_starts_later<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (view, start) = schedule(&s, "buffered", Overlap::BufferOne).await;
    let Fired::Recorded { run: Some(first), .. } = s.fire_schedule(&due(&view, 1, &start)).await.expect("fire 1")
    else {
        panic!("the first fire starts a run");
    };
    let second = s.fire_schedule(&due(&view, 2, &start)).await.expect("fire 2");
    assert!(matches!(
        second,
        Fired::Recorded {
            outcome: Some(FireOutcome::Buffered),
            run: None,
            ..
        }
    ));
    let third = s.fire_schedule(&due(&view, 3, &start)).await.expect("fire 3");
    assert!(matches!(
        third,
        Fired::Recorded {
            outcome: Some(FireOutcome::SkippedOverlap),
            ..
        }
    ));
    let at = view.cursor + TimeDelta::hours(2);
    assert_eq!(
        s.start_buffered(view.id, at, &start).await.expect("buffered"),
        None,
        "the first run is still pending"
    );
    // End the first run as a cancelling pass does.
    let mut p = pass(&s, first).await;
    p.cancel_waiting().await.expect("cancel waiting");
    assert!(
        p.transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel run")
    );
    p.commit().await.expect("commit");
    assert_eq!(
        s.start_buffered(view.id, at - TimeDelta::hours(1), &start)
            .await
            .expect("other time"),
        None,
        "only the waiting fire time starts"
    );
    let run = s
        .start_buffered(view.id, at, &start)
        .await
        .expect("buffered")
        .expect("starts");
    let got = s.get_schedule("buffered").await.expect("get").expect("exists");
    assert_eq!(got.buffered, None);
    assert_eq!(
        (got.counts.started, got.counts.buffered, got.counts.skipped_overlap),
        (1, 1, 1)
    );
    let fires = s
        .schedule_fires(view.id, view.cursor, view.cursor + TimeDelta::hours(3), 10)
        .await
        .expect("fires");
    let outcomes: Vec<_> = fires.iter().map(|f| (f.outcome, f.run)).collect();
    assert_eq!(
        outcomes,
        [
            (FireOutcome::Started, Some(first)),
            (FireOutcome::Buffered, Some(run)),
            (FireOutcome::SkippedOverlap, None)
        ]
    );
    assert_eq!(
        s.start_buffered(view.id, at, &start).await.expect("again"),
        None,
        "a buffered fire starts once"
    );
}

/// Missed times are recorded once each with the cursor moved past them;
/// a call for times at or before the cursor writes nothing; a paused
/// schedule fires nothing; resuming moves the cursor to store now.
pub async fn missed_times_pauses_and_resumes_move_the_cursor_as_told<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let (view, start) = schedule(&s, "cursor", Overlap::Skip).await;
    let missed = [view.cursor + TimeDelta::hours(1), view.cursor + TimeDelta::hours(2)];
    let fired = s
        .fire_schedule(&Fire {
            schedule: view.id,
            missed: &missed,
            due: None,
        })
        .await
        .expect("missed");
    assert_eq!(
        fired,
        Fired::Recorded {
            outcome: None,
            run: None,
            missed: 2,
            cancelled: 0
        }
    );
    assert_eq!(
        s.fire_schedule(&due(&view, 2, &start)).await.expect("again"),
        Fired::Handled,
        "the cursor is past it"
    );
    let got = s.get_schedule("cursor").await.expect("get").expect("exists");
    assert_eq!((got.cursor, got.counts.missed), (missed[1], 2));
    s.set_schedule_paused("cursor", true)
        .await
        .expect("pause")
        .expect("exists");
    assert_eq!(
        s.fire_schedule(&due(&got, 1, &start)).await.expect("paused"),
        Fired::Inactive
    );
    clock.advance(Duration::from_secs(10 * 3600));
    let resumed = s
        .set_schedule_paused("cursor", false)
        .await
        .expect("resume")
        .expect("exists");
    let now = s.store_now().await.expect("now");
    assert!(
        resumed.cursor > missed[1] && resumed.cursor <= now,
        "resumed from store now"
    );
    assert!(s.list_runs(10).await.expect("runs").is_empty());
    assert!(s.delete_schedule("cursor").await.expect("delete"));
    assert!(!s.delete_schedule("cursor").await.expect("delete again"));
    assert_eq!(
        s.fire_schedule(&due(&resumed, 1, &start)).await.expect("deleted"),
        Fired::Inactive
    );
}

/// A backfill starts a fire time's run once, whatever the overlap policy
/// and without moving the cursor; a fire time already recorded starts
/// nothing.
pub async fn a_backfill_starts_each_fire_time_once<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (view, start) = schedule(&s, "backfill", Overlap::Skip).await;
    let earlier = view.cursor - TimeDelta::hours(5);
    let first = s.backfill_fire(view.id, earlier, &start).await.expect("backfill");
    assert!(first.is_some());
    let second = s
        .backfill_fire(view.id, earlier + TimeDelta::hours(1), &start)
        .await
        .expect("backfill while the first is pending");
    assert!(second.is_some(), "a backfill ignores the overlap policy");
    assert_eq!(s.backfill_fire(view.id, earlier, &start).await.expect("again"), None);
    assert_eq!(
        s.backfill_fire(view.id, view.cursor + TimeDelta::hours(1), &start)
            .await
            .expect("ahead"),
        None,
        "a time after the cursor is the scheduler's"
    );
    let got = s.get_schedule("backfill").await.expect("get").expect("exists");
    assert_eq!((got.cursor, got.counts.started), (view.cursor, 2));
    let fires = s
        .schedule_fires(view.id, earlier, view.cursor, 10)
        .await
        .expect("fires");
    assert_eq!(fires.len(), 2);
    assert!(fires.iter().all(|f| f.backfill && f.outcome == FireOutcome::Started));
    assert_eq!(s.list_runs(10).await.expect("runs").len(), 2);
}
