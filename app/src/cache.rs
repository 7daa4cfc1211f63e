//! Published definitions by id. (name, version) is immutable, so a cached
//! definition never goes stale; loading re-validates
//! (docs/design/definitions.md#loading).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flowforge_domain::WorkflowDefinition;
use flowforge_ports::{DefinitionStore, LoadError, Published, WorkflowId};

/// Caches loaded definitions in front of a store.
#[derive(Debug)]
pub struct DefinitionCache<S> {
    store: S,
    loaded: Mutex<HashMap<WorkflowId, Arc<Published>>>,
}

/// The most definitions kept; beyond it the cache starts over (definitions
/// are few; this only bounds memory against a pathological store).
const CAPACITY: usize = 1024;

impl<S: DefinitionStore> DefinitionCache<S> {
    /// An empty cache over `store`.
    pub fn new(store: S) -> Self {
        Self {
            store,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// The definition `id`, loading it on first use.
    pub async fn get(&self, id: WorkflowId) -> Result<Arc<Published>, LoadError> {
        if let Some(p) = self.lock().get(&id) {
            return Ok(Arc::clone(p));
        }
        let published = Arc::new(self.store.load_definition(id).await?);
        let mut loaded = self.lock();
        if loaded.len() >= CAPACITY {
            loaded.clear();
        }
        loaded.insert(id, Arc::clone(&published));
        Ok(published)
    }

    /// Seeds the cache with a definition just published.
    pub fn insert(&self, published: Published) {
        self.lock().insert(published.id, Arc::new(published));
    }

    /// The definition, if cached.
    pub fn definition(&self, id: WorkflowId) -> Option<Arc<WorkflowDefinition>> {
        self.lock().get(&id).map(|p| Arc::clone(&p.definition))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorkflowId, Arc<Published>>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (single inserts/clears), so a poisoned lock is still usable.
        self.loaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
