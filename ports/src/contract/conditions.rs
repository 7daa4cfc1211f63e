//! Contract cases: conditional tasks (docs/design/conditions.md): the hold
//! a start puts on them, the run flagged for a conditional task without
//! dependencies, and the pass's skip, condition failure and reads.

use flowforge_domain::condition::Trigger;
use flowforge_domain::{SkipReason, TaskRunState, TaskTransition};
use serde_json::json;

use crate::store::{DefinitionStore, RunPass, RunStore, Scope};

use super::*;

/// `r` (a root with a `when`), `a` → `b` (`when`), `a`, `b` → `j`
/// (`none_failed`), `b` → `c` (plain).
fn branching() -> Value {
    json!({"name": "branching", "version": 1, "tasks": [
        {"key": "r", "task_type": "noop", "when": "run_input.n == 1"},
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "noop", "depends_on": ["a"], "when": "inputs.a.ok"},
        {"key": "j", "task_type": "noop", "depends_on": ["a", "b"], "trigger": "none_failed"},
        {"key": "c", "task_type": "noop", "depends_on": ["b"]}
    ]})
}

/// A conditional task waits on one hold beyond its dependencies, a run
/// with one that has no dependencies is flagged for its first pass, and
/// `when` and `trigger` come back from the store as written.
pub async fn a_conditional_task_waits_on_a_hold_and_comes_back_as_written<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let published = publish(&s, branching()).await;
    let loaded = s.load_definition(published.id).await.expect("load");
    assert_eq!(loaded.fingerprint, published.fingerprint);
    let b = loaded.definition.task("b").expect("b");
    assert_eq!(b.when(), Some("inputs.a.ok"));
    assert_eq!(loaded.definition.task("j").expect("j").trigger(), Trigger::NoneFailed);
    let run = s.start_run(published.id, json!({"n": 1})).await.expect("start");
    assert_eq!(
        s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"),
        [run],
        "the root's condition is decided by the run's first pass"
    );
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let counts = p
        .pending_counts(&["r".into(), "a".into(), "b".into(), "j".into(), "c".into()])
        .await
        .expect("pending_counts");
    assert_eq!(
        counts,
        [("r".into(), 1), ("b".into(), 2), ("j".into(), 3), ("c".into(), 1)],
        "one hold on each conditional task; `a` is ready"
    );
    p.commit().await.expect("commit");
    assert_eq!(view(&s, run, "a").await.state, TaskRunState::Ready);
}

/// `skip_pending` and `fail_pending` move only pending rows, record their
/// edge and flag each row, so the same pass's next `take_flagged` returns
/// it; `dependency_outcomes` reads the run input, states and outputs.
pub async fn skips_and_condition_failures_flag_what_they_move<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, branching()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"ok": false}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let skipped = p
        .skip_pending(&["b".into(), "a".into()], SkipReason::ConditionFalse)
        .await
        .expect("skip_pending");
    assert_eq!(skipped, ["b"], "only a pending row is skipped");
    assert!(
        p.fail_pending(
            "r",
            TaskTransition::FailCondition,
            "`when` could not be evaluated: boom"
        )
        .await
        .expect("fail_pending")
    );
    assert!(
        !p.fail_pending("a", TaskTransition::FailCondition, "no")
            .await
            .expect("fail_pending"),
        "a succeeded row stays"
    );
    let flagged = p.take_flagged().await.expect("take_flagged");
    let states: Vec<(&str, TaskRunState)> = flagged.iter().map(|t| (t.key.as_str(), t.state)).collect();
    assert_eq!(states, [("r", TaskRunState::Failed), ("b", TaskRunState::Skipped)]);
    let outcomes = p
        .dependency_outcomes(&["a".into(), "b".into()])
        .await
        .expect("dependency_outcomes");
    assert_eq!(outcomes.run_input, json!({"n": 1}));
    assert_eq!(
        outcomes.tasks,
        [
            ("a".into(), TaskRunState::Succeeded, Some(json!({"ok": false}))),
            ("b".into(), TaskRunState::Skipped, None)
        ]
    );
    let tally = p.tally().await.expect("tally");
    assert_eq!((tally.skipped, tally.failed, tally.succeeded), (1, 1, 1));
    p.commit().await.expect("commit");
    let b = view(&s, run, "b").await;
    assert_eq!(b.skip_reason, Some(SkipReason::ConditionFalse));
    assert!(b.finished_at.is_some());
    assert_eq!(b.output, None);
    let r = view(&s, run, "r").await;
    assert_eq!(r.error.as_deref(), Some("`when` could not be evaluated: boom"));
    assert_eq!(transitions(&events_of(&s, run, "b").await), ["skip"]);
    let r_events = events_of(&s, run, "r").await;
    assert_eq!(transitions(&r_events), ["fail_condition"]);
    assert_eq!(
        r_events[0].error.as_deref(),
        Some("`when` could not be evaluated: boom")
    );
}
