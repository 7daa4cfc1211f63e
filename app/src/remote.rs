//! Remote workers (docs/design/handlers.md#remote-workers): code in any
//! language claims task runs of its types by polling, heartbeats their
//! leases and stores their outcomes — the same claim, lease and fencing
//! token as a queue-fed worker, so a polled claim never races a delivered
//! dispatch into a second run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::limits::{self, Limits, ValueKind};
use flowforge_domain::plan::Handoff;
use flowforge_ports::store::{
    Claim, DEFAULT_PRIORITY_AGING, FinishResult, Handover, LeaseStatus, TaskInputs, TaskOutcome, WorkerRegistration,
};
use flowforge_ports::{MapItem, RunId, Store, TaskRunId, WorkerId, WorkflowId};
use futures_util::StreamExt;
use serde_json::{Map, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cache::DefinitionCache;
use crate::error::Error;

/// The first pause of a long poll that found nothing; it doubles up to
/// [`POLL_MAX_PAUSE`], so an idle poller costs a few queries a second and
/// new work is seen within a quarter of a second.
const POLL_FIRST_PAUSE: Duration = Duration::from_millis(10);
const POLL_MAX_PAUSE: Duration = Duration::from_millis(250);
/// How many outcomes of one request are stored at once: each is a commit
/// of its own, so throughput follows how many are in flight (up to what
/// the pool and the database's cores allow).
const FINISH_CONCURRENCY: usize = 16;

/// Bounds on what remote workers may ask for.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The lease of a claim that names none.
    pub default_lease: Duration,
    /// The longest lease a claim may ask for.
    pub max_lease: Duration,
    /// The longest a claim request waits for work.
    pub max_wait: Duration,
    /// The most task runs one claim request takes.
    pub max_batch: u32,
    /// Output and input sizes (docs/design/data-flow.md#limits).
    pub limits: Limits,
    /// The priority aging step claims are ordered by
    /// (docs/design/priorities.md#aging).
    pub aging: Duration,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            default_lease: Duration::from_secs(30),
            max_lease: Duration::from_secs(600),
            max_wait: Duration::from_secs(25),
            max_batch: 100,
            limits: Limits::default(),
            aging: DEFAULT_PRIORITY_AGING,
        }
    }
}

/// A task run claimed for a remote worker, with everything its attempt
/// needs.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteClaim {
    /// The task run.
    pub task_run_id: TaskRunId,
    /// The token the attempt presents with its heartbeats and outcome.
    pub token: i64,
    /// Its run.
    pub run_id: RunId,
    /// The task's key.
    pub task_key: String,
    /// The task's type.
    pub task_type: String,
    /// The forward task it undoes, for a compensator.
    pub compensate_for: Option<String>,
    /// 1-based attempt.
    pub attempt: u32,
    /// `{run_id}:{task_key}`, stable across attempts.
    pub idempotency_key: String,
    /// The run's input.
    pub run_input: Value,
    /// Outputs of the task's dependencies by key (a compensator: of the
    /// task it undoes).
    pub inputs: Map<String, Value>,
    /// The task's `config`.
    pub config: Map<String, Value>,
    /// A child of a mapped task: its item and index
    /// (docs/design/map.md#children).
    pub item: Option<MapItem>,
    /// When the lease runs out unless renewed (store time).
    pub lease_expires_at: DateTime<Utc>,
    /// The lease length heartbeats renew.
    pub lease: Duration,
    /// When the attempt times out: a heartbeat or outcome after it fails
    /// the attempt as timed out.
    pub deadline: DateTime<Utc>,
}

/// A lease renewal a remote worker asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    /// The task run.
    pub task_run_id: TaskRunId,
    /// The claim's token.
    pub token: i64,
    /// Progress to store with the renewal.
    pub progress: Option<Value>,
}

/// What became of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatStatus {
    /// Renewed: go on.
    Held,
    /// Renewed, but the run is being cancelled: stop and report `cancelled`.
    CancelRequested,
    /// The lease is gone (reaped, finished, or another token holds it):
    /// stop; any outcome will be refused.
    Lost,
    /// The attempt ran past its timeout and was failed: stop.
    TimedOut,
}

/// How a remote attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteOutcome {
    /// It succeeded with this output.
    Succeeded(Value),
    /// It failed.
    Failed {
        /// Why, for the run report.
        error: String,
        /// Whether another attempt may succeed.
        retryable: bool,
        /// The least wait before the next attempt.
        retry_after: Option<Duration>,
    },
    /// It stopped because its run is being cancelled.
    Cancelled,
}

/// One outcome a remote worker stores.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteResult {
    /// The task run.
    pub task_run_id: TaskRunId,
    /// Its run (where the task is looked up if this process did not issue
    /// the claim).
    pub run_id: RunId,
    /// The claim's token.
    pub token: i64,
    /// How it ended.
    pub outcome: RemoteOutcome,
}

/// A claim this process issued, until its outcome is stored.
#[derive(Debug, Clone)]
struct Issued {
    workflow_id: WorkflowId,
    task_key: String,
    /// Within the run's generation: what the retry policy counts.
    attempt: u32,
    lease: Duration,
    timeout: Duration,
    deadline: Instant,
}

/// The remote-worker use cases over one store.
#[derive(Debug)]
pub struct RemoteWork<S: Store> {
    store: S,
    defs: Arc<DefinitionCache<S>>,
    config: RemoteConfig,
    issued: Mutex<HashMap<(TaskRunId, i64), Issued>>,
    registered: Mutex<HashMap<WorkerId, Instant>>,
}

impl<S: Store> RemoteWork<S> {
    /// Remote work over `store`.
    pub fn new(store: S, defs: Arc<DefinitionCache<S>>, config: RemoteConfig) -> Self {
        Self {
            store,
            defs,
            config,
            issued: Mutex::default(),
            registered: Mutex::default(),
        }
    }

    fn issued(&self) -> std::sync::MutexGuard<'_, HashMap<(TaskRunId, i64), Issued>> {
        self.issued.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims up to `max` ready task runs of `task_types` for `worker`,
    /// waiting up to `wait` for one to become ready (or until `stop`).
    /// Registers the worker and its types, so runs using them can start.
    pub async fn claim(
        &self,
        worker: &WorkerId,
        task_types: &[String],
        max: u32,
        lease: Option<Duration>,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<Vec<RemoteClaim>, Error> {
        self.register(worker, task_types, max).await?;
        self.forget_abandoned();
        let lease = lease.unwrap_or(self.config.default_lease).min(self.config.max_lease);
        let max = max.clamp(1, self.config.max_batch);
        let until = Instant::now() + wait.min(self.config.max_wait);
        let mut pause = POLL_FIRST_PAUSE;
        loop {
            let claims = self
                .store
                .claim_ready(task_types, worker, lease, max, self.config.aging)
                .await?;
            if !claims.is_empty() {
                let mut prepared = Vec::with_capacity(claims.len());
                let mut read = HashMap::new();
                for claim in claims {
                    if let Some(c) = self.prepare(worker, claim, lease, &mut read).await {
                        prepared.push(c);
                    }
                }
                if !prepared.is_empty() {
                    return Ok(prepared);
                }
            }
            let now = Instant::now();
            if now >= until {
                return Ok(Vec::new());
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(Vec::new()),
                () = tokio::time::sleep(pause.min(until - now)) => {}
            }
            pause = (pause * 2).min(POLL_MAX_PAUSE);
        }
    }

    /// Forgets the claims of workers that went silent: a lease past the
    /// attempt's deadline with no heartbeat has expired, and the reaper
    /// owns the task run now.
    fn forget_abandoned(&self) {
        let now = Instant::now();
        self.issued().retain(|_, i| now < later(i.deadline, i.lease));
    }

    /// Registers `worker` as serving `task_types`, at most once a
    /// registration refresh period: every poll would otherwise be a write.
    async fn register(&self, worker: &WorkerId, task_types: &[String], slots: u32) -> Result<(), Error> {
        let every = self.config.default_lease / 3;
        let due = {
            let mut seen = self.registered.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            match seen.get(worker) {
                Some(at) if now.duration_since(*at) < every => false,
                _ => {
                    if seen.len() >= 4096 {
                        seen.retain(|_, at| now.duration_since(*at) < every);
                    }
                    seen.insert(worker.clone(), now);
                    true
                }
            }
        };
        if due {
            self.store
                .register_worker(&WorkerRegistration {
                    id: worker.clone(),
                    host: "remote".to_owned(),
                    pid: 0,
                    task_types: task_types.to_vec(),
                    concurrency: slots,
                })
                .await?;
        }
        Ok(())
    }

    /// Gathers what the claimed attempt needs. An attempt that cannot be
    /// prepared is failed here (for good when no attempt could do better)
    /// and not handed out.
    async fn prepare(
        &self,
        worker: &WorkerId,
        claim: Claim,
        lease: Duration,
        read: &mut HashMap<(RunId, Vec<String>), TaskInputs>,
    ) -> Option<RemoteClaim> {
        let fail = |error: String, retry_in: Option<Duration>| TaskOutcome::Failed { error, retry_in };
        let published = match self.defs.get(claim.workflow_id).await {
            Ok(p) => p,
            Err(e) => {
                self.give_up(
                    worker,
                    &claim,
                    fail(format!("cannot load the run's definition: {e}"), None),
                )
                .await;
                return None;
            }
        };
        let def = &published.definition;
        let Some((task, index)) = def.task_of_run(&claim.task_key) else {
            let error = format!("task '{}' is not in the run's definition", claim.task_key);
            self.give_up(worker, &claim, fail(error, None)).await;
            return None;
        };
        let keys: Vec<String> = match &claim.compensate_for {
            Some(forward) => vec![forward.clone()],
            None => task.depends_on().to_vec(),
        };
        // The tasks of one batch often share a run and dependencies (a
        // fan-out's branches): their inputs are read once per batch.
        let memo = (claim.run_id, keys);
        let inputs = match read.get(&memo) {
            Some(inputs) => Ok(inputs.clone()),
            None => {
                self.store
                    .task_inputs(claim.run_id, &memo.1, self.config.limits.task_inputs_bytes)
                    .await
            }
        };
        let inputs = match inputs {
            Ok(i) => {
                read.insert(memo, i.clone());
                match crate::inputs::for_trigger(&self.store, claim.run_id, task, i.outputs).await {
                    Ok(outputs) => TaskInputs { outputs, ..i },
                    Err(e) => {
                        let retry_in = def.retry_policy(task).next_retry(claim.generation_attempt(), false);
                        let error = format!("could not read the task's inputs: {e}");
                        self.give_up(worker, &claim, fail(error, retry_in)).await;
                        return None;
                    }
                }
            }
            Err(flowforge_ports::store::Error::Refused(refusal)) => {
                self.give_up(worker, &claim, fail(refusal.to_string(), None)).await;
                return None;
            }
            Err(e) => {
                let retry_in = def.retry_policy(task).next_retry(claim.generation_attempt(), false);
                let error = format!("could not read the task's inputs: {e}");
                self.give_up(worker, &claim, fail(error, retry_in)).await;
                return None;
            }
        };
        let item = match crate::inputs::map_item(task, index, &inputs.outputs) {
            Ok(item) => item,
            Err(error) => {
                self.give_up(worker, &claim, fail(error, None)).await;
                return None;
            }
        };
        let timeout = def.timeout(task);
        // In store time, as the lease is: the claim stamped it at
        // `lease_expires_at - lease`.
        let delta = |d: Duration| chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX);
        let deadline = claim
            .lease_expires_at
            .checked_sub_signed(delta(lease))
            .and_then(|claimed| claimed.checked_add_signed(delta(timeout)))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        self.issued().insert(
            (claim.task_run_id, claim.token),
            Issued {
                workflow_id: claim.workflow_id,
                task_key: claim.task_key.clone(),
                attempt: claim.generation_attempt(),
                lease,
                timeout,
                deadline: later(Instant::now(), timeout),
            },
        );
        Some(RemoteClaim {
            task_run_id: claim.task_run_id,
            token: claim.token,
            run_id: claim.run_id,
            idempotency_key: format!("{}:{}", claim.run_id, claim.task_key),
            task_key: claim.task_key,
            task_type: task.task_type().to_owned(),
            compensate_for: claim.compensate_for,
            attempt: claim.attempt,
            run_input: inputs.run_input,
            inputs: inputs.outputs,
            config: task.config().clone(),
            item,
            lease_expires_at: claim.lease_expires_at,
            lease,
            deadline,
        })
    }

    /// Stores the outcome of an attempt nobody will run; if that fails,
    /// the lease runs out and the reaper takes the row back.
    async fn give_up(&self, worker: &WorkerId, claim: &Claim, outcome: TaskOutcome) {
        tracing::warn!(task_run_id = %claim.task_run_id, ?outcome, "a remote claim could not be prepared");
        if let Err(e) = self
            .store
            .finish_task_run(claim.task_run_id, claim.token, worker, outcome)
            .await
        {
            tracing::warn!(error = %e, "storing the failed preparation failed; the reaper will retry the task");
        }
    }

    /// Renews the leases of `beats`, storing progress where given.
    pub async fn heartbeat(&self, worker: &WorkerId, beats: &[Beat]) -> Result<Vec<BeatStatus>, Error> {
        if !beats.is_empty() {
            self.touch(worker).await;
        }
        let mut statuses = Vec::with_capacity(beats.len());
        for beat in beats {
            let key = (beat.task_run_id, beat.token);
            let issued = self.issued().get(&key).cloned();
            if let Some(issued) = &issued
                && Instant::now() >= issued.deadline
            {
                self.time_out(worker, key, issued.clone()).await?;
                statuses.push(BeatStatus::TimedOut);
                continue;
            }
            let lease = issued.as_ref().map_or(self.config.default_lease, |i| i.lease);
            let status = match &beat.progress {
                Some(progress) => {
                    limits::check_value(ValueKind::TaskProgress, progress, limits::MAX_PROGRESS_BYTES)?;
                    self.store
                        .report_progress(beat.task_run_id, beat.token, progress, lease)
                        .await?
                }
                None => self.store.renew_lease(beat.task_run_id, beat.token, lease).await?,
            };
            statuses.push(match status {
                LeaseStatus::Held {
                    cancel_requested: false,
                } => BeatStatus::Held,
                LeaseStatus::Held { cancel_requested: true } => BeatStatus::CancelRequested,
                LeaseStatus::Lost => {
                    self.issued().remove(&key);
                    BeatStatus::Lost
                }
            });
        }
        Ok(statuses)
    }

    /// Keeps a worker that only heartbeats and reports (a long task) in
    /// the registry of live workers.
    async fn touch(&self, worker: &WorkerId) {
        let due = {
            let mut seen = self.registered.lock().unwrap_or_else(PoisonError::into_inner);
            let due = seen
                .get(worker)
                .is_none_or(|at| at.elapsed() >= self.config.default_lease / 3);
            if due {
                seen.insert(worker.clone(), Instant::now());
            }
            due
        };
        if due && let Err(e) = self.store.touch_worker(worker).await {
            tracing::warn!(error = %e, worker = %worker, "could not refresh a remote worker's registration");
        }
    }

    /// Fails an attempt that outlived its timeout.
    async fn time_out(&self, worker: &WorkerId, key: (TaskRunId, i64), issued: Issued) -> Result<FinishResult, Error> {
        let outcome = TaskOutcome::Failed {
            error: format!("timed out after {}s", issued.timeout.as_secs_f64()),
            retry_in: self
                .retry_in(issued.workflow_id, &issued.task_key, issued.attempt, false, None)
                .await,
        };
        self.store_outcome(worker, key, outcome, &Handoff::default()).await
    }

    /// Stores an attempt's outcome with its token, handing a success on
    /// as `handoff` says; the claim is settled either way (recorded, or
    /// refused as stale).
    async fn store_outcome(
        &self,
        worker: &WorkerId,
        key: (TaskRunId, i64),
        outcome: TaskOutcome,
        handoff: &Handoff,
    ) -> Result<FinishResult, Error> {
        let stored = self
            .store
            .finish_and_hand_off(key.0, key.1, worker, outcome, handoff, Handover::Sweep)
            .await?;
        self.issued().remove(&key);
        Ok(stored.result)
    }

    async fn retry_in(
        &self,
        workflow: WorkflowId,
        task_key: &str,
        attempt: u32,
        permanent: bool,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        // Without its definition the task cannot be retried by its policy;
        // failing it for good is what a worker does then too.
        let published = self.defs.get(workflow).await.ok()?;
        let (task, _) = published.definition.task_of_run(task_key)?;
        published
            .definition
            .retry_policy(task)
            .next_retry(attempt, permanent)
            .map(|backoff| retry_after.map_or(backoff, |after| backoff.max(after)))
    }

    /// Stores the outcomes of `results`, each with its token: a stale
    /// token changes nothing and gets [`FinishResult::Stale`].
    pub async fn finish(&self, worker: &WorkerId, results: Vec<RemoteResult>) -> Result<Vec<FinishResult>, Error> {
        self.touch(worker).await;
        let stored: Vec<Result<FinishResult, Error>> = futures_util::stream::iter(results)
            .map(|r| self.finish_one(worker, r))
            .buffered(FINISH_CONCURRENCY)
            .collect()
            .await;
        stored.into_iter().collect()
    }

    async fn finish_one(&self, worker: &WorkerId, result: RemoteResult) -> Result<FinishResult, Error> {
        let key = (result.task_run_id, result.token);
        let issued = self.issued().get(&key).cloned();
        let issued = match issued {
            Some(i) => Some(i),
            None => self.look_up(&result).await?,
        };
        let Some(issued) = issued else {
            // No such task run in that run: no token of it can match.
            return Ok(FinishResult::Stale);
        };
        if Instant::now() >= issued.deadline {
            return self.time_out(worker, key, issued).await;
        }
        let outcome = match result.outcome {
            RemoteOutcome::Succeeded(output) => {
                match limits::check_value(ValueKind::TaskOutput, &output, self.config.limits.task_output_bytes) {
                    Ok(_) => TaskOutcome::Succeeded { output },
                    Err(refusal) => TaskOutcome::Failed {
                        error: refusal.to_string(),
                        retry_in: None,
                    },
                }
            }
            RemoteOutcome::Failed {
                error,
                retryable,
                retry_after,
            } => TaskOutcome::Failed {
                error: limits::storable_text(&error).into_owned(),
                retry_in: self
                    .retry_in(
                        issued.workflow_id,
                        &issued.task_key,
                        issued.attempt,
                        !retryable,
                        retry_after,
                    )
                    .await,
            },
            RemoteOutcome::Cancelled => {
                // `cancelled` ends an attempt only for a run being
                // cancelled; otherwise the worker gave the attempt up, and
                // it is retried like any failure.
                match self.store.renew_lease(key.0, key.1, issued.lease).await? {
                    LeaseStatus::Held { cancel_requested: true } | LeaseStatus::Lost => TaskOutcome::Cancelled,
                    LeaseStatus::Held {
                        cancel_requested: false,
                    } => TaskOutcome::Failed {
                        error: "the remote worker gave the attempt up".to_owned(),
                        retry_in: self
                            .retry_in(issued.workflow_id, &issued.task_key, issued.attempt, false, None)
                            .await,
                    },
                }
            }
        };
        let handoff = match outcome {
            TaskOutcome::Succeeded { .. } => self.defs.handoff(issued.workflow_id, &issued.task_key).await,
            _ => Handoff::default(),
        };
        self.store_outcome(worker, key, outcome, &handoff).await
    }

    /// The claim behind a result this process did not issue (it restarted,
    /// or another server issued it): the task as its run holds it now. Its
    /// timeout was the issuing server's to enforce.
    async fn look_up(&self, result: &RemoteResult) -> Result<Option<Issued>, Error> {
        let Some(detail) = self.store.get_run(result.run_id).await? else {
            return Ok(None);
        };
        let Some(task) = detail.tasks.iter().find(|t| t.id == result.task_run_id) else {
            return Ok(None);
        };
        Ok(Some(Issued {
            workflow_id: detail.summary.workflow_id,
            task_key: task.key.clone(),
            attempt: task.attempt,
            lease: self.config.default_lease,
            timeout: Duration::MAX,
            deadline: later(Instant::now(), Duration::MAX),
        }))
    }
}

/// `at + by`, or as late as this platform's clock can say.
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(at)
}
