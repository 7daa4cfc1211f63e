//! Failure propagation (docs/design/cancellation.md#transitive-cancellation):
//! when a task fails for good, its whole downstream chain is cancelled with
//! `upstream_failed` in the same scheduler pass, while an independent branch
//! runs on to success; the run then fails.

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::{CancelReason, TaskRunState};
use flowforge_ports::{Delivery, FinishResult};
use serde_json::json;

use super::{Log, history, position, scenario, task_of};

#[tokio::test]
async fn a_failure_cancels_the_downstream_chain_in_one_pass_while_an_independent_branch_succeeds() {
    let ran: Log<String> = Log::default();
    let log = ran.clone();
    let s = scenario(move |b| {
        b.handler_fn("ok", move |ctx: TaskContext| {
            let log = log.clone();
            async move {
                log.push(ctx.task_key.clone());
                Ok::<_, HandlerError>(json!({}))
            }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "chain", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "fail"},
                    {"key": "b", "task_type": "ok", "depends_on": ["a"]},
                    {"key": "c", "task_type": "ok", "depends_on": ["b"]},
                    {"key": "d", "task_type": "ok", "depends_on": ["c"]},
                    {"key": "x", "task_type": "ok"},
                    {"key": "y", "task_type": "ok", "depends_on": ["x"]}
                ]
            }),
            json!({}),
        )
        .await;
    assert_eq!(s.publish(run).await, 2, "the two roots");
    let a = s.next_delivery().await.expect("a's dispatch");
    assert_eq!(a.dispatch().task_key, "a");
    let x = s.next_delivery().await.expect("x's dispatch");
    assert_eq!(
        s.engine.worker().handle(a).await.expect("ack"),
        Handled::Finished(FinishResult::Recorded(TaskRunState::Failed))
    );

    // ONE pass cancels b, c and d — the transitive closure, not just b.
    s.schedule(run).await;
    let d = s.detail(run).await;
    for key in ["b", "c", "d"] {
        let t = task_of(&d, key);
        assert_eq!(t.state, TaskRunState::Cancelled, "{key}");
        assert_eq!(t.cancel_reason, Some(CancelReason::UpstreamFailed), "{key}");
        assert_eq!(
            history(&d, key),
            [(
                "cancel_pending".into(),
                Some("pending".into()),
                Some("cancelled".into()),
                Some(1)
            )],
            "{key} never ran"
        );
    }
    let first = position(&d, Some("b"), "cancel_pending", 0);
    assert_eq!(position(&d, Some("c"), "cancel_pending", 0), first + 1);
    assert_eq!(position(&d, Some("d"), "cancel_pending", 0), first + 2);
    // The independent branch is untouched, and the run is not over.
    assert_eq!(task_of(&d, "x").state, TaskRunState::Ready);
    assert_eq!(task_of(&d, "y").state, TaskRunState::Pending);
    assert_eq!(d.summary.state, RunState::Running);

    s.engine.worker().handle(x).await.expect("ack");
    s.settle(run).await;
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "x").state, TaskRunState::Succeeded);
    assert_eq!(task_of(&d, "y").state, TaskRunState::Succeeded);
    assert_eq!(task_of(&d, "a").state, TaskRunState::Failed);
    assert_eq!(d.summary.state, RunState::Failed);
    assert_eq!(ran.entries(), ["x", "y"], "no cancelled task ever ran");
    let report = s.report(run).await;
    assert_eq!(report.state, "failed");
    let reasons: Vec<(&str, &str, Option<&str>)> = report
        .tasks
        .iter()
        .map(|t| (t.key.as_str(), t.state.as_str(), t.cancel_reason.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("a", "failed", None),
            ("b", "cancelled", Some("upstream_failed")),
            ("c", "cancelled", Some("upstream_failed")),
            ("d", "cancelled", Some("upstream_failed")),
            ("x", "succeeded", None),
            ("y", "succeeded", None)
        ]
    );
}
