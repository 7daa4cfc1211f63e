//! Retries (docs/design/state-machines.md#attempts-and-retries): a failed
//! attempt with attempts left moves failed → retrying in the same transaction,
//! with `retry_at = store now + min(delay × backoff^(k−1), max_delay)`; the
//! scheduler makes it ready only when store time reaches it; exhausted retries
//! fail the task for good; permanent failures and panics are handled as the
//! design says.

use std::time::Duration;

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::{CancelReason, TaskRunState};
use flowforge_ports::FinishResult;
use serde_json::json;

use super::{Counter, delta, event, ms_between, scenario, task_of, transitions};

#[tokio::test]
async fn retries_back_off_exponentially_in_store_time_up_to_the_cap() {
    let calls = Counter::default();
    let counter = calls.clone();
    let s = scenario(move |b| {
        b.handler_fn("flaky", move |ctx: TaskContext| {
            counter.hit();
            async move {
                if ctx.attempt < 4 {
                    Err(HandlerError::retryable(format!("flaky attempt {}", ctx.attempt)))
                } else {
                    Ok(json!({ "attempts": ctx.attempt }))
                }
            }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "backoff", "version": 1,
                "tasks": [
                    {"key": "flaky", "task_type": "flaky",
                     "retry": {"max_attempts": 4, "delay_seconds": 10, "backoff": 3, "max_delay_seconds": 60}},
                    {"key": "after", "task_type": "echo", "depends_on": ["flaky"]}
                ]
            }),
            json!({}),
        )
        .await;
    s.publish(run).await;

    // delay × backoff^(k−1) = 10 s, 30 s, then 90 s capped at 60 s.
    let delays = [10u64, 30, 60].map(Duration::from_secs);
    for (i, delay) in delays.into_iter().enumerate() {
        let k = i as u32 + 1;
        assert_eq!(
            s.work_one().await,
            Some(Handled::Finished(FinishResult::Recorded(TaskRunState::Retrying))),
            "attempt {k}"
        );
        let d = s.detail(run).await;
        let flaky = task_of(&d, "flaky");
        assert_eq!(flaky.state, TaskRunState::Retrying);
        assert_eq!(flaky.attempt, k + 1, "the row counts the next attempt");
        assert_eq!(flaky.error.as_deref(), Some(format!("flaky attempt {k}").as_str()));
        let retry_at = flaky.retry_at.expect("a retrying row has retry_at");
        let claim = event(&d, "flaky", "claim", i);
        let fail = event(&d, "flaky", "fail", i);
        let scheduled = event(&d, "flaky", "schedule_retry", i);
        assert_eq!((fail.attempt, scheduled.attempt), (Some(k), Some(k + 1)));
        assert_eq!(fail.error.as_deref(), Some(format!("flaky attempt {k}").as_str()));
        // retry_at = (store time of the failure) + the policy's delay. The
        // failure happened after the claim and is recorded by the
        // `schedule_retry` event of the same transaction (SQLite keeps
        // milliseconds), so retry_at − delay lies in [claim, event + 1 ms].
        let failed_at = retry_at - delta(delay);
        assert!(
            claim.at <= failed_at && ms_between(scheduled.at, failed_at) <= 1,
            "attempt {k}: retry_at {retry_at} is not the failure time + {delay:?} \
             (claim at {}, schedule_retry at {})",
            claim.at,
            scheduled.at
        );

        // Not due a little before retry_at: nothing is dispatched.
        s.clock.advance(delay - Duration::from_secs(5));
        s.schedule(run).await;
        assert_eq!(s.task(run, "flaky").await.state, TaskRunState::Retrying, "attempt {k}");
        assert_eq!(s.publish(run).await, 0);
        // Due once store time reaches it.
        s.clock.advance(Duration::from_secs(5));
        s.schedule(run).await;
        let ready = s.task(run, "flaky").await;
        assert_eq!(
            (ready.state, ready.attempt, ready.retry_at),
            (TaskRunState::Ready, k + 1, None)
        );
        assert_eq!(s.publish(run).await, 1);
    }
    assert_eq!(
        s.work_one().await,
        Some(Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded)))
    );
    s.settle(run).await;
    assert_eq!(s.run_state(run).await, RunState::Succeeded);
    assert_eq!(calls.get(), 4);
    let d = s.detail(run).await;
    assert_eq!(
        transitions(&d, "flaky"),
        [
            "claim",
            "fail",
            "schedule_retry",
            "retry_ready",
            "claim",
            "fail",
            "schedule_retry",
            "retry_ready",
            "claim",
            "fail",
            "schedule_retry",
            "retry_ready",
            "claim",
            "succeed"
        ]
    );
    let report = s.report(run).await;
    assert_eq!(report.tasks[0].attempt, 4);
    assert_eq!(report.tasks[0].output, Some(json!({"attempts": 4})));
}

#[tokio::test]
async fn exhausted_retries_fail_the_task_for_good() {
    let calls = Counter::default();
    let counter = calls.clone();
    let s = scenario(move |b| {
        b.handler_fn("broken", move |ctx: TaskContext| {
            counter.hit();
            async move { Err::<serde_json::Value, _>(HandlerError::retryable(format!("broken #{}", ctx.attempt))) }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "exhausted", "version": 1,
                "tasks": [
                    {"key": "broken", "task_type": "broken",
                     "retry": {"max_attempts": 3, "delay_seconds": 1, "backoff": 2}},
                    {"key": "after", "task_type": "echo", "depends_on": ["broken"]}
                ]
            }),
            json!({}),
        )
        .await;
    for k in 1..=2 {
        s.settle(run).await;
        let broken = s.task(run, "broken").await;
        assert_eq!((broken.state, broken.attempt), (TaskRunState::Retrying, k + 1));
        assert_eq!(s.run_state(run).await, RunState::Running);
        s.clock.advance(Duration::from_secs(3600));
    }
    s.settle(run).await;

    let d = s.detail(run).await;
    let broken = task_of(&d, "broken");
    assert_eq!(broken.state, TaskRunState::Failed);
    assert_eq!(broken.attempt, 3);
    assert_eq!(broken.error.as_deref(), Some("broken #3"));
    assert_eq!(broken.retry_at, None);
    assert_eq!(
        transitions(&d, "broken"),
        [
            "claim",
            "fail",
            "schedule_retry",
            "retry_ready",
            "claim",
            "fail",
            "schedule_retry",
            "retry_ready",
            "claim",
            "fail"
        ],
        "the last failure schedules no retry"
    );
    assert_eq!(calls.get(), 3);
    let after = task_of(&d, "after");
    assert_eq!(after.state, TaskRunState::Cancelled);
    assert_eq!(after.cancel_reason, Some(CancelReason::UpstreamFailed));
    assert_eq!(d.summary.state, RunState::Failed);
    let report = s.report(run).await;
    assert_eq!(report.state, "failed");
    assert_eq!(report.tasks[0].state, "failed");
    assert_eq!(report.tasks[0].attempt, 3);
}

#[tokio::test]
async fn a_permanent_failure_skips_the_remaining_attempts() {
    let calls = Counter::default();
    let counter = calls.clone();
    let s = scenario(move |b| {
        b.handler_fn("picky", move |_ctx: TaskContext| {
            counter.hit();
            async move { Err::<serde_json::Value, _>(HandlerError::permanent("config.mode is not supported")) }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "permanent", "version": 1,
                "tasks": [{"key": "picky", "task_type": "picky", "retry": {"max_attempts": 5}}]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    let d = s.detail(run).await;
    let picky = task_of(&d, "picky");
    assert_eq!((picky.state, picky.attempt), (TaskRunState::Failed, 1));
    assert_eq!(picky.error.as_deref(), Some("config.mode is not supported"));
    assert_eq!(transitions(&d, "picky"), ["claim", "fail"]);
    assert_eq!(calls.get(), 1);
    assert_eq!(d.summary.state, RunState::Failed);
}

#[tokio::test]
async fn a_panicking_handler_is_a_failed_attempt_not_a_crash() {
    let s = scenario(|b| {
        b.handler_fn("panics_once", |ctx: TaskContext| async move {
            if ctx.attempt == 1 {
                panic!("boom on attempt 1");
            }
            Ok::<_, HandlerError>(json!({ "attempt": ctx.attempt }))
        })
        .blocking_handler("panics_blocking", |_ctx: TaskContext| panic!("blocking boom"))
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "panics", "version": 1,
                "tasks": [
                    {"key": "async", "task_type": "panics_once",
                     "retry": {"max_attempts": 2, "delay_seconds": 1}},
                    {"key": "blocking", "task_type": "panics_blocking"}
                ]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    s.clock.advance(Duration::from_secs(2));
    s.settle(run).await;

    let d = s.detail(run).await;
    let first = event(&d, "async", "fail", 0);
    assert_eq!(first.error.as_deref(), Some("handler panicked: boom on attempt 1"));
    let recovered = task_of(&d, "async");
    assert_eq!((recovered.state, recovered.attempt), (TaskRunState::Succeeded, 2));
    let blocking = task_of(&d, "blocking");
    assert_eq!((blocking.state, blocking.attempt), (TaskRunState::Failed, 1));
    assert_eq!(blocking.error.as_deref(), Some("handler panicked: blocking boom"));
    assert_eq!(d.summary.state, RunState::Failed);
}
