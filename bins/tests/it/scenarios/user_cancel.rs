//! A user's cancellation (docs/design/cancellation.md#cancel-requests,
//! docs/design/state-machines.md#deriving-the-run-state): the running
//! handler is stopped and its task ends `cancelled` through
//! `cancel_running`; pending, ready and retrying tasks are cancelled by
//! their own edges, all with reason `user`; the run ends `cancelled` (exit
//! code 3 territory), is not compensated, and is never terminal while a
//! task is still active.

use std::sync::Arc;
use std::time::Duration;

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::{CancelReason, TaskRunState};
use flowforge_ports::store::CancelOutcome;
use flowforge_ports::{Delivery, FinishResult, RunStore};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::{Counter, EmbeddedBuilder, history, position, run_transitions, scenario, task_of, within};

/// A handler that announces its start, waits for its cancellation signal
/// and then stops (as a well-behaved handler does).
#[derive(Clone, Default)]
struct Blocker {
    started: Arc<Notify>,
    calls: Counter,
    saw_cancel: Counter,
}

impl Blocker {
    fn register(&self, b: EmbeddedBuilder) -> EmbeddedBuilder {
        let me = self.clone();
        b.handler_fn("block", move |ctx: TaskContext| {
            let me = me.clone();
            async move {
                me.calls.hit();
                me.started.notify_one();
                ctx.cancel.cancelled().await;
                me.saw_cancel.hit();
                Err::<Value, _>(HandlerError::retryable("stopped on cancellation"))
            }
        })
    }

    async fn wait_started(&self) {
        within("the blocking handler to start", self.started.notified()).await;
    }
}

fn cancelled_by_user() -> (TaskRunState, Option<CancelReason>) {
    (TaskRunState::Cancelled, Some(CancelReason::User))
}

#[tokio::test]
async fn cancelling_a_running_run_stops_its_handler_and_cancels_the_waiting_tasks() {
    let blocker = Blocker::default();
    let s = scenario(|b| blocker.register(b)).await;
    let run = s
        .start(
            json!({
                "name": "cancel-me", "version": 1,
                "tasks": [
                    {"key": "prep", "task_type": "noop"},
                    {"key": "a", "task_type": "block", "depends_on": ["prep"]},
                    {"key": "b", "task_type": "echo", "depends_on": ["a"]},
                    {"key": "c", "task_type": "echo", "depends_on": ["b"]},
                    {"key": "undo_prep", "task_type": "noop", "compensate_for": "prep"}
                ]
            }),
            json!({}),
        )
        .await;
    s.publish(run).await;
    s.work_one().await.expect("prep ran");
    s.schedule(run).await;
    s.publish(run).await;
    let delivery = s.next_delivery().await.expect("a's dispatch");
    let handling = s.spawn_work(delivery);
    blocker.wait_started().await;
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "a").state, TaskRunState::Running);
    assert_eq!(d.summary.state, RunState::Running);

    assert_eq!(s.engine.cancel(run).await.expect("cancel"), CancelOutcome::Requested);
    assert_eq!(
        within("the stopped handler's outcome", handling).await.expect("join"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Cancelled)),
        "the running task is cancelled, not failed"
    );
    s.settle(run).await;

    let d = s.detail(run).await;
    assert_eq!(blocker.saw_cancel.get(), 1, "the handler was told to stop");
    assert_eq!(blocker.calls.get(), 1);
    let a = task_of(&d, "a");
    assert_eq!((a.state, a.cancel_reason), cancelled_by_user());
    assert_eq!(
        history(&d, "a").last().cloned(),
        Some((
            "cancel_running".into(),
            Some("running".into()),
            Some("cancelled".into()),
            Some(1)
        ))
    );
    for key in ["b", "c"] {
        let t = task_of(&d, key);
        assert_eq!(
            (t.state, t.cancel_reason),
            cancelled_by_user(),
            "{key} waits on a task the USER cancelled: reason user, not upstream_failed"
        );
    }
    assert_eq!(task_of(&d, "prep").state, TaskRunState::Succeeded);
    assert_eq!(d.summary.state, RunState::Cancelled);
    assert_eq!(run_transitions(&d), ["start", "cancel"]);
    assert!(
        d.tasks.iter().all(|t| t.compensate_for.is_none()),
        "a cancelled run is not compensated"
    );
    let report = s.report(run).await;
    assert_eq!(
        report.run_state(),
        Some(RunState::Cancelled),
        "`flowforge run` exits 3 on this"
    );
    assert!(report.compensations.is_empty());
}

#[tokio::test]
async fn a_handler_that_stops_when_cancelled_always_ends_cancelled_never_failed() {
    // The handler returns (an error) as soon as its cancellation signal
    // fires; the worker sees the signal and the handler's result at the
    // same moment. The attempt must still end `cancel_running` — every
    // time, not depending on which of the two the worker looks at first.
    let blocker = Blocker::default();
    let s = scenario(|b| blocker.register(b)).await;
    let def = json!({
        "name": "stop-on-cancel", "version": 1,
        "tasks": [{"key": "a", "task_type": "block"}]
    });
    let mut outcomes = Vec::new();
    for _ in 0..20 {
        let run = s.start(def.clone(), json!({})).await;
        s.publish(run).await;
        let delivery = s.next_delivery().await.expect("a's dispatch");
        let handling = s.spawn_work(delivery);
        blocker.wait_started().await;
        s.engine.cancel(run).await.expect("cancel");
        outcomes.push(within("the stopped handler's outcome", handling).await.expect("join"));
        s.settle(run).await;
    }
    let cancelled = Handled::Finished(FinishResult::Recorded(TaskRunState::Cancelled));
    let wrong: Vec<&Handled> = outcomes.iter().filter(|o| **o != cancelled).collect();
    assert!(
        wrong.is_empty(),
        "{} of 20 cancelled attempts were not recorded as cancel_running: {wrong:?}",
        wrong.len()
    );
}

#[tokio::test]
async fn cancel_reaches_pending_ready_retrying_and_running_tasks_each_by_its_own_edge() {
    let blocker = Blocker::default();
    // A short lease: the running task learns of the cancel at its next
    // heartbeat (a third of the lease). Store time never moves here and no
    // scheduler pass runs while the task runs, so nothing can be reaped.
    let s = scenario(|b| blocker.register(b).lease(Duration::from_secs(3))).await;
    let run = s
        .start(
            json!({
                "name": "cancel-everything", "version": 1,
                "tasks": [
                    {"key": "running", "task_type": "block"},
                    {"key": "ready", "task_type": "echo"},
                    {"key": "retrying", "task_type": "fail",
                     "retry": {"max_attempts": 3, "delay_seconds": 600}},
                    {"key": "pending", "task_type": "echo", "depends_on": ["ready"]}
                ]
            }),
            json!({}),
        )
        .await;
    assert_eq!(s.publish(run).await, 3);
    let running = s.next_delivery().await.expect("running's dispatch");
    assert_eq!(running.dispatch().task_key, "running");
    let ready = s.next_delivery().await.expect("ready's dispatch");
    assert_eq!(ready.dispatch().task_key, "ready");
    let handling = s.spawn_work(running);
    blocker.wait_started().await;
    assert_eq!(
        s.work_one().await,
        Some(Handled::Finished(FinishResult::Recorded(TaskRunState::Retrying)))
    );
    s.schedule(run).await;
    let d = s.detail(run).await;
    let states: Vec<(&str, TaskRunState)> = d.tasks.iter().map(|t| (t.key.as_str(), t.state)).collect();
    assert_eq!(
        states,
        [
            ("running", TaskRunState::Running),
            ("ready", TaskRunState::Ready),
            ("retrying", TaskRunState::Retrying),
            ("pending", TaskRunState::Pending)
        ]
    );

    // Cancelled from outside this engine (as `flowforge runs cancel` does):
    // the worker hears of it at its next heartbeat.
    assert_eq!(
        s.engine.store().request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    assert_eq!(
        within("the heartbeat to stop the handler", handling)
            .await
            .expect("join"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Cancelled))
    );
    s.settle(run).await;
    // The dispatch held back meanwhile claims nothing now.
    assert_eq!(s.engine.worker().handle(ready).await.expect("ack"), Handled::Skipped);

    let d = s.detail(run).await;
    for (key, edge, from, attempt) in [
        ("running", "cancel_running", "running", 1),
        ("ready", "cancel_ready", "ready", 1),
        ("retrying", "cancel_retrying", "retrying", 2),
        ("pending", "cancel_pending", "pending", 1),
    ] {
        let t = task_of(&d, key);
        assert_eq!((t.state, t.cancel_reason), cancelled_by_user(), "{key}");
        assert_eq!(
            history(&d, key).last().cloned(),
            Some((edge.into(), Some(from.into()), Some("cancelled".into()), Some(attempt))),
            "{key}"
        );
        assert!(t.finished_at.is_some(), "{key}");
        assert_eq!(t.retry_at, None, "{key}");
    }
    assert_eq!(blocker.saw_cancel.get(), 1);
    assert_eq!(d.summary.state, RunState::Cancelled);
    assert_eq!(run_transitions(&d), ["start", "cancel"]);
}

#[tokio::test]
async fn the_dependents_of_a_task_the_user_cancelled_are_cancelled_for_the_user() {
    // The running task stops first (its worker hears of the cancel at a
    // heartbeat and records cancel_running), THEN the scheduler's pass
    // runs: its dependents are still the user's cancellation, not an
    // upstream failure — nothing failed (decisions 3 and 5).
    let blocker = Blocker::default();
    let s = scenario(|b| blocker.register(b).lease(Duration::from_secs(3))).await;
    let run = s
        .start(
            json!({
                "name": "cancel-then-pass", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "block"},
                    {"key": "b", "task_type": "echo", "depends_on": ["a"]},
                    {"key": "c", "task_type": "echo", "depends_on": ["b"]}
                ]
            }),
            json!({}),
        )
        .await;
    s.publish(run).await;
    let delivery = s.next_delivery().await.expect("a's dispatch");
    let handling = s.spawn_work(delivery);
    blocker.wait_started().await;
    s.engine.store().request_cancel(run).await.expect("cancel");
    assert_eq!(
        within("the heartbeat to stop the handler", handling)
            .await
            .expect("join"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Cancelled))
    );
    s.settle(run).await;
    let d = s.detail(run).await;
    let a = task_of(&d, "a");
    assert_eq!((a.state, a.cancel_reason), cancelled_by_user());
    for key in ["b", "c"] {
        let t = task_of(&d, key);
        assert_eq!((t.state, t.cancel_reason), cancelled_by_user(), "{key}");
    }
    assert_eq!(d.summary.state, RunState::Cancelled);
}

#[tokio::test]
async fn a_run_is_never_terminal_while_a_task_is_still_running() {
    // This handler ignores cancellation and finishes only when let go.
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (g, st) = (Arc::clone(&gate), Arc::clone(&started));
    let s = scenario(move |b| {
        b.handler_fn("gated", move |_ctx: TaskContext| {
            let (gate, started) = (Arc::clone(&g), Arc::clone(&st));
            async move {
                started.notify_one();
                gate.notified().await;
                Ok::<_, HandlerError>(json!({"finished": true}))
            }
        })
    })
    .await;
    let def = json!({
        "name": "still-running", "version": 1,
        "tasks": [
            {"key": "long", "task_type": "gated"},
            {"key": "later", "task_type": "echo", "depends_on": ["long"]},
            {"key": "other", "task_type": "fail", "retry": {"max_attempts": 2, "delay_seconds": 600}}
        ]
    });
    let run = s.start(def, json!({})).await;
    assert_eq!(s.publish(run).await, 2);
    let long = s.next_delivery().await.expect("long's dispatch");
    let handling = s.spawn_work(long);
    within("the gated handler to start", started.notified()).await;
    s.work_one().await.expect("other's first attempt");
    s.schedule(run).await;

    // A cancel the worker has not heard of yet (its heartbeat is 100 s away).
    s.engine.store().request_cancel(run).await.expect("cancel");
    for _ in 0..3 {
        s.schedule(run).await;
        let d = s.detail(run).await;
        assert_eq!(task_of(&d, "long").state, TaskRunState::Running);
        assert_eq!(
            (task_of(&d, "later").state, task_of(&d, "later").cancel_reason),
            cancelled_by_user()
        );
        assert_eq!(
            (task_of(&d, "other").state, task_of(&d, "other").cancel_reason),
            cancelled_by_user()
        );
        assert_eq!(
            d.summary.state,
            RunState::Running,
            "everything else is cancelled, but a task is still running"
        );
    }

    // The task finishes before it ever sees the cancel: its success
    // stands, and only then does the run end (cancelled: others were).
    gate.notify_one();
    assert_eq!(
        within("the gated handler to finish", handling).await.expect("join"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded))
    );
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "long").state, TaskRunState::Succeeded);
    assert_eq!(d.summary.state, RunState::Cancelled);
    let cancelled_at = position(&d, None, "cancel", 0);
    let succeeded_at = position(&d, Some("long"), "succeed", 0);
    assert!(
        succeeded_at < cancelled_at,
        "the run ended only after its last task stopped"
    );
}

#[tokio::test]
async fn a_run_cancelled_before_anything_started_takes_cancel_before_start() {
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({
                "name": "never-started", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "noop"},
                    {"key": "b", "task_type": "noop", "depends_on": ["a"]}
                ]
            }),
            json!({}),
        )
        .await;
    assert_eq!(s.engine.cancel(run).await.expect("cancel"), CancelOutcome::Requested);
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(d.summary.state, RunState::Cancelled);
    assert_eq!(run_transitions(&d), ["cancel_before_start"]);
    for (key, edge) in [("a", "cancel_ready"), ("b", "cancel_pending")] {
        let t = task_of(&d, key);
        assert_eq!((t.state, t.cancel_reason), cancelled_by_user(), "{key}");
        assert_eq!(history(&d, key).last().map(|h| h.0.clone()), Some(edge.to_owned()));
        assert_eq!(t.started_at, None, "{key}");
    }
    assert_eq!(
        s.engine.cancel(run).await.expect("cancel again"),
        CancelOutcome::AlreadyFinished(RunState::Cancelled)
    );
}
