//! Behaviour of the in-process queue: at-least-once delivery.

use std::time::Duration;

use flowforge_adapters_inproc::InprocQueue;
use flowforge_domain::Priority;
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
        priority: Priority::DEFAULT,
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
async fn try_next_takes_what_waits_beside_an_unacked_delivery() {
    let q = InprocQueue::new();
    let mut c = q.consumer().await.unwrap();
    assert!(c.try_next().is_none(), "nothing waits");
    publish(&q, &[1, 2]).await;
    let first = c.next().await.unwrap().unwrap();
    let second = c.try_next().expect("the second waits beside the first, unacked");
    assert_eq!(
        (first.dispatch().dispatch_id, second.dispatch().dispatch_id),
        (DispatchId(1), DispatchId(2))
    );
    assert!(c.try_next().is_none(), "nothing more waits");
    // Dropped unacked, it comes back as a `next` delivery would.
    drop(second);
    first.ack().await.unwrap();
    let again = c.try_next().expect("the dropped one is back");
    assert_eq!(again.dispatch().dispatch_id, DispatchId(2));
    assert!(again.redelivered());
    again.ack().await.unwrap();
    assert!(q.is_empty());

    // A closed queue still hands out what it holds, then ends.
    publish(&q, &[3]).await;
    q.close();
    let last = c.next().await.unwrap().expect("what it held");
    assert_eq!(last.dispatch().dispatch_id, DispatchId(3));
    last.ack().await.unwrap();
    assert!(c.next().await.unwrap().is_none(), "closed and empty");
    assert!(c.try_next().is_none());
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

fn ranked(n: i64, priority: u8, ready_seconds: i64) -> Dispatch {
    Dispatch {
        priority: Priority::new(i64::from(priority)).expect("on the scale"),
        ready_at: chrono::DateTime::from_timestamp(1_800_000_000 + ready_seconds, 0),
        ..dispatch(n)
    }
}

async fn drain(q: &InprocQueue) -> Vec<i64> {
    let mut c = q.consumer().await.expect("a consumer");
    let mut order = Vec::new();
    while !q.is_empty() {
        let d = c.next().await.expect("a delivery").expect("open");
        order.push(d.dispatch().dispatch_id.0);
        d.ack().await.expect("ack");
    }
    order
}

#[tokio::test]
async fn hands_out_the_highest_priority_first_and_fifo_within_one() {
    let q = InprocQueue::new();
    let batch = [
        ranked(1, 0, 0),
        ranked(2, 5, 1),
        ranked(3, 9, 2),
        ranked(4, 5, 3),
        ranked(5, 9, 4),
    ];
    assert!(q.publish(&batch).await.into_iter().all(|r| r.is_ok()));
    assert_eq!(drain(&q).await, [3, 5, 2, 4, 1]);
}

#[tokio::test]
async fn waiting_work_ages_past_newer_higher_priority_work() {
    // One level per 10 s: a priority-0 dispatch ready at 0 s outranks
    // priority-9 work ready after 90 s, and is outranked by any sooner.
    let q = InprocQueue::with_aging(Duration::from_secs(10));
    let batch = [ranked(1, 0, 0), ranked(2, 9, 89), ranked(3, 9, 91), ranked(4, 9, 200)];
    assert!(q.publish(&batch).await.into_iter().all(|r| r.is_ok()));
    assert_eq!(drain(&q).await, [2, 1, 3, 4]);
}

#[tokio::test]
async fn a_redelivery_keeps_its_place_in_the_order() {
    let q = InprocQueue::new();
    assert!(
        q.publish(&[ranked(1, 9, 0), ranked(2, 1, 0)])
            .await
            .into_iter()
            .all(|r| r.is_ok())
    );
    let mut c = q.consumer().await.unwrap();
    let first = c.next().await.unwrap().unwrap();
    assert_eq!(first.dispatch().dispatch_id.0, 1);
    drop(first);
    let again = c.next().await.unwrap().unwrap();
    assert_eq!((again.dispatch().dispatch_id.0, again.redelivered()), (1, true));
    again.ack().await.unwrap();
    assert_eq!(drain(&q).await, [2]);
}

/// A slot may run a dispatch itself only when the queue would not deliver
/// anything before it (docs/design/outbox-and-queues.md#continuing-a-chain).
#[tokio::test]
async fn it_tells_whether_it_holds_work_more_urgent_than_a_dispatch() {
    let q = InprocQueue::new();
    assert!(!q.holds_more_urgent(&ranked(1, 5, 0)), "an empty queue holds nothing");
    assert!(q.publish(&[ranked(2, 5, 10)]).await.into_iter().all(|r| r.is_ok()));
    assert!(
        q.holds_more_urgent(&ranked(3, 5, 20)),
        "the same priority, ready earlier, goes first"
    );
    assert!(
        q.holds_more_urgent(&ranked(3, 1, 5)),
        "a lower priority waits behind the queued one though ready sooner"
    );
    assert!(
        !q.holds_more_urgent(&ranked(3, 9, 20)),
        "a higher priority goes before the queued one though ready later"
    );
    assert!(
        !q.holds_more_urgent(&ranked(1, 5, 10)),
        "nor does work ready at the same time with a later id"
    );
}
