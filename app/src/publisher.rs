//! The outbox publisher (docs/design/outbox-and-queues.md#the-publisher): sweep
//! unpublished rows in bounded batches, in priority order
//! (docs/design/priorities.md), publish them with confirms, mark the
//! confirmed ones in the same transaction. A broker outage rolls back: the rows
//! stay and are retried. A queue that keeps a window takes only what fits;
//! the rest waits in the outbox, polled until there is room. Rows a
//! committer holds to publish itself are left to it until their hold is
//! over (docs/design/outbox-and-queues.md#publish-after-commit).

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_ports::store::{DEFAULT_PRIORITY_AGING, Notifier, OutboxSweep, Topic};
use flowforge_ports::{DispatchId, DispatchPublisher, Scope, Store, queue};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// How long after a held row's release the loop looks, so the sweep's
/// store time has reached it.
const HOLD_SLACK: Duration = Duration::from_millis(5);

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Rows confirmed and marked published.
    pub published: usize,
    /// Rows left unpublished (unroutable, refused, timed out).
    pub failed: usize,
    /// Whether the batch was full (sweep again at once).
    pub more: bool,
    /// Whether the queue's window held rows back (sweep again once a
    /// consumer has taken some).
    pub held_back: bool,
}

/// Tuning of the publisher loop.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// Which runs' rows to publish.
    pub scope: Scope,
    /// Most rows per sweep (each sweep is one transaction).
    pub batch: u32,
    /// The slow periodic sweep that only backs up the notifications.
    pub safety_net: Duration,
    /// Wakes the loop like a store notification does (see
    /// [`Scope::Runs`]: its owner pokes it after adding a run).
    pub nudge: Option<Arc<Notify>>,
    /// How long waiting work takes to gain one priority level
    /// (docs/design/priorities.md#aging).
    pub aging: Duration,
    /// How soon to look again while the queue's window holds rows back;
    /// doubled (up to a quarter second) each time the window stays full, so
    /// a queue without consumers is not polled hard.
    pub room_poll: Duration,
    /// Re-arms, every half of this, the rows published at least this long
    /// ago whose task run is still ready: dispatches the broker lost (a
    /// deleted queue). For a queue that keeps a window, which re-armed rows
    /// go through like any other, so their duplicates never exceed it
    /// (docs/design/outbox-and-queues.md#lost-dispatches). `None`: never.
    pub redispatch_after: Option<Duration>,
    /// The longest hold committers put on rows they publish themselves, as
    /// distributed workers do (docs/design/outbox-and-queues.md#publish-after-commit),
    /// or `None` when none does (an embedded engine). Nothing wakes the
    /// loop when a hold ends, so it sleeps no longer than this, nor than
    /// until the first hold it knows of ends.
    pub holds: Option<Duration>,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            scope: Scope::All,
            batch: 500,
            safety_net: Duration::from_secs(30),
            nudge: None,
            aging: DEFAULT_PRIORITY_AGING,
            room_poll: Duration::from_millis(5),
            redispatch_after: None,
            holds: Some(crate::after_commit::DEFAULT_HOLD),
        }
    }
}

/// When the loop re-arms lost dispatches, and which.
#[derive(Debug)]
struct Rearm {
    /// A queue that died with its process: everything, once, at start.
    startup: bool,
    after: Option<Duration>,
    next: Option<Instant>,
}

impl Rearm {
    fn new(durable: bool, after: Option<Duration>) -> Self {
        Self {
            startup: !durable,
            after,
            next: after.map(|a| Instant::now() + a / 2),
        }
    }

    /// How old a dispatch must be to be re-armed now, if a re-arm is due.
    fn due(&self) -> Option<Duration> {
        if self.startup {
            return Some(Duration::ZERO);
        }
        let after = self.after?;
        (Instant::now() >= self.next?).then_some(after)
    }

    fn done(&mut self) {
        self.startup = false;
        self.next = self.after.map(|a| Instant::now() + a / 2);
    }

    /// How long the loop may sleep before the next re-arm is due.
    fn wait(&self) -> Option<Duration> {
        self.next.map(|n| n.saturating_duration_since(Instant::now()))
    }
}

/// Moves outbox rows to the queue.
#[derive(Debug)]
pub struct OutboxPublisher<S, P> {
    store: S,
    queue: P,
    config: PublisherConfig,
}

impl<S: Store, P: DispatchPublisher> OutboxPublisher<S, P> {
    /// A publisher from `store` to `queue`.
    pub fn new(store: S, queue: P, config: PublisherConfig) -> Self {
        Self { store, queue, config }
    }

    /// One sweep. Rows that failed to publish stay unpublished; if any
    /// failure was the broker's (transient), the sweep reports an error so
    /// the loop backs off — after committing what did get through.
    pub async fn publish_once(&self) -> Result<SweepReport, Error> {
        let batch = self.config.batch;
        let room = self.queue.room().await?;
        let limit = room.map_or(batch, |room| room.min(batch));
        if limit == 0 {
            return Ok(SweepReport {
                held_back: true,
                ..SweepReport::default()
            });
        }
        let Some(mut sweep) = self
            .store
            .begin_sweep(self.config.scope.clone(), limit, self.config.aging)
            .await?
        else {
            return Ok(SweepReport::default());
        };
        let rows = sweep.dispatches().to_vec();
        let results = self.queue.publish(&rows).await;
        let mut confirmed: Vec<DispatchId> = Vec::with_capacity(rows.len());
        let mut transient: Option<queue::Error> = None;
        let mut failed = 0;
        for (row, result) in rows.iter().zip(results) {
            match result {
                Ok(()) => confirmed.push(row.dispatch_id),
                Err(e) => {
                    failed += 1;
                    tracing::error!(
                        dispatch_id = %row.dispatch_id, run_id = %row.run_id, task_key = %row.task_key,
                        token = row.fencing_token, error = %e, "dispatch not published; the row stays in the outbox"
                    );
                    if e.is_transient() {
                        transient.get_or_insert(e);
                    } else {
                        return Err(e.into());
                    }
                }
            }
        }
        if !confirmed.is_empty() {
            sweep.mark_published(&confirmed).await?;
            sweep.commit().await?;
        }
        if let Some(e) = transient {
            return Err(e.into());
        }
        Ok(SweepReport {
            published: confirmed.len(),
            failed,
            more: rows.len() >= batch as usize,
            held_back: limit < batch && rows.len() >= limit as usize,
        })
    }

    /// One sweep of the loop, after re-arming what is lost when that is due
    /// (docs/design/outbox-and-queues.md#lost-dispatches): at start, every
    /// published row of a task run still ready at its token when the queue
    /// died with its process (it starts empty, so nobody will deliver
    /// them); periodically, with `redispatch_after`, the rows published
    /// that long ago.
    async fn sweep(&self, rearm: &mut Rearm) -> Result<SweepReport, Error> {
        if let Some(age) = rearm.due() {
            let rows = self.store.rearm_lost_dispatches(self.config.scope.clone(), age).await?;
            if rows > 0 {
                tracing::warn!(
                    rows,
                    published_seconds_ago = age.as_secs(),
                    "publishing again dispatches still unclaimed since they were published: \
                     lost by the queue, or waiting that long (a duplicate claims nothing)"
                );
            }
            rearm.done();
        }
        self.publish_once().await
    }

    /// `wait`, or less if a row held for its committer is released sooner,
    /// and at most `hold`, for holds taken while the loop sleeps: nothing
    /// wakes it when a hold ends (its committer settles the row, or died;
    /// docs/design/outbox-and-queues.md#publish-after-commit).
    async fn until_a_hold_ends(&self, wait: Duration, hold: Duration) -> Duration {
        let wait = wait.min(hold + HOLD_SLACK);
        match self.store.held_for(self.config.scope.clone()).await {
            Ok(Some(held)) => wait.min(held + HOLD_SLACK),
            Ok(None) => wait,
            Err(e) => {
                tracing::debug!(error = %e, "cannot see the rows held for their committers");
                wait
            }
        }
    }

    /// Sweeps until `shutdown`, woken by new outbox rows; backs off (capped,
    /// jittered) while the queue or the store is unavailable. A queue-type
    /// mismatch is fatal: no retry can fix it.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        let notifier = self.store.notifier().await?;
        let mut failures = 0u32;
        let mut full_polls = 0u32;
        let mut rearm = Rearm::new(self.queue.durable(), self.config.redispatch_after);
        loop {
            let mut wait = self.config.safety_net;
            let mut room_poll = false;
            match self.sweep(&mut rearm).await {
                Ok(report) => {
                    failures = 0;
                    if report.more {
                        continue;
                    }
                    if report.held_back {
                        room_poll = true;
                        full_polls = if report.published > 0 {
                            0
                        } else {
                            full_polls.saturating_add(1)
                        };
                        wait = self
                            .config
                            .room_poll
                            .saturating_mul(1 << full_polls.min(8))
                            .min(Duration::from_millis(250));
                    }
                }
                Err(Error::Queue(e)) if !e.is_transient() => return Err(Error::Queue(e)),
                Err(e) => {
                    failures += 1;
                    let wait = crate::backoff(failures);
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "outbox sweep failed; rows stay pending");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            }
            let wait = rearm.wait().map_or(wait, |due| wait.min(due));
            let wait = match self.config.holds {
                // While the window is full the room poll looks soon anyway,
                // and a row whose hold has ended could not go out sooner.
                Some(hold) if !room_poll => self.until_a_hold_ends(wait, hold).await,
                _ => wait,
            };
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = notifier.notified(Topic::Publisher) => {}
                () = crate::nudged(self.config.nudge.as_deref()) => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_that_dies_with_its_process_rearms_everything_once_at_start() {
        let mut rearm = Rearm::new(false, None);
        assert_eq!(rearm.due(), Some(Duration::ZERO));
        rearm.done();
        assert_eq!(rearm.due(), None);
        assert_eq!(rearm.wait(), None, "nothing bounds the loop's sleep");
    }

    #[test]
    fn a_durable_queue_rearms_only_what_waited_the_bound_every_half_of_it() {
        assert_eq!(Rearm::new(true, None).due(), None);
        let hour = Duration::from_secs(3600);
        let rearm = Rearm::new(true, Some(hour));
        assert_eq!(rearm.due(), None, "not before half the bound");
        assert!(rearm.wait().is_some_and(|w| w <= hour / 2));
        let mut now = Rearm::new(true, Some(Duration::ZERO));
        assert_eq!(now.due(), Some(Duration::ZERO));
        now.done();
        assert_eq!(
            now.due(),
            Some(Duration::ZERO),
            "due again once half the bound has passed"
        );
    }
}
