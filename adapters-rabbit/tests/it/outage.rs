//! Outages: an unreachable broker fails fast, a cut or stalled connection
//! fails within the configured bounds, and the next call reconnects. Each
//! test cuts only its own connections, through its own proxy.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use flowforge_adapters_rabbit::{RabbitPublisher, RabbitQueue};
use flowforge_ports::{Delivery as _, DispatchConsumer as _, DispatchPublisher as _, DispatchQueue as _, queue};

use crate::support::{Fixture, broker_address, dispatch, within};
use flowforge_testkit::{Mode, Proxy, amqp_url_via};

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Whether every result is an error the outbox publisher would retry.
fn all_transient_failures(results: &[Result<(), queue::Error>]) -> bool {
    results
        .iter()
        .all(|result| matches!(result, Err(queue::Error::Unavailable(_) | queue::Error::Timeout(_))))
}

fn ids(dispatches: &[flowforge_ports::Dispatch]) -> BTreeSet<i64> {
    dispatches.iter().map(|d| d.dispatch_id.0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_unavailable_at_once() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "unreachable").await;
    let nowhere = amqp_url_via(&url, closed_port());
    let publisher = RabbitPublisher::new(fx.config_for(&nowhere)).unwrap();
    let queue = RabbitQueue::new(fx.config_for(&nowhere)).unwrap();

    let started = Instant::now();
    let results = publisher.publish(&[dispatch(1), dispatch(2)]).await;
    let consumer = queue.consumer().await;

    assert!(
        matches!(
            results.as_slice(),
            [Err(queue::Error::Unavailable(_)), Err(queue::Error::Unavailable(_))]
        ),
        "{results:?}"
    );
    assert!(matches!(consumer, Err(queue::Error::Unavailable(_))), "{consumer:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_fails_fast_while_the_connection_is_cut_and_resumes_when_restored() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "cut").await;
    RabbitQueue::new(fx.config()).unwrap().declare().await.unwrap();
    let proxy = Proxy::start(broker_address(&url)).await;
    let publisher = RabbitPublisher::new(fx.config_for(&amqp_url_via(&url, proxy.port()))).unwrap();
    assert_eq!(publisher.publish(&[dispatch(1)]).await, vec![Ok(())]);

    proxy.set(Mode::Cut);
    // The established connection dies; then reconnecting is refused.
    for n in [2, 3] {
        let started = Instant::now();
        let results = publisher.publish(&[dispatch(n)]).await;
        assert!(all_transient_failures(&results), "{results:?}");
        // Bounded by the configured timeouts (2 s publish, 3 s confirm).
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "took {:?}",
            started.elapsed()
        );
    }
    proxy.set(Mode::Forward);
    assert_eq!(publisher.publish(&[dispatch(4)]).await, vec![Ok(())]);

    let landed = ids(&fx.drain().await);
    assert!(landed.is_superset(&BTreeSet::from([1, 4])), "{landed:?}");
    assert!(landed.is_subset(&BTreeSet::from([1, 2, 3, 4])), "{landed:?}");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_broker_times_out_the_confirms_and_publishing_resumes() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "stall").await;
    RabbitQueue::new(fx.config()).unwrap().declare().await.unwrap();
    let proxy = Proxy::start(broker_address(&url)).await;
    let publisher = RabbitPublisher::new(fx.config_for(&amqp_url_via(&url, proxy.port()))).unwrap();
    assert_eq!(publisher.publish(&[dispatch(1)]).await, vec![Ok(())]);

    proxy.set(Mode::Stall);
    let started = Instant::now();
    let results = publisher.publish(&[dispatch(2), dispatch(3)]).await;
    let waited = started.elapsed();
    assert!(
        results.iter().all(|r| matches!(r, Err(queue::Error::Timeout(_)))),
        "{results:?}"
    );
    // The confirm timeout is 3 s; publishes were written before it starts.
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(6),
        "took {waited:?}"
    );
    // A new connection cannot complete its handshake either.
    let started = Instant::now();
    let results = publisher.publish(&[dispatch(4)]).await;
    assert!(
        matches!(results.as_slice(), [Err(queue::Error::Unavailable(_))]),
        "{results:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    proxy.set(Mode::Forward);
    assert_eq!(publisher.publish(&[dispatch(5)]).await, vec![Ok(())]);
    // The stalled publishes may still arrive once traffic flows: a
    // duplicate at worst, which the worker's claim absorbs.
    let landed = ids(&fx.drain().await);
    assert!(landed.is_superset(&BTreeSet::from([1, 5])), "{landed:?}");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_consumer_fails_its_ack_and_a_new_consumer_gets_the_redelivery() {
    let url = broker_or_skip!();
    let fx = Fixture::new(&url, "consumercut").await;
    let direct = RabbitQueue::new(fx.config()).unwrap();
    direct.declare().await.unwrap();
    assert_eq!(
        RabbitPublisher::new(fx.config()).unwrap().publish(&[dispatch(1)]).await,
        vec![Ok(())]
    );
    let proxy = Proxy::start(broker_address(&url)).await;
    let queue = RabbitQueue::new(fx.config_for(&amqp_url_via(&url, proxy.port()))).unwrap();
    let mut consumer = queue.consumer().await.unwrap();
    let delivery = within(10, "the delivery", consumer.next()).await.unwrap().unwrap();
    assert_eq!(delivery.dispatch(), &dispatch(1));

    proxy.set(Mode::Cut);
    let next = within(10, "next on a cut connection", consumer.next()).await;
    assert!(matches!(next, Err(queue::Error::Unavailable(_))), "{next:?}");
    // Once the loss is known, the ack fails rather than vanishing (an ack
    // racing the loss may be written and lost: the broker redelivers then).
    let ack = within(10, "the failing ack", delivery.ack()).await;
    assert!(
        matches!(ack, Err(queue::Error::Unavailable(_) | queue::Error::Timeout(_))),
        "{ack:?}"
    );
    let again = within(10, "next on a dead consumer", consumer.next()).await;
    assert!(matches!(again, Err(queue::Error::Unavailable(_))), "{again:?}");
    let reconnect = within(10, "consumer() while cut", queue.consumer()).await;
    assert!(matches!(reconnect, Err(queue::Error::Unavailable(_))), "{reconnect:?}");

    proxy.set(Mode::Forward);
    let mut consumer = queue.consumer().await.unwrap();
    let redelivery = within(10, "the redelivery", consumer.next()).await.unwrap().unwrap();
    assert_eq!(redelivery.dispatch(), &dispatch(1));
    assert!(redelivery.redelivered());
    redelivery.ack().await.unwrap();
    consumer.close().await.unwrap();
    assert_eq!(fx.ready().await, 0);
    fx.cleanup().await;
}
