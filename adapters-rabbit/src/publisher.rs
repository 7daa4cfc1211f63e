//! [`RabbitPublisher`]: publishes dispatches with confirms, many in flight,
//! and tells a routed message from a returned one.

use std::collections::HashSet;
use std::time::Duration;

use flowforge_ports::{Dispatch, DispatchPublisher, queue};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::broker;
use crate::config::{ConfigError, DispatchWindow, RabbitConfig, Settings};

/// AMQP delivery mode 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;

/// Publishes dispatches to the dispatch exchange (see the crate docs).
///
/// Connects lazily, on the first publish, and again on the first publish
/// after the connection was lost or a batch ended in doubt: it never
/// retries by itself, the outbox publisher's loop owns the backoff.
/// Batches are published one at a time (see [`RabbitPublisher::publish`]).
#[derive(Debug)]
pub struct RabbitPublisher {
    settings: Settings,
    session: Mutex<Option<Session>>,
}

/// A connection, its confirm-mode channel, and the channel that asks the
/// queue's depth (a failed passive declare closes its channel, which must
/// not be the one carrying confirms).
#[derive(Debug)]
struct Session {
    connection: Connection,
    channel: Channel,
    probe: Option<Channel>,
}

impl RabbitPublisher {
    /// A publisher for `config`. Does not connect yet.
    pub fn new(config: RabbitConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            settings: Settings::from_config(&config)?,
            session: Mutex::new(None),
        })
    }

    /// Connects (if not connected) and declares the exchange, so a process
    /// can fail fast at start. Publishing does the same by itself.
    pub async fn connect(&self) -> Result<(), queue::Error> {
        let mut session = self.session.lock().await;
        self.ensure_session(&mut session).await.map(|_| ())
    }

    async fn ensure_session<'a>(&self, slot: &'a mut Option<Session>) -> Result<&'a Session, queue::Error> {
        let alive = slot
            .as_ref()
            .is_some_and(|session| session.connection.status().connected() && session.channel.status().connected());
        if !alive {
            if slot.take().is_some() {
                tracing::warn!(url = %self.settings.display_url, "publisher connection lost; reconnecting");
            }
            *slot = Some(self.open_session().await?);
        }
        slot.as_ref()
            .ok_or_else(|| queue::Error::Unavailable("publisher session vanished".to_owned()))
    }

    async fn open_session(&self) -> Result<Session, queue::Error> {
        let settings = &self.settings;
        let connection = broker::connect(settings).await?;
        let channel = broker::open_channel(&connection, settings).await?;
        broker::bounded(
            settings.connect_timeout,
            "enabling publisher confirms",
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        broker::declare_exchange(&channel, settings).await?;
        Ok(Session {
            connection,
            channel,
            probe: None,
        })
    }

    /// The queue's ready messages and consumers, by a passive declare on
    /// the probe channel. `Ok(None)`: the queue does not exist yet (no
    /// worker has declared it).
    async fn depth(&self, session: &mut Session) -> Result<Option<(u32, u32)>, queue::Error> {
        let settings = &self.settings;
        let probe = match &session.probe {
            Some(channel) if channel.status().connected() => channel.clone(),
            _ => {
                let channel = broker::open_channel(&session.connection, settings).await?;
                session.probe = Some(channel.clone());
                channel
            }
        };
        let declared = broker::bounded_raw(
            settings.connect_timeout,
            "asking the queue's depth",
            probe.queue_declare(
                settings.queue.clone(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await?;
        match declared {
            Ok(queue) => Ok(Some((queue.message_count(), queue.consumer_count()))),
            Err(error) if broker::not_found(&error) => {
                session.probe = None;
                Ok(None)
            }
            Err(error) => {
                session.probe = None;
                Err(broker::unavailable("asking the queue's depth", &error))
            }
        }
    }
}

impl DispatchPublisher for RabbitPublisher {
    /// Publishes the batch on one confirm-mode channel: every message is
    /// written first (`mandatory`, persistent, JSON, `message_id` = the
    /// dispatch id), then all confirms are awaited together under one
    /// deadline.
    ///
    /// A message is `Ok` only when the broker acked it and did not return
    /// it. Returns are matched to dispatches by `message_id`, not by which
    /// confirm lapin attached them to: with several confirms in flight it
    /// attaches a return to whichever confirm completes next. So a batch
    /// whose confirms did not all arrive cannot prove that an acked message
    /// was not also returned: its acked messages are then reported as
    /// `Timeout` (or `Unavailable`) too, to be republished (duplicates are
    /// harmless), and the session is dropped so no stale confirm or return
    /// leaks into the next batch. Concurrent calls are serialised for the
    /// same reason.
    async fn publish(&self, batch: &[Dispatch]) -> Vec<Result<(), queue::Error>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let mut slot = self.session.lock().await;
        let channel = match self.ensure_session(&mut slot).await {
            Ok(session) => session.channel.clone(),
            Err(error) => return vec![Err(error); batch.len()],
        };
        let outcome = publish_batch(&channel, &self.settings, batch).await;
        if outcome.in_doubt {
            // The channel may hold unresolved confirms and returns: start
            // the next batch on a fresh connection.
            *slot = None;
        }
        outcome.results
    }

    /// Quorum queues keep persistent messages across restarts of the broker
    /// and of every client.
    fn durable(&self) -> bool {
        true
    }

    /// What fills [`RabbitConfig::dispatch_window`](crate::RabbitConfig):
    /// the window less the messages already waiting ready. Unbounded, or a
    /// queue nobody declared yet (a publish would come back unroutable,
    /// which the caller reports): `None`.
    async fn room(&self) -> Result<Option<u32>, queue::Error> {
        if self.settings.dispatch_window == DispatchWindow::Unbounded {
            return Ok(None);
        }
        let mut slot = self.session.lock().await;
        if self.ensure_session(&mut slot).await.is_err() {
            // Let the publish report the outage, as it did before windows.
            return Ok(None);
        }
        let Some(session) = slot.as_mut() else {
            return Ok(None);
        };
        let Some((ready, consumers)) = self.depth(session).await? else {
            return Ok(None);
        };
        Ok(self
            .settings
            .dispatch_window
            .size(consumers)
            .map(|window| window.saturating_sub(ready)))
    }
}

struct BatchOutcome {
    results: Vec<Result<(), queue::Error>>,
    /// Some confirm did not arrive: the channel's state is unknown.
    in_doubt: bool,
}

async fn publish_batch(channel: &Channel, settings: &Settings, batch: &[Dispatch]) -> BatchOutcome {
    // Phase 1: write every publish. They are polled together, so the frames
    // go out back to back instead of one socket round trip each.
    let writes = batch.iter().map(|dispatch| write_one(channel, settings, dispatch));
    let written: Vec<Result<PublisherConfirm, queue::Error>> = futures_util::future::join_all(writes).await;
    if let Some(error) = written.iter().find_map(|w| w.as_ref().err()).cloned() {
        // Dropping the confirms we did get is fine: the session is dropped.
        let results = written
            .into_iter()
            .map(|w| match w {
                Ok(_) => Err(in_doubt_error(&error)),
                Err(own) => Err(own),
            })
            .collect();
        return BatchOutcome {
            results,
            in_doubt: true,
        };
    }

    // Phase 2: await all confirms under one deadline.
    let deadline = Instant::now() + settings.confirm_timeout;
    let mut confirmations: Vec<Option<lapin::Result<Confirmation>>> = batch.iter().map(|_| None).collect();
    let mut pending: FuturesUnordered<_> = written
        .into_iter()
        .enumerate()
        .filter_map(|(index, w)| w.ok().map(|confirm| async move { (index, confirm.await) }))
        .collect();
    let mut timed_out = false;
    loop {
        match tokio::time::timeout_at(deadline, pending.next()).await {
            Ok(Some((index, confirmation))) => {
                if let Some(slot) = confirmations.get_mut(index) {
                    *slot = Some(confirmation);
                }
            }
            Ok(None) => break,
            Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    drop(pending);
    let outcome = judge(batch, confirmations, timed_out, settings.confirm_timeout);
    if outcome.in_doubt {
        tracing::warn!(
            batch = batch.len(),
            "publish batch ended in doubt; dropping the publisher connection"
        );
    }
    outcome
}

/// Each dispatch's result from what the broker answered (`None`: nothing
/// before the deadline or the wait ended with `timed_out`). No I/O.
///
/// `confirmations` has exactly one entry per dispatch of `batch`, in order.
fn judge(
    batch: &[Dispatch],
    confirmations: Vec<Option<lapin::Result<Confirmation>>>,
    timed_out: bool,
    confirm_timeout: Duration,
) -> BatchOutcome {
    debug_assert_eq!(confirmations.len(), batch.len(), "one confirmation slot per dispatch");
    // Every return seen in this batch, by dispatch id.
    let mut returned_ids: HashSet<String> = HashSet::new();
    let mut acked: Vec<Option<bool>> = Vec::with_capacity(batch.len());
    let mut channel_error: Option<queue::Error> = None;
    let mut unattributed_return = false;
    for confirmation in confirmations {
        acked.push(match confirmation {
            Some(Ok(Confirmation::NotRequested)) => {
                // Cannot happen on a confirm_select channel; never count an
                // unconfirmed publish as delivered.
                channel_error.get_or_insert(queue::Error::Unavailable(
                    "the channel is not in confirm mode".to_owned(),
                ));
                None
            }
            Some(Ok(confirmation)) => {
                let is_ack = confirmation.is_ack();
                if let Some(message) = confirmation.take_message() {
                    match returned_dispatch_id(&message) {
                        Some(id) => {
                            returned_ids.insert(id);
                        }
                        // A return we cannot attribute could be any acked
                        // message's: none of them is proven routed.
                        None => unattributed_return = true,
                    }
                }
                Some(is_ack)
            }
            Some(Err(error)) => {
                channel_error.get_or_insert(broker::unavailable("awaiting a publisher confirm", &error));
                None
            }
            None => None,
        });
    }
    let in_doubt = timed_out || unattributed_return || acked.iter().any(Option::is_none);
    let doubt = match channel_error {
        Some(error) => error,
        None if unattributed_return => {
            queue::Error::Unavailable("the broker returned a message without a dispatch id".to_owned())
        }
        None => queue::Error::Timeout(format!(
            "the broker did not confirm the batch within {confirm_timeout:?}"
        )),
    };
    let results = batch
        .iter()
        .zip(acked)
        .map(|(dispatch, acked)| {
            if !returned_ids.is_empty() && returned_ids.contains(&dispatch.dispatch_id.to_string()) {
                return Err(queue::Error::Unroutable(dispatch.dispatch_id));
            }
            match acked {
                Some(false) => Err(queue::Error::Nacked(dispatch.dispatch_id)),
                // Acked, and the whole batch resolved: every return of the
                // batch has been seen, and none was this one's.
                Some(true) if !in_doubt => Ok(()),
                Some(true) => Err(in_doubt_error(&doubt)),
                None => Err(doubt.clone()),
            }
        })
        .collect();
    BatchOutcome { results, in_doubt }
}

/// Writes one publish, bounded by the publish timeout.
async fn write_one(
    channel: &Channel,
    settings: &Settings,
    dispatch: &Dispatch,
) -> Result<PublisherConfirm, queue::Error> {
    let payload = serde_json::to_vec(dispatch).map_err(|error| {
        queue::Error::Unavailable(format!("cannot serialise dispatch {}: {error}", dispatch.dispatch_id))
    })?;
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(dispatch.dispatch_id.to_string().into())
        .with_delivery_mode(PERSISTENT)
        .with_headers(crate::trace::headers(dispatch));
    let publish = channel.basic_publish(
        settings.exchange.clone(),
        settings.routing_key.clone(),
        BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        },
        &payload,
        properties,
    );
    match tokio::time::timeout(settings.publish_timeout, publish).await {
        Ok(Ok(confirm)) => Ok(confirm),
        Ok(Err(error)) => Err(broker::unavailable("publishing", &error)),
        Err(_) => Err(queue::Error::Timeout(format!(
            "publishing dispatch {} was not written within {:?}",
            dispatch.dispatch_id, settings.publish_timeout
        ))),
    }
}

/// The error of a message whose own outcome is unknown because of `cause`.
fn in_doubt_error(cause: &queue::Error) -> queue::Error {
    match cause {
        queue::Error::Timeout(text) => queue::Error::Timeout(format!("outcome unknown, batch incomplete: {text}")),
        other => queue::Error::Unavailable(format!("outcome unknown, batch incomplete: {other}")),
    }
}

/// The dispatch id a returned message carries: its `message_id`, or failing
/// that the id in its JSON payload.
fn returned_dispatch_id(message: &BasicReturnMessage) -> Option<String> {
    if let Some(id) = message.properties.message_id() {
        return Some(id.to_string());
    }
    serde_json::from_slice::<Dispatch>(&message.data)
        .ok()
        .map(|dispatch| dispatch.dispatch_id.to_string())
}

#[cfg(test)]
mod tests {
    use flowforge_ports::{DispatchId, RunId, TaskRunId};
    use lapin::message::Delivery;

    use super::*;

    fn dispatch(n: i64) -> Dispatch {
        Dispatch {
            dispatch_id: DispatchId(n),
            task_run_id: TaskRunId(n),
            run_id: RunId(Default::default()),
            task_key: format!("t{n}"),
            task_type: "noop".to_owned(),
            fencing_token: 1,
            ready_at: None,
            priority: Default::default(),
        }
    }

    /// The broker's return of dispatch `n`, as lapin hands it over.
    fn returned(n: i64, with_message_id: bool) -> BasicReturnMessage {
        let mut delivery = Delivery::mock(
            0,
            "x".into(),
            "k".into(),
            false,
            serde_json::to_vec(&dispatch(n)).unwrap(),
        );
        if with_message_id {
            delivery.properties = BasicProperties::default().with_message_id(n.to_string().into());
        }
        BasicReturnMessage {
            delivery,
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    fn ack(message: Option<BasicReturnMessage>) -> Option<lapin::Result<Confirmation>> {
        Some(Ok(Confirmation::Ack(message)))
    }

    fn check(
        confirmations: Vec<Option<lapin::Result<Confirmation>>>,
        timed_out: bool,
        expected: &[&str],
        expected_in_doubt: bool,
    ) {
        let batch: Vec<Dispatch> = (1..=confirmations.len() as i64).map(dispatch).collect();
        let outcome = judge(&batch, confirmations, timed_out, Duration::from_secs(1));
        let actual: Vec<&str> = outcome
            .results
            .iter()
            .map(|result| match result {
                Ok(()) => "ok",
                Err(queue::Error::Unroutable(_)) => "unroutable",
                Err(queue::Error::Nacked(_)) => "nacked",
                Err(queue::Error::Timeout(_)) => "timeout",
                Err(queue::Error::Unavailable(_)) => "unavailable",
                Err(_) => "other",
            })
            .collect();
        assert_eq!(actual, expected);
        assert_eq!(outcome.in_doubt, expected_in_doubt);
    }

    #[test]
    fn returns_count_for_their_dispatch_whichever_confirm_carries_them() {
        // lapin attached the return of 3 to the confirm of 1.
        check(
            vec![ack(Some(returned(3, true))), ack(None), ack(None), ack(None)],
            false,
            &["ok", "ok", "unroutable", "ok"],
            false,
        );
        // Without a message_id, the payload names the dispatch.
        check(
            vec![ack(None), ack(Some(returned(1, false)))],
            false,
            &["unroutable", "ok"],
            false,
        );
    }

    #[test]
    fn a_nack_is_refused_and_does_not_cast_doubt() {
        check(
            vec![ack(None), Some(Ok(Confirmation::Nack(None))), ack(None)],
            false,
            &["ok", "nacked", "ok"],
            false,
        );
    }

    #[test]
    fn an_incomplete_batch_proves_no_ack_routed_but_keeps_what_it_knows() {
        // 2 never confirmed: a return still queued for it could belong to
        // any acked message, so none of them is reported delivered.
        check(
            vec![
                ack(None),
                None,
                ack(Some(returned(4, true))),
                ack(None),
                Some(Ok(Confirmation::Nack(None))),
            ],
            true,
            &["timeout", "timeout", "timeout", "unroutable", "nacked"],
            true,
        );
    }

    #[test]
    fn a_channel_error_or_an_anonymous_return_casts_doubt() {
        let closed = Some(Err(lapin::Error::from(lapin::ErrorKind::InvalidChannel(1))));
        check(vec![ack(None), closed], false, &["unavailable", "unavailable"], true);
        let mut anonymous = returned(1, false);
        anonymous.delivery.data = b"garbage".to_vec();
        check(
            vec![ack(Some(anonymous)), ack(None)],
            false,
            &["unavailable", "unavailable"],
            true,
        );
        check(
            vec![Some(Ok(Confirmation::NotRequested))],
            false,
            &["unavailable"],
            true,
        );
    }
}
