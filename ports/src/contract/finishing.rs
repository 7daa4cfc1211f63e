//! Contract cases: finishing attempts: outcomes, retries, stale finishes and fencing.

use std::time::Duration;

use flowforge_domain::{CancelReason, TaskRunState};
use serde_json::json;

use crate::clock::Clock;
use crate::store::{FinishResult, RunPass, RunStore, Scope, TaskOutcome};

use super::*;

/// `succeed` stores the output, clears the lease, sets `finished_at`,
/// records the event and flags the run.
pub async fn finish_succeeded_stores_the_output<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    drain_flags(&s, run).await;
    let output = json!({"rows": 3, "nested": {"ok": true}});
    assert_eq!(
        finish(&s, &c, "w", succeeded(output.clone())).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    let a = view(&s, run, "a").await;
    assert_eq!(a.state, TaskRunState::Succeeded);
    assert_eq!(a.output, Some(output));
    assert!(a.lease_owner.is_none());
    assert!(a.finished_at.is_some());
    assert_eq!(a.token, c.token, "finishing does not move the token");
    let last = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(last.transition, "succeed");
    assert_eq!(
        (last.from.as_deref(), last.to.as_deref()),
        (Some("running"), Some("succeeded"))
    );
    assert_eq!(
        (last.attempt, last.token, last.worker.as_deref()),
        (Some(1), Some(c.token), Some("w"))
    );

    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state),
        ("a", TaskRunState::Succeeded)
    );
}

/// `fail` without a retry rests in failed for good, keeping the error.
pub async fn finish_failed_without_retry_fails_for_good<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    let outcome = failed_for_good("exit code 3");
    assert_eq!(
        finish(&s, &c, "w", outcome).await,
        FinishResult::Recorded(TaskRunState::Failed)
    );
    let a = view(&s, run, "a").await;
    assert_eq!(a.state, TaskRunState::Failed);
    assert_eq!(a.error.as_deref(), Some("exit code 3"));
    assert!(a.lease_owner.is_none() && a.finished_at.is_some() && a.retry_at.is_none());
    assert!(a.output.is_none());
    let last = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.to.as_deref(), last.error.as_deref()),
        ("fail", Some("failed"), Some("exit code 3"))
    );
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(flagged.iter().any(|t| t.key == "a" && t.state == TaskRunState::Failed));
}

/// A failure with attempts left moves to retrying in the same transaction
/// (`fail` + `schedule_retry`): attempt + 1, `retry_at` = store now + delay,
/// lease and `finished_at` cleared, error kept; it is due only once store
/// time reaches `retry_at`, and `promote_due_retries` re-dispatches it. The
/// error stays the last error after a later success.
pub async fn finish_failed_with_retry_schedules_it_in_store_time<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    clock.advance(Duration::from_secs(86_400));
    let run = start(&s, single("retry", 3)).await;
    let c = claim(&s, run, "t", "w", LONG).await;
    let first_start = view(&s, run, "t").await.started_at;
    let outcome = TaskOutcome::Failed {
        error: "boom".into(),
        retry_in: Some(Duration::from_secs(10)),
    };
    assert_eq!(
        finish(&s, &c, "w", outcome).await,
        FinishResult::Recorded(TaskRunState::Retrying)
    );
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Retrying);
    assert_eq!(t.attempt, 2);
    assert_eq!(t.error.as_deref(), Some("boom"));
    assert!(t.lease_owner.is_none() && t.finished_at.is_none());
    let evs = events_of(&s, run, "t").await;
    assert_eq!(transitions(&evs), ["claim", "fail", "schedule_retry"]);
    assert_eq!((evs[1].attempt, evs[1].to.as_deref()), (Some(1), Some("failed")));
    assert_eq!(evs[1].error.as_deref(), Some("boom"));
    assert_eq!(
        (evs[2].from.as_deref(), evs[2].to.as_deref(), evs[2].attempt),
        (Some("failed"), Some("retrying"), Some(2))
    );
    assert_eq!((evs[1].token, evs[2].token), (Some(c.token), Some(c.token)));
    let scheduled = evs[2].at;
    assert_store_time(scheduled, clock.offset());
    near(
        millis(t.retry_at.expect("retry_at"), scheduled),
        10_000,
        "retry_at - store now",
    );

    drain_flags(&s, run).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty(),
        "a retry is not due before its time"
    );
    let wait = s.next_deadline(Scope::All).await.expect("deadline").expect("the retry");
    assert!(
        wait <= Duration::from_secs(10) && wait >= Duration::from_secs(7),
        "{wait:?}"
    );
    let mut p = pass(&s, run).await;
    assert!(
        p.promote_due_retries().await.expect("promote").is_empty(),
        "not yet due"
    );
    drop(p);

    clock.advance(Duration::from_secs(11));
    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);
    assert_eq!(
        s.next_deadline(Scope::All).await.expect("deadline"),
        Some(Duration::ZERO)
    );
    let mut p = pass(&s, run).await;
    assert_eq!(p.promote_due_retries().await.expect("promote"), ["t"]);
    p.commit().await.expect("commit");
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Ready);
    assert!(t.retry_at.is_none());
    let d = dispatches_of(&s, run, "t").await;
    assert!(
        d.iter().any(|d| d.fencing_token == t.token),
        "the retry is dispatched at its token"
    );
    assert_eq!(
        transitions(&events_of(&s, run, "t").await).last().copied(),
        Some("retry_ready")
    );
    let again = claim(&s, run, "t", "w", LONG).await;
    assert_eq!(again.attempt, 2);
    assert!(again.token > c.token);
    assert_eq!(view(&s, run, "t").await.started_at, first_start, "started_at is kept");
    finish(&s, &again, "w", succeeded(json!({}))).await;
    assert_eq!(
        view(&s, run, "t").await.error.as_deref(),
        Some("boom"),
        "a success keeps the last error"
    );
}

/// `cancel_running` (a worker stopping on a cancel request) records the
/// reason `user`.
pub async fn finish_cancelled_records_the_user_reason<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    assert_eq!(
        finish(&s, &c, "w", TaskOutcome::Cancelled).await,
        FinishResult::Recorded(TaskRunState::Cancelled)
    );
    let a = view(&s, run, "a").await;
    assert_eq!(a.state, TaskRunState::Cancelled);
    assert_eq!(a.cancel_reason, Some(CancelReason::User));
    assert!(a.finished_at.is_some() && a.lease_owner.is_none());
    let last = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.from.as_deref(), last.to.as_deref()),
        ("cancel_running", Some("running"), Some("cancelled"))
    );
}

/// A finish with a token that no longer holds the lease changes nothing
/// and leaves a `stale_write_rejected` event with the presented token.
pub async fn a_stale_finish_changes_nothing_and_is_audited<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    let before = view(&s, run, "a").await;
    let stale = c.token + 1;
    let result = s
        .finish_task_run(c.task_run_id, stale, &worker("intruder"), succeeded(json!({"x": 1})))
        .await
        .expect("finish");
    assert_eq!(result, FinishResult::Stale);
    assert_eq!(view(&s, run, "a").await, before, "nothing changed");
    let audit = events_of(&s, run, "a").await.pop().expect("an event");
    assert_eq!(audit.transition, "stale_write_rejected");
    assert_eq!((audit.from.as_deref(), audit.to.as_deref()), (None, None));
    assert_eq!((audit.token, audit.worker.as_deref()), (Some(stale), Some("intruder")));

    // A finished row rejects a second finish with its own token too.
    finish(&s, &c, "w", succeeded(json!({"first": true}))).await;
    let second = finish(&s, &c, "w", succeeded(json!({"second": true}))).await;
    assert_eq!(second, FinishResult::Stale);
    assert_eq!(view(&s, run, "a").await.output, Some(json!({"first": true})));
}

/// A stale finish promotes nothing: it flags nothing, so no pass lowers a
/// dependent's counter or writes its dispatch, before or after the real
/// finish (which promotes the dependent exactly once).
pub async fn a_stale_finish_promotes_nothing<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    drain_flags(&s, run).await;
    let stale = s
        .finish_task_run(c.task_run_id, c.token + 1, &worker("intruder"), succeeded(json!({})))
        .await
        .expect("finish");
    assert_eq!(stale, FinishResult::Stale);
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    let mut p = pass(&s, run).await;
    assert!(
        p.take_flagged().await.expect("take_flagged").is_empty(),
        "a stale finish flags nothing"
    );
    p.commit().await.expect("commit");
    assert_eq!(view(&s, run, "b").await.state, TaskRunState::Pending);
    assert!(dispatches_of(&s, run, "b").await.is_empty());

    finish(&s, &c, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        p.satisfy_dependencies(&[("b".to_owned(), 1)]).await.expect("satisfy"),
        ["b"]
    );
    p.commit().await.expect("commit");
    let late = finish(&s, &c, "w", succeeded(json!({"late": true}))).await;
    assert_eq!(late, FinishResult::Stale);
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(dispatches_of(&s, run, "b").await.len(), 1, "b is dispatched once");
}

/// Spec 000's fencing sequence: A claims, its lease expires, the reaper
/// takes it back, B claims; A's late finish is stale, B's is recorded.
pub async fn fencing_rejects_a_worker_whose_lease_was_reaped<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("fence", 2)).await;
    let a = claim(&s, run, "t", "A", Duration::from_secs(10)).await;
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    let b = claim(&s, run, "t", "B", LONG).await;
    assert!(b.token > a.token);
    assert_eq!(
        finish(&s, &a, "A", succeeded(json!({"by": "A"}))).await,
        FinishResult::Stale
    );
    assert_eq!(
        finish(&s, &b, "B", succeeded(json!({"by": "B"}))).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    assert_eq!(view(&s, run, "t").await.output, Some(json!({"by": "B"})));
    let evs = events_of(&s, run, "t").await;
    assert_eq!(
        transitions(&evs),
        ["claim", "reap_lease", "claim", "stale_write_rejected", "succeed"]
    );
    let tokens: Vec<i64> = evs.iter().map(|e| e.token.expect("a token")).collect();
    assert_eq!(tokens[0], a.token);
    assert!(tokens[1] > tokens[0] && tokens[2] > tokens[1], "{tokens:?}");
    assert_eq!(tokens[2], b.token);
    assert_eq!((tokens[3], evs[3].worker.as_deref()), (a.token, Some("A")));
    assert_eq!((tokens[4], evs[4].worker.as_deref()), (b.token, Some("B")));
}

/// The lease rule at the finish (docs/design/leases-and-fencing.md#the-reaper):
/// a lease that expired but was not yet reaped still finishes, because the
/// token alone decides. The reaper's own conditional UPDATE re-checks the
/// state and token, so the finish and the reap cannot both win: whichever
/// commits first makes the other change nothing.
pub async fn an_expired_lease_not_yet_reaped_still_finishes_and_the_reaper_then_spares_it<F: StoreFactory>(
    factory: &F,
) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("late", 2)).await;
    let a = claim(&s, run, "t", "A", Duration::from_secs(10)).await;
    clock.advance(Duration::from_secs(11));
    assert_eq!(
        finish(&s, &a, "A", succeeded(json!({"by": "A"}))).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert!(reaped.is_empty(), "a finished task is not reaped: {reaped:?}");
    assert_eq!(view(&s, run, "t").await.output, Some(json!({"by": "A"})));
    assert_eq!(transitions(&events_of(&s, run, "t").await), ["claim", "succeed"]);
}
