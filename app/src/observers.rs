//! A set of observers, called after persistence with every failure and
//! panic contained and logged (docs/design/handlers.md#lifecycle-hooks).

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use flowforge_domain::SkipReason;
use flowforge_ports::{Observer, RunEvent, TaskEvent};

use crate::registry::panic_message;

/// The observers of one engine.
#[derive(Clone, Default)]
pub struct Observers(Vec<Arc<dyn Observer>>);

impl fmt::Debug for Observers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

impl Observers {
    /// Adds an observer.
    pub fn push(&mut self, observer: Arc<dyn Observer>) {
        self.0.push(observer);
    }

    fn each(&self, hook: &'static str, call: impl Fn(&dyn Observer)) {
        for observer in &self.0 {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| call(observer.as_ref()))) {
                tracing::error!(hook, panic = %panic_message(payload.as_ref()), "an observer panicked; the run goes on");
            }
        }
    }

    /// `on_task_start` on every observer.
    pub fn task_start(&self, e: &TaskEvent) {
        self.each("on_task_start", |o| o.on_task_start(e));
    }
    /// `on_task_succeeded` on every observer.
    pub fn task_succeeded(&self, e: &TaskEvent) {
        self.each("on_task_succeeded", |o| o.on_task_succeeded(e));
    }
    /// `on_task_failed` on every observer.
    pub fn task_failed(&self, e: &TaskEvent) {
        self.each("on_task_failed", |o| o.on_task_failed(e));
    }
    /// `on_task_retry` on every observer.
    pub fn task_retry(&self, e: &TaskEvent) {
        self.each("on_task_retry", |o| o.on_task_retry(e));
    }
    /// `on_task_skipped` on every observer.
    pub fn task_skipped(&self, e: &TaskEvent, reason: SkipReason) {
        self.each("on_task_skipped", |o| o.on_task_skipped(e, reason));
    }
    /// `on_workflow_done` on every observer.
    pub fn workflow_done(&self, e: &RunEvent) {
        self.each("on_workflow_done", |o| o.on_workflow_done(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowforge_domain::RunState;
    use flowforge_ports::RunId;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Panicky;
    impl Observer for Panicky {
        fn on_workflow_done(&self, _: &RunEvent) {
            panic!("observer bug");
        }
    }

    #[derive(Default)]
    struct Counter(AtomicUsize);
    impl Observer for Counter {
        fn on_workflow_done(&self, _: &RunEvent) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_panicking_observer_does_not_stop_the_others() {
        let counter = Arc::new(Counter::default());
        let mut set = Observers::default();
        set.push(Arc::new(Panicky));
        set.push(counter.clone());
        set.workflow_done(&RunEvent {
            run_id: RunId(Default::default()),
            workflow: "w".into(),
            version: 1,
            state: RunState::Succeeded,
        });
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    }
}
