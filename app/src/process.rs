//! Helpers for the distributed processes: a worker that registers itself
//! (DESIGN §5), publishing against the task types live workers serve, and
//! waiting for a run driven by other processes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::{RunState, WorkflowDefinition};
use flowforge_ports::store::{Notifier, Published, Topic, WorkerRegistration};
use flowforge_ports::{DispatchQueue, RunId, Store};
use tokio_util::sync::CancellationToken;

use crate::builtins::BUILTIN_TYPES;
use crate::engine::check_task_types;
use crate::error::Error;
use crate::worker::Worker;

/// How recently a worker must have been seen to count as live.
pub const LIVE_WORKER_WINDOW: Duration = Duration::from_secs(90);

/// Publishes `def` if every task type is served by a live worker, or is a
/// built-in every worker serves (all but `command`, which a worker serves
/// only with `--allow-command`).
pub async fn publish_checked<S: Store>(store: &S, def: &WorkflowDefinition) -> Result<Published, Error> {
    let mut known: BTreeSet<String> = BUILTIN_TYPES
        .iter()
        .filter(|t| **t != "command")
        .map(|t| (*t).to_owned())
        .collect();
    known.extend(store.live_task_types(LIVE_WORKER_WINDOW).await?);
    check_task_types(def, &known)?;
    Ok(store.publish_definition(def).await?)
}

/// Runs `worker` registered in the store: registers it, refreshes its
/// last-seen time every `every`, and marks it stopped when it ends.
pub async fn run_registered<S: Store, Q: DispatchQueue>(
    worker: Arc<Worker<S, Q>>,
    store: S,
    registration: WorkerRegistration,
    every: Duration,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    store.register_worker(&registration).await?;
    let touching = {
        let store = store.clone();
        let id = registration.id.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                if let Err(e) = store.touch_worker(&id).await {
                    tracing::warn!(error = %e, "could not refresh the worker registration");
                }
            }
        })
    };
    let result = worker.run(shutdown.clone()).await;
    shutdown.cancel();
    let _ = touching.await;
    if let Err(e) = store.deregister_worker(&registration.id).await {
        tracing::warn!(error = %e, "could not mark the worker stopped");
    }
    result
}

/// Waits until `run` is terminal, driven by whichever processes serve it:
/// woken by the store's run-settled notifications, re-checking at least
/// every `recheck` (a notification can be missed across a reconnect).
pub async fn wait_for_run<S: Store>(store: &S, run: RunId, recheck: Duration) -> Result<RunState, Error> {
    let notifier = store.notifier().await?;
    loop {
        let detail = store.get_run(run).await?.ok_or(Error::RunNotFound(run))?;
        let state = detail.summary.state;
        if matches!(state, RunState::Succeeded | RunState::Failed | RunState::Cancelled) {
            return Ok(state);
        }
        tokio::select! {
            () = notifier.notified(Topic::RunSettled) => {}
            () = tokio::time::sleep(recheck) => {}
        }
    }
}
