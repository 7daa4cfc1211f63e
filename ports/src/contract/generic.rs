//! Contract cases: the generic transition path (docs/design/state-machines.md#caller-contract): illegal edges refused before any I/O, lost races reported as such.

use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::{CancelReason, TaskRunState};
use serde_json::json;
use tokio::sync::Barrier;

use crate::ids::TaskRunId;
use crate::store::{FinishResult, RunStore, TaskOutcome, TransitionError};

use super::*;

/// An edge not in the machine is `Illegal`, a lease-spending edge is
/// `LeaseRequired`, a reserved edge is `Reserved` — identically whether or
/// not the row exists, so before any I/O.
pub async fn illegal_transitions_fail_before_any_io<F: StoreFactory>(factory: &F) {
    use TaskRunState::*;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let real = view(&s, run, "a").await;
    let ghost = TaskRunId(i64::MAX);
    for (from, to) in [
        (Succeeded, Pending),
        (Pending, Running),
        (Cancelled, Ready),
        (Ready, Ready),
        (Retrying, Failed),
        (Succeeded, Failed),
    ] {
        let expected = TransitionError::Illegal { from, to };
        assert_eq!(s.transition_task_run(ghost, from, to).await, Err(expected.clone()));
        assert_eq!(s.transition_task_run(real.id, from, to).await, Err(expected));
    }
    for (from, to, edge) in [
        (Running, Succeeded, flowforge_domain::TaskTransition::Succeed),
        (Running, Failed, flowforge_domain::TaskTransition::Fail),
        (Running, Cancelled, flowforge_domain::TaskTransition::CancelRunning),
    ] {
        let got = s.transition_task_run(ghost, from, to).await;
        assert_eq!(got, Err(TransitionError::LeaseRequired(edge)));
        let message = got.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("finish_task_run"), "{message}");
    }
    for (from, to, edge, operation) in [
        (Ready, Running, flowforge_domain::TaskTransition::Claim, "claim"),
        (Running, Ready, flowforge_domain::TaskTransition::ReapLease, "reap"),
        (
            Failed,
            Retrying,
            flowforge_domain::TaskTransition::ScheduleRetry,
            "finish",
        ),
        (
            Pending,
            Succeeded,
            flowforge_domain::TaskTransition::Collect,
            "collect_map",
        ),
    ] {
        match s.transition_task_run(ghost, from, to).await {
            Err(TransitionError::Reserved {
                transition,
                operation: op,
            }) => {
                assert_eq!(transition, edge);
                assert!(op.contains(operation), "{op}");
            }
            other => panic!("{from} -> {to} must be reserved, got {other:?}"),
        }
    }
    assert_eq!(view(&s, run, "a").await, real, "nothing changed");
    assert!(events(&s, run).await.is_empty());
}

/// A legal edge another writer beat is `Ok(false)`, not an error; of N
/// concurrent callers exactly one wins.
pub async fn a_lost_race_is_false_not_an_error<F: StoreFactory>(factory: &F) {
    const RACERS: usize = 6;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = view(&s, run, "a").await;
    assert_eq!(
        s.transition_task_run(a.id, TaskRunState::Pending, TaskRunState::Ready)
            .await,
        Ok(false),
        "a is already ready"
    );
    assert_eq!(
        s.transition_task_run(TaskRunId(i64::MAX), TaskRunState::Pending, TaskRunState::Ready)
            .await,
        Ok(false),
        "no row matched"
    );
    let barrier = Arc::new(Barrier::new(RACERS));
    let handles: Vec<_> = (0..RACERS)
        .map(|_| {
            let (s, barrier) = (s.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.transition_task_run(a.id, TaskRunState::Ready, TaskRunState::Cancelled)
                    .await
            })
        })
        .collect();
    let mut won = 0;
    for h in handles {
        won += usize::from(h.await.expect("racer task").expect("a legal edge"));
    }
    assert_eq!(won, 1, "exactly one cancel wins");
    assert_eq!(
        transitions(&events_of(&s, run, "a").await),
        ["cancel_ready"],
        "one event for one change"
    );
}

/// The generic edges write what they need: `dependencies_satisfied` and
/// `retry_ready` a dispatch, the cancels reason `user` and `finished_at`.
pub async fn generic_transitions_record_events_and_dispatch<F: StoreFactory>(factory: &F) {
    use TaskRunState::*;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let b = view(&s, run, "b").await;
    assert_eq!(s.transition_task_run(b.id, Pending, Ready).await, Ok(true));
    let b = view(&s, run, "b").await;
    assert_eq!(b.state, Ready);
    assert!(
        dispatches_of(&s, run, "b")
            .await
            .iter()
            .any(|d| d.fencing_token == b.token)
    );
    let ev = events_of(&s, run, "b").await;
    assert_eq!(
        (ev[0].transition.as_str(), ev[0].from.as_deref(), ev[0].to.as_deref()),
        ("dependencies_satisfied", Some("pending"), Some("ready"))
    );
    claim(&s, run, "b", "w", LONG).await;

    let c = view(&s, run, "c").await;
    assert_eq!(s.transition_task_run(c.id, Pending, Cancelled).await, Ok(true));
    let c = view(&s, run, "c").await;
    assert_eq!((c.state, c.cancel_reason), (Cancelled, Some(CancelReason::User)));
    assert!(c.finished_at.is_some());
    assert_eq!(transitions(&events_of(&s, run, "c").await), ["cancel_pending"]);

    let a = view(&s, run, "a").await;
    assert_eq!(s.transition_task_run(a.id, Ready, Cancelled).await, Ok(true));
    assert_eq!(view(&s, run, "a").await.cancel_reason, Some(CancelReason::User));
    assert_eq!(transitions(&events_of(&s, run, "a").await), ["cancel_ready"]);

    let retry = json!({"name": "two", "version": 1, "tasks": [
        {"key": "x", "task_type": "flaky", "retry": {"max_attempts": 3}},
        {"key": "y", "task_type": "flaky", "retry": {"max_attempts": 3}}
    ]});
    let run = start(&s, retry).await;
    for key in ["x", "y"] {
        let c = claim(&s, run, key, "w", LONG).await;
        let outcome = TaskOutcome::Failed {
            error: "again".into(),
            retry_in: Some(Duration::from_secs(3_600)),
        };
        assert_eq!(finish(&s, &c, "w", outcome).await, FinishResult::Recorded(Retrying));
    }
    let x = view(&s, run, "x").await;
    assert_eq!(s.transition_task_run(x.id, Retrying, Ready).await, Ok(true));
    let x = view(&s, run, "x").await;
    assert_eq!((x.state, x.retry_at), (Ready, None));
    assert!(
        dispatches_of(&s, run, "x")
            .await
            .iter()
            .any(|d| d.fencing_token == x.token)
    );
    assert_eq!(
        transitions(&events_of(&s, run, "x").await).last().copied(),
        Some("retry_ready")
    );
    let y = view(&s, run, "y").await;
    assert_eq!(s.transition_task_run(y.id, Retrying, Cancelled).await, Ok(true));
    let y = view(&s, run, "y").await;
    assert_eq!(
        (y.state, y.cancel_reason, y.retry_at),
        (Cancelled, Some(CancelReason::User), None)
    );
    assert!(y.finished_at.is_some());
    assert_eq!(
        transitions(&events_of(&s, run, "y").await).last().copied(),
        Some("cancel_retrying")
    );
}
