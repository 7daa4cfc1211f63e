//! Dispatch priorities in the distributed mode
//! (docs/design/priorities.md#the-broker-window): the `flowforge
//! publisher` keeps one ready message per consumer in the quorum queue and
//! leaves the rest in the outbox, swept highest priority first, so work
//! that arrives behind a busy slot is served in priority order, not in the
//! order it came.

use std::sync::{Arc, Mutex, PoisonError};

use flowforge::{HandlerError, Service, TaskContext, TaskTypes};
use flowforge_domain::{Priority, TaskRunState};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::cluster::{Cluster, SdkWorker};
use super::{definition, detail, eventually, task};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_queued_behind_a_busy_slot_is_served_by_priority_through_the_broker_window() {
    let Some(mut cluster) = Cluster::migrated("priorities").await else {
        return;
    };
    let served = Arc::new(Mutex::new(Vec::<u64>::new()));
    let release = Arc::new(Notify::new());
    let (record, held) = (Arc::clone(&served), Arc::clone(&release));
    let worker = cluster
        .worker("priority-worker", 1)
        .handler_fn("prio.job", move |ctx: TaskContext| {
            let (record, held) = (Arc::clone(&record), Arc::clone(&held));
            async move {
                let n = ctx.run_input["n"]
                    .as_u64()
                    .ok_or_else(|| HandlerError::permanent("no n"))?;
                if ctx.run_input["hold"] == json!(true) {
                    held.notified().await;
                }
                record.lock().unwrap_or_else(PoisonError::into_inner).push(n);
                Ok::<Value, HandlerError>(json!({}))
            }
        })
        .build()
        .await
        .expect("the worker builds");
    let serving = SdkWorker::serve(worker);

    let store = cluster.db.store().await;
    super::served(&store, "prio.job").await;
    cluster.spawn("publisher", ["publisher"]);
    cluster.spawn("scheduler", ["scheduler"]);
    let service = Service::new(store.clone());
    let def = definition(&json!({"name": "prio", "version": 1, "tasks": [{"key": "t", "task_type": "prio.job"}]}));
    let published = service
        .publish(&def, &TaskTypes::LiveWorkers)
        .await
        .expect("publish: the worker's type is live");
    let start = |n: u64, p: u8, hold: bool| {
        let service = &service;
        async move {
            let priority = Priority::new(i64::from(p)).expect("on the scale");
            service
                .start(published.id, json!({"n": n, "hold": hold}), priority)
                .await
                .expect("start")
                .id
        }
    };

    // Run 0 holds the only slot; run 1 fills the window (one ready message
    // for the one consumer).
    let blocker = start(0, 5, true).await;
    eventually("the blocker running", || async {
        (task(&detail(&store, blocker).await, "t").state == TaskRunState::Running).then_some(())
    })
    .await;
    start(1, 0, false).await;
    eventually("run 1 in the window", || async {
        (cluster.broker.ready().await == Some(1)).then_some(())
    })
    .await;
    // Everything after it waits in the outbox: published as it came, a
    // quorum queue would serve it first come, first served.
    for (n, p) in [(2, 3), (3, 9), (4, 5), (5, 9), (6, 1), (7, 5)] {
        start(n, p, false).await;
    }
    release.notify_one();

    let order = eventually("every run served", || async {
        let order = served.lock().unwrap_or_else(PoisonError::into_inner).clone();
        (order.len() == 8).then_some(order)
    })
    .await;
    assert_eq!(order, [0, 1, 3, 5, 4, 7, 2, 6], "{}", cluster.logs());

    serving.stop().await;
}
