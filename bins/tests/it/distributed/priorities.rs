//! Dispatch priorities in the distributed mode
//! (docs/design/priorities.md#the-broker-window): the `flowforge
//! publisher` keeps one ready message per consumer in the quorum queue and
//! leaves the rest in the outbox, swept highest priority first, so a single
//! worker slot is served in priority order.

use std::sync::{Arc, Mutex, PoisonError};

use flowforge::{HandlerError, Service, TaskContext, TaskTypes, Worker, WorkerId};
use flowforge_domain::Priority;
use serde_json::{Value, json};

use super::cluster::Cluster;
use super::{definition, eventually, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_is_served_highest_priority_first_through_the_broker_window() {
    let Some(mut cluster) = Cluster::migrated("priorities").await else {
        return;
    };
    let served = Arc::new(Mutex::new(Vec::<u64>::new()));
    let record = Arc::clone(&served);
    let worker = Worker::builder()
        .database(cluster.db.url.clone())
        .broker(cluster.broker.url.clone())
        .queue(cluster.broker.queue.clone())
        .concurrency(1)
        .worker_id(WorkerId("priority-worker".to_owned()))
        .handler_fn("prio.job", move |ctx: TaskContext| {
            let record = Arc::clone(&record);
            async move {
                let n = ctx.run_input["n"]
                    .as_u64()
                    .ok_or_else(|| HandlerError::permanent("no n"))?;
                record.lock().unwrap_or_else(PoisonError::into_inner).push(n);
                Ok::<Value, HandlerError>(json!({}))
            }
        })
        .build()
        .await
        .expect("the worker builds");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(worker.run_until(async move {
        let _ = stopped.await;
    }));

    let store = cluster.db.store().await;
    super::served(&store, "prio.job").await;
    let service = Service::new(store);
    let def = definition(&json!({"name": "prio", "version": 1, "tasks": [{"key": "t", "task_type": "prio.job"}]}));
    let published = service
        .publish(&def, &TaskTypes::LiveWorkers)
        .await
        .expect("publish: the worker's type is live");
    // Every run waits in the outbox before the publisher starts, as a
    // backlog does behind a busy slot.
    let priorities = [0u8, 3, 9, 5, 9, 1, 5];
    for (n, p) in priorities.iter().enumerate() {
        let priority = Priority::new(i64::from(*p)).expect("on the scale");
        service
            .start(published.id, json!({"n": n}), priority)
            .await
            .expect("start");
    }
    cluster.spawn("publisher", ["publisher"]);
    cluster.spawn("scheduler", ["scheduler"]);

    let order = eventually("every run served", || async {
        let order = served.lock().unwrap_or_else(PoisonError::into_inner).clone();
        (order.len() == priorities.len()).then_some(order)
    })
    .await;
    assert_eq!(order, [2, 4, 3, 6, 1, 5, 0], "{}", cluster.logs());

    stop.send(()).expect("the worker listens");
    within("the worker's drain", serving)
        .await
        .expect("join")
        .expect("a clean stop");
}
