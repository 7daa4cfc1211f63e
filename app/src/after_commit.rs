//! Publish after commit (docs/design/outbox-and-queues.md#publish-after-commit):
//! the dispatches a worker's finish made ready are published by the
//! worker's process right after the commit. Into a broker, they are held
//! from the outbox sweep, published with confirms, and their rows settled —
//! marked published, or released to the sweep when they did not go through
//! or the queue's window had no room for them; the outbox publisher stays
//! the safety net, sweeping a row whose committer died before settling it
//! once its hold is over. Into a queue that dies with the process, they are
//! committed published and pushed: there is nothing to settle, and what a
//! dead process did not push is re-armed by the next publisher's start.
//! A dispatch the finishing slot keeps for itself
//! (docs/design/outbox-and-queues.md#continuing-a-chain) is not published at
//! all: a held one is settled published once the slot has claimed it.

use std::cmp::Reverse;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge_domain::Priority;
use flowforge_domain::plan::Handoff;
use flowforge_ports::store::Handover;
use flowforge_ports::{Dispatch, DispatchId, DispatchPublisher, OutboxStore, queue};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long a finish holds its dispatches from the sweep by default: far
/// longer than a publish and its confirm take on a healthy broker, short
/// enough that a crashed worker's dispatches wait little. Dispatches still
/// waiting here at half of it go to the sweep instead, so a slow broker
/// makes few duplicates.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(5);

/// How long a stopping process waits for its last dispatches to publish.
const FLUSH_WITHIN: Duration = Duration::from_secs(5);

/// The widest handoff whose dispatches a finish holds: a wider fan-out's
/// could not fit a window anyway (releasing them is one more write per
/// row), and the sweep publishes wide batches well.
const MOST_HELD: usize = 64;

/// Most dispatches published in one batch (one settling statement).
const MOST_PER_BATCH: usize = 500;

/// A worker's handle on its process's after-commit publisher. Cheap to
/// clone; a forwarding publisher ([`AfterCommit::start`]) ends once every
/// handle is dropped, after publishing what it was handed.
#[derive(Clone)]
pub struct AfterCommit {
    how: How,
}

#[derive(Clone)]
enum How {
    /// Held rows, handed to the task that publishes and settles them.
    Forward {
        sender: mpsc::UnboundedSender<Handed>,
        hold: Duration,
    },
    /// Rows committed published, pushed by the finishing slot itself.
    Push(Arc<dyn Push>),
}

impl std::fmt::Debug for AfterCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.how {
            How::Forward { hold, .. } => f
                .debug_struct("AfterCommit")
                .field("hold", hold)
                .finish_non_exhaustive(),
            How::Push(_) => f.write_str("AfterCommit(push)"),
        }
    }
}

/// A [`DispatchPublisher`] behind a pointer: the handle does not name the
/// queue's type.
trait Push: Send + Sync + 'static {
    fn push<'a>(&'a self, batch: &'a [Dispatch]) -> Pushing<'a>;
    fn holds_more_urgent(&self, dispatch: &Dispatch) -> bool;
}

/// A push in flight: one outcome per dispatch, in order.
type Pushing<'a> = Pin<Box<dyn Future<Output = Vec<Result<(), queue::Error>>> + Send + 'a>>;

impl<P: DispatchPublisher> Push for P {
    fn push<'a>(&'a self, batch: &'a [Dispatch]) -> Pushing<'a> {
        Box::pin(self.publish(batch))
    }

    fn holds_more_urgent(&self, dispatch: &Dispatch) -> bool {
        DispatchPublisher::holds_more_urgent(self, dispatch)
    }
}

/// What one finish handed over.
#[derive(Debug)]
struct Handed {
    dispatches: Vec<Dispatch>,
    /// Other rows were waiting for the sweep at the commit.
    queued: bool,
    at: Instant,
    /// The dispatches were claimed in this process: settle them published
    /// without publishing them.
    kept: bool,
}

/// The publishing loop behind [`AfterCommit`].
#[derive(Debug)]
struct Forwarder<S, P> {
    store: S,
    queue: P,
    hold: Duration,
    receiver: mpsc::UnboundedReceiver<Handed>,
}

impl AfterCommit {
    /// A handle whose finishes hold their dispatches for `hold`, and the
    /// task, spawned here, that publishes them into `queue` and settles
    /// them in `store`. The task ends once every handle is dropped and
    /// what they handed over is published: await it then, so a stopping
    /// process leaves no row to wait for its hold.
    pub fn start<S: OutboxStore, P: DispatchPublisher>(store: S, queue: P, hold: Duration) -> (Self, JoinHandle<()>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let forwarder = Forwarder {
            store,
            queue,
            hold,
            receiver,
        };
        (
            Self {
                how: How::Forward { sender, hold },
            },
            tokio::spawn(forwarder.run()),
        )
    }

    /// A handle whose finishes commit their dispatches published and push
    /// them into `queue` themselves, or `None` when `queue` outlives the
    /// process ([`DispatchPublisher::durable`]): a dispatch a broker did
    /// not confirm must stay in the outbox, so that queue takes
    /// [`AfterCommit::start`].
    pub fn pushing<P: DispatchPublisher>(queue: P) -> Option<Self> {
        (!queue.durable()).then(|| Self {
            how: How::Push(Arc::new(queue)),
        })
    }

    /// Who publishes the dispatches of a finish handing on `handoff`: this
    /// publisher, or the sweep, which takes a handoff wider than
    /// [`MOST_HELD`] from a forwarding one.
    pub fn handover_for(&self, handoff: &Handoff) -> Handover {
        match &self.how {
            How::Forward { hold, .. } if handoff.dependents.len() <= MOST_HELD => Handover::Held(*hold),
            How::Forward { .. } => Handover::Sweep,
            How::Push(_) => Handover::Pushed,
        }
    }

    /// Hands over dispatches just committed, with whether other rows were
    /// waiting for the sweep then ([`Finished`](flowforge_ports::store::Finished)
    /// says both). If a forwarding loop has ended, the sweep publishes them
    /// once their hold is over; what a closed in-process queue refuses is
    /// re-armed by the next publisher's start.
    pub async fn hand(&self, dispatches: Vec<Dispatch>, queued: bool) {
        match &self.how {
            How::Forward { sender, .. } => {
                let handed = Handed {
                    dispatches,
                    queued,
                    at: Instant::now(),
                    kept: false,
                };
                if sender.send(handed).is_err() {
                    tracing::debug!("the after-commit publisher has stopped; the sweep publishes these dispatches");
                }
            }
            How::Push(queue) => {
                let results = queue.push(&dispatches).await;
                for (dispatch, result) in dispatches.iter().zip(results) {
                    if let Err(e) = result {
                        tracing::warn!(
                            dispatch_id = %dispatch.dispatch_id, run_id = %dispatch.run_id, task_key = %dispatch.task_key,
                            error = %e, "dispatch not pushed after its commit; the next publisher's start re-arms it"
                        );
                    }
                }
            }
        }
    }

    /// Whether a finishing slot may keep `dispatch` and run it itself
    /// (docs/design/outbox-and-queues.md#continuing-a-chain): not when the
    /// queue it would be pushed into holds more urgent work. A broker
    /// cannot tell; its backlog in the outbox the finish reports instead.
    pub fn may_keep(&self, dispatch: &Dispatch) -> bool {
        match &self.how {
            How::Forward { .. } => true,
            How::Push(queue) => !queue.holds_more_urgent(dispatch),
        }
    }

    /// Settles a dispatch its finishing slot kept and then claimed itself
    /// (or found claimed or cancelled already): nobody publishes it. A held
    /// row is marked published; a pushed one was committed published. If
    /// the forwarding loop has ended, the sweep publishes it once its hold
    /// is over, and that duplicate claims nothing.
    pub fn kept(&self, dispatch: Dispatch) {
        if let How::Forward { sender, .. } = &self.how {
            let handed = Handed {
                dispatches: vec![dispatch],
                queued: false,
                at: Instant::now(),
                kept: true,
            };
            if sender.send(handed).is_err() {
                tracing::debug!("the after-commit publisher has stopped; the sweep's copy of a kept dispatch is stale");
            }
        }
    }
}

/// Waits, briefly, for the task [`AfterCommit::start`] spawned to publish
/// what a stopped worker's last finishes handed over (every handle must be
/// dropped); what does not make it is swept once its hold is over.
pub async fn flush(publishing: JoinHandle<()>) {
    if tokio::time::timeout(FLUSH_WITHIN, publishing).await.is_err() {
        tracing::warn!("dispatches still publishing at exit are left to the outbox sweep");
    }
}

impl<S: OutboxStore, P: DispatchPublisher> Forwarder<S, P> {
    /// Publishes what the handles hand over, in batches of whatever
    /// arrived meanwhile, until every handle is dropped.
    async fn run(mut self) {
        while let Some(first) = self.receiver.recv().await {
            let mut batch = vec![first];
            let mut size = batch[0].dispatches.len();
            while size < MOST_PER_BATCH
                && let Ok(more) = self.receiver.try_recv()
            {
                size += more.dispatches.len();
                batch.push(more);
            }
            self.publish(batch).await;
        }
    }

    /// Publishes what may go now and settles every row: a failure never
    /// loses one, it only leaves it to the sweep.
    async fn publish(&self, batch: Vec<Handed>) {
        let (kept, batch): (Vec<Handed>, Vec<Handed>) = batch.into_iter().partition(|h| h.kept);
        let mut published: Vec<DispatchId> = kept
            .iter()
            .flat_map(|h| h.dispatches.iter().map(|d| d.dispatch_id))
            .collect();
        let room = if batch.is_empty() {
            None
        } else {
            match self.queue.room().await {
                Ok(room) => room,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot see the queue's room; leaving these dispatches to the sweep");
                    Some(0)
                }
            }
        };
        let (now, mut released) = split(batch, room, self.hold / 2);
        if !now.is_empty() {
            let mut results = self.queue.publish(&now).await.into_iter();
            for dispatch in &now {
                match results.next() {
                    Some(Ok(())) => published.push(dispatch.dispatch_id),
                    outcome => {
                        let error = outcome.map_or_else(|| "no outcome reported".to_owned(), |e| format!("{e:?}"));
                        tracing::warn!(
                            dispatch_id = %dispatch.dispatch_id, run_id = %dispatch.run_id, task_key = %dispatch.task_key,
                            error, "dispatch not published after its commit; released to the sweep"
                        );
                        released.push(dispatch.dispatch_id);
                    }
                }
            }
        }
        if let Err(e) = self.store.settle_held(&published, &released).await {
            tracing::warn!(
                error = %e,
                published = published.len(),
                released = released.len(),
                "cannot settle dispatches published after commit; the sweep publishes them again once their hold \
                 is over (a duplicate claims nothing)"
            );
        }
    }
}

/// The order a queue that sorts would deliver dispatches in: highest
/// priority first, then oldest readiness.
pub(crate) fn urgency(d: &Dispatch) -> (Reverse<Priority>, i64) {
    (Reverse(d.priority), d.dispatch_id.0)
}

/// Which handed-over dispatches to publish now, most urgent first, and
/// which to release to the sweep: those handed over `stale` ago or more
/// (their hold is running out, and the sweep would publish them again);
/// with a window (`room`), those that do not fit, and every one committed
/// while other rows waited for the sweep, which publishes the backlog in
/// priority order (docs/design/priorities.md#the-broker-window).
fn split(batch: Vec<Handed>, room: Option<u32>, stale: Duration) -> (Vec<Dispatch>, Vec<DispatchId>) {
    let mut now = Vec::new();
    let mut released = Vec::new();
    for handed in batch {
        let go = handed.at.elapsed() < stale && !(room.is_some() && handed.queued);
        if go {
            now.extend(handed.dispatches);
        } else {
            released.extend(handed.dispatches.iter().map(|d| d.dispatch_id));
        }
    }
    if let Some(room) = room {
        now.sort_by_key(urgency);
        let fits = now.len().min(room as usize);
        released.extend(now.drain(fits..).map(|d| d.dispatch_id));
    }
    (now, released)
}

#[cfg(test)]
mod tests {
    use flowforge_domain::Priority;
    use flowforge_ports::{RunId, TaskRunId};

    use super::*;

    fn dispatch(id: i64, priority: u8) -> Dispatch {
        Dispatch {
            dispatch_id: DispatchId(id),
            task_run_id: TaskRunId(id),
            run_id: RunId(Default::default()),
            task_key: format!("t{id}"),
            task_type: "noop".to_owned(),
            fencing_token: 1,
            ready_at: None,
            priority: Priority::new(i64::from(priority)).expect("on the scale"),
        }
    }

    fn handed(ids: &[(i64, u8)], queued: bool, ago: Duration) -> Handed {
        Handed {
            dispatches: ids.iter().map(|&(id, p)| dispatch(id, p)).collect(),
            queued,
            at: Instant::now() - ago,
            kept: false,
        }
    }

    fn ids(dispatches: &[Dispatch]) -> Vec<i64> {
        dispatches.iter().map(|d| d.dispatch_id.0).collect()
    }

    const STALE: Duration = Duration::from_secs(60);

    #[test]
    fn without_a_window_everything_fresh_goes_and_what_waited_too_long_is_released() {
        let batch = vec![
            handed(&[(1, 5), (2, 5)], true, Duration::ZERO),
            handed(&[(3, 9)], false, STALE),
        ];
        let (now, released) = split(batch, None, STALE);
        assert_eq!(ids(&now), [1, 2], "a backlog does not matter without a window");
        assert_eq!(released, [DispatchId(3)]);
    }

    #[test]
    fn a_window_takes_the_most_urgent_that_fit_and_leaves_a_backlog_to_the_sweep() {
        let batch = vec![
            handed(&[(1, 2), (2, 7), (3, 7)], false, Duration::ZERO),
            handed(&[(4, 9)], true, Duration::ZERO),
        ];
        let (now, mut released) = split(batch, Some(2), STALE);
        assert_eq!(ids(&now), [2, 3], "most urgent first, then oldest");
        released.sort();
        assert_eq!(released, [DispatchId(1), DispatchId(4)]);
        let (now, released) = split(vec![handed(&[(5, 5)], false, Duration::ZERO)], Some(0), STALE);
        assert!(now.is_empty());
        assert_eq!(released, [DispatchId(5)], "no room: the sweep takes it");
    }
}
