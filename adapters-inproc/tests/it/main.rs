//! Behaviour of the in-process queue: at-least-once delivery.

use std::time::Duration;

use flowforge_adapters_inproc::InprocQueue;
use flowforge_ports::{
    Delivery, Dispatch, DispatchConsumer, DispatchId, DispatchPublisher, DispatchQueue, RunId, TaskRunId,
};

fn dispatch(n: i64) -> Dispatch {
    Dispatch {
        dispatch_id: DispatchId(n),
        task_run_id: TaskRunId(n),
        run_id: RunId(uuid::Uuid::nil()),
        task_key: format!("t{n}"),
        task_type: "noop".into(),
        fencing_token: 0,
        ready_at: None,
    }
}

async fn publish(q: &InprocQueue, ns: &[i64]) {
    let batch: Vec<Dispatch> = ns.iter().map(|&n| dispatch(n)).collect();
    assert!(q.publish(&batch).await.into_iter().all(|r| r.is_ok()));
}

#[tokio::test]
async fn delivers_in_order_and_ack_removes() {
    let q = InprocQueue::new();
    publish(&q, &[1, 2]).await;
    let mut c = q.consumer().await.unwrap();
    let d = c.next().await.unwrap().unwrap();
    assert_eq!(d.dispatch().dispatch_id, DispatchId(1));
    assert!(!d.redelivered());
    d.ack().await.unwrap();
    let d = c.next().await.unwrap().unwrap();
    assert_eq!(d.dispatch().dispatch_id, DispatchId(2));
    d.ack().await.unwrap();
    assert!(q.is_empty());
}

#[tokio::test]
async fn a_nacked_or_dropped_delivery_comes_back_redelivered() {
    let q = InprocQueue::new();
    publish(&q, &[7]).await;
    let mut c = q.consumer().await.unwrap();
    c.next().await.unwrap().unwrap().nack_requeue().await.unwrap();
    let again = c.next().await.unwrap().unwrap();
    assert!(again.redelivered());
    drop(again);
    let mut other = q.consumer().await.unwrap();
    drop(c);
    let third = other.next().await.unwrap().unwrap();
    assert_eq!(third.dispatch().dispatch_id, DispatchId(7));
    assert!(third.redelivered());
    third.ack().await.unwrap();
    assert!(q.is_empty());
}

#[tokio::test]
async fn a_waiting_consumer_is_woken_and_close_ends_it() {
    let q = InprocQueue::new();
    let mut c = q.consumer().await.unwrap();
    let waiter = tokio::spawn(async move {
        let d = c.next().await.unwrap().unwrap();
        let id = d.dispatch().dispatch_id;
        d.ack().await.unwrap();
        (id, c.next().await.unwrap().is_none())
    });
    tokio::task::yield_now().await;
    publish(&q, &[3]).await;
    q.close();
    let (id, closed) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, DispatchId(3));
    assert!(closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_consumers_share_the_work_exactly_once() {
    let q = InprocQueue::new();
    let mut handles = Vec::new();
    for _ in 0..4 {
        let mut c = q.consumer().await.unwrap();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = c.next().await.unwrap() {
                got.push(d.dispatch().dispatch_id.0);
                d.ack().await.unwrap();
            }
            got
        }));
    }
    let ids: Vec<i64> = (0..1000).collect();
    publish(&q, &ids).await;
    while !q.is_empty() {
        tokio::task::yield_now().await;
    }
    q.close();
    let mut all = Vec::new();
    for h in handles {
        all.extend(tokio::time::timeout(Duration::from_secs(10), h).await.unwrap().unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, ids);
}
