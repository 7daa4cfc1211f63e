//! The worker (docs/design/handlers.md#the-worker): consume a dispatch,
//! claim the task run with its token, run the trusted handler with a
//! timeout while heartbeating the lease, store the outcome with the token,
//! and only then acknowledge; then run, in the same slot, a task that
//! success made ready (docs/design/outbox-and-queues.md#continuing-a-chain).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowforge_domain::TaskRunState;
use flowforge_domain::limits::{self, Limits, ValueKind};
use flowforge_domain::plan::Handoff;
use flowforge_ports::handler::Pulse;
use flowforge_ports::store::{
    Claim, FinishCall, FinishResult, Finished, Handover, LeaseStatus, NextClaim, TaskInputs, TaskOutcome,
};
use flowforge_ports::{
    Delivery, Dispatch, DispatchConsumer, DispatchQueue, HandlerError, RunId, Scope, Store, TaskContext, TaskEvent,
    WorkerId, queue, store,
};
use serde_json::{Map, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio::time::error::Elapsed;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::after_commit::{AfterCommit, urgency};
use crate::cache::DefinitionCache;
use crate::error::Error;
use crate::observers::Observers;
use crate::registry::{HandlerRegistry, panic_message};

/// How long a slot waits before requeueing a dispatch it could not claim
/// because the store failed.
const STORE_TROUBLE_PAUSE: Duration = Duration::from_secs(1);
/// How long a slot holds a dispatch of a type it does not serve before
/// returning it, so that the broker hands it to another consumer instead
/// of straight back to this one.
const NOT_SERVED_PAUSE: Duration = Duration::from_millis(200);
/// The least time between two lease renewals a handler's pulses bring
/// forward.
const PULSE_GAP: Duration = Duration::from_secs(1);

/// The first pause before storing an outcome again after the store was
/// unreachable; it doubles up to [`FINISH_RETRY_MAX_PAUSE`].
const FINISH_RETRY_FIRST_PAUSE: Duration = Duration::from_millis(200);
const FINISH_RETRY_MAX_PAUSE: Duration = Duration::from_secs(2);

/// Tuning of a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// How this worker names itself in leases and events.
    pub id: WorkerId,
    /// Concurrency slots: one consumer with prefetch 1 each.
    pub concurrency: usize,
    /// Lease length; the heartbeat renews it every third of it.
    pub lease: Duration,
    /// How long a handler gets to stop after its cancellation fires
    /// (timeout, cancel, lost lease) before it is abandoned.
    pub stop_grace: Duration,
    /// The largest output stored and the largest inputs assembled for one
    /// attempt (docs/design/data-flow.md#limits).
    pub limits: Limits,
    /// Task timeouts above this are refused (RabbitMQ's consumer timeout
    /// would otherwise close the channel under a long task).
    pub max_task_timeout: Option<Duration>,
    /// Publishes the dispatches a success made ready right after its
    /// commit (docs/design/outbox-and-queues.md#publish-after-commit);
    /// without it they wait for the outbox publisher's sweep.
    pub after_commit: Option<AfterCommit>,
    /// How many tasks in a row a slot runs straight from its own finishes
    /// (docs/design/outbox-and-queues.md#continuing-a-chain) before it
    /// takes its next dispatch from the queue again; 0 never. Needs
    /// `after_commit`.
    pub chain_hops: u32,
}

/// A slot's default [`WorkerConfig::chain_hops`]: long enough that a chain
/// rarely crosses the queue, short enough that work queued behind a slot's
/// chain waits for a few tasks at most.
pub const DEFAULT_CHAIN_HOPS: u32 = 16;

/// How long a slot goes on running tasks from its own finishes: a task
/// that ends later keeps nothing. Saving a hop matters for short tasks
/// only, and the bound keeps a delivery the broker already handed this
/// slot's consumer waiting for at most one more task, so it stays within
/// the consumer timeout as a task does
/// (docs/design/outbox-and-queues.md#consumer-timeout).
const CHAIN_BUDGET: Duration = Duration::from_secs(1);

/// A dispatch a finish kept for its slot, with what the finished task
/// leaves it.
struct Kept {
    dispatch: Dispatch,
    carried: Option<Carried>,
}

/// What a finished task leaves the task its slot runs next
/// (docs/design/outbox-and-queues.md#carried-inputs): the run input it
/// was given and the output it just stored. The kept task's claim
/// succeeding at its token means that success is still the one stored,
/// so a task depending on it alone takes these instead of reading them
/// back.
struct Carried {
    run_input: Value,
    key: String,
    output: Value,
}

impl Carried {
    /// The inputs of a forward task depending on `keys`, as
    /// [`task_inputs`](flowforge_ports::RunStore::task_inputs) would read
    /// them, limit included; `None` unless `keys` is the carried task alone.
    fn inputs(self, keys: &[String], limit: usize) -> Option<Result<TaskInputs, store::Error>> {
        let [key] = keys else {
            return None;
        };
        if *key != self.key {
            return None;
        }
        Some(
            limits::check_value(ValueKind::TaskInputs, &self.output, limit)
                .map(|_| TaskInputs {
                    run_input: self.run_input,
                    outputs: Map::from_iter([(self.key, self.output)]),
                })
                .map_err(store::Error::from),
        )
    }
}

/// A delivery a slot took as its attempt ended, beside the one it was
/// finishing (docs/design/leases-and-fencing.md#finish-and-claim-next),
/// with the claim that finish made of it, if it made one.
struct Taken<D> {
    delivery: D,
    claimed: Option<Claimed>,
}

/// A claim made before its delivery is handled: the store's answer, and
/// when it was asked (the lease's local deadline counts from then).
struct Claimed {
    answer: Result<Option<Claim>, store::Error>,
    asked: Instant,
}

/// Asked once, as an attempt ends, for the slot's next delivery if one
/// already waits: `None` when none does, `Some(None)` for one taken that
/// this worker does not serve (handled as it comes, not claimed), else
/// the claim its finish makes.
type TakeNext<'a> = dyn FnMut() -> Option<Option<NextClaim>> + Send + 'a;

impl WorkerConfig {
    /// A config with the default lease
    /// (docs/design/leases-and-fencing.md#leases-and-heartbeats) and limits
    /// (docs/design/data-flow.md#limits).
    pub fn new(id: WorkerId, concurrency: usize) -> Self {
        Self {
            id,
            concurrency: concurrency.max(1),
            lease: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
            limits: Limits::default(),
            max_task_timeout: None,
            after_commit: None,
            chain_hops: DEFAULT_CHAIN_HOPS,
        }
    }
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The claim matched nothing (duplicate or stale dispatch): acked
    /// without running.
    Skipped,
    /// The attempt ran and its outcome was stored (`Stale` if the lease had
    /// been lost meanwhile); acked.
    Finished(FinishResult),
    /// The store could not be written: nacked for redelivery.
    Requeued,
    /// This worker has no handler for the dispatch's task type: returned
    /// to the queue unclaimed, for a worker that serves it.
    NotServed,
}

/// The span of one dispatch's handling: `dispatch_token` is what its claim
/// must match; `token` and `attempt` are the attempt's own, once claimed;
/// `kept` says it came from the slot's own finish, not the queue.
fn task_span(d: &Dispatch, kept: bool) -> tracing::Span {
    tracing::info_span!(
        "task",
        run_id = %d.run_id,
        task_key = %d.task_key,
        dispatch_token = d.fencing_token,
        attempt = tracing::field::Empty,
        token = tracing::field::Empty,
        kept,
    )
}

/// How an attempt ended, before it is stored.
enum Ending {
    Output(Value),
    Failed(HandlerError),
    TimedOut(Duration),
    Cancelled,
    LeaseLost,
    /// No renewal succeeded for this long: the handler was stopped before
    /// the lease could run out.
    LeaseExpiring(Duration),
}

/// In-flight attempts by run, so an embedding process can stop a run's
/// handlers at once instead of waiting for the next heartbeat.
#[derive(Debug, Default)]
struct InFlight {
    next: AtomicU64,
    by_run: Mutex<HashMap<RunId, HashMap<u64, CancellationToken>>>,
}

struct InFlightGuard<'a> {
    set: &'a InFlight,
    run: RunId,
    id: u64,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, HashMap<u64, CancellationToken>>> {
        self.by_run.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enter(&self, run: RunId, token: CancellationToken) -> InFlightGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().entry(run).or_default().insert(id, token);
        InFlightGuard { set: self, run, id }
    }

    fn cancel(&self, run: RunId) -> usize {
        self.lock().get(&run).map_or(0, |tokens| {
            tokens.values().for_each(CancellationToken::cancel);
            tokens.len()
        })
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.set.lock();
        if let Some(tokens) = map.get_mut(&self.run) {
            tokens.remove(&self.id);
            if tokens.is_empty() {
                map.remove(&self.run);
            }
        }
    }
}

/// A worker process's engine room.
pub struct Worker<S: Store, Q> {
    store: S,
    queue: Q,
    defs: Arc<DefinitionCache<S>>,
    registry: Arc<HandlerRegistry>,
    observers: Observers,
    config: WorkerConfig,
    in_flight: InFlight,
}

impl<S: Store, Q> std::fmt::Debug for Worker<S, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: Store, Q: DispatchQueue> Worker<S, Q> {
    /// A worker consuming from `queue`.
    pub fn new(
        store: S,
        queue: Q,
        defs: Arc<DefinitionCache<S>>,
        registry: Arc<HandlerRegistry>,
        observers: Observers,
        config: WorkerConfig,
    ) -> Self {
        Self {
            store,
            queue,
            defs,
            registry,
            observers,
            config,
            in_flight: InFlight::default(),
        }
    }

    /// This worker's config.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Stops the handlers of `run` running here now (they end as
    /// `cancel_running` once the run is cancel-requested). Returns how many.
    pub fn cancel_run_locally(&self, run: RunId) -> usize {
        self.in_flight.cancel(run)
    }

    /// Runs every concurrency slot until `shutdown`: each slot stops
    /// consuming, finishes and acks its in-flight delivery, and returns.
    /// A queue-type mismatch ends the worker with that error; a slot that
    /// panicked stops the others and ends it with [`Error::LoopPanicked`].
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), Error> {
        // A failing slot stops its fellow slots only: cancelling the
        // caller's token would also end the loops beside the worker
        // cleanly, and whoever watches them could take that clean end for
        // the failure before the worker reports its own.
        let shutdown = shutdown.child_token();
        crate::metrics::slots_total(self.config.concurrency);
        let mut slots = JoinSet::new();
        for slot in 0..self.config.concurrency {
            let me = Arc::clone(&self);
            let shutdown = shutdown.clone();
            slots.spawn(async move { me.slot(slot, shutdown).await });
        }
        let mut result = Ok(());
        while let Some(joined) = slots.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    shutdown.cancel();
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "a worker slot panicked");
                    shutdown.cancel();
                    // The panic outranks a slot's error: it is the bug.
                    if !matches!(result, Err(Error::LoopPanicked { .. })) {
                        result = Err(Error::LoopPanicked {
                            what: "worker",
                            message: if e.is_panic() {
                                panic_message(e.into_panic().as_ref())
                            } else {
                                "a slot was aborted".to_owned()
                            },
                        });
                    }
                }
            }
        }
        result
    }

    async fn slot(&self, slot: usize, shutdown: CancellationToken) -> Result<(), Error> {
        let mut failures = 0u32;
        loop {
            let consumer = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                c = self.queue.consumer() => c,
            };
            let mut consumer = match consumer {
                Ok(c) => c,
                Err(e) if !e.is_transient() => return Err(e.into()),
                Err(e) => {
                    failures += 1;
                    let wait = crate::backoff(failures);
                    tracing::warn!(slot, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot consume; reconnecting");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            // What a finish took for this slot is handled before anything
            // else, shutdown included once its claim is made: a stopping
            // slot returns one it has not claimed (the combined call
            // failed, or its type is not served here) rather than start it.
            let mut taken: Option<Taken<<Q::Consumer as DispatchConsumer>::Delivery>> = None;
            loop {
                let next = match taken.take() {
                    Some(t) if t.claimed.is_none() && shutdown.is_cancelled() => {
                        if let Err(e) = t.delivery.nack_requeue().await {
                            tracing::warn!(slot, error = %e, "returning the next delivery failed; the broker requeues it with the channel");
                        }
                        return Ok(());
                    }
                    Some(t) => Ok(Some((t.delivery, t.claimed))),
                    None => tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return Ok(()),
                        next = consumer.next() => next.map(|d| d.map(|d| (d, None))),
                    },
                };
                match next {
                    Ok(Some((delivery, claimed))) => {
                        failures = 0;
                        let may_keep = self.config.chain_hops > 0;
                        // A stopping slot takes no more work.
                        let mut take = || {
                            if shutdown.is_cancelled() {
                                None
                            } else {
                                consumer.try_next()
                            }
                        };
                        let (handled, kept, next) = self.handle_delivery(delivery, claimed, may_keep, &mut take).await;
                        taken = next;
                        self.continue_chain(kept, &shutdown).await;
                        if let Err(e) = handled {
                            // Its claim may be made already: run it before
                            // the consumer it came from goes.
                            if let Some(t) = taken.take()
                                && let (Err(e), ..) =
                                    self.handle_delivery(t.delivery, t.claimed, false, &mut || None).await
                            {
                                tracing::warn!(slot, error = %e, "acknowledging the next delivery failed too");
                            }
                            // The outcome is stored but the ack failed: drop the
                            // consumer (closing its channel) so the broker
                            // requeues; the redelivery is acked without running.
                            tracing::warn!(slot, error = %e, "acknowledgement failed; reconnecting");
                            break;
                        }
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        failures += 1;
                        let wait = crate::backoff(failures);
                        tracing::warn!(slot, error = %e, retry_in_ms = wait.as_millis() as u64, "consumer failed; reconnecting");
                        tokio::select! {
                            () = shutdown.cancelled() => return Ok(()),
                            () = tokio::time::sleep(wait) => break,
                        }
                    }
                }
            }
        }
    }

    /// Handles one delivery end to end; what its success makes ready is
    /// published, none of it run here. `Err` only when the final ack or
    /// nack failed (the caller tears the connection down).
    pub async fn handle<D: Delivery>(&self, delivery: D) -> Result<Handled, queue::Error> {
        self.handle_delivery(delivery, None, false, &mut || None).await.0
    }

    /// Runs what its own finishes kept for the slot
    /// (docs/design/outbox-and-queues.md#continuing-a-chain), one task
    /// after the other, each claimed at the token its dispatch carries as
    /// if it had come from the queue. After [`WorkerConfig::chain_hops`]
    /// tasks, or [`CHAIN_BUDGET`], the last task keeps nothing; once the
    /// worker is stopping, what the last one kept is handed to the queue
    /// instead.
    async fn continue_chain(&self, mut kept: Option<Kept>, shutdown: &CancellationToken) {
        let Some(after_commit) = self.config.after_commit.as_ref() else {
            return;
        };
        let started = Instant::now();
        let mut hops = 0;
        while let Some(k) = kept.take() {
            if shutdown.is_cancelled() {
                after_commit.hand(vec![k.dispatch], false).await;
                return;
            }
            hops += 1;
            let may_keep = hops < self.config.chain_hops && started.elapsed() < CHAIN_BUDGET;
            kept = self.run_kept(k, after_commit, may_keep).await;
        }
    }

    /// Claims and runs one dispatch a finish kept, returning what its own
    /// finish kept in turn.
    async fn run_kept(&self, kept: Kept, after_commit: &AfterCommit, may_keep: bool) -> Option<Kept> {
        let Kept { dispatch: d, carried } = kept;
        let span = task_span(&d, true);
        async move {
            let asked = Instant::now();
            match self
                .store
                .claim_task_run(d.task_run_id, d.fencing_token, &self.config.id, self.config.lease)
                .await
            {
                Ok(Some(claim)) => {
                    after_commit.kept(d.clone());
                    let (finished, kept, _) = self
                        .run_claimed(&d, &claim, asked, None, may_keep, carried, &mut || None)
                        .await;
                    if let Err(e) = finished {
                        // No delivery to return: the row stays running until
                        // the reaper takes its lease back and retries it.
                        tracing::error!(error = %e, "storing the outcome failed; the reaper retries the task");
                    }
                    kept
                }
                Ok(None) => {
                    // Cancelled or reaped since: its dispatch would be stale.
                    tracing::debug!("not ready at this token any more; not running it");
                    after_commit.kept(d);
                    None
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed; handing the dispatch to the queue");
                    after_commit.hand(vec![d], false).await;
                    None
                }
            }
        }
        .instrument(span)
        .await
    }

    /// [`Worker::handle`] of a delivery `claimed` already or not, keeping
    /// for the slot, when `may_keep`, one of the dispatches its success
    /// makes ready, and returning the slot's next delivery if its finish
    /// took one from `take_next`.
    async fn handle_delivery<D: Delivery>(
        &self,
        delivery: D,
        claimed: Option<Claimed>,
        may_keep: bool,
        take_next: &mut (dyn FnMut() -> Option<D> + Send),
    ) -> (Result<Handled, queue::Error>, Option<Kept>, Option<Taken<D>>) {
        let d: Dispatch = delivery.dispatch().clone();
        let span = task_span(&d, false);
        let mut kept = None;
        let mut taken = None;
        let mut next_claimed = None;
        let handled = async {
            let (answer, asked) = match claimed {
                // Claimed by the finish before it: served here.
                Some(Claimed { answer, asked }) => (answer, asked),
                None => {
                    // Claiming would spend the attempt on a worker that
                    // cannot run it; on a queue shared with workers that
                    // serve more types, the dispatch belongs to one of them.
                    if !self.registry.contains(&d.task_type) {
                        // A type served by polling workers only (over the
                        // API) has its dispatches circle among the consumers
                        // until one of those claims the row; from then on
                        // the dispatch is stale and dropped here rather
                        // than returned.
                        if let Ok(false) = self.store.dispatch_is_current(d.task_run_id, d.fencing_token).await {
                            tracing::debug!("not ready at this token any more (claimed by a polling worker); acking");
                            delivery.ack().await?;
                            return Ok(Handled::Skipped);
                        }
                        tracing::debug!(task_type = %d.task_type, "task type not served here; returning the dispatch");
                        tokio::time::sleep(NOT_SERVED_PAUSE).await;
                        delivery.nack_requeue().await?;
                        return Ok(Handled::NotServed);
                    }
                    // The lease's local deadline counts from before the
                    // claim was sent: the store stamps the expiry later
                    // than that.
                    let asked = Instant::now();
                    let answer = self
                        .store
                        .claim_task_run(d.task_run_id, d.fencing_token, &self.config.id, self.config.lease)
                        .await;
                    (answer, asked)
                }
            };
            let claim = match answer {
                Ok(Some(claim)) => claim,
                Ok(None) => {
                    tracing::debug!(
                        redelivered = delivery.redelivered(),
                        "not ready at this token (duplicate or stale dispatch); acking without running"
                    );
                    delivery.ack().await?;
                    return Ok(Handled::Skipped);
                }
                Err(e) => {
                    // The store is in trouble: requeueing at once would only
                    // spin the dispatch between broker and store.
                    tracing::error!(error = %e, "claim failed; requeueing the dispatch shortly");
                    tokio::time::sleep(STORE_TROUBLE_PAUSE).await;
                    delivery.nack_requeue().await?;
                    return Ok(Handled::Requeued);
                }
            };
            let mut take = || {
                let next = take_next()?;
                let dispatch = next.dispatch();
                let claim = self.registry.contains(&dispatch.task_type).then_some(NextClaim {
                    id: dispatch.task_run_id,
                    token: dispatch.fencing_token,
                    lease: self.config.lease,
                });
                taken = Some(next);
                Some(claim)
            };
            let (finished, next, claimed) = self
                .run_claimed(&d, &claim, asked, delivery.trace_parent(), may_keep, None, &mut take)
                .await;
            kept = next;
            next_claimed = claimed;
            match finished {
                Ok(result) => {
                    delivery.ack().await?;
                    Ok(Handled::Finished(result))
                }
                Err(e) => {
                    // Never ack an outcome that is not stored: the
                    // redelivery finds the row still running and is acked
                    // without running; the reaper retries the task.
                    tracing::error!(error = %e, "storing the outcome failed; requeueing the dispatch");
                    delivery.nack_requeue().await?;
                    Ok(Handled::Requeued)
                }
            }
        }
        .instrument(span)
        .await;
        let taken = taken.map(|delivery| Taken {
            delivery,
            claimed: next_claimed,
        });
        (handled, kept, taken)
    }

    /// Runs a claimed attempt of dispatch `d`, with what the task before
    /// it in this slot `carried`, and stores its outcome, returning it
    /// with the dispatch its success kept for this slot, if any, and the
    /// claim of what `take_next` gave as the attempt ended.
    #[expect(
        clippy::too_many_arguments,
        reason = "one attempt's context, each from a different source"
    )]
    async fn run_claimed(
        &self,
        d: &Dispatch,
        claim: &Claim,
        asked: Instant,
        trace_parent: Option<&str>,
        may_keep: bool,
        carried: Option<Carried>,
        take_next: &mut TakeNext<'_>,
    ) -> (Result<FinishResult, store::Error>, Option<Kept>, Option<Claimed>) {
        tracing::Span::current()
            .record("attempt", claim.attempt)
            .record("token", claim.token);
        crate::metrics::slot_busy(1.0);
        if let Some(ready_at) = d.ready_at {
            // Both ends in store time: the lease was stamped at the claim.
            let lease = chrono::TimeDelta::from_std(self.config.lease).unwrap_or_default();
            let claimed_at = claim.lease_expires_at - lease;
            crate::metrics::scheduled(&d.task_type, (claimed_at - ready_at).to_std().unwrap_or_default());
        }
        // One span per attempt, in its run's trace
        // (docs/design/server.md#traces).
        let execute = tracing::info_span!(
            "flowforge.task.execute",
            run_id = %claim.run_id,
            task_key = %claim.task_key,
            attempt = claim.attempt,
            token = claim.token,
            worker = %self.config.id,
        );
        crate::telemetry::link(&execute, claim.run_id, trace_parent);
        let (outcome, event, run_input) = self
            .attempt(claim, asked, carried, may_keep)
            .instrument(execute.clone())
            .await;
        let finished = self
            .finish(claim, &outcome, may_keep, take_next)
            .instrument(execute)
            .await;
        crate::metrics::slot_busy(-1.0);
        match finished {
            Ok((result, kept, claimed)) => {
                crate::metrics::attempt_finished(&d.task_type, result, asked.elapsed());
                self.report(result, event);
                let kept = kept.map(|dispatch| Kept {
                    dispatch,
                    carried: match (outcome, run_input) {
                        (TaskOutcome::Succeeded { output }, Some(run_input)) => Some(Carried {
                            run_input,
                            key: claim.task_key.clone(),
                            output,
                        }),
                        _ => None,
                    },
                });
                (Ok(result), kept, claimed)
            }
            Err(e) => (Err(e), None, None),
        }
    }

    /// Stores the outcome, retrying while the store is unreachable for up
    /// to one lease: a database restarting under a finished attempt must
    /// not cost the work, which a requeue would (the redelivery finds the
    /// row still running, so the task waits for the reaper and runs
    /// again). Retrying is safe at any time, since the token decides: once
    /// the lease has been reaped, the finish is `Stale`. With `may_keep`,
    /// one of the dispatches the success hands over is kept for this slot
    /// instead ([`Worker::keep`]), unless `take_next` gives the slot its
    /// next delivery: then the first try also claims that delivery's task
    /// run (docs/design/leases-and-fencing.md#finish-and-claim-next),
    /// returning the claim's answer.
    async fn finish(
        &self,
        claim: &Claim,
        outcome: &TaskOutcome,
        may_keep: bool,
        take_next: &mut TakeNext<'_>,
    ) -> Result<(FinishResult, Option<Dispatch>, Option<Claimed>), store::Error> {
        let handoff = self.handoff(claim, outcome).await;
        let after_commit = self.config.after_commit.as_ref();
        let handover = after_commit.map_or(Handover::Sweep, |a| a.handover_for(&handoff));
        let started = Instant::now();
        let mut pause = FINISH_RETRY_FIRST_PAUSE;
        let mut failed_before = false;
        let next = take_next();
        // A slot with its next delivery in hand runs that next, not a chain.
        let may_keep = may_keep && next.is_none();
        if let Some(Some(next)) = next {
            let asked = Instant::now();
            let call = FinishCall {
                id: claim.task_run_id,
                token: claim.token,
                worker: &self.config.id,
                outcome: outcome.clone(),
                handoff: &handoff,
                handover,
            };
            match self.store.finish_and_claim(call, next).await {
                Ok((finished, answer)) => {
                    let (result, _) = self.settle(claim, finished, handover, false, false).await;
                    return Ok((result, None, Some(Claimed { answer, asked })));
                }
                Err(e) => {
                    // The next delivery is claimed the usual way instead.
                    tracing::warn!(error = %e, "storing the outcome with the next claim failed; storing it alone");
                    failed_before = true;
                }
            }
        }
        loop {
            match self
                .store
                .finish_and_hand_off(
                    claim.task_run_id,
                    claim.token,
                    &self.config.id,
                    outcome.clone(),
                    &handoff,
                    handover,
                )
                .await
            {
                Err(e) if e.is_transient() && started.elapsed() + pause < self.config.lease => {
                    tracing::warn!(error = %e, retry_in = ?pause, "storing the outcome failed; retrying");
                    failed_before = true;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(FINISH_RETRY_MAX_PAUSE);
                }
                Ok(finished) => {
                    let (result, kept) = self.settle(claim, finished, handover, failed_before, may_keep).await;
                    return Ok((result, kept, None));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands what a stored finish made ready to the queue, keeping one for
    /// this slot when `may_keep`, and re-arms what a finish whose earlier
    /// try `failed_before` may have handed on unpushed.
    async fn settle(
        &self,
        claim: &Claim,
        finished: Finished,
        handover: Handover,
        failed_before: bool,
        may_keep: bool,
    ) -> (FinishResult, Option<Dispatch>) {
        let after_commit = self.config.after_commit.as_ref();
        if handover == Handover::Pushed && failed_before && finished.result == FinishResult::Stale {
            self.rearm_unpushed(claim).await;
        }
        // Rows come back only when the handover is ours.
        let mut handed = finished.held;
        let kept = match after_commit {
            Some(after_commit) if may_keep && !finished.queued => self.keep(&mut handed, after_commit),
            _ => None,
        };
        if let Some(after_commit) = after_commit
            && !handed.is_empty()
        {
            after_commit.hand(handed, finished.queued).await;
        }
        (finished.result, kept)
    }

    /// Takes from `handed` the dispatch this slot runs next
    /// (docs/design/outbox-and-queues.md#continuing-a-chain): the most
    /// urgent one of a type served here, as the queue would order them,
    /// unless the queue holds more urgent work. The caller keeps nothing
    /// when other rows wait for the sweep: a backlog goes out in priority
    /// order, and a kept dispatch would jump it.
    fn keep(&self, handed: &mut Vec<Dispatch>, after_commit: &AfterCommit) -> Option<Dispatch> {
        let at = handed
            .iter()
            .enumerate()
            .filter(|(_, d)| self.registry.contains(&d.task_type))
            .min_by_key(|(_, d)| urgency(d))
            .map(|(at, _)| at)?;
        after_commit.may_keep(&handed[at]).then(|| handed.remove(at))
    }

    /// A finish that failed to answer may still have committed, writing
    /// the rows it handed on published, which nobody then pushed; its
    /// retry is stale and returns none. Re-arms the run's published rows
    /// of ready tasks, as a restart would, for the sweep to deliver
    /// (docs/design/outbox-and-queues.md#publish-after-commit); a
    /// duplicate claims nothing.
    async fn rearm_unpushed(&self, claim: &Claim) {
        match self
            .store
            .rearm_lost_dispatches(Scope::Run(claim.run_id), Duration::ZERO)
            .await
        {
            Ok(rearmed) => {
                tracing::info!(run_id = %claim.run_id, rearmed, "re-armed what a finish that failed to answer may have handed on")
            }
            Err(e) => tracing::error!(
                run_id = %claim.run_id, error = %e,
                "cannot re-arm what a finish that failed to answer may have handed on; the next start re-arms it"
            ),
        }
    }

    /// What the attempt's outcome hands on (docs/design/scheduler.md#handoff):
    /// only a forward task's success does, read from the run's definition
    /// (a cache hit: the attempt loaded it).
    async fn handoff(&self, claim: &Claim, outcome: &TaskOutcome) -> Handoff {
        if !matches!(outcome, TaskOutcome::Succeeded { .. }) || claim.compensate_for.is_some() {
            return Handoff::default();
        }
        self.defs.handoff(claim.workflow_id, &claim.task_key).await
    }

    /// Renews the lease, storing the progress reported since the last
    /// renewal with it when there is some it can store.
    async fn renew(&self, claim: &Claim, progress: Option<Value>) -> Result<LeaseStatus, store::Error> {
        let lease = self.config.lease;
        if let Some(progress) = progress {
            match limits::check_value(ValueKind::TaskProgress, &progress, limits::MAX_PROGRESS_BYTES) {
                Ok(_) => match self
                    .store
                    .report_progress(claim.task_run_id, claim.token, &progress, lease)
                    .await
                {
                    Err(store::Error::Refused(refusal)) => {
                        tracing::warn!(%refusal, "progress not stored");
                    }
                    other => return other,
                },
                Err(refusal) => tracing::warn!(%refusal, "progress not stored"),
            }
        }
        self.store.renew_lease(claim.task_run_id, claim.token, lease).await
    }

    fn report(&self, result: FinishResult, event: TaskEvent) {
        match result {
            FinishResult::Recorded(TaskRunState::Succeeded) => {
                tracing::info!("task succeeded");
                self.observers.task_succeeded(&event);
            }
            FinishResult::Recorded(TaskRunState::Retrying) => {
                tracing::warn!(
                    error = event.error.as_deref().unwrap_or(""),
                    "attempt failed; retry scheduled"
                );
                self.observers.task_retry(&event);
            }
            FinishResult::Recorded(TaskRunState::Failed) => {
                tracing::warn!(error = event.error.as_deref().unwrap_or(""), "task failed");
                self.observers.task_failed(&event);
            }
            FinishResult::Recorded(state) => tracing::info!(%state, "task stopped"),
            FinishResult::Stale => {
                tracing::warn!("the lease was lost meanwhile; the stale outcome was rejected and audited");
            }
        }
    }

    /// Runs one claimed attempt and turns its ending into the outcome to
    /// store, plus the observer event describing it and, when `carry`, the
    /// run input it was given (for a task its success keeps,
    /// [`Carried`]). Its inputs come from `carried` when they are all
    /// there, else from the store.
    async fn attempt(
        &self,
        claim: &Claim,
        asked: Instant,
        carried: Option<Carried>,
        carry: bool,
    ) -> (TaskOutcome, TaskEvent, Option<Value>) {
        let mut event = TaskEvent {
            run_id: claim.run_id,
            task_key: claim.task_key.clone(),
            task_type: String::new(),
            compensate_for: claim.compensate_for.clone(),
            attempt: claim.attempt,
            output: None,
            error: None,
            retry_in: None,
        };
        let permanent = |event: &mut TaskEvent, message: String| {
            event.error = Some(message.clone());
            (
                TaskOutcome::Failed {
                    error: message,
                    retry_in: None,
                },
                event.clone(),
                None,
            )
        };
        let published = match self.defs.get(claim.workflow_id).await {
            Ok(p) => p,
            Err(e) => return permanent(&mut event, format!("cannot load the run's definition: {e}")),
        };
        let def = &published.definition;
        let Some((task, index)) = def.task_of_run(&claim.task_key) else {
            return permanent(
                &mut event,
                format!("task '{}' is not in the run's definition", claim.task_key),
            );
        };
        event.task_type = task.task_type().to_owned();
        self.observers.task_start(&event);
        let policy = def.retry_policy(task);
        let timeout = def.timeout(task);
        if let Some(max) = self.config.max_task_timeout
            && timeout > max
        {
            return permanent(
                &mut event,
                format!(
                    "timeout of {}s is above this worker's limit of {}s (the queue's consumer timeout)",
                    timeout.as_secs_f64(),
                    max.as_secs_f64()
                ),
            );
        }
        if !self.registry.contains(task.task_type()) {
            return permanent(
                &mut event,
                format!(
                    "no handler for task type '{}' on worker {} (it serves: {})",
                    task.task_type(),
                    self.config.id,
                    self.registry.task_types().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        let keys: Vec<String> = match &claim.compensate_for {
            Some(forward) => vec![forward.clone()],
            None => task.depends_on().to_vec(),
        };
        let limit = self.config.limits.task_inputs_bytes;
        let known = carried
            .filter(|_| claim.compensate_for.is_none())
            .and_then(|c| c.inputs(&keys, limit));
        let read = match known {
            Some(known) => known,
            None => self.store.task_inputs(claim.run_id, &keys, limit).await,
        };
        let read = match read {
            Ok(i) => crate::inputs::for_trigger(&self.store, claim.run_id, task, i.outputs)
                .await
                .map(|outputs| TaskInputs {
                    outputs,
                    run_input: i.run_input,
                }),
            Err(e) => Err(e),
        };
        let inputs = match read {
            Ok(i) => i,
            // The same outputs are as large next time.
            Err(store::Error::Refused(refusal)) => return permanent(&mut event, refusal.to_string()),
            Err(e) => {
                let message = format!("could not read the task's inputs: {e}");
                event.error = Some(message.clone());
                event.retry_in = policy.next_retry(claim.generation_attempt(), false);
                return (
                    TaskOutcome::Failed {
                        error: message,
                        retry_in: event.retry_in,
                    },
                    event,
                    None,
                );
            }
        };
        let item = match crate::inputs::map_item(task, index, &inputs.outputs) {
            Ok(item) => item,
            Err(error) => return permanent(&mut event, error),
        };
        let cancel = CancellationToken::new();
        // A run's cancellation stops its forward tasks, never a compensator: a
        // cancel does not interrupt a rollback
        // (docs/design/cancellation.md#rollbacks-are-not-interrupted).
        let _in_flight = claim
            .compensate_for
            .is_none()
            .then(|| self.in_flight.enter(claim.run_id, cancel.clone()));
        let run_input = carry.then(|| inputs.run_input.clone());
        let ctx = TaskContext {
            run_id: claim.run_id,
            task_key: claim.task_key.clone(),
            task_type: task.task_type().to_owned(),
            attempt: claim.attempt,
            token: claim.token,
            idempotency_key: format!("{}:{}", claim.run_id, claim.task_key),
            run_input: inputs.run_input,
            inputs: inputs.outputs,
            config: task.config().clone(),
            item,
            cancel: cancel.clone(),
            pulse: Pulse::default(),
        };
        let ending = self.supervise(claim, asked, ctx, timeout, cancel).await;
        let mut retry_after = None;
        let (error, permanent_failure) = match ending {
            // An output no store can keep, or too large to, fails for good:
            // the same handler gives the same output again.
            Ending::Output(output) => {
                match limits::check_value(ValueKind::TaskOutput, &output, self.config.limits.task_output_bytes) {
                    Ok(_) => {
                        event.output = Some(output.clone());
                        return (TaskOutcome::Succeeded { output }, event, run_input);
                    }
                    Err(refusal) => (refusal.to_string(), true),
                }
            }
            Ending::Failed(e) => {
                retry_after = e.retry_after;
                let permanent = e.is_permanent();
                (e.message, permanent)
            }
            Ending::TimedOut(after) => (format!("timed out after {}s", after.as_secs_f64()), false),
            Ending::Cancelled => return (TaskOutcome::Cancelled, event, None),
            Ending::LeaseLost => ("the lease was lost (reaped) while the handler ran".to_owned(), false),
            Ending::LeaseExpiring(unrenewed) => (
                format!(
                    "the lease could not be renewed for {:.1}s (store unreachable); the handler was stopped before the lease ran out",
                    unrenewed.as_secs_f64()
                ),
                false,
            ),
        };
        // As the store will keep it (docs/design/data-flow.md#limits).
        let error = limits::storable_text(&error).into_owned();
        event.error = Some(error.clone());
        // A handler that knows when trying again makes sense (a
        // `Retry-After`) delays the retry past the policy's backoff, never
        // below it and never into an attempt the policy does not allow.
        event.retry_in = policy
            .next_retry(claim.generation_attempt(), permanent_failure)
            .map(|backoff| retry_after.map_or(backoff, |after| backoff.max(after)));
        (
            TaskOutcome::Failed {
                error,
                retry_in: event.retry_in,
            },
            event,
            None,
        )
    }

    /// Runs the handler until it returns, times out, its run is cancelled,
    /// its lease is lost, or its lease could run out
    /// (docs/design/leases-and-fencing.md#local-lease-deadline).
    ///
    /// The lease is renewed every third of it, concurrently: a store that
    /// stalls never holds up the watch on the timeout, the cancel or the
    /// lease. The lease is held until `asked + lease`, where `asked` is when
    /// the claim (or the last successful renewal) was sent — the store
    /// stamped its expiry after that moment, so this local deadline is never
    /// later than the store's, whatever the two clocks say. A quarter of a
    /// lease before that deadline an unrenewed handler is cancelled, and it
    /// is dropped (a command's process group killed) before the deadline:
    /// no attempt outlives its lease, so no two attempts run at once.
    async fn supervise(
        &self,
        claim: &Claim,
        asked: Instant,
        ctx: TaskContext,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Ending {
        let pulse = ctx.pulse.clone();
        let Some(mut handler) = self.registry.invoke(ctx) else {
            return Ending::Failed(HandlerError::permanent("the handler disappeared from the registry"));
        };
        let lease = self.config.lease;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let beat = (lease / 3).max(Duration::from_millis(10));
        let margin = lease / 4;
        let mut renewed_at = asked;
        let mut held_until = asked + lease;
        let mut next_beat = Instant::now() + beat;
        // A pulse brings the next renewal forward, but never closer than
        // this to the one before: a chatty handler costs one write a second.
        let pulse_gap = beat.min(PULSE_GAP);
        let mut last_sent = asked;
        let mut renewal: Option<Renewal<'_>> = None;
        let stop = loop {
            let give_up_at = held_until.checked_sub(margin).unwrap_or(held_until);
            tokio::select! {
                result = &mut handler => {
                    return match result {
                        Ok(output) => Ending::Output(output),
                        // A handler that gives up because its run was
                        // cancelled reports an error in the same instant:
                        // the attempt was cancelled, not failed.
                        Err(_) if cancel.is_cancelled() => Ending::Cancelled,
                        Err(e) => Ending::Failed(e),
                    };
                }
                () = &mut deadline => break Ending::TimedOut(timeout),
                () = cancel.cancelled() => break Ending::Cancelled,
                () = tokio::time::sleep_until(give_up_at) => {
                    break Ending::LeaseExpiring(renewed_at.elapsed());
                }
                () = pulse.pulsed(), if renewal.is_none() => {
                    next_beat = next_beat.min(Instant::now().max(last_sent + pulse_gap));
                }
                () = tokio::time::sleep_until(next_beat), if renewal.is_none() => {
                    let sent = Instant::now();
                    last_sent = sent;
                    let renew = self.renew(claim, pulse.take_progress());
                    // A renewal that hangs is given up at the next beat, so a
                    // fresh one (on a fresh connection) can be tried.
                    renewal = Some(Box::pin(async move { (sent, tokio::time::timeout(beat, renew).await) }));
                }
                (sent, renewed) = poll_renewal(&mut renewal) => {
                    renewal = None;
                    next_beat = Instant::now() + beat;
                    match renewed {
                        Ok(Ok(LeaseStatus::Held { cancel_requested: false })) => {
                            renewed_at = sent;
                            held_until = sent + lease;
                        }
                        Ok(Ok(LeaseStatus::Held { cancel_requested: true })) => break Ending::Cancelled,
                        Ok(Ok(LeaseStatus::Lost)) => break Ending::LeaseLost,
                        // The lease may still be ours: try again soon, while
                        // the local deadline keeps counting.
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "heartbeat failed");
                            next_beat = Instant::now() + beat / 3;
                        }
                        Err(_) => {
                            tracing::warn!(after_ms = beat.as_millis() as u64, "heartbeat got no answer");
                            next_beat = Instant::now();
                        }
                    }
                }
            }
        };
        drop(renewal);
        cancel.cancel();
        // The grace never runs past the lease: once it is out, another
        // worker may start the next attempt.
        let grace = self
            .config
            .stop_grace
            .min(held_until.saturating_duration_since(Instant::now()) / 2);
        if tokio::time::timeout(grace, &mut handler).await.is_err() {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "handler ignored its cancellation; abandoning it"
            );
        }
        stop
    }
}

/// A renewal's answer: when it was sent, and what the store said (`Err`
/// when it said nothing within a beat).
type Renewed = (Instant, Result<Result<LeaseStatus, store::Error>, Elapsed>);

/// A lease renewal in flight.
type Renewal<'a> = Pin<Box<dyn Future<Output = Renewed> + Send + 'a>>;

/// The renewal's answer, or never when none is in flight.
async fn poll_renewal(renewal: &mut Option<Renewal<'_>>) -> Renewed {
    match renewal {
        Some(renewal) => renewal.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn carried() -> Carried {
        Carried {
            run_input: json!({"n": 1}),
            key: "a".into(),
            output: json!({"n": 2}),
        }
    }

    fn keys(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|&k| k.to_owned()).collect()
    }

    #[test]
    fn a_task_depending_on_the_carried_task_alone_takes_its_output_and_the_run_input() {
        let inputs = carried()
            .inputs(&keys(&["a"]), 1024)
            .expect("covered")
            .expect("within the limit");
        assert_eq!(inputs.run_input, json!({"n": 1}));
        assert_eq!(Value::Object(inputs.outputs), json!({"a": {"n": 2}}));
    }

    #[test]
    fn a_task_with_any_other_dependencies_reads_the_store() {
        for other in [&[][..], &["b"], &["a", "b"], &["b", "a"]] {
            assert!(carried().inputs(&keys(other), 1024).is_none(), "{other:?}");
        }
    }

    #[test]
    fn carried_inputs_are_held_to_the_limit_the_store_applies() {
        let Some(Err(store::Error::Refused(refusal))) = carried().inputs(&keys(&["a"]), 6) else {
            panic!("refused");
        };
        assert_eq!(
            refusal.to_string(),
            limits::Refusal::TooLarge {
                kind: ValueKind::TaskInputs,
                bytes: 7,
                limit: 6
            }
            .to_string(),
            "the 7 bytes of {{\"n\":2}}, as the store's read refuses them"
        );
        assert!(carried().inputs(&keys(&["a"]), 7).expect("covered").is_ok());
    }
}
