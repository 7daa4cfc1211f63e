//! Declarations that contradict what exists are reported, never retried.

use flowforge_adapters_rabbit::{RabbitPublisher, RabbitQueue};
use flowforge_ports::{DispatchPublisher as _, DispatchQueue as _, queue};
use lapin::ExchangeKind;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;

use crate::support::{Fixture, dispatch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_queue_of_the_same_name_is_a_type_mismatch_carrying_the_procedure() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "mismatch").await;
    fx.declare_classic_queue().await.unwrap();
    let queue = RabbitQueue::new(fx.config()).unwrap();

    for attempt in [queue.declare().await.map(|_| ()), queue.consumer().await.map(|_| ())] {
        let Err(queue::Error::QueueTypeMismatch(message)) = &attempt else {
            panic!("expected a queue-type mismatch, got {attempt:?}");
        };
        assert!(!attempt.as_ref().unwrap_err().is_transient());
        for needle in [
            format!("queue '{}'", fx.queue),
            "x-queue-type".to_owned(),
            "1. Stop the worker and the publisher".to_owned(),
            "2. Wait for the queue to drain".to_owned(),
            format!("3. Delete the queue: rabbitmqctl delete_queue '{}'", fx.queue),
            "4. Start the worker".to_owned(),
            "5. Start the publisher".to_owned(),
        ] {
            assert!(message.contains(&needle), "missing {needle:?} in {message}");
        }
    }
    // The connection survives the refused declaration (a channel error).
    fx.probe_channel().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_of_another_type_is_reported_as_a_non_transient_mismatch() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "exchange").await;
    fx.probe_channel()
        .await
        .exchange_declare(
            fx.exchange.as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let publisher = RabbitPublisher::new(fx.config()).unwrap();

    let results = publisher.publish(&[dispatch(1)]).await;

    let [Err(queue::Error::QueueTypeMismatch(message))] = results.as_slice() else {
        panic!("expected an exchange mismatch, got {results:?}");
    };
    assert!(message.contains(&format!("exchange '{}'", fx.exchange)), "{message}");
    fx.cleanup().await;
}
