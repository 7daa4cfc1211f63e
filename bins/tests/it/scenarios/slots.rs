//! A worker slot that panics ends the worker with an error, so the
//! process exits non-zero and its supervisor restarts it, instead of
//! reporting a clean stop while serving nothing.

use std::sync::Arc;

use flowforge::HandlerRegistry;
use flowforge_adapters_inproc::InprocConsumer;
use flowforge_adapters_sqlite::SqliteStore;
use flowforge_app::cache::DefinitionCache;
use flowforge_app::worker::{Worker, WorkerConfig};
use flowforge_ports::{DispatchQueue, SystemClock, WorkerId, queue};
use tokio_util::sync::CancellationToken;

/// A queue whose every consumer panics while opening.
struct PanickingQueue;

impl DispatchQueue for PanickingQueue {
    type Consumer = InprocConsumer;

    async fn consumer(&self) -> Result<InprocConsumer, queue::Error> {
        panic!("the consumer exploded");
    }
}

#[tokio::test]
async fn a_worker_whose_slot_panicked_ends_with_an_infrastructure_error() {
    let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
        .await
        .expect("an in-memory store");
    let worker = Arc::new(Worker::new(
        store.clone(),
        PanickingQueue,
        Arc::new(DefinitionCache::new(store)),
        Arc::new(HandlerRegistry::new()),
        Default::default(),
        WorkerConfig::new(WorkerId("panicky".into()), 2),
    ));
    let error = worker
        .run(CancellationToken::new())
        .await
        .expect_err("a panicked slot is a failed worker");
    assert!(error.is_infrastructure(), "exit code 4: {error}");
    assert!(error.to_string().contains("the consumer exploded"), "{error}");
}
