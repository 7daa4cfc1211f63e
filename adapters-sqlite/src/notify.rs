//! In-process wake-ups (docs/design/wake-ups.md#in-process): one
//! `tokio::sync::Notify` per topic, owned by the store and shared by its
//! clones, fired after a write commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flowforge_ports::{Notifier, Topic};
use tokio::sync::Notify;

/// The store-wide wake-up state.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    // The scheduler and the publisher each run ONE loop per process, so
    // `notify_one` is exact: it wakes that loop, or stores a permit for its
    // next wait when it is busy.
    scheduler: Notify,
    publisher: Notify,
    // Several tasks may wait for runs to settle (a CLI run, API waiters), and
    // a single stored permit would be consumed by whichever came first. So a
    // settle bumps a generation and wakes every current waiter; each
    // notifier handle remembers the generation it last saw, which gives every
    // handle its own "kept for the next wait" permit.
    settled: Notify,
    settled_generation: AtomicU64,
}

impl Wakeups {
    /// Sends one notification on `topic`.
    pub(crate) fn wake(&self, topic: Topic) {
        match topic {
            Topic::Scheduler => self.scheduler.notify_one(),
            Topic::Publisher => self.publisher.notify_one(),
            Topic::RunSettled => {
                self.settled_generation.fetch_add(1, Ordering::SeqCst);
                self.settled.notify_waiters();
            }
        }
    }
}

/// The store's [`Notifier`]: wake-ups from this process's writes.
///
/// Each handle keeps its own `RunSettled` permit, so several waiters each
/// see a settle that happened while they were not waiting.
#[derive(Debug)]
pub struct SqliteNotifier {
    wakeups: Arc<Wakeups>,
    settled_seen: AtomicU64,
}

impl SqliteNotifier {
    pub(crate) fn new(wakeups: Arc<Wakeups>) -> Self {
        let seen = wakeups.settled_generation.load(Ordering::SeqCst);
        Self {
            wakeups,
            settled_seen: AtomicU64::new(seen),
        }
    }

    async fn settled(&self) {
        loop {
            let notified = self.wakeups.settled.notified();
            let mut notified = std::pin::pin!(notified);
            // Registering before reading the generation closes the gap
            // between "no new settle yet" and waiting: a settle in between
            // wakes this registered waiter.
            notified.as_mut().enable();
            let current = self.wakeups.settled_generation.load(Ordering::SeqCst);
            let seen = self.settled_seen.swap(current, Ordering::SeqCst);
            if current != seen {
                return;
            }
            notified.await;
        }
    }
}

impl Notifier for SqliteNotifier {
    async fn notified(&self, topic: Topic) {
        match topic {
            Topic::Scheduler => self.wakeups.scheduler.notified().await,
            Topic::Publisher => self.wakeups.publisher.notified().await,
            Topic::RunSettled => self.settled().await,
        }
    }
}
