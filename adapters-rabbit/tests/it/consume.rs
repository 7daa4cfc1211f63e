//! The consumer: prefetch 1, ack, nack with requeue, redelivery when a
//! delivery or its consumer is dropped, and poison messages.

use flowforge_adapters_rabbit::{RabbitConsumer, RabbitDelivery, RabbitPublisher, RabbitQueue};
use flowforge_ports::{Delivery as _, Dispatch, DispatchConsumer as _, DispatchPublisher as _, DispatchQueue as _};
use lapin::options::BasicGetOptions;
use lapin::options::BasicNackOptions;

use crate::support::{Fixture, capture_errors, dispatch, within};

/// A test's queue, with the dispatches `numbers` published to it.
async fn queue_with(fx: &Fixture, numbers: &[i64]) -> RabbitQueue {
    let queue = RabbitQueue::new(fx.config()).unwrap();
    queue.declare().await.unwrap();
    let batch: Vec<Dispatch> = numbers.iter().copied().map(dispatch).collect();
    let results = RabbitPublisher::new(fx.config()).unwrap().publish(&batch).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    queue
}

/// The consumer's next delivery, which must come within 10 s.
async fn next(consumer: &mut RabbitConsumer) -> RabbitDelivery {
    within(10, "the next delivery", consumer.next())
        .await
        .unwrap()
        .expect("a delivery")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_one_holds_back_the_second_message_until_the_first_is_acked() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "prefetch").await;
    let queue = queue_with(&fx, &[1, 2]).await;
    let mut consumer = queue.consumer().await.unwrap();

    let first = next(&mut consumer).await;
    assert_eq!(first.dispatch(), &dispatch(1));
    // With the first unacked, the broker kept the second on the queue
    // rather than pushing it to the consumer: a basic.get finds it there.
    let probe = fx.probe_channel().await;
    let held = probe
        .basic_get(fx.queue.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("the second message is still on the queue");
    assert_eq!(
        serde_json::from_slice::<Dispatch>(&held.delivery.data).unwrap(),
        dispatch(2)
    );
    held.delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            multiple: false,
        })
        .await
        .unwrap();
    first.ack().await.unwrap();
    let second = next(&mut consumer).await;
    assert_eq!(second.dispatch(), &dispatch(2));
    second.ack().await.unwrap();
    consumer.close().await.unwrap();
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_travels_in_a_header_and_ready_at_in_the_payload() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "traceparent").await;
    let queue = RabbitQueue::new(fx.config()).unwrap();
    queue.declare().await.unwrap();
    let mut sent = dispatch(3);
    sent.ready_at = Some(chrono::DateTime::from_timestamp_millis(1_796_000_000_123).unwrap());
    let results = RabbitPublisher::new(fx.config())
        .unwrap()
        .publish(std::slice::from_ref(&sent))
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut consumer = queue.consumer().await.unwrap();

    let delivery = next(&mut consumer).await;
    assert_eq!(delivery.dispatch(), &sent);
    let expected = format!("00-{}-0000000000000003-01", sent.run_id.0.simple());
    assert_eq!(delivery.trace_parent(), Some(expected.as_str()));
    delivery.ack().await.unwrap();
    consumer.close().await.unwrap();
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_removes_the_message() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "ack").await;
    let queue = queue_with(&fx, &[1, 2]).await;
    let mut consumer = queue.consumer().await.unwrap();

    for n in [1, 2] {
        let delivery = next(&mut consumer).await;
        assert_eq!(delivery.dispatch(), &dispatch(n));
        assert!(!delivery.redelivered());
        delivery.ack().await.unwrap();
    }
    // Closing requeues whatever is unacked; the broker processed the acks
    // before the close, so nothing comes back.
    consumer.close().await.unwrap();
    assert_eq!(fx.ready().await, 0);
    fx.cleanup().await;
}

/// Frames are 16 KiB unless the URL says otherwise (the adapter's
/// `DEFAULT_FRAME_MAX`): a dispatch several frames long is split on the way
/// in and joined on the way out, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_longer_than_several_frames_arrives_whole() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "bigframes").await;
    let queue = RabbitQueue::new(fx.config()).unwrap();
    queue.declare().await.unwrap();
    let mut big = dispatch(1);
    big.task_key = "k".repeat(3 * flowforge_adapters_rabbit::DEFAULT_FRAME_MAX as usize + 17);
    let publisher = RabbitPublisher::new(fx.config()).unwrap();
    assert_eq!(publisher.publish(std::slice::from_ref(&big)).await, vec![Ok(())]);
    let mut consumer = queue.consumer().await.unwrap();
    let delivery = next(&mut consumer).await;
    assert_eq!(delivery.dispatch(), &big);
    delivery.ack().await.unwrap();
    consumer.close().await.unwrap();
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_requeue_redelivers_with_redelivered_set() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "nack").await;
    let queue = queue_with(&fx, &[1]).await;
    let mut consumer = queue.consumer().await.unwrap();

    let first = next(&mut consumer).await;
    assert!(!first.redelivered());
    first.nack_requeue().await.unwrap();
    let again = next(&mut consumer).await;
    assert_eq!(again.dispatch(), &dispatch(1));
    assert!(again.redelivered());
    again.ack().await.unwrap();
    consumer.close().await.unwrap();
    assert_eq!(fx.ready().await, 0);
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_delivery_is_delivered_again() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "dropdelivery").await;
    let queue = queue_with(&fx, &[1]).await;
    let mut consumer = queue.consumer().await.unwrap();

    drop(next(&mut consumer).await);
    let again = next(&mut consumer).await;
    assert_eq!(again.dispatch(), &dispatch(1));
    assert!(again.redelivered());
    again.ack().await.unwrap();
    consumer.close().await.unwrap();
    assert_eq!(fx.ready().await, 0);
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_consumer_redelivers_its_unacked_delivery_and_its_ack_fails() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "dropconsumer").await;
    let queue = queue_with(&fx, &[1]).await;
    let mut first_consumer = queue.consumer().await.unwrap();
    let orphan = next(&mut first_consumer).await;

    drop(first_consumer);
    let mut second_consumer = queue.consumer().await.unwrap();
    let again = next(&mut second_consumer).await;
    assert_eq!(again.dispatch(), &dispatch(1));
    assert!(again.redelivered());
    // The first delivery's channel is gone: its ack cannot succeed.
    let stale = within(10, "the stale ack", orphan.ack()).await;
    assert!(stale.is_err(), "{stale:?}");
    again.ack().await.unwrap();
    second_consumer.close().await.unwrap();
    assert_eq!(fx.ready().await, 0);
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_a_dispatch_is_rejected_once_and_skipped() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "poison").await;
    let queue = queue_with(&fx, &[]).await;
    fx.publish_raw(b"{\"not\": \"a dispatch\"}").await;
    fx.publish_raw(&[0xff, 0xfe, 0x00]).await;
    fx.publish_raw(&serde_json::to_vec(&dispatch(3)).unwrap()).await;
    let mut consumer = queue.consumer().await.unwrap();
    let (guard, logs) = capture_errors();

    let valid = next(&mut consumer).await;
    drop(guard);
    assert_eq!(valid.dispatch(), &dispatch(3));
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert_eq!(logs.matches("ERROR").count(), 2, "{logs}");
    assert!(logs.contains("rejecting a message that is not a dispatch"), "{logs}");
    assert!(logs.contains(r#"payload={"not": "a dispatch"}"#), "{logs}");
    assert!(!valid.redelivered());
    valid.ack().await.unwrap();
    consumer.close().await.unwrap();
    assert_eq!(fx.ready().await, 0, "rejected without requeue, not looping");
    fx.cleanup().await;
}
