//! Contract cases: an operator's retry of a finished run — the `resume`
//! and `reset` edges in one transaction, generations in the history,
//! attempts counted per generation, and one winner among concurrent retries
//! (docs/design/retry.md).

use std::sync::Arc;

use flowforge_domain::retry::Reset;
use flowforge_domain::{CancelReason, RunState, RunTransition, TaskRunState};
use tokio::sync::Barrier;

use crate::store::{RunPass, RunStore};

use super::*;

/// A run of `single` (`max_attempts` as given) whose one task failed for
/// good on its first attempt, settled `failed`.
async fn failed_run<S: Store>(s: &S, attempts: u32) -> RunId {
    let run = start(s, single("retried", attempts)).await;
    let c = claim(s, run, "t", "w1", LONG).await;
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    p.commit().await.expect("commit");
    let failed = failed_for_good("boom");
    finish(s, &c, "w1", failed).await;
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(p.transition_run(RunTransition::Fail).await.expect("fail"));
    p.commit().await.expect("commit");
    run
}

fn reset_t(from: TaskRunState) -> Vec<Reset> {
    vec![Reset {
        key: "t".into(),
        from,
        to: TaskRunState::Ready,
        pending_deps: 0,
    }]
}

/// `resume_run` moves the run back to running at generation 2 and resets
/// the task: attempt + 1 with the earlier attempts as its base, token + 1,
/// error and end cleared, a dispatch at the new token; the `resume` and
/// `reset` events carry generation 2, everything before them generation 1.
pub async fn a_resumed_run_opens_its_next_generation<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = failed_run(&s, 1).await;
    let before = view(&s, run, "t").await;
    assert_eq!(
        s.resume_run(run, RunState::Failed, 1, &reset_t(TaskRunState::Failed), &[])
            .await
            .expect("resume_run"),
        Some(2)
    );
    let detail = s.get_run(run).await.expect("get_run").expect("the run");
    assert_eq!(
        (
            detail.summary.state,
            detail.summary.generation,
            detail.summary.finished_at
        ),
        (RunState::Running, 2, None)
    );
    let t = view(&s, run, "t").await;
    assert_eq!((t.state, t.attempt, t.generation), (TaskRunState::Ready, 2, 2));
    assert_eq!(t.token, before.token + 1, "the token only grows");
    assert!(t.error.is_none() && t.finished_at.is_none() && t.cancel_reason.is_none());

    let history = events(&s, run).await;
    let (earlier, opened) = history.split_at(history.len() - 2);
    let opened: Vec<_> = opened
        .iter()
        .map(|e| {
            (
                e.task.as_deref(),
                e.transition.as_str(),
                e.from.as_deref(),
                e.to.as_deref(),
                e.generation,
            )
        })
        .collect();
    assert_eq!(
        opened,
        [
            (None, "resume", Some("failed"), Some("running"), 2),
            (Some("t"), "reset", Some("failed"), Some("ready"), 2)
        ]
    );
    assert!(earlier.iter().all(|e| e.generation == 1), "{earlier:?}");
    assert!(
        dispatches_of(&s, run, "t")
            .await
            .iter()
            .any(|d| d.fencing_token == t.token),
        "a ready reset task is dispatched at its new token"
    );

    let c = claim(&s, run, "t", "w2", LONG).await;
    assert_eq!((c.attempt, c.attempt_base, c.generation_attempt()), (2, 1, 1));
    let claimed = events_of(&s, run, "t").await.pop().expect("the claim event");
    assert_eq!((claimed.transition.as_str(), claimed.generation), ("claim", 2));
}

/// A late write of generation 1's attempt is still fenced off after the
/// reset, and the reaper counts attempts within the generation: with
/// `max_attempts: 2`, the reset task's first attempt (attempt 2 in all) is
/// reaped back to ready, not failed for good as two attempts in all would.
pub async fn a_reset_task_is_fenced_and_counts_attempts_per_generation<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = failed_run(&s, 2).await;
    let stale = s.get_run(run).await.expect("get_run").expect("the run").tasks[0].token;
    s.resume_run(run, RunState::Failed, 1, &reset_t(TaskRunState::Failed), &[])
        .await
        .expect("resume_run")
        .expect("the retry applies");
    let t = view(&s, run, "t").await;
    let late = s
        .finish_task_run(t.id, stale, &worker("w1"), succeeded(serde_json::json!({"late": true})))
        .await
        .expect("finish_task_run");
    assert_eq!(late, crate::store::FinishResult::Stale);

    claim(&s, run, "t", "w2", Duration::from_secs(5)).await;
    clock.advance(Duration::from_secs(6));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLease);
    let t = view(&s, run, "t").await;
    assert_eq!((t.state, t.attempt, t.generation), (TaskRunState::Ready, 3, 2));
}

/// A plan read before the run changed applies nothing: a run no longer in
/// the planned state or generation, or a task no longer in its planned
/// state, leaves every row as it was.
pub async fn a_stale_retry_plan_applies_nothing<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = failed_run(&s, 1).await;
    let before = s.get_run(run).await.expect("get_run").expect("the run");
    let wrong_task = s
        .resume_run(run, RunState::Failed, 1, &reset_t(TaskRunState::Cancelled), &[])
        .await
        .expect("resume_run");
    let wrong_state = s
        .resume_run(run, RunState::Cancelled, 1, &reset_t(TaskRunState::Failed), &[])
        .await
        .expect("resume_run");
    let wrong_generation = s
        .resume_run(run, RunState::Failed, 2, &reset_t(TaskRunState::Failed), &[])
        .await
        .expect("resume_run");
    assert_eq!((wrong_task, wrong_state, wrong_generation), (None, None, None));
    assert_eq!(s.get_run(run).await.expect("get_run").expect("the run"), before);
}

/// Concurrent retries of one run: exactly one opens generation 2.
pub async fn concurrent_retries_open_one_generation<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = failed_run(&s, 1).await;
    const CALLERS: usize = 4;
    let barrier = Arc::new(Barrier::new(CALLERS));
    let mut calls = Vec::new();
    for _ in 0..CALLERS {
        let (s, barrier) = (s.clone(), barrier.clone());
        calls.push(tokio::spawn(async move {
            barrier.wait().await;
            s.resume_run(run, RunState::Failed, 1, &reset_t(TaskRunState::Failed), &[])
                .await
        }));
    }
    let mut won = Vec::new();
    for call in calls {
        if let Some(generation) = call.await.expect("the caller ran").expect("resume_run") {
            won.push(generation);
        }
    }
    assert_eq!(won, [2], "exactly one retry wins");
    let resumes = events(&s, run)
        .await
        .iter()
        .filter(|e| e.transition == "resume")
        .count();
    assert_eq!(resumes, 1);
}

/// A compensated run retried from its tasks (docs/design/retry.md#compensated-runs):
/// the later generation's rollback sees only its own compensator rows. A
/// compensator first needed now is created in the current generation; one
/// an earlier rollback finished takes `reset` back to ready — attempt + 1
/// over its earlier attempts, token + 1 (the earlier attempt's late write
/// is fenced off), output cleared, its event and dispatch — once.
pub async fn a_later_rollback_reruns_the_compensators_of_its_generation<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(
        &s,
        serde_json::json!({"name": "saga", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop"},
            {"key": "c", "task_type": "noop", "depends_on": ["a", "b"]},
            {"key": "undo_a", "task_type": "undo", "compensate_for": "a"},
            {"key": "undo_b", "task_type": "undo", "compensate_for": "b"}
        ]}),
    )
    .await;
    // Generation 1: a succeeds, b fails, c is cancelled, undo_a runs.
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(serde_json::json!({"gen": 1}))).await;
    let b = claim(&s, run, "b", "w", LONG).await;
    let failed = failed_for_good("boom");
    finish(&s, &b, "w", failed).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.cancel_pending(&["c".into()], CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    p.commit().await.expect("commit");
    let undo = claim(&s, run, "undo_a", "w", LONG).await;
    finish(&s, &undo, "w", succeeded(serde_json::json!({"undone": 1}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(p.transition_run(RunTransition::Fail).await.expect("fail"));
    p.commit().await.expect("commit");

    // The retry: a (compensated) and b again, c after them.
    let resets = [
        ("a", TaskRunState::Succeeded, TaskRunState::Ready, 0),
        ("b", TaskRunState::Failed, TaskRunState::Ready, 0),
        ("c", TaskRunState::Cancelled, TaskRunState::Pending, 2),
    ]
    .map(|(key, from, to, pending_deps)| Reset {
        key: key.into(),
        from,
        to,
        pending_deps,
    });
    assert_eq!(
        s.resume_run(run, RunState::Failed, 1, &resets, &[])
            .await
            .expect("resume_run"),
        Some(2)
    );
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(
        p.compensator_states().await.expect("states").is_empty(),
        "generation 1's rollback is not generation 2's"
    );
    p.commit().await.expect("commit");

    // Generation 2: a and b succeed, and its rollback undoes both.
    for key in ["a", "b"] {
        let c = claim(&s, run, key, "w", LONG).await;
        finish(&s, &c, "w", succeeded(serde_json::json!({"gen": 2}))).await;
    }
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(p.create_compensator("undo_b", "b").await.expect("create undo_b"));
    assert!(p.create_compensator("undo_a", "a").await.expect("re-arm undo_a"));
    assert!(!p.create_compensator("undo_a", "a").await.expect("again"), "once");
    assert_eq!(
        p.compensator_states().await.expect("states"),
        [
            ("undo_a".to_owned(), TaskRunState::Ready),
            ("undo_b".to_owned(), TaskRunState::Ready)
        ]
    );
    p.commit().await.expect("commit");

    let (undo_a, undo_b) = (view(&s, run, "undo_a").await, view(&s, run, "undo_b").await);
    assert_eq!(
        (undo_b.state, undo_b.attempt, undo_b.generation),
        (TaskRunState::Ready, 1, 2)
    );
    assert_eq!(
        (undo_a.state, undo_a.attempt, undo_a.generation, undo_a.output.as_ref()),
        (TaskRunState::Ready, 2, 2, None)
    );
    assert_eq!(undo_a.token, undo.token + 1, "the token only grows");
    let last = events_of(&s, run, "undo_a").await.pop().expect("the reset event");
    assert_eq!(
        (
            last.transition.as_str(),
            last.from.as_deref(),
            last.to.as_deref(),
            last.generation
        ),
        ("reset", Some("succeeded"), Some("ready"), 2)
    );
    assert!(
        dispatches_of(&s, run, "undo_a")
            .await
            .iter()
            .any(|d| d.fencing_token == undo_a.token),
        "the re-armed compensator is dispatched at its new token"
    );
    let late = s
        .finish_task_run(
            undo.task_run_id,
            undo.token,
            &worker("w"),
            succeeded(serde_json::json!({})),
        )
        .await
        .expect("finish_task_run");
    assert_eq!(late, crate::store::FinishResult::Stale);
    let again = claim(&s, run, "undo_a", "w2", LONG).await;
    assert_eq!((again.attempt, again.generation_attempt()), (2, 1));
}
