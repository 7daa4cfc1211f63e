//! The dispatch queue in process (the embedded queue): at-least-once like
//! the real broker — a delivery that is nacked, or dropped without an ack
//! (its consumer gone, its task panicked), is delivered again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use flowforge_ports::{Delivery, Dispatch, DispatchConsumer, DispatchPublisher, DispatchQueue, queue};
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Inner {
    ready: Mutex<Ready>,
    available: Notify,
}

#[derive(Debug, Default)]
struct Ready {
    messages: VecDeque<(Dispatch, bool)>,
    closed: bool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Ready> {
        // Every critical section is a single push or pop: a panic cannot
        // leave the deque half-updated, so a poisoned lock is still sound.
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, dispatch: Dispatch, redelivered: bool, front: bool) {
        let mut ready = self.lock();
        if front {
            ready.messages.push_front((dispatch, redelivered));
        } else {
            ready.messages.push_back((dispatch, redelivered));
        }
        drop(ready);
        self.available.notify_one();
    }
}

/// An in-process queue: clone it freely, every clone is the same queue.
#[derive(Debug, Clone, Default)]
pub struct InprocQueue {
    inner: Arc<Inner>,
}

impl InprocQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
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
                    ready.messages.push_back((d.clone(), false));
                    results.push(Ok(()));
                }
            }
        }
        for _ in 0..batch.len() {
            self.inner.available.notify_one();
        }
        results
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
            {
                let mut ready = self.inner.lock();
                if let Some((dispatch, redelivered)) = ready.messages.pop_front() {
                    let more = !ready.messages.is_empty();
                    drop(ready);
                    if more {
                        // Pass the baton: another waiting consumer may take the next one.
                        self.inner.available.notify_one();
                    }
                    return Ok(Some(InprocDelivery {
                        inner: Arc::clone(&self.inner),
                        dispatch: Some(dispatch),
                        redelivered,
                    }));
                }
                if ready.closed {
                    return Ok(None);
                }
            }
            notified.await;
        }
    }
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
            self.inner.push(dispatch, true, true);
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
