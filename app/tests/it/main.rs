//! `app`'s own integration tests: the use cases, the scheduler and the
//! worker over the in-process queue and an in-memory SQLite store, and
//! schedules on both stores.

mod engine;
mod props;
mod schedules;
mod service;

use std::sync::Arc;

use flowforge_adapters_inproc::InprocQueue;
use flowforge_adapters_sqlite::SqliteStore;
use flowforge_app::{Engine, EngineConfig, HandlerRegistry};
use flowforge_domain::WorkflowDefinition;
use flowforge_domain::schema::parse_value;
use flowforge_ports::{Clock, SystemClock};
use serde_json::Value;

/// A fresh in-memory store of its own.
async fn store_with(clock: Arc<dyn Clock>) -> SqliteStore {
    SqliteStore::connect("sqlite::memory:", clock)
        .await
        .expect("an in-memory SQLite store opens")
}

async fn store() -> SqliteStore {
    store_with(Arc::new(SystemClock)).await
}

/// An engine over `store` and a new in-process queue, two worker slots.
fn engine(store: SqliteStore, registry: HandlerRegistry) -> Engine<SqliteStore, InprocQueue> {
    let config = EngineConfig {
        concurrency: 2,
        ..EngineConfig::default()
    };
    Engine::new(store, InprocQueue::new(), registry, Vec::new(), config)
}

fn definition(v: Value) -> WorkflowDefinition {
    parse_value(v).expect("the test's definition is valid")
}
