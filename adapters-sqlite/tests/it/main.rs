//! The SQLite adapter's one integration-test binary: the store contract
//! suite over a fresh temp-file database per test (WAL needs a real file),
//! plus what only SQLite has (`sqlite.rs`).

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use flowforge_adapters_sqlite::SqliteStore;
use flowforge_ports::clock::ManualClock;
use flowforge_ports::contract::StoreFactory;
use tempfile::TempDir;

mod sqlite;

/// Each store gets its own database file in its own temp folder; the
/// folders live as long as the factory (one test).
#[derive(Debug, Default)]
pub(crate) struct SqliteFactory {
    dirs: Mutex<Vec<TempDir>>,
}

impl SqliteFactory {
    /// A fresh database path in a folder removed with the factory.
    pub(crate) fn path(&self) -> PathBuf {
        let dir = tempfile::tempdir().expect("a temp folder");
        let path = dir.path().join("flowforge.db");
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).push(dir);
        path
    }
}

impl StoreFactory for SqliteFactory {
    type Store = SqliteStore;

    fn create(&self, clock: Arc<ManualClock>) -> impl Future<Output = SqliteStore> + Send {
        let url = format!("sqlite://{}", self.path().display());
        async move { SqliteStore::connect(&url, clock).await.expect("connect") }
    }
}

mod contract {
    flowforge_ports::store_contract_tests!(crate::SqliteFactory::default());
}
