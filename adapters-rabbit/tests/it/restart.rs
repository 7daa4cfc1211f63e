//! A broker restarted under the adapter, in a container of the test's own
//! (flowforge-testkit's `Dedicated`): the quorum queue keeps every
//! dispatch whose publish was confirmed, and a consumer opened after the
//! restart receives each of them once.

use std::time::{Duration, Instant};

use flowforge_adapters_rabbit::{RabbitPublisher, RabbitQueue};
use flowforge_ports::{Delivery as _, Dispatch, DispatchConsumer as _, DispatchPublisher as _, DispatchQueue as _};
use flowforge_testkit::{Dedicated, Service};

use crate::support::{Fixture, dispatch, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_broker_keeps_every_confirmed_dispatch_on_the_quorum_queue() {
    const N: i64 = 200;
    let Some(broker) = Dedicated::start(Service::Rabbitmq).await else {
        return;
    };
    let fx = Fixture::new(&broker.url(), "restart").await;
    let queue = RabbitQueue::new(fx.config()).unwrap();
    queue.declare().await.unwrap();
    let batch: Vec<Dispatch> = (1..=N).map(dispatch).collect();
    let results = RabbitPublisher::new(fx.config()).unwrap().publish(&batch).await;
    assert!(
        results.iter().all(Result::is_ok),
        "every publish confirmed: {results:?}"
    );

    broker.restart().await;

    // The queue's leader is elected again shortly after the broker takes
    // connections: until then, opening a consumer may fail.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut consumer = loop {
        match queue.consumer().await {
            Ok(consumer) => break consumer,
            Err(e) => {
                assert!(Instant::now() < deadline, "no consumer after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let mut received = Vec::new();
    while received.len() < batch.len() {
        let delivery = within(30, "the next kept dispatch", consumer.next())
            .await
            .unwrap()
            .expect("a delivery");
        received.push(delivery.dispatch().clone());
        delivery.ack().await.unwrap();
    }
    received.sort_by_key(|d| d.dispatch_id.0);
    assert_eq!(received, batch, "every confirmed dispatch, each once");
    consumer.close().await.unwrap();
}
