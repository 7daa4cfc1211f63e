//! At-least-once delivery without double execution
//! (docs/design/outbox-and-queues.md#redelivery): a dispatch delivered again —
//! while its task runs, or after it finished — matches no claim, is acked
//! without running, and leaves the history alone; and a dispatch the
//! in-process queue took with its process is published again by the next
//! (docs/design/outbox-and-queues.md#lost-dispatches).

use std::sync::Arc;

use flowforge::{Embedded, HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::TaskRunState;
use flowforge_ports::{Delivery, DispatchPublisher, FinishResult, Scope};
use serde_json::json;
use tokio::sync::Notify;

use super::{Counter, LONG_LEASE, history, scenario, task_of, transitions, within};

#[tokio::test]
async fn a_redelivered_dispatch_is_not_executed_again() {
    let calls = Counter::default();
    let counter = calls.clone();
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (g, st) = (Arc::clone(&gate), Arc::clone(&started));
    let s = scenario(move |b| {
        b.handler_fn("once", move |_ctx: TaskContext| {
            let n = counter.hit();
            let (gate, started) = (Arc::clone(&g), Arc::clone(&st));
            async move {
                started.notify_one();
                gate.notified().await;
                Ok::<_, HandlerError>(json!({ "call": n }))
            }
        })
    })
    .await;
    let run = s
        .start(
            json!({"name": "once", "version": 1, "tasks": [{"key": "once", "task_type": "once"}]}),
            json!({}),
        )
        .await;
    assert_eq!(s.publish(run).await, 1);
    let delivery = s.next_delivery().await.expect("the dispatch");
    let dispatch = delivery.dispatch().clone();
    let handling = s.spawn_work(delivery);
    within("the handler to start", started.notified()).await;

    // Delivered again while the first delivery's attempt runs.
    assert!(
        s.queue()
            .publish(std::slice::from_ref(&dispatch))
            .await
            .iter()
            .all(Result::is_ok)
    );
    assert_eq!(s.work_one().await, Some(Handled::Skipped));
    assert_eq!(s.task(run, "once").await.state, TaskRunState::Running);

    gate.notify_one();
    assert_eq!(
        within("the attempt to finish", handling).await.expect("join"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Succeeded))
    );
    s.settle(run).await;
    let before = s.detail(run).await;
    assert_eq!(before.summary.state, RunState::Succeeded);

    // Delivered again after the task finished (a broker redelivery after a
    // lost ack): acked without running.
    for _ in 0..2 {
        assert!(
            s.queue()
                .publish(std::slice::from_ref(&dispatch))
                .await
                .iter()
                .all(Result::is_ok)
        );
        assert_eq!(s.work_one().await, Some(Handled::Skipped));
    }
    s.settle(run).await;
    assert_eq!(calls.get(), 1, "the handler ran exactly once");
    let after = s.detail(run).await;
    assert_eq!(after.events, before.events, "no claim, no event");
    let once = task_of(&after, "once");
    assert_eq!((once.attempt, once.output.clone()), (1, Some(json!({"call": 1}))));
    assert_eq!(transitions(&after, "once"), ["claim", "succeed"]);
}

#[tokio::test]
async fn a_dispatch_lost_with_the_last_process_is_published_again() {
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({"name": "chain", "version": 1, "tasks": [
                {"key": "first", "task_type": "noop"},
                {"key": "second", "task_type": "noop", "depends_on": ["first"]}
            ]}),
            json!({}),
        )
        .await;
    assert_eq!(s.publish(run).await, 1);
    assert!(matches!(s.work_one().await, Some(Handled::Finished(_))));
    s.schedule(run).await;
    // The second task's dispatch is published into this engine's queue,
    // which nobody consumes again: the process that held it is gone.
    assert_eq!(s.publish(run).await, 1);
    assert_eq!(s.task(run, "second").await.state, TaskRunState::Ready);

    let next = Embedded::builder()
        .database(s.database_url())
        .clock(s.clock.clone())
        .lease(LONG_LEASE)
        .build()
        .await
        .expect("the next process's engine");
    let serving = next.serve(Scope::All);
    assert_eq!(
        within("the next process to finish the run", next.wait(run))
            .await
            .expect("wait"),
        RunState::Succeeded
    );
    serving.stop().await.expect("stop");
    let claims = history(&s.detail(run).await, "second")
        .into_iter()
        .filter(|(transition, ..)| transition == "claim")
        .count();
    assert_eq!(claims, 1);
    // Had the earlier process lived on, its copy claims nothing.
    assert_eq!(s.work_one().await, Some(Handled::Skipped));
}
