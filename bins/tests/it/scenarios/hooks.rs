//! Lifecycle hooks (docs/design/handlers.md#lifecycle-hooks): task start,
//! succeeded, failed, retry and workflow done fire in order — start before
//! each attempt's outcome, workflow done last, after the rollback — and
//! only after the change they announce is stored; a panicking observer is
//! contained: the run completes and the other observers are still called.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use flowforge::{HandlerError, Observer, RunEvent, RunId, SqliteStore, TaskContext, TaskEvent};
use flowforge_ports::{RunDetail, RunStore};
use serde_json::json;
use tokio::runtime::Handle;

use super::{Counter, Log, scenario, task_of, within};

/// One hook call, with what the store showed while the hook ran.
#[derive(Debug, Clone, PartialEq)]
struct Hooked {
    hook: &'static str,
    task: String,
    attempt: u32,
    stored: String,
}

fn hooked(hook: &'static str, task: &str, attempt: u32, stored: &str) -> Hooked {
    Hooked {
        hook,
        task: task.to_owned(),
        attempt,
        stored: stored.to_owned(),
    }
}

/// Records every hook and reads the store from inside it.
#[derive(Default)]
struct Recorder {
    store: OnceLock<SqliteStore>,
    log: Log<Hooked>,
}

impl Recorder {
    /// The stored run, read synchronously from inside the hook.
    fn stored(&self, run: RunId) -> Option<RunDetail> {
        let store = self.store.get()?;
        tokio::task::block_in_place(|| Handle::current().block_on(store.get_run(run)))
            .ok()
            .flatten()
    }

    fn task_hook(&self, hook: &'static str, e: &TaskEvent, describe: impl Fn(&flowforge_ports::TaskRunView) -> String) {
        let stored = match self.stored(e.run_id) {
            Some(d) => d
                .tasks
                .iter()
                .find(|t| t.key == e.task_key)
                .map_or_else(|| "no row".to_owned(), describe),
            None => "no store".to_owned(),
        };
        self.log.push(hooked(hook, &e.task_key, e.attempt, &stored));
    }
}

impl Observer for Recorder {
    fn on_task_start(&self, e: &TaskEvent) {
        self.task_hook("start", e, |t| format!("{}@{}", t.state, t.attempt));
    }
    fn on_task_succeeded(&self, e: &TaskEvent) {
        // The announced output is the stored one.
        let announced = e.output.clone();
        self.task_hook("succeeded", e, move |t| {
            let same = if t.output == announced {
                "stored output"
            } else {
                "OTHER output"
            };
            format!("{}@{} {same}", t.state, t.attempt)
        });
    }
    fn on_task_failed(&self, e: &TaskEvent) {
        self.task_hook("failed", e, |t| {
            format!("{}@{} {}", t.state, t.attempt, t.error.as_deref().unwrap_or("-"))
        });
    }
    fn on_task_retry(&self, e: &TaskEvent) {
        let retry_in = e.retry_in;
        self.task_hook("retry", e, move |t| {
            format!("{}@{} due={} in {retry_in:?}", t.state, t.attempt, t.retry_at.is_some())
        });
    }
    fn on_workflow_done(&self, e: &RunEvent) {
        let stored = self
            .stored(e.run_id)
            .map_or_else(|| "no store".to_owned(), |d| d.summary.state.to_string());
        self.log
            .push(hooked("done", &e.workflow, 0, &format!("{} stored {stored}", e.state)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_fire_in_order_and_only_after_what_they_announce_is_stored() {
    let recorder = Arc::new(Recorder::default());
    let observer: Arc<dyn Observer> = recorder.clone();
    let s = scenario(|b| {
        b.observer(observer).handler_fn("ok", |ctx: TaskContext| async move {
            Ok::<_, HandlerError>(json!({ "done": ctx.task_key }))
        })
    })
    .await;
    recorder
        .store
        .set(s.engine.store().clone())
        .expect("set the store once");
    let run = s
        .start(
            json!({
                "name": "hooks", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "ok"},
                    {"key": "b", "task_type": "fail", "depends_on": ["a"],
                     "config": {"message": "nope"},
                     "retry": {"max_attempts": 2, "delay_seconds": 1}},
                    {"key": "c", "task_type": "ok", "depends_on": ["b"]},
                    {"key": "undo_a", "task_type": "ok", "compensate_for": "a"}
                ]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    s.clock.advance(Duration::from_secs(2));
    s.settle(run).await;
    assert_eq!(s.report(run).await.state, "failed");

    assert_eq!(
        recorder.log.entries(),
        [
            hooked("start", "a", 1, "running@1"),
            hooked("succeeded", "a", 1, "succeeded@1 stored output"),
            hooked("start", "b", 1, "running@1"),
            hooked("retry", "b", 1, "retrying@2 due=true in Some(1s)"),
            hooked("start", "b", 2, "running@2"),
            hooked("failed", "b", 2, "failed@2 nope (attempt 2)"),
            hooked("start", "undo_a", 1, "running@1"),
            hooked("succeeded", "undo_a", 1, "succeeded@1 stored output"),
            hooked("done", "hooks", 0, "failed stored failed"),
        ]
    );
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "c").state, flowforge_domain::TaskRunState::Cancelled);
}

/// Panics in every hook, after counting the call.
#[derive(Default)]
struct Panicky(Counter);

impl Observer for Panicky {
    fn on_task_start(&self, _: &TaskEvent) {
        self.0.hit();
        panic!("observer bug in on_task_start");
    }
    fn on_task_succeeded(&self, _: &TaskEvent) {
        self.0.hit();
        panic!("observer bug in on_task_succeeded");
    }
    fn on_task_failed(&self, _: &TaskEvent) {
        self.0.hit();
        panic!("observer bug in on_task_failed");
    }
    fn on_task_retry(&self, _: &TaskEvent) {
        self.0.hit();
        panic!("observer bug in on_task_retry");
    }
    fn on_workflow_done(&self, _: &RunEvent) {
        self.0.hit();
        panic!("observer bug in on_workflow_done");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_observer_is_contained_and_the_others_are_still_called() {
    let panicky = Arc::new(Panicky::default());
    let recorder = Arc::new(Recorder::default());
    let (first, second): (Arc<dyn Observer>, Arc<dyn Observer>) = (panicky.clone(), recorder.clone());
    // The panicking observer is registered first, so every hook reaches it
    // before the recorder (and before the engine's own run waiters).
    let s = scenario(|b| b.observer(first).observer(second)).await;
    let def = flowforge::parse_definition(
        &serde_json::to_vec(&json!({
            "name": "panicky-hooks", "version": 1,
            "tasks": [
                {"key": "a", "task_type": "noop"},
                {"key": "b", "task_type": "fail", "depends_on": ["a"],
                 "config": {"fail_times": 1},
                 "retry": {"max_attempts": 2, "delay_seconds": 0.01}}
            ]
        }))
        .expect("json"),
    )
    .expect("valid");
    let report = within("the run to finish despite the panics", s.engine.run(&def, json!({})))
        .await
        .expect("run");
    assert_eq!(report.state, "succeeded", "{report:#?}");
    let seen: Vec<(&str, String, u32)> = recorder
        .log
        .entries()
        .into_iter()
        .map(|h| (h.hook, h.task, h.attempt))
        .collect();
    assert_eq!(
        seen,
        [
            ("start", "a".to_owned(), 1),
            ("succeeded", "a".to_owned(), 1),
            ("start", "b".to_owned(), 1),
            ("retry", "b".to_owned(), 1),
            ("start", "b".to_owned(), 2),
            ("succeeded", "b".to_owned(), 2),
            ("done", "panicky-hooks".to_owned(), 0),
        ]
    );
    assert_eq!(panicky.0.get(), 7, "every hook reached the panicking observer");
}
