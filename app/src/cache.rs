//! Published definitions by id and by (name, version). (name, version) is
//! immutable, so a cached definition never goes stale; loading re-validates
//! (docs/design/definitions.md#loading).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flowforge_domain::WorkflowDefinition;
use flowforge_domain::plan::{self, Handoff};
use flowforge_ports::{DefinitionStore, LoadError, Published, WorkflowId};

/// Caches loaded definitions in front of a store.
#[derive(Debug)]
pub struct DefinitionCache<S> {
    store: S,
    loaded: Mutex<Loaded>,
}

/// The cached definitions and their names.
#[derive(Debug, Default)]
struct Loaded {
    by_id: HashMap<WorkflowId, Arc<Published>>,
    by_name: HashMap<(String, u32), WorkflowId>,
}

impl Loaded {
    fn insert(&mut self, published: Arc<Published>) {
        if self.by_id.len() >= CAPACITY {
            self.by_id.clear();
            self.by_name.clear();
        }
        let def = &published.definition;
        self.by_name
            .insert((def.name().to_owned(), def.version()), published.id);
        self.by_id.insert(published.id, published);
    }
}

/// The most definitions kept; beyond it the cache starts over (definitions
/// are few; this only bounds memory against a pathological store).
const CAPACITY: usize = 1024;

impl<S: DefinitionStore> DefinitionCache<S> {
    /// An empty cache over `store`.
    pub fn new(store: S) -> Self {
        Self {
            store,
            loaded: Mutex::new(Loaded::default()),
        }
    }

    /// The definition `id`, loading it on first use.
    pub async fn get(&self, id: WorkflowId) -> Result<Arc<Published>, LoadError> {
        if let Some(p) = self.lock().by_id.get(&id) {
            return Ok(Arc::clone(p));
        }
        let published = Arc::new(self.store.load_definition(id).await?);
        self.lock().insert(Arc::clone(&published));
        Ok(published)
    }

    /// What a success of `task_key` in a run of `id` hands on in its own
    /// transaction (docs/design/scheduler.md#handoff). Nothing when the
    /// definition cannot be read: the pass then promotes as it always can.
    pub async fn handoff(&self, id: WorkflowId, task_key: &str) -> Handoff {
        match self.get(id).await {
            Ok(published) => plan::handoff(&published.definition, task_key),
            Err(_) => Handoff::default(),
        }
    }

    /// Seeds the cache with a definition just published or found.
    pub fn insert(&self, published: Published) {
        self.lock().insert(Arc::new(published));
    }

    /// The definition `name` at `version`, if cached.
    pub fn named(&self, name: &str, version: u32) -> Option<Arc<Published>> {
        let loaded = self.lock();
        let id = loaded.by_name.get(&(name.to_owned(), version))?;
        loaded.by_id.get(id).cloned()
    }

    /// The definition, if cached.
    pub fn definition(&self, id: WorkflowId) -> Option<Arc<WorkflowDefinition>> {
        self.lock().by_id.get(&id).map(|p| Arc::clone(&p.definition))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (single inserts/clears), so a poisoned lock is still usable.
        self.loaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
