//! The publisher: confirmed publishes land with the exact payload, returns
//! are unroutable, and a large batch is confirmed in one go.

use std::collections::BTreeSet;
use std::time::Instant;

use flowforge_adapters_rabbit::{RabbitPublisher, RabbitQueue};
use flowforge_ports::{
    Delivery as _, Dispatch, DispatchConsumer as _, DispatchPublisher as _, DispatchQueue as _, queue,
};
use tokio::sync::{mpsc, watch};

use crate::support::{Fixture, dispatch, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_publish_lands_on_the_bound_quorum_queue_with_the_exact_payload() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "lands").await;
    RabbitQueue::new(fx.config()).unwrap().declare().await.unwrap();
    let publisher = RabbitPublisher::new(fx.config()).unwrap();
    let sent = dispatch(7);

    assert_eq!(publisher.publish(std::slice::from_ref(&sent)).await, vec![Ok(())]);

    let message = fx.get().await.expect("the confirmed dispatch is on the queue");
    assert_eq!(message.delivery.data, serde_json::to_vec(&sent).unwrap());
    assert_eq!(
        serde_json::from_slice::<Dispatch>(&message.delivery.data).unwrap(),
        sent
    );
    let properties = &message.delivery.properties;
    assert_eq!(
        properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(properties.message_id().as_ref().map(|s| s.as_str()), Some("7"));
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    assert!(fx.get().await.is_none(), "exactly one message");
    // A quorum queue: declaring it classic contradicts its x-queue-type.
    let refusal = fx.declare_classic_queue().await.expect_err("the queue is not classic");
    assert!(refusal.to_string().contains("x-queue-type"), "{refusal}");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_publish_is_unroutable_although_the_broker_acks_it() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "unroutable").await;
    // The publisher declares the exchange; nothing binds a queue to it.
    let publisher = RabbitPublisher::new(fx.config()).unwrap();
    let batch: Vec<Dispatch> = (1..=50).map(dispatch).collect();

    let results = publisher.publish(&batch).await;

    let expected: Vec<Result<(), queue::Error>> = batch
        .iter()
        .map(|d| Err(queue::Error::Unroutable(d.dispatch_id)))
        .collect();
    assert_eq!(results, expected);
    // Once a queue is bound, the same publisher routes: no return lingers.
    RabbitQueue::new(fx.config()).unwrap().declare().await.unwrap();
    assert_eq!(publisher.publish(&batch[..3]).await, vec![Ok(()), Ok(()), Ok(())]);
    assert_eq!(fx.drain().await, batch[..3].to_vec());
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_a_thousand_is_confirmed_and_consumed_exactly_once() {
    const N: i64 = 1000;
    const CONSUMERS: usize = 4;
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "batch").await;
    let queue = std::sync::Arc::new(RabbitQueue::new(fx.config()).unwrap());
    queue.declare().await.unwrap();
    let publisher = RabbitPublisher::new(fx.config()).unwrap();
    publisher.connect().await.unwrap();
    let batch: Vec<Dispatch> = (1..=N).map(dispatch).collect();

    let started = Instant::now();
    let results = within(60, "publishing 1000", publisher.publish(&batch)).await;
    let elapsed = started.elapsed();

    assert!(
        results.iter().all(Result::is_ok),
        "{:?}",
        results.iter().find(|r| r.is_err())
    );
    assert_eq!(results.len(), batch.len());
    println!(
        "confirmed publishes/s for a batch of {N}: {:.0} ({elapsed:?})",
        N as f64 / elapsed.as_secs_f64()
    );
    // Consume them all on several consumers; each reports a dispatch once
    // its ack went out, and closes its channel (waiting for the broker)
    // when told to stop.
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut workers = Vec::new();
    for _ in 0..CONSUMERS {
        let (queue, seen_tx, mut stop_rx) = (queue.clone(), seen_tx.clone(), stop_rx.clone());
        workers.push(tokio::spawn(async move {
            let mut consumer = queue.consumer().await.unwrap();
            loop {
                tokio::select! {
                    next = consumer.next() => {
                        let delivery = next.unwrap().unwrap();
                        let id = delivery.dispatch().dispatch_id.0;
                        delivery.ack().await.unwrap();
                        seen_tx.send(id).unwrap();
                    }
                    _ = stop_rx.changed() => break,
                }
            }
            consumer.close().await.unwrap();
        }));
    }
    let mut seen = Vec::new();
    while seen.len() < N as usize {
        seen.push(within(30, "the next consumed dispatch", seen_rx.recv()).await.unwrap());
    }
    stop_tx.send(true).unwrap();
    for worker in workers {
        within(10, "a consumer closing", worker).await.unwrap();
    }

    while let Ok(late) = seen_rx.try_recv() {
        seen.push(late);
    }
    let distinct: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(seen.len(), N as usize, "no dispatch consumed twice");
    assert_eq!(distinct, (1..=N).collect::<BTreeSet<_>>());
    assert_eq!(fx.ready().await, 0, "nothing left or requeued");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_the_queue_refuses_is_nacked_while_the_rest_of_the_batch_confirms() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "nacked").await;
    // A queue bound by hand that holds three messages and refuses more: the
    // broker nacks what it cannot store.
    let publisher = RabbitPublisher::new(fx.config()).unwrap();
    publisher.connect().await.unwrap();
    fx.declare_full_queue(3).await;
    let batch: Vec<Dispatch> = (1..=8).map(dispatch).collect();

    let results = publisher.publish(&batch).await;

    let expected: Vec<Result<(), queue::Error>> = batch
        .iter()
        .map(|d| {
            if d.dispatch_id.0 <= 3 {
                Ok(())
            } else {
                Err(queue::Error::Nacked(d.dispatch_id))
            }
        })
        .collect();
    assert_eq!(results, expected);
    assert_eq!(fx.drain().await, batch[..3].to_vec());
    fx.cleanup().await;
}
