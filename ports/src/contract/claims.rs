//! Contract cases: starting runs, claiming dispatches and renewing leases.

use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::{RunState, RunTransition, TaskRunState};
use serde_json::json;
use tokio::sync::Barrier;

use crate::clock::Clock;
use crate::ids::{TaskRunId, WorkflowId};
use crate::store::{CancelOutcome, DefinitionStore, LeaseStatus, RunPass, RunStore, Scope, TaskOutcome};

use super::*;

/// A run starts pending with one task run per forward task: the roots ready
/// with one dispatch each at their token, the rest pending, compensators
/// not materialised, no history yet.
pub async fn start_run_materialises_forward_tasks_only<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    let input = json!({"date": "2026-11-29", "rows": [1, 2]});
    let run = s.start_run(p.id, input.clone()).await.expect("start_run");

    let detail = s.get_run(run).await.expect("get_run").expect("exists");
    assert_eq!(detail.summary.id, run);
    assert_eq!(detail.summary.workflow_id, p.id);
    assert_eq!(
        (detail.summary.workflow.as_str(), detail.summary.version),
        ("diamond", 1)
    );
    assert_eq!(detail.summary.state, RunState::Pending);
    assert!(!detail.summary.cancel_requested);
    assert!(detail.summary.started_at.is_none() && detail.summary.finished_at.is_none());
    assert_eq!(detail.fingerprint, p.fingerprint);
    assert_eq!(detail.input, input);
    assert!(detail.events.is_empty(), "creating rows is not a transition");

    let got: Vec<(&str, TaskRunState)> = detail.tasks.iter().map(|t| (t.key.as_str(), t.state)).collect();
    assert_eq!(
        got,
        [
            ("a", TaskRunState::Ready),
            ("b", TaskRunState::Ready),
            ("c", TaskRunState::Pending),
            ("d", TaskRunState::Pending)
        ],
        "forward tasks in creation order; the compensator is not materialised"
    );
    for t in &detail.tasks {
        assert_eq!(t.attempt, 1);
        assert!(t.compensate_for.is_none());
        assert!(t.cancel_reason.is_none() && t.output.is_none() && t.error.is_none());
        assert!(t.started_at.is_none() && t.finished_at.is_none() && t.retry_at.is_none());
        assert!(t.lease_owner.is_none());
    }

    let dispatches = unpublished(&s, Scope::Run(run)).await;
    let got: Vec<(&str, &str)> = dispatches
        .iter()
        .map(|d| (d.task_key.as_str(), d.task_type.as_str()))
        .collect();
    assert_eq!(got, [("a", "noop"), ("b", "echo")], "one dispatch per ready root");
    for d in &dispatches {
        let t = detail.tasks.iter().find(|t| t.key == d.task_key).expect("its task run");
        assert_eq!((d.task_run_id, d.run_id, d.fencing_token), (t.id, run, t.token));
    }
    assert!(s.list_runs(10).await.expect("list_runs").iter().any(|r| r.id == run));
    assert!(
        s.start_run(WorkflowId(i64::MAX), json!({})).await.is_err(),
        "no run of an unknown definition"
    );
}

/// Exactly one of N concurrent claimers of one dispatch wins.
pub async fn claim_wins_exactly_once_among_concurrent_claimers<F: StoreFactory>(factory: &F) {
    const CLAIMERS: usize = 8;
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = view(&s, run, "a").await;
    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let handles: Vec<_> = (0..CLAIMERS)
        .map(|i| {
            let (s, barrier) = (s.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.claim_task_run(a.id, a.token, &worker(&format!("w{i}")), LONG)
                    .await
                    .expect("claim_task_run")
            })
        })
        .collect();
    let mut wins = Vec::new();
    for h in handles {
        wins.extend(h.await.expect("claimer task"));
    }
    assert_eq!(wins.len(), 1, "exactly one claimer wins");
    let won = &wins[0];
    assert!(won.token > a.token, "a claim bumps the token");
    let now = view(&s, run, "a").await;
    assert_eq!(now.state, TaskRunState::Running);
    assert_eq!(now.token, won.token);
    let claims = events_of(&s, run, "a").await;
    assert_eq!(transitions(&claims), ["claim"], "one claim event");
    assert_eq!(now.lease_owner, claims[0].worker);
}

/// A claim matches only a ready row at the dispatch's token in a run
/// without a cancel request.
pub async fn claim_refuses_stale_duplicate_and_cancelled_dispatches<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = view(&s, run, "a").await;
    let w = worker("w");
    let wrong = s.claim_task_run(a.id, a.token + 1, &w, LONG).await.expect("claim");
    assert!(wrong.is_none(), "a token the row is not at claims nothing");
    assert!(
        s.claim_task_run(a.id, a.token, &w, LONG)
            .await
            .expect("claim")
            .is_some()
    );
    let duplicate = s.claim_task_run(a.id, a.token, &w, LONG).await.expect("claim");
    assert!(duplicate.is_none(), "a redelivered dispatch claims nothing");
    let b = view(&s, run, "b").await;
    assert!(
        s.claim_task_run(b.id, b.token, &w, LONG)
            .await
            .expect("claim")
            .is_none(),
        "a pending row is not claimable"
    );
    assert!(
        s.claim_task_run(TaskRunId(i64::MAX), 0, &w, LONG)
            .await
            .expect("claim")
            .is_none(),
        "an unknown row claims nothing"
    );

    let other = s
        .start_run(
            s.find_definition("chain", 1).await.expect("find").expect("stored").id,
            json!({}),
        )
        .await
        .expect("start_run");
    assert_eq!(
        s.request_cancel(other).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    let ready = view(&s, other, "a").await;
    assert!(
        s.claim_task_run(ready.id, ready.token, &w, LONG)
            .await
            .expect("claim")
            .is_none(),
        "a claim never succeeds for a cancel-requested run"
    );
    assert_eq!(view(&s, other, "a").await.state, TaskRunState::Ready);
}

/// A claim's lease ends at store now + lease; `started_at` is set by the
/// first claim; the first start of a pending run flags it for a pass.
pub async fn claim_takes_a_lease_in_store_time_and_flags_the_first_start<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    clock.advance(Duration::from_secs(86_400));
    let run = start(&s, chain()).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );

    let c = claim(&s, run, "a", "w1", LONG).await;
    assert_eq!((c.run_id, c.task_key.as_str(), c.attempt), (run, "a", 1));
    assert!(c.compensate_for.is_none());
    let p = s.find_definition("chain", 1).await.expect("find").expect("stored");
    assert_eq!(c.workflow_id, p.id);
    let claimed = events_of(&s, run, "a").await;
    let at = claimed[0].at;
    assert_store_time(at, clock.offset());
    near(millis(c.lease_expires_at, at), 300_000, "lease end - claim time");
    let a = view(&s, run, "a").await;
    near(
        millis(a.started_at.expect("started_at"), at),
        0,
        "started_at is the claim's store time",
    );
    assert_eq!(a.lease_owner.as_deref(), Some("w1"));

    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state),
        ("a", TaskRunState::Running)
    );
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    p.commit().await.expect("commit");

    // A later first start in a running run needs no pass.
    finish(&s, &c, "w1", succeeded(json!({}))).await;
    drain_flags(&s, run).await;
    let mut p = pass(&s, run).await;
    p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    claim(&s, run, "b", "w1", LONG).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
}

/// A heartbeat extends the lease while the token holds it, reports a cancel
/// request, and reports `Lost` once the token moved on.
pub async fn renew_lease_extends_reports_cancel_and_detects_loss<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    clock.advance(Duration::from_secs(100));
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token, LONG).await.expect("renew"),
        LeaseStatus::Held {
            cancel_requested: false
        }
    );
    let deadline = s
        .next_deadline(Scope::Run(run))
        .await
        .expect("deadline")
        .expect("a lease");
    near(
        i64::try_from(deadline.as_millis()).unwrap_or(i64::MAX),
        300_000,
        "the renewed lease",
    );
    // Past the original lease, within the renewed one: nothing to reap.
    clock.advance(Duration::from_secs(250));
    assert!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").is_empty());

    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token, LONG).await.expect("renew"),
        LeaseStatus::Held { cancel_requested: true }
    );
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token + 1, LONG).await.expect("renew"),
        LeaseStatus::Lost,
        "another token never holds the lease"
    );
    finish(&s, &c, "w", TaskOutcome::Cancelled).await;
    assert_eq!(
        s.renew_lease(c.task_run_id, c.token, LONG).await.expect("renew"),
        LeaseStatus::Lost,
        "a finished row has no lease"
    );
}
