//! App-level scenario tests (issue 3): the engine's behaviour and its
//! compensation (docs/design/state-machines.md#deriving-the-run-state,
//! docs/design/compensation.md#one-at-a-time), over a real SQLite file and the
//! in-process queue, driven through the embedding API. Most tests step the
//! engine by hand (a scheduler pass, an outbox sweep, one delivery at a time)
//! with a [`ManualClock`] for store time, so every intermediate state can be
//! checked and no test waits on wall-clock time for a retry or a lease. One
//! file per theme; this module holds the harness.

mod cancellation;
mod compensation;
pub(crate) mod concurrency;
mod hooks;
mod leases;
mod outputs;
mod priorities;
mod readiness;
mod redelivery;
mod retries;
mod slots;
mod timeouts;
mod user_cancel;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use flowforge::{Embedded, EmbeddedEngine, InprocQueue, RunId, RunReport, RunState, parse_definition};
use flowforge_adapters_inproc::InprocDelivery;
use flowforge_app::scheduler::ScheduleReport;
use flowforge_app::worker::Handled;
use flowforge_ports::clock::ManualClock;
use flowforge_ports::{
    DispatchConsumer, DispatchQueue, EventView, RunDetail, RunStore, Scope, TaskRunView, WorkflowId,
};
use serde_json::Value;
use tempfile::TempDir;

pub(crate) use flowforge::EmbeddedBuilder;

/// The lease of every test not about reaping: long enough that a slow machine
/// never reaps by accident (docs/design/leases-and-fencing.md#store-time).
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(300);

/// How long any wait for something the engine does may take before the
/// test fails (generous: a slow CI machine must not fail a correct engine).
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// One engine over its own SQLite file, with a hand-moved store clock.
pub(crate) struct Scenario {
    pub(crate) engine: Arc<EmbeddedEngine>,
    pub(crate) clock: Arc<ManualClock>,
    dir: TempDir,
}

fn database_in(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.path().join("flowforge.db").display())
}

/// Builds a scenario: a fresh database file, a [`ManualClock`], a long
/// lease, two worker slots and every dispatch left to the sweep (the
/// scenarios step each loop by hand), then whatever `configure` adds
/// (handlers, observers, another lease).
pub(crate) async fn scenario(configure: impl FnOnce(EmbeddedBuilder) -> EmbeddedBuilder) -> Scenario {
    let dir = tempfile::tempdir().expect("a temp folder");
    let clock = Arc::new(ManualClock::default());
    let builder = Embedded::builder()
        .database(database_in(&dir))
        .clock(clock.clone())
        .lease(LONG_LEASE)
        .concurrency(2)
        .push_after_commit(false);
    let engine = configure(builder).build().await.expect("the engine builds");
    Scenario {
        engine: Arc::new(engine),
        clock,
        dir,
    }
}

impl Scenario {
    /// Publishes `definition` (JSON) through the engine.
    pub(crate) async fn publish_def(&self, definition: &Value) -> WorkflowId {
        let bytes = serde_json::to_vec(definition).expect("serialise");
        let def = parse_definition(&bytes).expect("a valid definition");
        self.engine.publish(&def).await.expect("publish").id
    }

    /// Publishes `definition` and starts a run of it with `input`.
    pub(crate) async fn start(&self, definition: Value, input: Value) -> RunId {
        let workflow = self.publish_def(&definition).await;
        self.engine.start(workflow, input).await.expect("start")
    }

    /// The database's URL, for another engine over the same file (a later
    /// process).
    pub(crate) fn database_url(&self) -> String {
        database_in(&self.dir)
    }

    /// The in-process queue.
    pub(crate) fn queue(&self) -> &InprocQueue {
        self.engine.queue()
    }

    /// One scheduler pass over `run`.
    pub(crate) async fn schedule(&self, run: RunId) -> ScheduleReport {
        self.engine
            .scheduler(Scope::Run(run))
            .schedule_once()
            .await
            .expect("scheduler pass")
    }

    /// One outbox sweep for `run`; returns how many dispatches were queued.
    pub(crate) async fn publish(&self, run: RunId) -> usize {
        self.engine
            .publisher(Scope::Run(run))
            .publish_once()
            .await
            .expect("outbox sweep")
            .published
    }

    /// The next queued delivery, or `None` when the queue is empty (never
    /// blocks).
    pub(crate) async fn next_delivery(&self) -> Option<InprocDelivery> {
        if self.queue().is_empty() {
            return None;
        }
        let mut consumer = self.queue().consumer().await.expect("consumer");
        consumer.next().await.expect("a delivery")
    }

    /// Handles one delivery in this task, if one is queued.
    pub(crate) async fn work_one(&self) -> Option<Handled> {
        let delivery = self.next_delivery().await?;
        Some(self.engine.worker().handle(delivery).await.expect("ack"))
    }

    /// Handles `delivery` on a task of its own (for handlers that wait).
    pub(crate) fn spawn_work(&self, delivery: InprocDelivery) -> tokio::task::JoinHandle<Handled> {
        let worker = Arc::clone(self.engine.worker());
        tokio::spawn(async move { worker.handle(delivery).await.expect("ack") })
    }

    /// Scheduler pass, outbox sweep and every queued delivery, repeated
    /// until nothing changes. Handlers must not wait for the test.
    pub(crate) async fn settle(&self, run: RunId) {
        for _ in 0..1_000 {
            let pass = self.schedule(run).await;
            let mut progressed = pass.reaped + pass.passes > 0;
            progressed |= self.publish(run).await > 0;
            while self.work_one().await.is_some() {
                progressed = true;
            }
            if !progressed {
                return;
            }
        }
        panic!("run {run} did not settle in 1000 steps");
    }

    /// The stored run with its tasks and history.
    pub(crate) async fn detail(&self, run: RunId) -> RunDetail {
        self.engine
            .store()
            .get_run(run)
            .await
            .expect("get_run")
            .expect("the run exists")
    }

    /// The stored state of `run`.
    pub(crate) async fn run_state(&self, run: RunId) -> RunState {
        self.detail(run).await.summary.state
    }

    /// The stored task run `key` of `run`.
    pub(crate) async fn task(&self, run: RunId, key: &str) -> TaskRunView {
        task_of(&self.detail(run).await, key).clone()
    }

    /// The report of `run`.
    pub(crate) async fn report(&self, run: RunId) -> RunReport {
        self.engine.report(run).await.expect("report")
    }
}

/// The task run `key` of a stored run.
pub(crate) fn task_of<'d>(detail: &'d RunDetail, key: &str) -> &'d TaskRunView {
    detail
        .tasks
        .iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no task run '{key}' in {:?}", detail.tasks))
}

/// One entry of a task's history: `(transition, from, to, attempt)`.
pub(crate) type Step = (String, Option<String>, Option<String>, Option<u32>);

/// The history of task `key`, in order.
pub(crate) fn history(detail: &RunDetail, key: &str) -> Vec<Step> {
    detail
        .events
        .iter()
        .filter(|e| e.task.as_deref() == Some(key))
        .map(|e| (e.transition.clone(), e.from.clone(), e.to.clone(), e.attempt))
        .collect()
}

/// The transition names of task `key`, in order.
pub(crate) fn transitions(detail: &RunDetail, key: &str) -> Vec<String> {
    history(detail, key).into_iter().map(|(t, ..)| t).collect()
}

/// The run's own transitions, in order.
pub(crate) fn run_transitions(detail: &RunDetail) -> Vec<String> {
    detail
        .events
        .iter()
        .filter(|e| e.task.is_none())
        .map(|e| e.transition.clone())
        .collect()
}

/// Index in the history of the `n`-th (0-based) `transition` of `task`
/// (`None`: a run transition).
pub(crate) fn position(detail: &RunDetail, task: Option<&str>, transition: &str, n: usize) -> usize {
    detail
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.task.as_deref() == task && e.transition == transition)
        .nth(n)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("no {transition} #{n} of {task:?} in {:#?}", detail.events))
}

/// The `n`-th (0-based) `transition` event of `task`.
pub(crate) fn event<'d>(detail: &'d RunDetail, task: &str, transition: &str, n: usize) -> &'d EventView {
    &detail.events[position(detail, Some(task), transition, n)]
}

/// Milliseconds between two store times.
pub(crate) fn ms_between(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds()
}

/// A duration as a chrono delta.
pub(crate) fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).expect("a representable duration")
}

/// Counts handler calls.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// Counts one call; returns the new total.
    pub(crate) fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Calls so far.
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A shared log that handlers and observers append to.
#[derive(Debug)]
pub(crate) struct Log<T>(Arc<Mutex<Vec<T>>>);

impl<T> Clone for Log<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Default for Log<T> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Vec::new())))
    }
}

impl<T: Clone> Log<T> {
    /// Appends one entry.
    pub(crate) fn push(&self, item: T) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(item);
    }

    /// Everything so far.
    pub(crate) fn entries(&self) -> Vec<T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Awaits `future`, failing the test after [`PATIENCE`].
pub(crate) async fn within<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}
