//! Wake-ups over `LISTEN/NOTIFY`: the hub every store clone shares, the
//! sending side, the listening task, and the [`PgNotifier`] handles loops
//! wait on.
//!
//! Sending: a committed write wakes this process's waiters at once, then
//! sends `NOTIFY` outside its transaction (see `queries/mod.rs` for why not
//! inside). Concurrent senders of one topic combine: while one NOTIFY is in
//! flight, later writers only mark the topic dirty and return, and the
//! sender notifies again once it is done — every commit is followed by a
//! NOTIFY that started after it, at about one statement per burst.
//!
//! Each topic keeps an epoch that every wake-up bumps. A handle remembers
//! the epoch it last returned at, so a wake-up sent while its loop was busy
//! is kept (the next wait returns at once), and every waiter on a topic —
//! several `--wait` callers on RunSettled, two schedulers in one process —
//! is woken, not just one: a spare wake is harmless to a loop that checks
//! for work, a lost one would stall it.

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use flowforge_ports::{Notifier, Topic, store};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::store_error;
use crate::queries::{CHANNEL_PUBLISHER, CHANNEL_RUN_SETTLED, CHANNEL_SCHEDULER};

const TOPICS: [Topic; 3] = [Topic::Scheduler, Topic::Publisher, Topic::RunSettled];
/// First wait before re-listening after the listening connection failed.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between attempts to re-listen.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

fn index(topic: Topic) -> usize {
    match topic {
        Topic::Scheduler => 0,
        Topic::Publisher => 1,
        Topic::RunSettled => 2,
    }
}

fn channel(topic: Topic) -> &'static str {
    match topic {
        Topic::Scheduler => CHANNEL_SCHEDULER,
        Topic::Publisher => CHANNEL_PUBLISHER,
        Topic::RunSettled => CHANNEL_RUN_SETTLED,
    }
}

#[derive(Default)]
struct TopicState {
    epoch: AtomicU64,
    notify: Notify,
    /// [`IDLE`], [`SENDING`] or [`DIRTY`]: this process's NOTIFY of the topic.
    outgoing: AtomicU8,
}

/// No NOTIFY of the topic in flight.
const IDLE: u8 = 0;
/// A sender's NOTIFY is in flight.
const SENDING: u8 = 1;
/// In flight, and a commit since it started needs another.
const DIRTY: u8 = 2;

impl TopicState {
    /// Whether the caller becomes the topic's sender (else it marked the
    /// in-flight sender dirty, which will notify again for it).
    fn claim(&self) -> bool {
        loop {
            match self
                .outgoing
                .compare_exchange(IDLE, SENDING, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(SENDING) => {
                    if self
                        .outgoing
                        .compare_exchange(SENDING, DIRTY, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// After a NOTIFY: whether the sender must send again (it was marked
    /// dirty meanwhile) or is done (back to idle).
    fn again(&self) -> bool {
        if self
            .outgoing
            .compare_exchange(SENDING, IDLE, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return false;
        }
        self.outgoing.store(SENDING, Ordering::SeqCst);
        true
    }
}

/// Returns the topics a sender still owns to idle if its future is dropped
/// mid-send, so a cancelled caller never silences the topic for good.
struct Owned<'h> {
    hub: &'h Hub,
    topics: Vec<Topic>,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        for t in &self.topics {
            self.hub.topics[index(*t)].outgoing.store(IDLE, Ordering::SeqCst);
        }
    }
}

/// Wake-ups shared by every clone of one store and its notifiers.
pub(crate) struct Hub {
    /// The payload of this store's notifications.
    instance: String,
    topics: [TopicState; 3],
    connect: PgConnectOptions,
    /// Whether the listening task runs (started by the first `notifier()`).
    listening: tokio::sync::Mutex<bool>,
    /// Stops the listening task when the last store clone goes away.
    stop: CancellationToken,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Hub {
    pub(crate) fn new(connect: PgConnectOptions) -> Self {
        Self {
            instance: uuid::Uuid::now_v7().to_string(),
            topics: Default::default(),
            connect,
            listening: tokio::sync::Mutex::new(false),
            stop: CancellationToken::new(),
        }
    }

    /// Wakes every waiter on `topic` and leaves the wake-up for handles
    /// that are not waiting yet.
    pub(crate) fn wake(&self, topic: Topic) {
        let state = &self.topics[index(topic)];
        state.epoch.fetch_add(1, Ordering::SeqCst);
        state.notify.notify_waiters();
    }

    /// Announces committed writes: wakes local waiters, then NOTIFYs other
    /// processes (combined with concurrent senders). A failed NOTIFY is
    /// logged, not returned: the write is committed, and the loops' slow
    /// periodic pass is the safety net for a lost wake-up.
    pub(crate) async fn publish(&self, pool: &PgPool, topics: &[Topic]) {
        for &topic in topics {
            self.wake(topic);
        }
        let mut owned = Owned {
            hub: self,
            topics: topics
                .iter()
                .copied()
                .filter(|t| self.topics[index(*t)].claim())
                .collect(),
        };
        while !owned.topics.is_empty() {
            let channels: Vec<&str> = owned.topics.iter().map(|t| channel(*t)).collect();
            let sent = sqlx::query(crate::queries::NOTIFY)
                .bind(&channels)
                .bind(&self.instance)
                .execute(pool)
                .await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, ?channels, "NOTIFY failed; other processes wake at their next periodic pass");
                return; // `owned` returns the topics to idle
            }
            owned.topics.retain(|t| self.topics[index(*t)].again());
        }
    }

    fn wake_all(&self) {
        for topic in TOPICS {
            self.wake(topic);
        }
    }

    fn on_notification(&self, channel_name: &str, payload: &str) {
        // This store woke its own waiters right after its commit.
        if payload == self.instance {
            return;
        }
        if let Some(topic) = TOPICS.into_iter().find(|t| channel(*t) == channel_name) {
            self.wake(topic);
        }
    }

    /// Starts the listening task once, after its first LISTEN succeeded, so
    /// a notification sent after `notifier()` returns is heard.
    pub(crate) async fn ensure_listening(self: &Arc<Self>) -> Result<(), store::Error> {
        let mut listening = self.listening.lock().await;
        if *listening {
            return Ok(());
        }
        let name = self.connect.get_application_name().unwrap_or("flowforge").to_owned();
        // Its own pool of one: the listening connection is held for the
        // store's lifetime and must not shrink the pool the queries use.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(self.connect.clone().application_name(&format!("{name}-listener")));
        let listener = open_listener(&pool).await?;
        tokio::spawn(listen(Arc::downgrade(self), self.stop.clone(), pool, listener));
        *listening = true;
        Ok(())
    }

    fn topic_epoch(&self, topic: Topic) -> u64 {
        self.topics[index(topic)].epoch.load(Ordering::SeqCst)
    }
}

async fn open_listener(pool: &PgPool) -> Result<PgListener, store::Error> {
    let mut listener = PgListener::connect_with(pool).await.map_err(store_error)?;
    listener
        .listen_all(TOPICS.into_iter().map(channel))
        .await
        .map_err(store_error)?;
    Ok(listener)
}

/// The listening loop: relays notifications to the hub; when the
/// connection fails, wakes every topic (notifications may have been missed
/// while nobody listened) and listens again with capped backoff.
async fn listen(hub: Weak<Hub>, stop: CancellationToken, pool: PgPool, mut listener: PgListener) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let failure = loop {
            let received = tokio::select! {
                () = stop.cancelled() => return,
                received = listener.try_recv() => received,
            };
            let Some(hub) = hub.upgrade() else { return };
            match received {
                Ok(Some(n)) => hub.on_notification(n.channel(), n.payload()),
                // The connection dropped and sqlx re-established it (and
                // re-listened) before returning: what was sent in between
                // is lost, so every loop must look again.
                Ok(None) => hub.wake_all(),
                Err(e) => {
                    hub.wake_all();
                    break e;
                }
            }
        };
        tracing::warn!(error = %failure, "lost the LISTEN connection; listening again");
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match open_listener(&pool).await {
                Ok(fresh) => {
                    listener = fresh;
                    backoff = MIN_BACKOFF;
                    let Some(hub) = hub.upgrade() else { return };
                    hub.wake_all();
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "cannot LISTEN yet; retrying"),
            }
        }
    }
}

/// A handle on the store's wake-ups (see the module docs for the
/// semantics). Cloning gives an independent handle that has seen what this
/// one has seen.
pub struct PgNotifier {
    hub: Arc<Hub>,
    seen: [AtomicU64; 3],
}

impl PgNotifier {
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        let seen = TOPICS.map(|t| AtomicU64::new(hub.topic_epoch(t)));
        Self { hub, seen }
    }
}

impl Clone for PgNotifier {
    fn clone(&self) -> Self {
        Self {
            hub: Arc::clone(&self.hub),
            seen: std::array::from_fn(|i| AtomicU64::new(self.seen[i].load(Ordering::SeqCst))),
        }
    }
}

impl fmt::Debug for PgNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgNotifier")
            .field("instance", &self.hub.instance)
            .finish_non_exhaustive()
    }
}

impl Notifier for PgNotifier {
    async fn notified(&self, topic: Topic) {
        let i = index(topic);
        let state = &self.hub.topics[i];
        let since = self.seen[i].load(Ordering::SeqCst);
        loop {
            // Register before reading the epoch, so a wake-up between the
            // read and the await is not lost.
            let notified = state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let epoch = state.epoch.load(Ordering::SeqCst);
            if epoch > since {
                self.seen[i].fetch_max(epoch, Ordering::SeqCst);
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hub() -> Arc<Hub> {
        Arc::new(Hub::new(PgConnectOptions::new()))
    }

    async fn woken(n: &PgNotifier, topic: Topic) -> bool {
        tokio::time::timeout(Duration::from_millis(50), n.notified(topic))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_wake_while_nobody_waits_is_kept_once() {
        let hub = hub();
        let n = PgNotifier::new(Arc::clone(&hub));
        hub.wake(Topic::Scheduler);
        hub.wake(Topic::Scheduler);
        assert!(woken(&n, Topic::Scheduler).await, "the kept wake-up");
        assert!(!woken(&n, Topic::Scheduler).await, "wake-ups coalesce");
        assert!(!woken(&n, Topic::Publisher).await, "topics are separate");
    }

    #[tokio::test]
    async fn every_waiter_on_a_topic_wakes() {
        let hub = hub();
        let n = Arc::new(PgNotifier::new(Arc::clone(&hub)));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let n = Arc::clone(&n);
                tokio::spawn(async move { n.notified(Topic::RunSettled).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        hub.wake(Topic::RunSettled);
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(1), w).await.unwrap().unwrap();
        }
    }

    #[test]
    fn concurrent_senders_of_a_topic_combine() {
        let t = TopicState::default();
        assert!(t.claim(), "the first writer sends");
        assert!(!t.claim(), "a writer during the send only marks it dirty");
        assert!(!t.claim(), "marks coalesce");
        assert!(t.again(), "the sender sends once more for them");
        assert!(!t.again(), "then it is done");
        assert!(t.claim(), "and the next writer sends again");
    }

    #[test]
    fn a_dropped_sender_returns_its_topics_to_idle() {
        let hub = hub();
        let owned = Owned {
            hub: &hub,
            topics: vec![Topic::Publisher],
        };
        assert!(hub.topics[1].claim());
        drop(owned);
        assert!(hub.topics[1].claim(), "not silenced by a cancelled sender");
    }

    #[test]
    fn own_notifications_are_skipped() {
        let hub = hub();
        let n = PgNotifier::new(Arc::clone(&hub));
        let own = hub.instance.clone();
        hub.on_notification(CHANNEL_PUBLISHER, &own);
        assert_eq!(hub.topic_epoch(Topic::Publisher), n.seen[1].load(Ordering::SeqCst));
        hub.on_notification(CHANNEL_PUBLISHER, "another-process");
        assert_eq!(hub.topic_epoch(Topic::Publisher), 1);
    }
}
