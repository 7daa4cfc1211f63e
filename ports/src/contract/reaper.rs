//! Contract cases: the reaper: expired leases redispatched, failed or cancelled.

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_domain::{CancelReason, TaskRunState};
use serde_json::json;

use crate::ids::RunId;
use crate::store::{CancelOutcome, RunPass, RunStore, Scope, Topic};

use super::*;

/// An expired lease with attempts left goes back to ready: attempt + 1,
/// token bumped, lease cleared, a new dispatch at the new token.
pub async fn reaping_with_attempts_left_redispatches<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("reap", 3)).await;
    let dispatched_at = view(&s, run, "t").await.token;
    let c = claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    let notifier = s.notifier().await.expect("notifier");
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    let r = &reaped[0];
    assert_eq!(
        (r.task_run_id, r.run_id, r.task_key.as_str()),
        (c.task_run_id, run, "t")
    );
    assert_eq!(r.transition, flowforge_domain::TaskTransition::ReapLease);
    assert!(!r.cancelled);
    assert_eq!(
        (r.attempt, r.token),
        (c.attempt, c.token),
        "the lost attempt and its token"
    );
    let t = view(&s, run, "t").await;
    assert_eq!((t.state, t.attempt), (TaskRunState::Ready, 2));
    assert!(t.token > c.token);
    assert!(t.lease_owner.is_none());
    let d = dispatches_of(&s, run, "t").await;
    assert!(
        d.iter().any(|d| d.fencing_token == t.token),
        "re-dispatched at the new token"
    );
    assert!(
        woke(&notifier, Topic::Publisher).await,
        "a re-dispatch wakes the publisher"
    );
    let last = events_of(&s, run, "t").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.from.as_deref(), last.to.as_deref()),
        ("reap_lease", Some("running"), Some("ready"))
    );
    assert_eq!((last.attempt, last.token), (Some(2), Some(t.token)));

    let old = s
        .claim_task_run(c.task_run_id, dispatched_at, &worker("late"), LONG)
        .await
        .expect("claim");
    assert!(old.is_none(), "the first dispatch is stale now");
    let again = claim(&s, run, "t", "w2", LONG).await;
    assert_eq!(again.attempt, 2);
}

/// An expired lease on the final attempt fails the task for good
/// (`reap_lease_final`), without a dispatch.
pub async fn reaping_the_final_attempt_fails_the_task<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("final", 1)).await;
    let c = claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    drain_flags(&s, run).await;
    let before = unpublished(&s, Scope::Run(run)).await.len();
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLeaseFinal);
    assert!(!reaped[0].cancelled);
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Failed);
    assert_eq!(t.attempt, 1);
    assert!(t.token > c.token);
    assert!(t.lease_owner.is_none() && t.finished_at.is_some());
    assert!(
        t.error.as_deref().is_some_and(|e| e.contains("lease expired")),
        "{:?}",
        t.error
    );
    assert_eq!(unpublished(&s, Scope::Run(run)).await.len(), before, "no dispatch");
    let last = events_of(&s, run, "t").await.pop().expect("an event");
    assert_eq!(
        (last.transition.as_str(), last.to.as_deref()),
        ("reap_lease_final", Some("failed"))
    );
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(flagged.iter().any(|f| f.key == "t" && f.state == TaskRunState::Failed));
}

/// In a cancel-requested run the reaper applies `reap_lease` then
/// `cancel_ready` (reason user) in one transaction, with no dispatch.
pub async fn reaping_a_cancel_requested_run_cancels_without_dispatch<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("cancelreap", 3)).await;
    claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    let before = unpublished(&s, Scope::Run(run)).await.len();
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLease);
    assert!(reaped[0].cancelled);
    let t = view(&s, run, "t").await;
    assert_eq!(t.state, TaskRunState::Cancelled);
    assert_eq!(t.cancel_reason, Some(CancelReason::User));
    assert!(t.finished_at.is_some() && t.lease_owner.is_none());
    assert_eq!(
        unpublished(&s, Scope::Run(run)).await.len(),
        before,
        "nothing dispatched"
    );
    let evs = events_of(&s, run, "t").await;
    assert_eq!(transitions(&evs), ["claim", "reap_lease", "cancel_ready"]);
}

/// The reaper takes only expired leases of running rows in scope, up to
/// its limit.
pub async fn the_reaper_spares_live_finished_and_out_of_scope_leases<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let p = publish(&s, single("spare", 3)).await;
    let live = s.start_run(p.id, json!({})).await.expect("start");
    let done = s.start_run(p.id, json!({})).await.expect("start");
    let other = s.start_run(p.id, json!({})).await.expect("start");
    let third = s.start_run(p.id, json!({})).await.expect("start");
    claim(&s, live, "t", "w", LONG).await;
    let finished = claim(&s, done, "t", "w", Duration::from_secs(10)).await;
    claim(&s, other, "t", "w", Duration::from_secs(10)).await;
    claim(&s, third, "t", "w", Duration::from_secs(10)).await;
    finish(&s, &finished, "w", succeeded(json!({}))).await;
    assert!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").is_empty());

    clock.advance(Duration::from_secs(11));
    let scoped = s.reap_expired_leases(Scope::Run(live), 10).await.expect("reap");
    assert!(scoped.is_empty(), "a live lease is not reaped");
    let limited = s.reap_expired_leases(Scope::All, 1).await.expect("reap");
    assert_eq!(limited.len(), 1, "the limit bounds one call");
    let rest = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(rest.len(), 1);
    let reaped: BTreeSet<RunId> = limited.iter().chain(&rest).map(|r| r.run_id).collect();
    assert_eq!(reaped, BTreeSet::from([other, third]));
    assert_eq!(
        view(&s, done, "t").await.state,
        TaskRunState::Succeeded,
        "finished rows are never touched"
    );
    assert_eq!(view(&s, live, "t").await.state, TaskRunState::Running);
}
