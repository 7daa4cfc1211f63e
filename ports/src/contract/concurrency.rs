//! Contract cases: concurrency limits (docs/design/concurrency.md) — gates
//! hold back what they guard and say why, a pool never has more holders
//! than its size however passes race, a settled run lets go, and a
//! retried run passes its gates again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use flowforge_domain::concurrency::{self, Gate};
use flowforge_domain::retry::{hold_at_gates, reset_set};
use flowforge_domain::{RunState, RunTransition};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::store::{GateCheck, RunPass, RunStore, Scope, StartOptions};

use super::*;

/// One root `t` behind a run-level limit on `$.k` of size `max`, and a
/// second task `u` after it behind a task-level limit of size 1.
fn limited(max: u32) -> Value {
    json!({"name": "limited", "version": 1,
    "concurrency": [{"key": "$.k", "max": max}],
    "tasks": [
        {"key": "t", "task_type": "noop"},
        {"key": "u", "task_type": "noop", "depends_on": ["t"], "concurrency": {"key": "$.k", "max": 1}}
    ]})
}

/// Starts a run of `published` with its gates resolved against `input`,
/// as the application does.
async fn start_gated<S: Store>(s: &S, published: &Published, input: Value) -> RunId {
    let gates: Vec<Gate> = concurrency::resolve(&published.definition, &input).expect("the key resolves");
    s.start_run_with(
        published.id,
        input,
        &StartOptions {
            gates,
            ..StartOptions::default()
        },
    )
    .await
    .expect("start")
    .id
}

/// One pass over `run` that tries its own gates, lowering its root on
/// success as the scheduler does, and commits.
async fn try_run_gates<S: Store>(s: &S, run: RunId) -> GateCheck {
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let check = p.pass_gates(None).await.expect("pass_gates");
    if check == GateCheck::Passed {
        p.satisfy_dependencies(&[("t".to_owned(), 1)]).await.expect("satisfy");
    }
    p.commit().await.expect("commit");
    check
}

/// A run gate keeps the run's first task pending and says so, and flags
/// the run for a pass; once passed the task is ready. A second run of the
/// same key finds the pool full; a run of another key does not. When the
/// holder settles its slot is let go and offered to the oldest waiter
/// only, which passes.
pub async fn gates_hold_back_what_they_guard_until_a_slot_is_free<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, limited(1)).await;
    let first = start_gated(&s, &p, json!({"k": "acme"})).await;
    let t = view(&s, first, "t").await;
    assert_eq!(t.state, TaskRunState::Pending);
    assert_eq!(t.blocked_by.as_deref(), Some("concurrency:acme"));
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .contains(&first),
        "a gated run is flagged for its first pass"
    );
    assert_eq!(try_run_gates(&s, first).await, GateCheck::Passed);
    let t = view(&s, first, "t").await;
    assert_eq!((t.state, t.blocked_by), (TaskRunState::Ready, None));

    let second = start_gated(&s, &p, json!({"k": "acme"})).await;
    let other = start_gated(&s, &p, json!({"k": "globex"})).await;
    let GateCheck::Full(scope) = try_run_gates(&s, second).await else {
        panic!("the pool of 'acme' has one slot, and it is held");
    };
    assert!(scope.contains("acme"), "{scope}");
    assert_eq!(try_run_gates(&s, other).await, GateCheck::Passed);
    assert_eq!(
        view(&s, second, "t").await.blocked_by.as_deref(),
        Some("concurrency:acme")
    );
    assert!(
        !s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .contains(&second),
        "a full pool gives its waiters no work"
    );

    let third = start_gated(&s, &p, json!({"k": "acme"})).await;
    assert_eq!(try_run_gates(&s, third).await, GateCheck::Full(scope.clone()));

    let mut settle = pass(&s, first).await;
    settle.take_flagged().await.expect("take_flagged");
    assert_eq!(settle.release_slots(true).await.expect("release"), 1);
    settle.commit().await.expect("commit");
    let with_work = s.runs_with_work(Scope::All, 10).await.expect("runs_with_work");
    assert!(
        with_work.contains(&second),
        "a slot let go gives its pool's oldest waiter work"
    );
    assert!(!with_work.contains(&third), "one slot is offered to one waiter");
    assert_eq!(try_run_gates(&s, second).await, GateCheck::Passed);
}

/// A task gate counts only once the task's dependencies are done: until
/// then the task waits on them, not on the gate, and no wait is due.
pub async fn a_task_gate_is_due_once_only_it_holds_the_task_back<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, limited(5)).await;
    let run = start_gated(&s, &p, json!({"k": 7})).await;
    assert_eq!(try_run_gates(&s, run).await, GateCheck::Passed);
    let mut p1 = pass(&s, run).await;
    p1.take_flagged().await.expect("take_flagged");
    assert_eq!(p1.waits().await.expect("waits"), [], "u still waits on t");
    p1.commit().await.expect("commit");
    assert_eq!(view(&s, run, "u").await.blocked_by, None);

    let mut p2 = pass(&s, run).await;
    p2.satisfy_dependencies(&[("u".to_owned(), 1)]).await.expect("t done");
    let waits = p2.waits().await.expect("waits");
    assert_eq!(waits.len(), 1);
    assert_eq!(
        (waits[0].task.as_deref(), waits[0].label.as_str(), waits[0].max),
        (Some("u"), "7", 1)
    );
    p2.commit().await.expect("commit");
    assert_eq!(view(&s, run, "u").await.blocked_by.as_deref(), Some("concurrency:7"));
}

/// However many passes race for one pool, at most `max` pass its gate, and
/// exactly that many when there are more runs than slots: the pool's
/// primary key decides, and a lost slot is looked for again while there
/// is room. Sizes and run counts are drawn at random.
pub async fn racing_passes_never_hold_more_slots_than_the_pool_has<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]));
    let cases = (1u32..=3, 2usize..=6);
    for case in 0..6 {
        let (max, runs) = cases.new_tree(&mut runner).expect("a case").current();
        let p = publish(&s, {
            let mut d = limited(max);
            d["version"] = json!(case + 1);
            d
        })
        .await;
        let key = json!({"k": format!("case-{case}")});
        let mut ids = Vec::new();
        for _ in 0..runs {
            ids.push(start_gated(&s, &p, key.clone()).await);
        }
        let barrier = Arc::new(Barrier::new(runs));
        let racers: Vec<_> = ids
            .iter()
            .map(|&run| {
                let (s, barrier) = (s.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    try_run_gates(&s, run).await == GateCheck::Passed
                })
            })
            .collect();
        let mut passed = 0;
        for racer in racers {
            passed += usize::from(racer.await.expect("the racer ends"));
        }
        let max = max as usize;
        assert_eq!(passed, max.min(runs), "max {max}, {runs} runs");
        let mut blocked = 0;
        for run in ids {
            blocked += usize::from(view(&s, run, "t").await.blocked_by.is_some());
        }
        assert_eq!(blocked, runs - passed, "every run that did not pass says why");
    }
}

/// The strategies' two writes: `cancel_newest` records the run's own
/// cancel request with reason `concurrency_limit`; `cancel_in_progress`
/// requests the cancel of the pool's oldest holder not already being
/// cancelled, with that reason, flags it for a pass, and finds nobody
/// once every holder is being cancelled. A pass over a run so cancelled
/// knows it (its rollback then runs).
pub async fn the_strategies_cancel_the_newest_or_the_oldest_holder_with_their_reason<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, limited(2)).await;
    let key = json!({"k": "site"});
    let older = start_gated(&s, &p, key.clone()).await;
    let newer = start_gated(&s, &p, key.clone()).await;
    assert_eq!(try_run_gates(&s, older).await, GateCheck::Passed);
    assert_eq!(try_run_gates(&s, newer).await, GateCheck::Passed);

    let turned_away = start_gated(&s, &p, key.clone()).await;
    let mut q = pass(&s, turned_away).await;
    q.take_flagged().await.expect("take_flagged");
    let GateCheck::Full(scope) = q.pass_gates(None).await.expect("pass_gates") else {
        panic!("two holders fill a pool of two");
    };
    q.cancel_for_limit().await.expect("cancel_for_limit");
    assert!(q.run().cancel_requested && q.run().limit_cancelled);
    q.commit().await.expect("commit");
    let summary = s.run_summary(turned_away).await.expect("summary").expect("the run");
    assert!(summary.cancel_requested);
    assert_eq!(summary.cancel_reason.as_deref(), Some("concurrency_limit"));

    let mut victims = Vec::new();
    for _ in 0..3 {
        let waiter = start_gated(&s, &p, key.clone()).await;
        let mut w = pass(&s, waiter).await;
        w.take_flagged().await.expect("take_flagged");
        victims.push(w.cancel_oldest_holder(&scope).await.expect("cancel_oldest_holder"));
        w.commit().await.expect("commit");
    }
    assert_eq!(victims, [Some(older), Some(newer), None], "oldest first, each once");
    let summary = s.run_summary(older).await.expect("summary").expect("the run");
    assert_eq!(summary.cancel_reason.as_deref(), Some("concurrency_limit"));
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .contains(&older),
        "a victim is flagged for its pass"
    );
    let victim = pass(&s, older).await;
    assert!(victim.run().cancel_requested && victim.run().limit_cancelled);
    victim.commit().await.expect("commit");
}

/// A retried run passes its gates again (docs/design/concurrency.md#retries).
/// A run cancelled by its limit (the writes `cancel_newest` makes) settles
/// cancelled with its reason; `resume_run` with its gates (counted in the
/// resets by `hold_at_gates`) clears the reason, makes the gates waits
/// again — already `tried`, which is what keeps the scheduler's strategy
/// from acting on the retry a second time — and flags the run. While the holder keeps the pool full the
/// reset task stays pending and says why; once the holder lets go the run
/// passes and its task is dispatched at its new token.
pub async fn a_retried_run_waits_at_its_gates_again<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, limited(1)).await;
    let key = json!({"k": "acme"});
    let holder = start_gated(&s, &p, key.clone()).await;
    assert_eq!(try_run_gates(&s, holder).await, GateCheck::Passed);

    let retried = start_gated(&s, &p, key.clone()).await;
    let mut q = pass(&s, retried).await;
    q.take_flagged().await.expect("take_flagged");
    assert!(matches!(
        q.pass_gates(None).await.expect("pass_gates"),
        GateCheck::Full(_)
    ));
    q.mark_gates_tried().await.expect("mark_gates_tried");
    q.cancel_for_limit().await.expect("cancel_for_limit");
    q.cancel_waiting().await.expect("cancel_waiting");
    q.release_slots(true).await.expect("settle");
    assert!(
        q.transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel")
    );
    q.commit().await.expect("commit");
    let summary = s.run_summary(retried).await.expect("summary").expect("the run");
    assert_eq!(
        (summary.state, summary.cancel_reason.as_deref()),
        (RunState::Cancelled, Some("concurrency_limit"))
    );

    let detail = s.get_run(retried).await.expect("get_run").expect("the run");
    let states: BTreeMap<&str, TaskRunState> = detail.tasks.iter().map(|t| (t.key.as_str(), t.state)).collect();
    let mut resets = reset_set(
        p.definition.graph(),
        |_| flowforge_domain::condition::Trigger::AllSucceeded,
        &states,
        &BTreeSet::new(),
        &[],
    )
    .expect("a cancelled run is retried");
    let gates = hold_at_gates(
        &mut resets,
        concurrency::resolve(&p.definition, &key).expect("the key resolves"),
    );
    let token = view(&s, retried, "t").await.token;
    assert_eq!(
        s.resume_run(retried, RunState::Cancelled, 1, &resets, &gates)
            .await
            .expect("resume_run"),
        Some(2)
    );
    let summary = s.run_summary(retried).await.expect("summary").expect("the run");
    assert_eq!((summary.state, summary.cancel_reason), (RunState::Running, None));
    let t = view(&s, retried, "t").await;
    assert_eq!(
        (t.state, t.blocked_by.as_deref()),
        (TaskRunState::Pending, Some("concurrency:acme"))
    );
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .contains(&retried),
        "a retried gated run is flagged for the pass that admits it"
    );
    let mut w = pass(&s, retried).await;
    w.take_flagged().await.expect("take_flagged");
    let waits = w.waits().await.expect("waits");
    assert!(!waits.is_empty() && waits.iter().all(|w| w.tried), "{waits:?}");
    w.commit().await.expect("commit");
    assert!(
        matches!(try_run_gates(&s, retried).await, GateCheck::Full(_)),
        "the holder keeps its slot"
    );

    let mut settle = pass(&s, holder).await;
    settle.take_flagged().await.expect("take_flagged");
    assert_eq!(settle.release_slots(true).await.expect("release"), 1);
    settle.commit().await.expect("commit");
    assert_eq!(try_run_gates(&s, retried).await, GateCheck::Passed);
    let t = view(&s, retried, "t").await;
    assert_eq!((t.state, t.blocked_by), (TaskRunState::Ready, None));
    assert!(t.token > token, "the token only grows");
    assert!(
        dispatches_of(&s, retried, "t")
            .await
            .iter()
            .any(|d| d.fencing_token == t.token),
        "the admitted task is dispatched at its new token"
    );
}
