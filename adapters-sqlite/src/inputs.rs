//! What `task_inputs` reads, kept in process: a run's input and the outputs
//! of its succeeded task runs. Every task's attempt reads them, and a
//! wide fan-out reads the same root output thousands of times.
//!
//! Both are immutable once written: a run's input never changes, and a
//! succeeded task run is terminal, so its stored result never changes.
//! An entry therefore answers exactly what the database would, whichever
//! process wrote it; a key without an entry (not succeeded yet, or
//! forgotten) is read from the database. The stored JSON text is kept and
//! parsed on each read, as a read from the database parses it.

use std::collections::HashMap;
use std::sync::Arc;

use flowforge_ports::RunId;

/// Bytes of JSON kept at most; past it the cache starts over.
const MAX_BYTES: usize = 64 << 20;
/// Texts longer than this are not kept (each would evict too much).
const MAX_ENTRY: usize = 1 << 20;

/// One run's cached inputs.
#[derive(Debug, Default)]
struct RunInputs {
    input: Option<Arc<str>>,
    /// Output text by task key, with the task run's id (outputs are
    /// returned in id order, as the database returns them).
    outputs: HashMap<String, (i64, Arc<str>)>,
}

/// The cache, per store (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct InputCache {
    runs: HashMap<RunId, RunInputs>,
    bytes: usize,
}

/// A cache hit: the run input and the wanted outputs in id order.
pub(crate) type Cached = (Arc<str>, Vec<(String, Arc<str>)>);

impl InputCache {
    fn room(&mut self, len: usize) -> bool {
        if len > MAX_ENTRY {
            return false;
        }
        if self.bytes + len > MAX_BYTES {
            self.runs.clear();
            self.bytes = 0;
        }
        self.bytes += len;
        true
    }

    /// Keeps a run's input.
    pub(crate) fn input(&mut self, run: RunId, text: &str) {
        if self.runs.get(&run).is_some_and(|r| r.input.is_some()) || !self.room(text.len()) {
            return;
        }
        self.runs.entry(run).or_default().input = Some(Arc::from(text));
    }

    /// Keeps the output of a task run known to have succeeded.
    pub(crate) fn output(&mut self, run: RunId, key: &str, id: i64, text: &str) {
        if self.runs.get(&run).is_some_and(|r| r.outputs.contains_key(key)) || !self.room(text.len()) {
            return;
        }
        self.runs
            .entry(run)
            .or_default()
            .outputs
            .insert(key.to_owned(), (id, Arc::from(text)));
    }

    /// The run input and the outputs of `keys`, if every one is kept.
    pub(crate) fn get(&self, run: RunId, keys: &[String]) -> Option<Cached> {
        let inputs = self.runs.get(&run)?;
        let input = inputs.input.clone()?;
        let mut outputs = Vec::with_capacity(keys.len());
        for key in keys {
            let (id, text) = inputs.outputs.get(key)?;
            outputs.push((*id, key, text));
        }
        outputs.sort_by_key(|(id, _, _)| *id);
        // A key named twice is one output, as the database's IN (…) gives it.
        outputs.dedup_by_key(|(id, _, _)| *id);
        Some((
            input,
            outputs
                .into_iter()
                .map(|(_, key, text)| (key.clone(), text.clone()))
                .collect(),
        ))
    }

    /// Drops a run's entries (it settled: no attempt of it reads them again).
    pub(crate) fn forget(&mut self, run: RunId) {
        if let Some(inputs) = self.runs.remove(&run) {
            let len =
                inputs.input.map_or(0, |t| t.len()) + inputs.outputs.values().map(|(_, t)| t.len()).sum::<usize>();
            self.bytes = self.bytes.saturating_sub(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: u128) -> RunId {
        RunId(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn a_hit_needs_the_input_and_every_key() {
        let mut cache = InputCache::default();
        let keys = vec!["b".to_owned(), "a".to_owned(), "a".to_owned()];
        assert!(cache.get(run(1), &[]).is_none());
        cache.output(run(1), "a", 7, "1");
        cache.input(run(1), "{}");
        assert!(cache.get(run(1), &keys).is_none(), "b is missing");
        cache.output(run(1), "b", 3, "2");
        let (input, outputs) = cache.get(run(1), &keys).expect("a hit");
        assert_eq!(&*input, "{}");
        let outputs: Vec<(&str, &str)> = outputs.iter().map(|(k, t)| (k.as_str(), &**t)).collect();
        assert_eq!(outputs, [("b", "2"), ("a", "1")], "id order, each key once");
        cache.forget(run(1));
        assert!(cache.get(run(1), &[]).is_none());
        assert_eq!(cache.bytes, 0);
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let mut cache = InputCache::default();
        let big = "x".repeat(MAX_ENTRY);
        for n in 0..100 {
            cache.input(run(n), &big);
            assert!(cache.bytes <= MAX_BYTES);
        }
        cache.input(run(1000), &"y".repeat(MAX_ENTRY + 1));
        assert!(cache.get(run(1000), &[]).is_none(), "too big to keep");
    }
}
