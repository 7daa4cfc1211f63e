//! What the API calls: the app's use cases behind one object-safe trait,
//! so the routes are plain functions (the OpenAPI document is generated
//! from them) while the store stays generic in `app`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_app::attempts::Attempt;
use flowforge_app::remote::{Beat, BeatStatus, RemoteClaim, RemoteConfig, RemoteResult, RemoteWork};
use flowforge_app::schedules::{BackfillFire, ScheduleRequest};
use flowforge_app::tokens::{self, Verdict};
use flowforge_app::{Error, Retry, RunReport, Service, TaskTypes};
use flowforge_domain::{Priority, WorkflowDefinition};
use flowforge_ports::store::{
    CancelOutcome, DefinitionSummary, EventView, FinishResult, Gauges, IdempotencyKey, KeyedStart, Published, RunQuery,
    ScheduleView,
};
use flowforge_ports::{RunId, RunSummary, Store, WorkerId, WorkerInfo, WorkflowId};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A boxed future: the price of an object-safe trait, one allocation per call.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// The use cases the API serves, over any store.
pub trait Backend: Send + Sync + 'static {
    /// Publishes a definition (its task types checked as the process allows).
    fn publish<'a>(&'a self, def: &'a WorkflowDefinition) -> Fut<'a, Published>;
    /// A definition by name and version (latest when `None`).
    fn find<'a>(&'a self, name: &'a str, version: Option<u32>) -> Fut<'a, Published>;
    /// Definitions, all or one name's versions.
    fn definitions<'a>(&'a self, name: Option<&'a str>) -> Fut<'a, Vec<DefinitionSummary>>;
    /// Checks that something here can run every task type of `def`.
    fn check_types<'a>(&'a self, def: &'a WorkflowDefinition) -> Fut<'a, ()>;
    /// Starts a run at `priority` (keyed when a key is given).
    fn start(
        &self,
        workflow: WorkflowId,
        input: Value,
        priority: Priority,
        key: Option<IdempotencyKey>,
    ) -> Fut<'_, KeyedStart>;
    /// A page of runs.
    fn page<'a>(&'a self, query: &'a RunQuery) -> Fut<'a, Vec<RunSummary>>;
    /// One run's summary.
    fn summary(&self, run: RunId) -> Fut<'_, RunSummary>;
    /// One run's report.
    fn report(&self, run: RunId) -> Fut<'_, RunReport>;
    /// Requests a cancel.
    fn cancel(&self, run: RunId) -> Fut<'_, CancelOutcome>;
    /// Retries a finished run (docs/design/retry.md).
    fn retry<'a>(&'a self, run: RunId, from: &'a [String], dry_run: bool) -> Fut<'a, Retry>;
    /// A task's attempts (`None`: no such task in the run).
    fn attempts<'a>(&'a self, run: RunId, task: &'a str) -> Fut<'a, Option<Vec<Attempt>>>;
    /// Events after a sequence number.
    fn events(&self, run: RunId, after: u64, limit: u32) -> Fut<'_, Vec<EventView>>;
    /// Registered workers.
    fn workers(&self) -> Fut<'_, Vec<WorkerInfo>>;
    /// Store gauges.
    fn gauges(&self) -> Fut<'_, Gauges>;
    /// Store reachable and migrated.
    fn ready(&self) -> Fut<'_, ()>;
    /// What a bearer secret grants.
    fn verify<'a>(&'a self, secret: &'a str) -> Fut<'a, Verdict>;
    /// [`Service::create_schedule`].
    fn create_schedule(&self, request: ScheduleRequest) -> Fut<'_, ScheduleView>;
    /// [`Service::schedules`].
    fn schedules(&self) -> Fut<'_, Vec<ScheduleView>>;
    /// [`Service::schedule`].
    fn schedule<'a>(&'a self, name: &'a str) -> Fut<'a, ScheduleView>;
    /// [`Service::pause_schedule`].
    fn pause_schedule<'a>(&'a self, name: &'a str, paused: bool) -> Fut<'a, ScheduleView>;
    /// [`Service::delete_schedule`].
    fn delete_schedule<'a>(&'a self, name: &'a str) -> Fut<'a, ()>;
    /// [`Service::backfill`].
    fn backfill<'a>(
        &'a self,
        name: &'a str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        dry_run: bool,
    ) -> Fut<'a, Vec<BackfillFire>>;
    /// Claims ready task runs for a remote worker (long poll).
    fn claim<'a>(
        &'a self,
        worker: &'a WorkerId,
        task_types: &'a [String],
        max: u32,
        lease: Option<Duration>,
        wait: Duration,
        stop: &'a CancellationToken,
    ) -> Fut<'a, Vec<RemoteClaim>>;
    /// Renews a remote worker's leases.
    fn heartbeat<'a>(&'a self, worker: &'a WorkerId, beats: &'a [Beat]) -> Fut<'a, Vec<BeatStatus>>;
    /// Stores a remote worker's outcomes.
    fn finish_remote<'a>(&'a self, worker: &'a WorkerId, results: Vec<RemoteResult>) -> Fut<'a, Vec<FinishResult>>;
}

/// [`Backend`] over the app's [`Service`].
#[derive(Debug)]
pub struct ServiceBackend<S: Store> {
    service: Service<S>,
    types: TaskTypes,
    remote: RemoteWork<S>,
}

impl<S: Store> ServiceBackend<S> {
    /// The use cases of `service`; definitions may use `types`; remote
    /// workers are held to `remote`.
    pub fn new(service: Service<S>, types: TaskTypes, remote: RemoteConfig) -> Self {
        // The definitions the service has loaded serve the remote claims too.
        let remote = RemoteWork::new(service.store().clone(), Arc::clone(service.definitions()), remote);
        Self { service, types, remote }
    }
}

impl<S: Store> Backend for ServiceBackend<S> {
    fn publish<'a>(&'a self, def: &'a WorkflowDefinition) -> Fut<'a, Published> {
        Box::pin(self.service.publish(def, &self.types))
    }
    fn find<'a>(&'a self, name: &'a str, version: Option<u32>) -> Fut<'a, Published> {
        Box::pin(self.service.find(name, version))
    }
    fn definitions<'a>(&'a self, name: Option<&'a str>) -> Fut<'a, Vec<DefinitionSummary>> {
        Box::pin(self.service.definitions_list(name))
    }
    fn check_types<'a>(&'a self, def: &'a WorkflowDefinition) -> Fut<'a, ()> {
        Box::pin(self.service.check_types(def, &self.types))
    }
    fn start(
        &self,
        workflow: WorkflowId,
        input: Value,
        priority: Priority,
        key: Option<IdempotencyKey>,
    ) -> Fut<'_, KeyedStart> {
        Box::pin(async move {
            match key {
                Some(key) => self.service.start_keyed(workflow, input, priority, &key).await,
                None => self
                    .service
                    .start(workflow, input, priority)
                    .await
                    .map(KeyedStart::Started),
            }
        })
    }
    fn page<'a>(&'a self, query: &'a RunQuery) -> Fut<'a, Vec<RunSummary>> {
        Box::pin(self.service.page(query))
    }
    fn summary(&self, run: RunId) -> Fut<'_, RunSummary> {
        Box::pin(self.service.summary(run))
    }
    fn report(&self, run: RunId) -> Fut<'_, RunReport> {
        Box::pin(self.service.report(run))
    }
    fn cancel(&self, run: RunId) -> Fut<'_, CancelOutcome> {
        Box::pin(self.service.cancel(run))
    }
    fn retry<'a>(&'a self, run: RunId, from: &'a [String], dry_run: bool) -> Fut<'a, Retry> {
        Box::pin(self.service.retry(run, from, dry_run))
    }
    fn attempts<'a>(&'a self, run: RunId, task: &'a str) -> Fut<'a, Option<Vec<Attempt>>> {
        Box::pin(self.service.attempts(run, task))
    }
    fn events(&self, run: RunId, after: u64, limit: u32) -> Fut<'_, Vec<EventView>> {
        Box::pin(self.service.events(run, after, limit))
    }
    fn workers(&self) -> Fut<'_, Vec<WorkerInfo>> {
        Box::pin(self.service.workers())
    }
    fn gauges(&self) -> Fut<'_, Gauges> {
        Box::pin(self.service.gauges())
    }
    fn ready(&self) -> Fut<'_, ()> {
        Box::pin(self.service.ready())
    }
    fn create_schedule(&self, request: ScheduleRequest) -> Fut<'_, ScheduleView> {
        Box::pin(self.service.create_schedule(request))
    }
    fn schedules(&self) -> Fut<'_, Vec<ScheduleView>> {
        Box::pin(self.service.schedules())
    }
    fn schedule<'a>(&'a self, name: &'a str) -> Fut<'a, ScheduleView> {
        Box::pin(self.service.schedule(name))
    }
    fn pause_schedule<'a>(&'a self, name: &'a str, paused: bool) -> Fut<'a, ScheduleView> {
        Box::pin(self.service.pause_schedule(name, paused))
    }
    fn delete_schedule<'a>(&'a self, name: &'a str) -> Fut<'a, ()> {
        Box::pin(self.service.delete_schedule(name))
    }
    fn backfill<'a>(
        &'a self,
        name: &'a str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        dry_run: bool,
    ) -> Fut<'a, Vec<BackfillFire>> {
        Box::pin(self.service.backfill(name, from, to, dry_run))
    }
    fn verify<'a>(&'a self, secret: &'a str) -> Fut<'a, Verdict> {
        Box::pin(tokens::verify(self.service.store(), secret))
    }
    fn claim<'a>(
        &'a self,
        worker: &'a WorkerId,
        task_types: &'a [String],
        max: u32,
        lease: Option<Duration>,
        wait: Duration,
        stop: &'a CancellationToken,
    ) -> Fut<'a, Vec<RemoteClaim>> {
        Box::pin(self.remote.claim(worker, task_types, max, lease, wait, stop))
    }
    fn heartbeat<'a>(&'a self, worker: &'a WorkerId, beats: &'a [Beat]) -> Fut<'a, Vec<BeatStatus>> {
        Box::pin(self.remote.heartbeat(worker, beats))
    }
    fn finish_remote<'a>(&'a self, worker: &'a WorkerId, results: Vec<RemoteResult>) -> Fut<'a, Vec<FinishResult>> {
        Box::pin(self.remote.finish(worker, results))
    }
}
