//! Contract cases: reads: runs, task inputs, the worker registry and the event history.

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_domain::{RunState, RunTransition};
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::ids::RunId;
use crate::store::{RunPass, RunStore, Scope, WorkerRegistration, WorkerRegistry};

use super::*;

/// `get_run` returns the run, its task runs in creation order and its
/// merged history; `list_runs` the newest runs first.
pub async fn get_run_and_list_runs_report_runs<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    assert!(s.get_run(RunId(uuid::Uuid::nil())).await.expect("get_run").is_none());
    assert!(s.list_runs(10).await.expect("list_runs").is_empty());
    let p = publish(&s, chain()).await;
    let older = s.start_run(p.id, json!({"i": 1})).await.expect("start");
    clock.advance(Duration::from_secs(1));
    let newer = s.start_run(p.id, json!({"i": 2})).await.expect("start");
    let listed: Vec<RunId> = s.list_runs(10).await.expect("list_runs").iter().map(|r| r.id).collect();
    assert_eq!(listed, [newer, older], "newest first");
    let top = s.list_runs(1).await.expect("list_runs");
    assert_eq!(top.len(), 1);
    assert_eq!(
        (top[0].id, top[0].workflow.as_str(), top[0].version),
        (newer, "chain", 1)
    );
    assert_eq!(top[0].state, RunState::Pending);

    let a = claim(&s, older, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"out": 1}))).await;
    let mut ps = pass(&s, older).await;
    ps.take_flagged().await.expect("take_flagged");
    ps.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    assert!(ps.create_compensator("undo_a", "a").await.expect("create"));
    // At one instant task events precede the run transition they led to.
    assert!(ps.transition_run(RunTransition::Start).await.expect("start"));
    ps.commit().await.expect("commit");

    let d = s.get_run(older).await.expect("get_run").expect("exists");
    assert_eq!(d.input, json!({"i": 1}));
    assert_eq!(d.summary.state, RunState::Running);
    let keys: Vec<&str> = d.tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c", "undo_a"], "creation order");
    let history: Vec<(Option<&str>, &str)> = d
        .events
        .iter()
        .map(|e| (e.task.as_deref(), e.transition.as_str()))
        .collect();
    assert_eq!(
        history,
        [
            (Some("a"), "claim"),
            (Some("a"), "succeed"),
            (Some("b"), "dependencies_satisfied"),
            (None, "start")
        ]
    );
    let start = &d.events[3];
    assert_eq!((start.attempt, start.token, start.worker.as_ref()), (None, None, None));
    assert!(d.events.windows(2).all(|w| w[0].at <= w[1].at), "oldest first");
}

/// `task_inputs` reads the run input and the outputs of the named tasks
/// that succeeded.
pub async fn task_inputs_read_the_run_input_and_outputs<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    let run = s.start_run(p.id, json!({"day": 3})).await.expect("start");
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"from": "a"}))).await;
    let b = claim(&s, run, "b", "w", LONG).await;
    finish(&s, &b, "w", succeeded(json!(["b", 2]))).await;
    let inputs = s
        .task_inputs(run, &["a".into(), "b".into(), "d".into()], usize::MAX)
        .await
        .expect("task_inputs");
    assert_eq!(inputs.run_input, json!({"day": 3}));
    assert_eq!(inputs.outputs.len(), 2, "d has no output");
    assert_eq!(inputs.outputs.get("a"), Some(&json!({"from": "a"})));
    assert_eq!(inputs.outputs.get("b"), Some(&json!(["b", 2])));
    let none = s.task_inputs(run, &[], usize::MAX).await.expect("task_inputs");
    assert!(none.outputs.is_empty());
    assert_eq!(none.run_input, json!({"day": 3}));
}

/// Workers register, refresh and deregister; live task types are those of
/// workers seen recently (store time) and not stopped.
pub async fn worker_registry_tracks_workers_and_live_task_types<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    assert!(s.list_workers().await.expect("list_workers").is_empty());
    let w1 = WorkerRegistration {
        id: worker("host-1-aaaa"),
        host: "host-1".into(),
        pid: 101,
        task_types: vec!["noop".into(), "echo".into()],
        concurrency: 4,
    };
    let w2 = WorkerRegistration {
        id: worker("host-2-bbbb"),
        host: "host-2".into(),
        pid: 202,
        task_types: vec!["command".into()],
        concurrency: 1,
    };
    s.register_worker(&w1).await.expect("register");
    s.register_worker(&w2).await.expect("register");
    let listed = s.list_workers().await.expect("list_workers");
    assert_eq!(listed.len(), 2);
    let info = listed.iter().find(|w| w.id == w1.id).expect("w1");
    let mut types = info.task_types.clone();
    types.sort();
    assert_eq!(types, ["echo", "noop"]);
    assert_eq!((info.host.as_str(), info.pid, info.concurrency), ("host-1", 101, 4));
    assert!(info.stopped_at.is_none());
    assert_store_time(info.started_at, clock.offset());
    let first_start = info.started_at;
    let minute = Duration::from_secs(60);
    assert_eq!(
        s.live_task_types(minute).await.expect("live"),
        BTreeSet::from(["command".into(), "echo".into(), "noop".into()])
    );

    clock.advance(Duration::from_secs(120));
    s.touch_worker(&w1.id).await.expect("touch");
    let listed = s.list_workers().await.expect("list_workers");
    assert_eq!(listed[0].id, w1.id, "most recently seen first");
    assert!(listed[0].last_seen_at > listed[1].last_seen_at);
    assert_eq!(
        s.live_task_types(minute).await.expect("live"),
        BTreeSet::from(["echo".into(), "noop".into()]),
        "w2 was not seen within the window"
    );

    s.deregister_worker(&w1.id).await.expect("deregister");
    let info = s.list_workers().await.expect("list_workers");
    let info = info.iter().find(|w| w.id == w1.id).expect("w1");
    assert!(info.stopped_at.is_some());
    assert!(
        s.live_task_types(minute).await.expect("live").is_empty(),
        "a stopped worker serves nothing"
    );

    s.register_worker(&w1).await.expect("register again");
    let info = s.list_workers().await.expect("list_workers");
    let info = info.iter().find(|w| w.id == w1.id).expect("w1");
    assert!(info.stopped_at.is_none(), "registering again revives it");
    assert_eq!(info.started_at, first_start, "started_at is the first registration");
}

/// Every transition of a run's life is in its history with the right
/// from, to and attempt, tokens rising with each claim, run transitions
/// among them.
pub async fn the_event_history_records_every_transition<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let doc = json!({"name": "life", "version": 1, "tasks": [
        {"key": "a", "task_type": "flaky", "retry": {"max_attempts": 2}},
        {"key": "b", "task_type": "noop", "depends_on": ["a"]}
    ]});
    let run = start(&s, doc).await;
    let first = first_attempt_flakes(&s, &clock, run).await;
    let second = claim(&s, run, "a", "w2", LONG).await;
    finish(&s, &second, "w2", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    let b = claim(&s, run, "b", "w1", LONG).await;
    finish(&s, &b, "w1", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(RunTransition::Succeed).await.expect("succeed");
    p.commit().await.expect("commit");

    let history = events(&s, run).await;
    let got: Vec<Step<'_>> = history
        .iter()
        .map(|e| {
            (
                e.task.as_deref(),
                e.transition.as_str(),
                e.from.as_deref(),
                e.to.as_deref(),
                e.attempt,
            )
        })
        .collect();
    let a = Some("a");
    let b_ = Some("b");
    assert_eq!(
        got,
        [
            (a, "claim", Some("ready"), Some("running"), Some(1)),
            (None, "start", Some("pending"), Some("running"), None),
            (a, "fail", Some("running"), Some("failed"), Some(1)),
            (a, "schedule_retry", Some("failed"), Some("retrying"), Some(2)),
            (a, "retry_ready", Some("retrying"), Some("ready"), Some(2)),
            (a, "claim", Some("ready"), Some("running"), Some(2)),
            (a, "succeed", Some("running"), Some("succeeded"), Some(2)),
            (b_, "dependencies_satisfied", Some("pending"), Some("ready"), Some(1)),
            (b_, "claim", Some("ready"), Some("running"), Some(1)),
            (b_, "succeed", Some("running"), Some("succeeded"), Some(1)),
            (None, "succeed", Some("running"), Some("succeeded"), None),
        ]
    );
    let workers: Vec<Option<&str>> = history
        .iter()
        .filter(|e| e.transition == "claim")
        .map(|e| e.worker.as_deref())
        .collect();
    assert_eq!(workers, [Some("w1"), Some("w2"), Some("w1")]);
    let a_tokens: Vec<i64> = history
        .iter()
        .filter(|e| e.task.as_deref() == Some("a"))
        .map(|e| e.token.expect("a token"))
        .collect();
    assert!(
        a_tokens.windows(2).all(|w| w[0] <= w[1]),
        "tokens never go back: {a_tokens:?}"
    );
    assert!(second.token > first.token, "each claim bumps the token");
    assert_eq!((a_tokens[0], a_tokens[5]), (first.token, second.token));
    assert!(history.windows(2).all(|w| w[0].at <= w[1].at));
}

/// Wide runs are written whole: starting 10 000 ready tasks, cancelling
/// them in one pass, and promoting a 9 999-task fan-out in one pass each
/// write every row, event and dispatch. That each is a batch, and how its
/// plan scales, is checked by the stores' plan tests (PostgreSQL's
/// `explain.rs`, SQLite's `plans.rs`) and measured by `cargo xtask bench`,
/// not timed here.
pub async fn wide_runs_are_written_in_batches<F: StoreFactory>(factory: &F) {
    const WIDE: usize = 10_000;
    let (s, _) = fresh(factory).await;

    let roots: Vec<Value> = (0..WIDE)
        .map(|i| json!({"key": format!("t{i:05}"), "task_type": "noop"}))
        .collect();
    let p = publish(&s, json!({"name": "wide", "version": 1, "tasks": roots})).await;
    let run = s.start_run(p.id, json!({})).await.expect("start_run");
    assert_eq!(
        unpublished(&s, Scope::Run(run)).await.len(),
        WIDE,
        "one dispatch per root"
    );
    assert!(s.request_cancel(run).await.expect("cancel").is_some());
    let mut ps = pass(&s, run).await;
    assert_eq!(ps.cancel_waiting().await.expect("cancel_waiting").len(), WIDE);
    ps.commit().await.expect("commit");

    let mut fan = vec![json!({"key": "root", "task_type": "noop"})];
    fan.extend((1..WIDE).map(|i| json!({"key": format!("f{i:05}"), "task_type": "noop", "depends_on": ["root"]})));
    let p = publish(&s, json!({"name": "fan", "version": 1, "tasks": fan})).await;
    let run = s.start_run(p.id, json!({})).await.expect("start_run");
    let root = claim(&s, run, "root", "w", LONG).await;
    finish(&s, &root, "w", succeeded(json!({}))).await;
    let done: Vec<(String, u32)> = (1..WIDE).map(|i| (format!("f{i:05}"), 1)).collect();
    let mut ps = pass(&s, run).await;
    ps.take_flagged().await.expect("take_flagged");
    let promoted = ps.satisfy_dependencies(&done).await.expect("satisfy");
    ps.commit().await.expect("commit");
    assert_eq!(promoted.len(), WIDE - 1);
    let dispatched = unpublished(&s, Scope::Run(run)).await;
    assert_eq!(dispatched.len(), WIDE, "the root's dispatch and one per promoted task");
    let history = events(&s, run).await;
    assert_eq!(
        history
            .iter()
            .filter(|e| e.transition == "dependencies_satisfied")
            .count(),
        WIDE - 1
    );
}
