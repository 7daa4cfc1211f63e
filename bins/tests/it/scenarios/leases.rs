//! Leases, the reaper and fencing
//! (docs/design/leases-and-fencing.md#the-reaper,
//! docs/design/leases-and-fencing.md#stale-writes), with store time moved
//! through the Clock port: a stalled worker's lease is reaped and the task runs
//! again; the stalled worker's late finish is rejected as stale and audited; a
//! lease lost on the final attempt fails the task (`reap_lease_final`) and its
//! dependents; a cancel-requested run's expired lease is reaped straight into
//! `cancelled`.

use std::time::Duration;

use flowforge::{HandlerError, Observer, RunState, TaskContext, TaskEvent};
use flowforge_app::worker::Handled;
use flowforge_domain::{CancelReason, TaskRunState, TaskTransition};
use flowforge_ports::store::{LeaseStatus, TaskOutcome};
use flowforge_ports::{Claim, Delivery, FinishResult, RunId, RunStore, WorkerId};
use serde_json::json;

use super::{LONG_LEASE, Log, Scenario, event, history, scenario, task_of, transitions};

/// The stalled worker: it claims through the store and then goes quiet.
fn worker_a() -> WorkerId {
    WorkerId("stalled-worker-a".into())
}

/// Publishes `run`'s first dispatch; worker A receives it, acks it and
/// claims its task run with a long lease.
async fn claimed_by_a(s: &Scenario, run: RunId) -> Claim {
    s.publish(run).await;
    let delivery = s.next_delivery().await.expect("the dispatch");
    let dispatch = delivery.dispatch().clone();
    delivery.ack().await.expect("ack");
    s.engine
        .store()
        .claim_task_run(dispatch.task_run_id, dispatch.fencing_token, &worker_a(), LONG_LEASE)
        .await
        .expect("claim")
        .expect("A wins the claim")
}

#[tokio::test]
async fn a_stalled_workers_late_finish_is_rejected_and_audited() {
    let s = scenario(|b| {
        b.handler_fn("job", |ctx: TaskContext| async move {
            Ok::<_, HandlerError>(json!({ "by": "the live worker", "attempt": ctx.attempt }))
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "stale", "version": 1,
                "tasks": [{"key": "job", "task_type": "job", "retry": {"max_attempts": 2}}]
            }),
            json!({}),
        )
        .await;
    let store = s.engine.store();
    // Worker A receives the dispatch, claims, acks... and stalls.
    let claim_a = claimed_by_a(&s, run).await;
    assert_eq!(claim_a.attempt, 1);

    // Store time passes A's lease: the next pass reaps it.
    s.clock.advance(LONG_LEASE + Duration::from_secs(1));
    let pass = s.schedule(run).await;
    assert_eq!(pass.reaped, 1);
    let reaped = s.task(run, "job").await;
    assert_eq!(
        (reaped.state, reaped.attempt),
        (TaskRunState::Ready, 2),
        "reap_lease: back to ready"
    );
    assert!(reaped.token > claim_a.token);
    assert_eq!(reaped.lease_owner, None);
    assert_eq!(
        store
            .renew_lease(claim_a.task_run_id, claim_a.token, LONG_LEASE)
            .await
            .expect("renew"),
        LeaseStatus::Lost,
        "A's heartbeat would now tell it to stop"
    );

    // The live worker (B) runs the re-dispatched task to success.
    assert_eq!(s.publish(run).await, 1);
    assert_eq!(
        s.work_one().await,
        Some(Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded)))
    );

    // A wakes up and presents its outcome with its old token.
    let late = store
        .finish_task_run(
            claim_a.task_run_id,
            claim_a.token,
            &worker_a(),
            TaskOutcome::Succeeded {
                output: json!({"by": "the stalled worker"}),
            },
        )
        .await
        .expect("finish");
    assert_eq!(late, FinishResult::Stale);
    s.settle(run).await;

    let d = s.detail(run).await;
    let job = task_of(&d, "job");
    assert_eq!(job.state, TaskRunState::Succeeded);
    assert_eq!(
        job.output,
        Some(json!({"by": "the live worker", "attempt": 2})),
        "B's result stands"
    );
    assert_eq!(
        transitions(&d, "job"),
        ["claim", "reap_lease", "claim", "succeed", "stale_write_rejected"]
    );
    let claim_1 = event(&d, "job", "claim", 0);
    let reap = event(&d, "job", "reap_lease", 0);
    let claim_2 = event(&d, "job", "claim", 1);
    let stale = event(&d, "job", "stale_write_rejected", 0);
    assert_eq!(claim_1.worker.as_deref(), Some("stalled-worker-a"));
    assert_eq!(
        reap.worker.as_deref(),
        Some("stalled-worker-a"),
        "the reap names who lost the lease"
    );
    assert_eq!(
        (reap.from.as_deref(), reap.to.as_deref()),
        (Some("running"), Some("ready"))
    );
    assert_ne!(claim_2.worker.as_deref(), Some("stalled-worker-a"));
    assert_eq!(
        stale.token,
        Some(claim_a.token),
        "the audit carries the token A presented"
    );
    assert_eq!(stale.worker.as_deref(), Some("stalled-worker-a"));
    assert_eq!(
        (stale.from.as_deref(), stale.to.as_deref()),
        (None, None),
        "not a transition"
    );
    let (t1, t_reap, t2) = (
        claim_1.token.expect("token"),
        reap.token.expect("token"),
        claim_2.token.expect("token"),
    );
    assert!(t1 < t_reap && t_reap < t2, "tokens only grow: {t1} < {t_reap} < {t2}");
    assert_eq!(d.summary.state, RunState::Succeeded);
}

#[derive(Default)]
struct Failures(Log<(String, u32, Option<String>)>);

impl Observer for Failures {
    fn on_task_failed(&self, e: &TaskEvent) {
        self.0.push((e.task_key.clone(), e.attempt, e.error.clone()));
    }
}

#[tokio::test]
async fn a_lease_lost_on_the_final_attempt_fails_the_task_and_its_dependents() {
    let failures = std::sync::Arc::new(Failures::default());
    let observer: std::sync::Arc<dyn Observer> = failures.clone();
    let s = scenario(|b| b.observer(observer)).await;
    let run = s
        .start(
            json!({
                "name": "reaped-for-good", "version": 1,
                "tasks": [
                    {"key": "doomed", "task_type": "noop"},
                    {"key": "after", "task_type": "noop", "depends_on": ["doomed"]},
                    {"key": "after_after", "task_type": "noop", "depends_on": ["after"]},
                    {"key": "independent", "task_type": "noop"}
                ]
            }),
            json!({}),
        )
        .await;
    let store = s.engine.store();
    let claim_a = claimed_by_a(&s, run).await;
    assert_eq!(claim_a.task_key, "doomed");

    s.clock.advance(LONG_LEASE + Duration::from_secs(1));
    let pass = s.schedule(run).await;
    assert_eq!(pass.reaped, 1);
    let d = s.detail(run).await;
    let t = task_of(&d, "doomed");
    assert_eq!(
        (t.state, t.attempt),
        (TaskRunState::Failed, 1),
        "max_attempts 1: no attempt left"
    );
    assert_eq!(t.error.as_deref(), Some("lease expired on the final attempt"));
    let reap = event(&d, "doomed", TaskTransition::ReapLeaseFinal.as_str(), 0);
    assert_eq!(
        (reap.from.as_deref(), reap.to.as_deref()),
        (Some("running"), Some("failed"))
    );
    assert_eq!(reap.worker.as_deref(), Some("stalled-worker-a"));
    // Its dependents are cancelled in the same scheduler call.
    for key in ["after", "after_after"] {
        let t = task_of(&d, key);
        assert_eq!(
            (t.state, t.cancel_reason),
            (TaskRunState::Cancelled, Some(CancelReason::UpstreamFailed))
        );
    }
    assert_eq!(
        failures.0.entries(),
        [(
            "doomed".to_owned(),
            1,
            Some("lease expired on the final attempt".to_owned())
        )],
        "the failed hook fires for a task reaped for good"
    );

    s.settle(run).await;
    let late = store
        .finish_task_run(
            claim_a.task_run_id,
            claim_a.token,
            &worker_a(),
            TaskOutcome::Succeeded { output: json!({}) },
        )
        .await
        .expect("finish");
    assert_eq!(late, FinishResult::Stale, "A cannot revive the failed task");
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "doomed").state, TaskRunState::Failed);
    assert_eq!(task_of(&d, "independent").state, TaskRunState::Succeeded);
    assert_eq!(d.summary.state, RunState::Failed);
}

#[tokio::test]
async fn an_expired_lease_of_a_cancel_requested_run_is_reaped_into_cancelled_without_a_dispatch() {
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({
                "name": "reap-cancelled", "version": 1,
                "tasks": [{"key": "job", "task_type": "noop", "retry": {"max_attempts": 3}}]
            }),
            json!({}),
        )
        .await;
    let store = s.engine.store();
    claimed_by_a(&s, run).await;
    s.schedule(run).await;
    store.request_cancel(run).await.expect("cancel");
    s.schedule(run).await;
    assert_eq!(s.run_state(run).await, RunState::Running, "A still holds its lease");

    s.clock.advance(LONG_LEASE + Duration::from_secs(1));
    let pass = s.schedule(run).await;
    assert_eq!(pass.reaped, 1);
    assert_eq!(s.publish(run).await, 0, "nothing is dispatched for a cancelled run");
    let d = s.detail(run).await;
    let job = task_of(&d, "job");
    assert_eq!(
        (job.state, job.cancel_reason),
        (TaskRunState::Cancelled, Some(CancelReason::User))
    );
    assert_eq!(
        history(&d, "job"),
        [
            ("claim".into(), Some("ready".into()), Some("running".into()), Some(1)),
            (
                "reap_lease".into(),
                Some("running".into()),
                Some("ready".into()),
                Some(2)
            ),
            (
                "cancel_ready".into(),
                Some("ready".into()),
                Some("cancelled".into()),
                Some(2)
            ),
        ]
    );
    assert_eq!(d.summary.state, RunState::Cancelled);
}
