//! The store contract suite of `flowforge-ports`, unchanged, against
//! PostgreSQL: each case gets a fresh database from [`PgFactory`], dropped
//! when the case ends.

use std::sync::{Arc, Mutex};

use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_ports::clock::ManualClock;
use flowforge_ports::contract::StoreFactory;

use crate::harness::{TestDb, options, server_reachable};

/// Creates one database per store and drops them all when the case ends.
pub(crate) struct PgFactory {
    databases: Mutex<Vec<TestDb>>,
}

impl PgFactory {
    /// A factory when the server answers; `None` skips the case (a failure
    /// under `REQUIRE_POSTGRES=1`, see the harness).
    pub(crate) fn if_server() -> Option<Self> {
        server_reachable().then(|| Self {
            databases: Mutex::new(Vec::new()),
        })
    }
}

impl StoreFactory for PgFactory {
    type Store = PgStore;

    async fn create(&self, clock: Arc<ManualClock>) -> PgStore {
        let db = TestDb::create()
            .await
            .expect("the server answered the reachability probe");
        // Cases race up to eight callers on one store: room for them.
        let opts = PgOptions {
            max_connections: 6,
            ..options()
        };
        let store = PgStore::connect(&db.url, clock, opts).await.unwrap();
        self.databases.lock().unwrap().push(db);
        store
    }
}

// The factory expression skips the case (returns from the test) when there
// is no server, so the suite runs unchanged or not at all.
flowforge_ports::store_contract_tests!(match PgFactory::if_server() {
    Some(factory) => factory,
    None => return,
});
