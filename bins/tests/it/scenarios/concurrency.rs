//! Concurrency limits in the embedded engine (docs/design/concurrency.md):
//! a queued key never has more runs or tasks going than its `max` (read
//! back from the event history), `cancel_newest` turns the newcomer away,
//! `cancel_in_progress` cancels and rolls back the older run, a retried
//! task waits at its gate again, and a key the input does not give refuses
//! the start.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use flowforge::{Error, HandlerError, RunState, TaskContext};
use flowforge_domain::TaskRunState;
use flowforge_ports::{RunDetail, RunId, Scope};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::{Counter, EmbeddedBuilder, Scenario, scenario, within};

/// The most intervals open at once, from `(start, end)` pairs of store
/// time; at equal times an end comes first, since a slot is let go in the
/// transaction that ends its holder, before the next holder can start.
pub(crate) fn most_at_once(intervals: &[(i64, i64)]) -> usize {
    let mut points: Vec<(i64, i32)> = intervals.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    points.sort_unstable();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, step) in points {
        open += step;
        most = most.max(open);
    }
    usize::try_from(most).unwrap_or(0)
}

/// When `detail`'s run started and when it ended (microseconds), from its
/// own history.
pub(crate) fn run_interval(detail: &RunDetail) -> (i64, i64) {
    let at = |names: &[&str]| {
        detail
            .events
            .iter()
            .find(|e| e.task.is_none() && names.contains(&e.transition.as_str()))
            .map(|e| e.at.timestamp_micros())
            .expect("the run's edge is in its history")
    };
    (at(&["start"]), at(&["succeed", "fail", "cancel"]))
}

/// A handler type `job` that yields a few times, so that runs overlap
/// whenever the engine lets them.
fn with_job(b: EmbeddedBuilder) -> EmbeddedBuilder {
    b.concurrency(4).handler_fn("job", |_ctx: TaskContext| async move {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        Ok::<Value, HandlerError>(json!({}))
    })
}

async fn serve_all(s: &Scenario, runs: &[RunId]) -> Vec<RunDetail> {
    let serving = s.engine.serve(Scope::All);
    let mut details = Vec::new();
    for &run in runs {
        let state = within("a limited run to end", s.engine.wait(run)).await.expect("wait");
        assert_eq!(state, RunState::Succeeded);
        details.push(s.detail(run).await);
    }
    serving.stop().await.expect("a clean stop");
    details
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_queued_runs_on_one_key_never_have_three_running() {
    let s = scenario(with_job).await;
    let workflow = s
        .publish_def(&json!({"name": "limited", "version": 1,
            "concurrency": [{"key": "$.customer", "max": 2, "strategy": "queue"}],
            "tasks": [{"key": "a", "task_type": "job"}, {"key": "b", "task_type": "job", "depends_on": ["a"]}]}))
        .await;
    let mut runs = Vec::new();
    for n in 0..20 {
        runs.push(
            s.engine
                .start(workflow, json!({"customer": "acme", "n": n}))
                .await
                .expect("start"),
        );
    }
    let waiting = s.task(runs[19], "a").await;
    assert_eq!(waiting.state, TaskRunState::Pending);
    assert_eq!(waiting.blocked_by.as_deref(), Some("concurrency:acme"));
    let details = serve_all(&s, &runs).await;
    let intervals: Vec<(i64, i64)> = details.iter().map(run_interval).collect();
    assert_eq!(most_at_once(&intervals), 2, "two at once, never three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_limit_holds_one_task_of_a_key_at_a_time_across_runs() {
    let going = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (g, m) = (going.clone(), most.clone());
    let s = scenario(move |b| {
        b.concurrency(4).handler_fn("charge", move |_ctx: TaskContext| {
            let (g, m) = (g.clone(), m.clone());
            async move {
                let now = g.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
                g.fetch_sub(1, Ordering::SeqCst);
                Ok::<Value, HandlerError>(json!({}))
            }
        })
    })
    .await;
    let workflow = s
        .publish_def(&json!({"name": "charges", "version": 1, "tasks": [
            {"key": "charge", "task_type": "charge", "concurrency": {"key": "$.account", "max": 1}}]}))
        .await;
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(s.engine.start(workflow, json!({"account": 42})).await.expect("start"));
    }
    let details = serve_all(&s, &runs).await;
    assert_eq!(most.load(Ordering::SeqCst), 1, "one charge of an account at a time");
    let intervals: Vec<(i64, i64)> = details
        .iter()
        .map(|d| {
            let at = |t: &str| {
                d.events
                    .iter()
                    .find(|e| e.task.as_deref() == Some("charge") && e.transition == t)
                    .map(|e| e.at.timestamp_micros())
                    .expect("the task's edge is in its history")
            };
            (at("claim"), at("succeed"))
        })
        .collect();
    assert_eq!(most_at_once(&intervals), 1);
}

/// A handler `hold` that runs until its run is cancelled, and `undo` that
/// counts rollbacks.
#[derive(Clone, Default)]
struct Holder {
    started: Arc<Notify>,
    undone: Counter,
}

impl Holder {
    fn register(&self, b: EmbeddedBuilder) -> EmbeddedBuilder {
        let (me, undo) = (self.clone(), self.undone.clone());
        // The lease stays long (300 s): a limit's cancel must stop the
        // older run's handler at once, not at its next heartbeat.
        b.concurrency(4)
            .handler_fn("hold", move |ctx: TaskContext| {
                let me = me.clone();
                async move {
                    if ctx.run_input["hold"] == json!(true) {
                        me.started.notify_one();
                        ctx.cancel.cancelled().await;
                        return Err(HandlerError::retryable("stopped on cancellation"));
                    }
                    Ok::<Value, HandlerError>(json!({}))
                }
            })
            .handler_fn("undo", move |_ctx: TaskContext| {
                let undo = undo.clone();
                async move {
                    undo.hit();
                    Ok::<Value, HandlerError>(json!({}))
                }
            })
    }
}

fn one_slot(strategy: &str) -> Value {
    json!({"name": "exclusive", "version": 1,
    "concurrency": [{"key": "$.site", "max": 1, "strategy": strategy}],
    "tasks": [
        {"key": "prepare", "task_type": "hold"},
        {"key": "deploy", "task_type": "hold", "depends_on": ["prepare"]},
        {"key": "unprepare", "task_type": "undo", "compensate_for": "prepare"}
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_newest_turns_the_newcomer_away_with_its_reason() {
    let holder = Holder::default();
    let s = scenario(|b| holder.register(b)).await;
    let workflow = s.publish_def(&one_slot("cancel_newest")).await;
    let serving = s.engine.serve(Scope::All);
    let first = s
        .engine
        .start(workflow, json!({"site": "eu", "hold": true}))
        .await
        .expect("start");
    within("the first run to hold its slot", holder.started.notified()).await;
    let second = s.engine.start(workflow, json!({"site": "eu"})).await.expect("start");
    let state = within("the newcomer to end", s.engine.wait(second))
        .await
        .expect("wait");
    assert_eq!(state, RunState::Cancelled);
    let report = s.report(second).await;
    assert_eq!(report.cancel_reason.as_deref(), Some("concurrency_limit"));
    assert!(report.tasks.iter().all(|t| t.started_at.is_none()), "nothing of it ran");
    assert_eq!(s.run_state(first).await, RunState::Running, "the holder is untouched");
    s.engine.cancel(first).await.expect("cancel");
    within("the holder to end", s.engine.wait(first)).await.expect("wait");
    serving.stop().await.expect("a clean stop");
    assert_eq!(holder.undone.get(), 0, "a user's cancel rolls nothing back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_progress_rolls_back_what_the_older_run_finished() {
    let holder = Holder::default();
    let s = scenario(|b| holder.register(b)).await;
    // `prepare` finishes, `deploy` holds: the cancel must undo `prepare`.
    let workflow = s
        .publish_def(&json!({"name": "exclusive", "version": 1,
        "concurrency": [{"key": "$.site", "max": 1, "strategy": "cancel_in_progress"}],
        "tasks": [
            {"key": "prepare", "task_type": "undo"},
            {"key": "deploy", "task_type": "hold", "depends_on": ["prepare"]},
            {"key": "unprepare", "task_type": "undo", "compensate_for": "prepare"}
        ]}))
        .await;
    let serving = s.engine.serve(Scope::All);
    let older = s
        .engine
        .start(workflow, json!({"site": "eu", "hold": true}))
        .await
        .expect("start");
    within("the older run to reach deploy", holder.started.notified()).await;
    let newer = s.engine.start(workflow, json!({"site": "eu"})).await.expect("start");
    let ended = within("the older run to end", s.engine.wait(older))
        .await
        .expect("wait");
    assert_eq!(ended, RunState::Cancelled, "{:#?}", s.detail(older).await.events);
    assert_eq!(
        within("the newer run to end", s.engine.wait(newer))
            .await
            .expect("wait"),
        RunState::Succeeded
    );
    serving.stop().await.expect("a clean stop");
    let (_, older_end) = run_interval(&s.detail(older).await);
    let (newer_start, _) = run_interval(&s.detail(newer).await);
    assert!(older_end <= newer_start, "the newer run waits for the older one's slot");
    let older = s.report(older).await;
    assert_eq!(older.cancel_reason.as_deref(), Some("concurrency_limit"));
    let undo: Vec<&str> = older.compensations.iter().map(|c| c.state.as_str()).collect();
    assert_eq!(undo, ["succeeded"], "prepare was rolled back");
    // prepare ran twice (once per run) and was undone once.
    assert_eq!(holder.undone.get(), 3);
}

/// A retried task passes its own gate again: while another run's task
/// holds the account's one slot, the reset task waits pending and says
/// why; the kept task does not run again; once the slot is let go the
/// retried run succeeds, and the two charges never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_task_waits_at_its_own_gate_again() {
    let holding = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let prepared = Counter::default();
    let (h, r, p) = (holding.clone(), release.clone(), prepared.clone());
    let s = scenario(move |b| {
        b.concurrency(4)
            .handler_fn("prep", move |_ctx: TaskContext| {
                let p = p.clone();
                async move {
                    p.hit();
                    Ok::<Value, HandlerError>(json!({}))
                }
            })
            .handler_fn("charge", move |ctx: TaskContext| {
                let (h, r) = (h.clone(), r.clone());
                async move {
                    if ctx.run_input["hold"] == json!(true) {
                        h.notify_one();
                        r.notified().await;
                    } else if ctx.attempt == 1 {
                        return Err(HandlerError::permanent("card declined"));
                    }
                    Ok::<Value, HandlerError>(json!({}))
                }
            })
    })
    .await;
    let workflow = s
        .publish_def(&json!({"name": "charges", "version": 1, "tasks": [
            {"key": "prep", "task_type": "prep"},
            {"key": "charge", "task_type": "charge", "depends_on": ["prep"],
             "concurrency": {"key": "$.account", "max": 1}}]}))
        .await;
    let serving = s.engine.serve(Scope::All);
    let declined = s.engine.start(workflow, json!({"account": 7})).await.expect("start");
    let state = within("the first charge to fail", s.engine.wait(declined))
        .await
        .expect("wait");
    assert_eq!(state, RunState::Failed);
    let holder = s
        .engine
        .start(workflow, json!({"account": 7, "hold": true}))
        .await
        .expect("start");
    within("the other run to hold the slot", holding.notified()).await;

    let retry = s.engine.retry(declined, &[], false).await.expect("retry");
    let set: Vec<(&str, TaskRunState, u32)> = retry
        .resets
        .iter()
        .map(|r| (r.key.as_str(), r.to, r.pending_deps))
        .collect();
    assert_eq!(set, [("charge", TaskRunState::Pending, 1)], "held at its gate");
    let waiting = s.task(declined, "charge").await;
    assert_eq!(
        (waiting.state, waiting.blocked_by.as_deref()),
        (TaskRunState::Pending, Some("concurrency:7"))
    );
    release.notify_one();
    let state = within("the retried run to end", s.engine.wait(declined))
        .await
        .expect("wait");
    assert_eq!(state, RunState::Succeeded);
    within("the holder to end", s.engine.wait(holder)).await.expect("wait");
    serving.stop().await.expect("a clean stop");
    assert_eq!(prepared.get(), 2, "the kept prep did not run again");
    let last = |d: &RunDetail, edge: &str| {
        d.events
            .iter()
            .filter(|e| e.task.as_deref() == Some("charge") && e.transition == edge)
            .map(|e| e.at)
            .next_back()
            .expect("the charge's edge is in its history")
    };
    let (held, retried) = (s.detail(holder).await, s.detail(declined).await);
    assert!(
        last(&held, "succeed") <= last(&retried, "claim"),
        "the retried charge waited for the slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_input_does_not_give_refuses_the_start() {
    let s = scenario(with_job).await;
    let workflow = s
        .publish_def(&json!({"name": "keyed", "version": 1,
            "concurrency": [{"key": "$.site", "max": 1}], "tasks": [{"key": "a", "task_type": "job"}]}))
        .await;
    let e = s
        .engine
        .start(workflow, json!({"region": "eu"}))
        .await
        .expect_err("refused");
    assert!(matches!(e, Error::ConcurrencyKeyUnresolved(_)), "{e}");
    assert!(e.to_string().contains("$.concurrency[0]"), "{e}");
}
