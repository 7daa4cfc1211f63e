//! The worker SDK (`flowforge::Worker`): one set of handlers runs unchanged
//! in the embedded engine and in a distributed worker process beside the
//! `flowforge` scheduler and publisher; progress shows while a task runs;
//! an `http` task runs in both; shutdown drains.

use std::sync::Arc;

use flowforge::{
    Embedded, HTTP_TASK_TYPE, HandlerError, HttpTask, HttpTaskOptions, RunState, Service, TaskContext, TaskTypes,
};
use flowforge_domain::{Priority, TaskRunState};
use flowforge_ports::WorkerRegistry as _;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::cluster::{Cluster, SdkWorker};
use super::{definition, detail, eventually, task};
use crate::hook::Hook;

/// An async handler, as a user writes it once for both modes.
async fn greet(ctx: TaskContext) -> Result<Value, HandlerError> {
    let name = ctx.run_input["name"]
        .as_str()
        .ok_or_else(|| HandlerError::permanent("run input needs a `name`"))?;
    Ok(json!({
        "greeting": format!("hello, {name}"),
        "attempt": ctx.attempt,
        "keyed": ctx.idempotency_key == format!("{}:{}", ctx.run_id, ctx.task_key),
        "fenced": ctx.token > 0,
    }))
}

/// A blocking handler, as a user writes it once for both modes.
fn shout(ctx: TaskContext) -> Result<Value, HandlerError> {
    let greeting = ctx.inputs["greet"]["greeting"]
        .as_str()
        .ok_or_else(|| HandlerError::permanent("no greeting"))?;
    Ok(json!({ "loud": greeting.to_uppercase() }))
}

fn flow(hook: &str) -> Value {
    json!({"name": "sdk", "version": 1, "tasks": [
        {"key": "greet", "task_type": "sdk.greet"},
        {"key": "shout", "task_type": "sdk.shout", "depends_on": ["greet"]},
        {"key": "notify", "task_type": "http", "depends_on": ["shout"], "config": {
            "method": "POST", "url": format!("{hook}/notify"), "body_from": "inputs",
            "headers": {"X-Flow": "sdk"}
        }},
        {"key": "wait", "task_type": "sdk.wait", "depends_on": ["notify"]}
    ]})
}

fn http_task() -> HttpTask {
    HttpTask::new(HttpTaskOptions::default()).expect("the http task type")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_of_handlers_runs_embedded_and_distributed() {
    let Some(mut cluster) = Cluster::migrated("sdk").await else {
        return;
    };
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    let hook = Hook::start(vec![(200, r#"{"delivered": true}"#)]).await;
    let def = definition(&flow(&hook.base));

    // The distributed worker: the user's handlers plus one that reports
    // progress and holds until the test has seen it.
    let release = Arc::new(Notify::new());
    let held = Arc::clone(&release);
    let worker = cluster
        .worker("sdk-worker", 2)
        .handler_fn("sdk.greet", greet)
        .blocking_handler("sdk.shout", shout)
        .handler(HTTP_TASK_TYPE, http_task())
        .handler_fn("sdk.wait", move |ctx: TaskContext| {
            let held = Arc::clone(&held);
            async move {
                ctx.progress(json!({"stage": "waiting"}));
                tokio::select! {
                    () = held.notified() => Ok(json!({"waited": true})),
                    () = ctx.cancel.cancelled() => Err(HandlerError::retryable("cancelled")),
                }
            }
        })
        .build()
        .await
        .expect("the worker builds");
    assert!(worker.task_types().iter().any(|t| t == "sdk.greet"));
    let serving = SdkWorker::serve(worker);

    let store = cluster.db.store().await;
    super::served(&store, "sdk.greet").await;
    let service = Service::new(store.clone());
    let published = service
        .publish(&def, &TaskTypes::LiveWorkers)
        .await
        .expect("publish: the worker's types are live");
    let run = service
        .start(published.id, json!({"name": "Ada"}), Priority::DEFAULT)
        .await
        .expect("start")
        .id;
    let progress = eventually("the waiting task's progress", || async {
        let d = detail(&store, run).await;
        let t = task(&d, "wait");
        (t.state == TaskRunState::Running).then(|| t.progress.clone()).flatten()
    })
    .await;
    assert_eq!(progress, json!({"stage": "waiting"}));
    release.notify_one();
    let done = eventually("the run's end", || async {
        let d = detail(&store, run).await;
        (d.summary.state != RunState::Running && d.summary.state != RunState::Pending).then_some(d)
    })
    .await;
    assert_eq!(done.summary.state, RunState::Succeeded, "{done:#?}\n{}", cluster.logs());
    let distributed: Vec<(String, Option<Value>)> =
        done.tasks.iter().map(|t| (t.key.clone(), t.output.clone())).collect();
    assert_eq!(task(&done, "greet").lease_owner, None);

    // Shutdown drains and deregisters.
    serving.stop().await;
    let workers = store.list_workers().await.expect("workers");
    let me = workers.iter().find(|w| w.id.0 == "sdk-worker").expect("registered");
    assert!(me.stopped_at.is_some(), "marked stopped");

    // The same handlers, embedded.
    let engine = Embedded::builder()
        .database("sqlite::memory:")
        .handler_fn("sdk.greet", greet)
        .blocking_handler("sdk.shout", shout)
        .handler(HTTP_TASK_TYPE, http_task())
        .handler_fn("sdk.wait", |ctx: TaskContext| async move {
            ctx.progress(json!({"stage": "waiting"}));
            Ok::<_, HandlerError>(json!({"waited": true}))
        })
        .build()
        .await
        .expect("the engine builds");
    let report = engine.run(&def, json!({"name": "Ada"})).await.expect("the run");
    assert_eq!(report.state, "succeeded", "{report:#?}");
    let embedded: Vec<(String, Option<Value>)> =
        report.tasks.iter().map(|t| (t.key.clone(), t.output.clone())).collect();
    assert_eq!(embedded, distributed, "the same outputs in both modes");
    assert_eq!(
        distributed[0].1,
        Some(json!({"greeting": "hello, Ada", "attempt": 1, "keyed": true, "fenced": true}))
    );
    assert_eq!(distributed[2].1, Some(json!({"delivered": true})));

    let received = hook.received();
    assert_eq!(received.len(), 2, "one call per mode: {received:?}");
    for r in &received {
        assert!(r.head.starts_with("POST /notify "), "{}", r.head);
        assert!(r.head.to_ascii_lowercase().contains("x-flow: sdk"), "{}", r.head);
        assert!(r.head.to_ascii_lowercase().contains("idempotency-key: "), "{}", r.head);
        let body: Value = serde_json::from_str(&r.body).expect("a JSON body");
        assert_eq!(body, json!({"shout": {"loud": "HELLO, ADA"}}));
    }
}

/// `flowforge worker --allow-http --http-allow HOST` serves `http` tasks to
/// the allowed host only; a worker without `--allow-http` serves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_serves_http_tasks_to_allowed_hosts_only() {
    let Some(mut cluster) = Cluster::migrated("http_worker").await else {
        return;
    };
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    cluster.spawn(
        "worker",
        [
            "worker",
            "--concurrency",
            "2",
            "--allow-http",
            "--http-allow",
            "127.0.0.1",
        ],
    );
    let store = cluster.db.store().await;
    super::served(&store, HTTP_TASK_TYPE).await;
    let hook = Hook::start(vec![(201, r#"{"id": 9}"#)]).await;
    let file = cluster.json(
        "calls.json",
        &json!({"name": "calls", "version": 1, "tasks": [
            {"key": "ok", "task_type": "http", "config": {"method": "PUT", "url": format!("{}/x", hook.base)}},
            {"key": "elsewhere", "task_type": "http", "config": {"url": "http://localhost.invalid/"}}
        ]}),
    );
    let run = cluster.submit(&file).await;
    let done = eventually("the run's end", || async {
        let d = detail(&store, run).await;
        matches!(
            d.summary.state,
            RunState::Succeeded | RunState::Failed | RunState::Cancelled
        )
        .then_some(d)
    })
    .await;
    assert_eq!(done.summary.state, RunState::Failed, "{done:#?}");
    assert_eq!(task(&done, "ok").output, Some(json!({"id": 9})), "{}", cluster.logs());
    let refused = task(&done, "elsewhere");
    assert_eq!(refused.state, TaskRunState::Failed);
    let error = refused.error.as_deref().unwrap_or_default();
    assert!(error.contains("--http-allow") || error.contains("allow"), "{error}");
    assert_eq!(hook.received().len(), 1, "only the allowed host was called");
}
