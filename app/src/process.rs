//! A worker process that registers itself
//! (docs/design/handlers.md#worker-registry), so publishing in the distributed
//! mode can check the task types live workers serve.

use std::sync::Arc;
use std::time::Duration;

use flowforge_ports::store::WorkerRegistration;
use flowforge_ports::{DispatchQueue, Store};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::worker::Worker;

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
