//! Readiness (docs/design/scheduler.md#the-pass): a task becomes ready,
//! and is claimed, only once every one of its dependencies succeeded; a
//! dispatch for a task that is not ready claims nothing; independent
//! branches run side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::TaskRunState;
use flowforge_ports::{Delivery, Dispatch, DispatchId, DispatchPublisher};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use super::{Log, history, position, scenario, task_of, within};

fn diamond() -> Value {
    json!({
        "name": "diamond", "version": 1,
        "tasks": [
            {"key": "start", "task_type": "step"},
            {"key": "left", "task_type": "step", "depends_on": ["start"]},
            {"key": "right", "task_type": "step", "depends_on": ["start"]},
            {"key": "join", "task_type": "step", "depends_on": ["left", "right"]}
        ]
    })
}

#[tokio::test]
async fn a_task_is_claimed_only_after_all_its_dependencies_succeeded() {
    let ran: Log<String> = Log::default();
    let log = ran.clone();
    let s = scenario(move |b| {
        b.handler_fn("step", move |ctx: TaskContext| {
            let log = log.clone();
            async move {
                log.push(ctx.task_key.clone());
                Ok::<_, HandlerError>(json!({ "key": ctx.task_key }))
            }
        })
    })
    .await;
    let run = s.start(diamond(), json!({})).await;

    // Only the root is dispatched at start.
    assert_eq!(s.publish(run).await, 1);
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "start").state, TaskRunState::Ready);
    for key in ["left", "right", "join"] {
        assert_eq!(task_of(&d, key).state, TaskRunState::Pending, "{key}");
    }
    assert_eq!(
        s.work_one().await,
        Some(Handled::Finished(flowforge_ports::FinishResult::Recorded(
            TaskRunState::Succeeded
        )))
    );
    assert_eq!(s.work_one().await, None, "nothing else is dispatched before a pass");

    // A forged dispatch for `join` while it is pending claims nothing.
    let join = task_of(&s.detail(run).await, "join").clone();
    let forged = Dispatch {
        dispatch_id: DispatchId(i64::MAX),
        task_run_id: join.id,
        run_id: run,
        task_key: "join".into(),
        task_type: "step".into(),
        fencing_token: join.token,
        ready_at: None,
        priority: flowforge_domain::Priority::DEFAULT,
    };
    assert!(
        s.queue()
            .publish(std::slice::from_ref(&forged))
            .await
            .iter()
            .all(Result::is_ok)
    );
    assert_eq!(s.work_one().await, Some(Handled::Skipped));

    // The pass promotes both branches; run only `left`.
    s.schedule(run).await;
    assert_eq!(s.publish(run).await, 2);
    let left = s.next_delivery().await.expect("left's dispatch");
    assert_eq!(left.dispatch().task_key, "left");
    let right = s.next_delivery().await.expect("right's dispatch");
    assert_eq!(right.dispatch().task_key, "right");
    s.engine.worker().handle(left).await.expect("ack");
    s.schedule(run).await;
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "left").state, TaskRunState::Succeeded);
    assert_eq!(task_of(&d, "right").state, TaskRunState::Ready);
    assert_eq!(
        task_of(&d, "join").state,
        TaskRunState::Pending,
        "join must wait for right as well"
    );
    assert_eq!(s.publish(run).await, 0);

    // Once `right` succeeds, `join` becomes ready and runs.
    s.engine.worker().handle(right).await.expect("ack");
    s.settle(run).await;
    assert_eq!(s.run_state(run).await, RunState::Succeeded);
    assert_eq!(ran.entries(), ["start", "left", "right", "join"]);

    // The history agrees: every claim comes after the success of each of
    // the task's dependencies, and promotion after the last of them.
    let d = s.detail(run).await;
    for (task, deps) in [
        ("left", &["start"][..]),
        ("right", &["start"][..]),
        ("join", &["left", "right"][..]),
    ] {
        let claim = position(&d, Some(task), "claim", 0);
        let promoted = position(&d, Some(task), "dependencies_satisfied", 0);
        assert!(promoted < claim, "{task}");
        for dep in deps {
            let done = position(&d, Some(dep), "succeed", 0);
            assert!(done < promoted, "{task} was promoted before {dep} succeeded");
        }
        assert_eq!(
            history(&d, task),
            [
                (
                    "dependencies_satisfied".into(),
                    Some("pending".into()),
                    Some("ready".into()),
                    Some(1)
                ),
                ("claim".into(), Some("ready".into()), Some("running".into()), Some(1)),
                (
                    "succeed".into(),
                    Some("running".into()),
                    Some("succeeded".into()),
                    Some(1)
                ),
            ],
            "{task}"
        );
    }
    let report = s.report(run).await;
    let order: Vec<&str> = report.tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(order, ["start", "left", "right", "join"], "tasks in topological order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn independent_branches_run_concurrently_when_served() {
    // Both branches must be inside their handlers at the same time to pass
    // the barrier: a sequential engine would never finish this run.
    let barrier = Arc::new(Barrier::new(2));
    let s = scenario(move |b| {
        b.handler_fn("step", move |ctx: TaskContext| {
            let barrier = Arc::clone(&barrier);
            async move {
                if ctx.task_key == "left" || ctx.task_key == "right" {
                    barrier.wait().await;
                }
                Ok::<_, HandlerError>(json!({ "key": ctx.task_key }))
            }
        })
        .concurrency(4)
    })
    .await;
    let def = flowforge::parse_definition(&serde_json::to_vec(&diamond()).expect("json")).expect("valid");
    let report = within("the diamond to finish", s.engine.run(&def, json!({})))
        .await
        .expect("run");
    assert_eq!(report.state, "succeeded", "{report:#?}");
}

/// Runs started concurrently through one engine share its loops and its
/// worker slots: `concurrency` bounds the handlers in flight across every
/// run, both slots do run handlers at once (the first two meet at a
/// barrier, which a serial engine would never pass), and each run still
/// reaches its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_of_one_engine_share_its_worker_slots() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let both = Arc::new(tokio::sync::Barrier::new(2));
    let (now, peak) = (Arc::clone(&in_flight), Arc::clone(&most));
    let s = scenario(move |b| {
        b.handler_fn("step", move |_ctx: TaskContext| {
            let (now, peak, calls, both) = (
                Arc::clone(&now),
                Arc::clone(&peak),
                Arc::clone(&calls),
                Arc::clone(&both),
            );
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(running, Ordering::SeqCst);
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    both.wait().await;
                }
                // Room for another slot to start a handler, if there were one.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(json!({}))
            }
        })
        .concurrency(2)
    })
    .await;
    let def = flowforge::parse_definition(&serde_json::to_vec(&diamond()).expect("json")).expect("valid");
    let engine = Arc::clone(&s.engine);
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (engine, def) = (Arc::clone(&engine), def.clone());
        runs.spawn(async move { engine.run(&def, json!({})).await });
    }
    let reports = within("six concurrent runs to finish", runs.join_all()).await;
    for report in reports {
        let report = report.expect("run");
        assert_eq!(report.state, "succeeded", "{report:#?}");
    }
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "{} handlers ran at once on an engine with two slots",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(in_flight.load(Ordering::SeqCst), 0);
}
