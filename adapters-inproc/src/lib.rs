//! The dispatch queue in process (the embedded queue): at-least-once like
//! the real broker — a delivery that is nacked, or dropped without an ack
//! (its consumer gone, its task panicked), is delivered again — and a
//! priority queue: it hands out the dispatch with the smallest priority
//! order key first (docs/design/priorities.md), so the embedded engine
//! serves ready work highest priority first, FIFO within a priority, with
//! aging.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use flowforge_domain::priority::{DEFAULT_AGING_MICROS, order_key};
use flowforge_ports::{Delivery, Dispatch, DispatchConsumer, DispatchPublisher, DispatchQueue, queue};
use tokio::sync::Notify;

#[derive(Debug)]
struct Inner {
    ready: Mutex<Ready>,
    available: Notify,
    aging_micros: i64,
}

/// A waiting dispatch, ordered by (order key, dispatch id, arrival).
#[derive(Debug)]
struct Waiting {
    rank: (i64, i64, u64),
    dispatch: Dispatch,
    redelivered: bool,
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

#[derive(Debug, Default)]
struct Ready {
    messages: BinaryHeap<Reverse<Waiting>>,
    arrivals: u64,
    closed: bool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Ready> {
        // Every critical section is a single push or pop: a panic cannot
        // leave the heap half-updated, so a poisoned lock is still sound.
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where `dispatch` ranks, arrival aside. A dispatch without a ready
    /// time (written before dispatches carried one) ranks as ready at the
    /// epoch: by priority, then in arrival order.
    fn rank(&self, dispatch: &Dispatch) -> (i64, i64) {
        let ready_micros = dispatch.ready_at.map_or(0, |t| t.timestamp_micros());
        (
            order_key(ready_micros, dispatch.priority, self.aging_micros),
            dispatch.dispatch_id.0,
        )
    }

    /// Queues `dispatch` under `ready`.
    fn enqueue(&self, ready: &mut Ready, dispatch: Dispatch, redelivered: bool) {
        let (key, id) = self.rank(&dispatch);
        ready.arrivals += 1;
        ready.messages.push(Reverse(Waiting {
            rank: (key, id, ready.arrivals),
            dispatch,
            redelivered,
        }));
    }

    fn push(&self, dispatch: Dispatch, redelivered: bool) {
        let mut ready = self.lock();
        self.enqueue(&mut ready, dispatch, redelivered);
        drop(ready);
        self.available.notify_one();
    }
}

/// An in-process queue: clone it freely, every clone is the same queue.
#[derive(Debug, Clone)]
pub struct InprocQueue {
    inner: Arc<Inner>,
}

impl Default for InprocQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl InprocQueue {
    /// An empty queue whose waiting work gains a priority level every five
    /// minutes.
    pub fn new() -> Self {
        Self::with_aging(Duration::from_micros(DEFAULT_AGING_MICROS.unsigned_abs()))
    }

    /// An empty queue whose waiting work gains a priority level every
    /// `aging`.
    pub fn with_aging(aging: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                ready: Mutex::default(),
                available: Notify::new(),
                aging_micros: i64::try_from(aging.as_micros()).unwrap_or(i64::MAX),
            }),
        }
    }

    /// Closes the queue: consumers drain what is left, then get `Ok(None)`.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.inner.available.notify_waiters();
    }

    /// Messages waiting for a consumer.
    pub fn len(&self) -> usize {
        self.inner.lock().messages.len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl DispatchPublisher for InprocQueue {
    /// Every dispatch is "confirmed" once it is queued: there is no broker
    /// to lose it and nothing to route, so this never fails while open.
    async fn publish(&self, batch: &[Dispatch]) -> Vec<Result<(), queue::Error>> {
        let mut results = Vec::with_capacity(batch.len());
        {
            let mut ready = self.inner.lock();
            for d in batch {
                if ready.closed {
                    results.push(Err(queue::Error::Closed));
                } else {
                    self.inner.enqueue(&mut ready, d.clone(), false);
                    results.push(Ok(()));
                }
            }
        }
        for _ in 0..batch.len() {
            self.inner.available.notify_one();
        }
        results
    }

    /// Whether the next delivery would come before `dispatch`.
    fn holds_more_urgent(&self, dispatch: &Dispatch) -> bool {
        let rank = self.inner.rank(dispatch);
        self.inner
            .lock()
            .messages
            .peek()
            .is_some_and(|Reverse(next)| (next.rank.0, next.rank.1) < rank)
    }

    /// What it holds dies with the process.
    fn durable(&self) -> bool {
        false
    }
}

impl DispatchQueue for InprocQueue {
    type Consumer = InprocConsumer;

    async fn consumer(&self) -> Result<InprocConsumer, queue::Error> {
        Ok(InprocConsumer {
            inner: Arc::clone(&self.inner),
        })
    }
}

/// A consumer of an [`InprocQueue`].
#[derive(Debug)]
pub struct InprocConsumer {
    inner: Arc<Inner>,
}

impl DispatchConsumer for InprocConsumer {
    type Delivery = InprocDelivery;

    async fn next(&mut self) -> Result<Option<InprocDelivery>, queue::Error> {
        loop {
            // Register interest before looking, so a push between the look
            // and the wait is not missed.
            let notified = self.inner.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match take(&self.inner) {
                (Some(delivery), _) => return Ok(Some(delivery)),
                (None, true) => return Ok(None),
                (None, false) => notified.await,
            }
        }
    }

    fn try_next(&mut self) -> Option<InprocDelivery> {
        take(&self.inner).0
    }
}

/// The most urgent waiting dispatch, as a delivery, if one waits, and
/// whether the queue is closed, seen under one lock: a closed queue still
/// hands out what it holds.
fn take(inner: &Arc<Inner>) -> (Option<InprocDelivery>, bool) {
    let mut ready = inner.lock();
    let Some(Reverse(Waiting {
        dispatch, redelivered, ..
    })) = ready.messages.pop()
    else {
        return (None, ready.closed);
    };
    let more = !ready.messages.is_empty();
    drop(ready);
    if more {
        // Pass the baton: another waiting consumer may take the next one.
        inner.available.notify_one();
    }
    let delivery = InprocDelivery {
        inner: Arc::clone(inner),
        dispatch: Some(dispatch),
        redelivered,
    };
    (Some(delivery), false)
}

/// One delivery; dropped without `ack` it goes back to the queue.
#[derive(Debug)]
pub struct InprocDelivery {
    inner: Arc<Inner>,
    dispatch: Option<Dispatch>,
    redelivered: bool,
}

impl InprocDelivery {
    fn requeue(&mut self) {
        if let Some(dispatch) = self.dispatch.take() {
            self.inner.push(dispatch, true);
        }
    }
}

impl Drop for InprocDelivery {
    fn drop(&mut self) {
        self.requeue();
    }
}

impl Delivery for InprocDelivery {
    fn dispatch(&self) -> &Dispatch {
        // `dispatch` is only taken by ack/nack/drop, which consume `self`.
        self.dispatch
            .as_ref()
            .unwrap_or_else(|| unreachable!("a live delivery holds its dispatch"))
    }

    fn redelivered(&self) -> bool {
        self.redelivered
    }

    async fn ack(mut self) -> Result<(), queue::Error> {
        self.dispatch = None;
        Ok(())
    }

    async fn nack_requeue(mut self) -> Result<(), queue::Error> {
        self.requeue();
        Ok(())
    }
}
