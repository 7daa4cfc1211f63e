//! Compensation (docs/design/compensation.md#one-at-a-time): once a
//! run's forward tasks settle as failed, the compensators of the succeeded
//! tasks run strictly one at a time, in reverse dependency order, each
//! seeing the output of the task it undoes; the run is held `running`
//! until the rollback settles; a compensator that fails for good halts the
//! rollback and the rest are reported `not_run`. Succeeded and cancelled
//! runs are never compensated.

use std::sync::Arc;

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::TaskRunState;
use flowforge_ports::{FinishResult, RunDetail};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use super::{Log, position, scenario, task_of, within};

/// What a compensator saw.
#[derive(Debug, Clone, PartialEq)]
struct Undo {
    key: String,
    inputs: Map<String, Value>,
    run_input: Value,
}

/// The compensator rows of a stored run, in creation order.
fn compensators(d: &RunDetail) -> Vec<(String, TaskRunState)> {
    d.tasks
        .iter()
        .filter(|t| t.compensate_for.is_some())
        .map(|t| (t.key.clone(), t.state))
        .collect()
}

#[tokio::test]
async fn compensators_run_one_at_a_time_in_reverse_order_while_the_run_stays_running() {
    let undone: Log<Undo> = Log::default();
    let log = undone.clone();
    let s = scenario(move |b| {
        b.handler_fn("work", |ctx: TaskContext| async move {
            Ok::<_, HandlerError>(json!({ "made": ctx.task_key }))
        })
        .handler_fn("undo", move |ctx: TaskContext| {
            let log = log.clone();
            async move {
                log.push(Undo {
                    key: ctx.task_key.clone(),
                    inputs: ctx.inputs.clone(),
                    run_input: ctx.run_input.clone(),
                });
                Ok::<_, HandlerError>(json!({ "undid": ctx.task_key }))
            }
        })
    })
    .await;
    let input = json!({"order": 7});
    // a → (b, c) → d; d fails. b and c are both undone before a.
    let run = s
        .start(
            json!({
                "name": "saga", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "work"},
                    {"key": "b", "task_type": "work", "depends_on": ["a"]},
                    {"key": "c", "task_type": "work", "depends_on": ["a"]},
                    {"key": "d", "task_type": "fail", "depends_on": ["b", "c"]},
                    {"key": "undo_a", "task_type": "undo", "compensate_for": "a"},
                    {"key": "undo_b", "task_type": "undo", "compensate_for": "b"},
                    {"key": "undo_c", "task_type": "undo", "compensate_for": "c"},
                    {"key": "undo_d", "task_type": "undo", "compensate_for": "d"}
                ]
            }),
            input.clone(),
        )
        .await;

    // Step by hand, looking at the stored run after every pass.
    let mut snapshots: Vec<(RunState, Vec<(String, TaskRunState)>)> = Vec::new();
    for _ in 0..100 {
        s.schedule(run).await;
        let d = s.detail(run).await;
        snapshots.push((d.summary.state, compensators(&d)));
        if d.summary.state != RunState::Running && d.summary.state != RunState::Pending {
            break;
        }
        s.publish(run).await;
        assert!(
            s.work_one().await.is_some(),
            "a running run always has work queued here"
        );
        while s.work_one().await.is_some() {}
    }
    let (last_state, last_rows) = snapshots.last().expect("at least one pass").clone();
    assert_eq!(last_state, RunState::Failed);
    assert_eq!(
        last_rows,
        [
            ("undo_c".to_owned(), TaskRunState::Succeeded),
            ("undo_b".to_owned(), TaskRunState::Succeeded),
            ("undo_a".to_owned(), TaskRunState::Succeeded),
        ],
        "reverse topological order; d never succeeded, so undo_d never exists"
    );
    for (state, rows) in &snapshots[..snapshots.len() - 1] {
        assert!(matches!(state, RunState::Pending | RunState::Running), "{state}");
        if !rows.is_empty() {
            assert_eq!(
                *state,
                RunState::Running,
                "the run is held running until the rollback settles"
            );
        }
        let active = rows.iter().filter(|(_, s)| *s != TaskRunState::Succeeded).count();
        assert!(active <= 1, "one compensator at a time: {rows:?}");
    }
    // Each compensator appeared alone, after the previous one succeeded.
    let appearances: Vec<Vec<(String, TaskRunState)>> = snapshots
        .iter()
        .map(|(_, rows)| rows.clone())
        .filter(|rows| !rows.is_empty())
        .collect();
    assert!(appearances.contains(&vec![("undo_c".to_owned(), TaskRunState::Ready)]));
    assert!(appearances.contains(&vec![
        ("undo_c".to_owned(), TaskRunState::Succeeded),
        ("undo_b".to_owned(), TaskRunState::Ready)
    ]));
    assert!(appearances.contains(&vec![
        ("undo_c".to_owned(), TaskRunState::Succeeded),
        ("undo_b".to_owned(), TaskRunState::Succeeded),
        ("undo_a".to_owned(), TaskRunState::Ready)
    ]));

    // Each compensator saw the output of the task it undoes, and the run input.
    let seen = undone.entries();
    let keys: Vec<&str> = seen.iter().map(|u| u.key.as_str()).collect();
    assert_eq!(keys, ["undo_c", "undo_b", "undo_a"]);
    for (u, forward) in seen.iter().zip(["c", "b", "a"]) {
        let expected: Map<String, Value> = [(forward.to_owned(), json!({ "made": forward }))].into_iter().collect();
        assert_eq!(u.inputs, expected, "{}", u.key);
        assert_eq!(u.run_input, input, "{}", u.key);
    }

    // The history: the run fails only after the last compensator succeeded.
    let d = s.detail(run).await;
    let run_failed = position(&d, None, "fail", 0);
    assert!(position(&d, Some("undo_a"), "succeed", 0) < run_failed);
    assert!(position(&d, Some("undo_b"), "succeed", 0) < position(&d, Some("undo_a"), "claim", 0));
    assert!(position(&d, Some("undo_c"), "succeed", 0) < position(&d, Some("undo_b"), "claim", 0));
    assert!(position(&d, Some("d"), "fail", 0) < position(&d, Some("undo_c"), "claim", 0));

    let report = s.report(run).await;
    assert_eq!(report.state, "failed");
    let comps: Vec<(&str, &str, &str, u32)> = report
        .compensations
        .iter()
        .map(|c| (c.key.as_str(), c.compensate_for.as_str(), c.state.as_str(), c.attempt))
        .collect();
    assert_eq!(
        comps,
        [
            ("undo_c", "c", "succeeded", 1),
            ("undo_b", "b", "succeeded", 1),
            ("undo_a", "a", "succeeded", 1)
        ]
    );
    assert_eq!(report.compensations[0].output, Some(json!({"undid": "undo_c"})));
}

#[tokio::test]
async fn a_compensator_that_fails_for_good_halts_the_rollback() {
    let s = scenario(|b| {
        b.handler_fn("work", |ctx: TaskContext| async move {
            Ok::<_, HandlerError>(json!({ "made": ctx.task_key }))
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "halted-saga", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "work"},
                    {"key": "b", "task_type": "work", "depends_on": ["a"]},
                    {"key": "c", "task_type": "fail", "depends_on": ["b"]},
                    {"key": "undo_a", "task_type": "noop", "compensate_for": "a"},
                    {"key": "undo_b", "task_type": "fail", "compensate_for": "b",
                     "config": {"message": "refund refused"}}
                ]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(d.summary.state, RunState::Failed);
    assert_eq!(
        compensators(&d),
        [("undo_b".to_owned(), TaskRunState::Failed)],
        "undo_a is never created"
    );
    let undo_b = task_of(&d, "undo_b");
    assert_eq!(undo_b.error.as_deref(), Some("refund refused (attempt 1)"));
    assert!(position(&d, Some("undo_b"), "fail", 0) < position(&d, None, "fail", 0));

    let report = s.report(run).await;
    assert_eq!(report.state, "failed");
    let comps: Vec<(&str, &str, &str, u32, Option<&str>)> = report
        .compensations
        .iter()
        .map(|c| {
            (
                c.key.as_str(),
                c.compensate_for.as_str(),
                c.state.as_str(),
                c.attempt,
                c.error.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        comps,
        [
            ("undo_b", "b", "failed", 1, Some("refund refused (attempt 1)")),
            ("undo_a", "a", "not_run", 0, None)
        ]
    );
    assert_eq!(report.compensations[1].output, None);
}

#[tokio::test]
async fn a_compensator_retries_under_its_own_policy() {
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({
                "name": "retrying-undo", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "noop"},
                    {"key": "b", "task_type": "fail", "depends_on": ["a"]},
                    {"key": "undo_a", "task_type": "fail", "compensate_for": "a",
                     "config": {"fail_times": 1},
                     "retry": {"max_attempts": 2, "delay_seconds": 30}}
                ]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    let d = s.detail(run).await;
    let undo = task_of(&d, "undo_a");
    assert_eq!((undo.state, undo.attempt), (TaskRunState::Retrying, 2));
    assert_eq!(d.summary.state, RunState::Running, "the rollback is not over");
    s.clock.advance(std::time::Duration::from_secs(31));
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "undo_a").state, TaskRunState::Succeeded);
    assert_eq!(d.summary.state, RunState::Failed);
}

#[tokio::test]
async fn a_cancel_that_arrives_during_the_rollback_does_not_interrupt_it() {
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({
                "name": "cancel-mid-rollback", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "noop"},
                    {"key": "b", "task_type": "noop", "depends_on": ["a"]},
                    {"key": "c", "task_type": "fail", "depends_on": ["b"]},
                    {"key": "undo_a", "task_type": "noop", "compensate_for": "a"},
                    {"key": "undo_b", "task_type": "noop", "compensate_for": "b"}
                ]
            }),
            json!({}),
        )
        .await;
    // Forward tasks settle as failed; the first compensator is created.
    for _ in 0..3 {
        s.schedule(run).await;
        s.publish(run).await;
        while s.work_one().await.is_some() {}
    }
    s.schedule(run).await;
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "c").state, TaskRunState::Failed);
    assert_eq!(compensators(&d), [("undo_b".to_owned(), TaskRunState::Ready)]);
    assert_eq!(d.summary.state, RunState::Running);

    // The user cancels now: the rollback goes on to its end
    // (docs/design/cancellation.md#rollbacks-are-not-interrupted).
    s.engine.cancel(run).await.expect("cancel");
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(
        compensators(&d),
        [
            ("undo_b".to_owned(), TaskRunState::Succeeded),
            ("undo_a".to_owned(), TaskRunState::Succeeded)
        ],
        "the rollback was interrupted: {:#?}",
        d.tasks
    );
    assert_eq!(d.summary.state, RunState::Failed);
}

#[tokio::test]
async fn a_cancel_does_not_stop_a_running_compensator() {
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (g, st) = (Arc::clone(&gate), Arc::clone(&started));
    let s = scenario(move |b| {
        b.handler_fn("undo_gated", move |ctx: TaskContext| {
            let (gate, started) = (Arc::clone(&g), Arc::clone(&st));
            async move {
                started.notify_one();
                gate.notified().await;
                if ctx.cancel.is_cancelled() {
                    return Err(HandlerError::retryable("the compensator was told to stop"));
                }
                Ok(json!({"undone": true}))
            }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "cancel-running-undo", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "noop"},
                    {"key": "b", "task_type": "fail", "depends_on": ["a"]},
                    {"key": "undo_a", "task_type": "undo_gated", "compensate_for": "a"}
                ]
            }),
            json!({}),
        )
        .await;
    s.publish(run).await;
    s.work_one().await.expect("a");
    s.schedule(run).await;
    s.publish(run).await;
    s.work_one().await.expect("b");
    s.schedule(run).await;
    assert_eq!(s.publish(run).await, 1, "undo_a is dispatched");
    let delivery = s.next_delivery().await.expect("undo_a's dispatch");
    let handling = s.spawn_work(delivery);
    within("the compensator to start", started.notified()).await;

    s.engine.cancel(run).await.expect("cancel");
    gate.notify_one();
    assert_eq!(
        within("the compensator to finish", handling).await.expect("join"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded)),
        "a cancel that arrives during a rollback does not interrupt it"
    );
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(compensators(&d), [("undo_a".to_owned(), TaskRunState::Succeeded)]);
    assert_eq!(d.summary.state, RunState::Failed);
}

#[tokio::test]
async fn a_run_that_succeeds_is_never_compensated() {
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({
                "name": "happy-saga", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "noop"},
                    {"key": "b", "task_type": "noop", "depends_on": ["a"]},
                    {"key": "undo_a", "task_type": "noop", "compensate_for": "a"}
                ]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(d.summary.state, RunState::Succeeded);
    assert!(compensators(&d).is_empty());
    assert!(s.report(run).await.compensations.is_empty());
}
