//! Contract cases: a success handing its dependents on in its own
//! transaction (docs/design/scheduler.md#handoff).

use std::time::Duration;

use flowforge_domain::plan::Handoff;
use flowforge_domain::{CancelReason, RunTransition, TaskRunState};
use serde_json::json;

use crate::store::{
    FinishCall, FinishResult, Finished, Handover, NextClaim, OutboxStore, RunPass, RunStore, Scope, TaskOutcome,
};

use super::*;

/// Names `keys` as a success's handoff.
fn naming(keys: &[&str], whole: bool) -> Handoff {
    Handoff {
        dependents: keys.iter().map(|k| (*k).to_owned()).collect(),
        joins: Vec::new(),
        whole,
    }
}

async fn hand_off<S: Store>(s: &S, c: &Claim, by: &str, outcome: TaskOutcome, handoff: &Handoff) -> FinishResult {
    s.finish_and_hand_off(c.task_run_id, c.token, &worker(by), outcome, handoff, Handover::Sweep)
        .await
        .expect("finish_and_hand_off")
        .result
}

/// Claims `a` of a fresh chain run and starts the run, as the pass after a
/// first claim does; no flag is left.
async fn running_chain<S: Store>(s: &S) -> (RunId, Claim) {
    let run = start(s, chain()).await;
    let c = claim(s, run, "a", "w", LONG).await;
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(RunTransition::Start).await.expect("start");
    p.commit().await.expect("commit");
    (run, c)
}

/// Claims `a` and `b` of a fresh diamond run, and takes the first
/// claims' flags, so that only what follows is flagged.
async fn claimed_diamond<S: Store>(s: &S) -> (RunId, Claim, Claim) {
    let run = start(s, diamond()).await;
    let a = claim(s, run, "a", "w", LONG).await;
    let b = claim(s, run, "b", "w", LONG).await;
    drain_flags(s, run).await;
    (run, a, b)
}

/// Every event of the run but its time, and its dispatches but their ids
/// and times.
async fn written<S: Store>(s: &S, run: RunId) -> (Vec<String>, Vec<String>) {
    let events = events(s, run)
        .await
        .into_iter()
        .map(|e| {
            format!(
                "{} {:?} {} {:?}→{:?} attempt {:?} token {:?} by {:?} error {:?}",
                e.seq, e.task, e.transition, e.from, e.to, e.attempt, e.token, e.worker, e.error
            )
        })
        .collect();
    let dispatches = unpublished(s, Scope::Run(run))
        .await
        .into_iter()
        .map(|d| {
            format!(
                "{} {} token {} {:?}",
                d.task_key, d.task_type, d.fencing_token, d.priority
            )
        })
        .collect();
    (events, dispatches)
}

/// The pass that takes the success's flag lowers only pending rows: the
/// handed-on `key` keeps its one dispatch.
async fn the_pass_counts_it_no_more<S: Store>(s: &S, run: RunId, key: &str) {
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(
        p.satisfy_dependencies(&[(key.to_owned(), 1)])
            .await
            .expect("satisfy")
            .is_empty()
    );
    p.commit().await.expect("commit");
    assert_eq!(dispatches_of(s, run, key).await.len(), 1, "one dispatch per readiness");
}

/// A success makes the dependent it alone held back ready with the same
/// rows as the pass's promotion — its event after the success's, its
/// outbox row — wakes the publisher, and, handed on whole, leaves no
/// flag for a pass.
pub async fn a_success_hands_on_what_it_alone_held_back<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (handed, c) = running_chain(&s).await;
    let notifier = s.notifier().await.expect("notifier");
    assert_eq!(
        hand_off(&s, &c, "w", succeeded(json!({"n": 1})), &naming(&["b"], true)).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    assert!(woke(&notifier, Topic::Publisher).await, "the publisher is woken");
    assert_eq!(view(&s, handed, "a").await.output, Some(json!({"n": 1})));
    assert_eq!(view(&s, handed, "b").await.state, TaskRunState::Ready);
    assert_eq!(view(&s, handed, "c").await.state, TaskRunState::Pending);
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty(),
        "a whole handoff leaves nothing for a pass"
    );

    // The same hop through the pass writes the same rows.
    let (passed, c) = running_chain(&s).await;
    finish(&s, &c, "w", succeeded(json!({"n": 1}))).await;
    let mut p = pass(&s, passed).await;
    assert_eq!(p.take_flagged().await.expect("take_flagged").len(), 1);
    assert_eq!(
        p.satisfy_dependencies(&[("b".to_owned(), 1)]).await.expect("satisfy"),
        ["b"]
    );
    p.commit().await.expect("commit");
    let (events, dispatches) = written(&s, handed).await;
    assert_eq!((events.clone(), dispatches.clone()), written(&s, passed).await);
    assert!(
        events.last().is_some_and(|e| e.contains("dependencies_satisfied")),
        "{events:?}"
    );
    assert_eq!(dispatches.len(), 2, "a's and b's dispatches: {dispatches:?}");

    // A flag the first claim set (the run starts) stays through a whole
    // handoff.
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    hand_off(&s, &c, "w", succeeded(json!({})), &naming(&["b"], true)).await;
    let mut p = pass(&s, run).await;
    assert_eq!(p.take_flagged().await.expect("take_flagged").len(), 1);
    p.commit().await.expect("commit");

    // Handed on but not whole: the success is flagged, and the pass,
    // which lowers only pending rows, leaves b alone.
    let (run, c) = running_chain(&s).await;
    hand_off(&s, &c, "w", succeeded(json!({})), &naming(&["b"], false)).await;
    assert_eq!(view(&s, run, "b").await.state, TaskRunState::Ready);
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .contains(&run)
    );
    the_pass_counts_it_no_more(&s, run, "b").await;
}

/// Only a recorded success hands on: a stale finish, a duplicate of one
/// already stored, a failure and a cancel promote nothing.
pub async fn a_stale_or_failed_finish_hands_on_nothing<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let handoff = naming(&["b"], true);
    let (run, c) = running_chain(&s).await;
    clock.advance(LONG + Duration::from_secs(1));
    assert_eq!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").len(), 1);
    assert_eq!(
        hand_off(&s, &c, "w", succeeded(json!({})), &handoff).await,
        FinishResult::Stale
    );
    assert_eq!(view(&s, run, "b").await.state, TaskRunState::Pending);
    assert!(dispatches_of(&s, run, "b").await.is_empty());
    assert_eq!(
        events_of(&s, run, "a").await.pop().map(|e| e.transition),
        Some("stale_write_rejected".to_owned()),
        "the stale finish is audited"
    );

    // A duplicate of a stored success is stale too and moves nothing more.
    let (run, c) = running_chain(&s).await;
    hand_off(&s, &c, "w", succeeded(json!({})), &naming(&["b"], false)).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.commit().await.expect("commit");
    let before = written(&s, run).await;
    assert_eq!(
        hand_off(&s, &c, "w", succeeded(json!({})), &handoff).await,
        FinishResult::Stale
    );
    let after = written(&s, run).await;
    assert_eq!(after.1, before.1, "no second dispatch");
    assert_eq!(after.0.len(), before.0.len() + 1, "only the audit: {:?}", after.0);

    // A failure or a cancel hands on nothing, and is flagged.
    for outcome in [failed_for_good("boom"), TaskOutcome::Cancelled] {
        let (run, c) = running_chain(&s).await;
        hand_off(&s, &c, "w", outcome, &handoff).await;
        assert_eq!(view(&s, run, "b").await.state, TaskRunState::Pending);
        assert!(dispatches_of(&s, run, "b").await.is_empty());
        assert!(
            s.runs_with_work(Scope::Run(run), 10)
                .await
                .expect("runs_with_work")
                .contains(&run)
        );
    }
}

/// Starts a run of a and b, c after a, and d after both, with `a` claimed
/// (its flags taken) and `b` ready: `a`'s claim and `b`'s dispatch.
async fn a_claimed_b_ready<S: Store>(s: &S) -> (RunId, Claim, NextClaim) {
    let run = start(
        s,
        json!({"name": "fork", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "echo"},
            {"key": "c", "task_type": "noop", "depends_on": ["a"]},
            {"key": "d", "task_type": "noop", "depends_on": ["a", "b"]}
        ]}),
    )
    .await;
    let a = claim(s, run, "a", "w", LONG).await;
    drain_flags(s, run).await;
    let b = view(s, run, "b").await;
    let next = NextClaim {
        id: b.id,
        token: b.token,
        lease: LONG,
    };
    (run, a, next)
}

/// What a claim says of its task, its run and times aside.
fn claimed_as(c: &Claim) -> (String, u32, u32, i64, Option<String>) {
    (
        c.task_key.clone(),
        c.attempt,
        c.attempt_base,
        c.token,
        c.compensate_for.clone(),
    )
}

/// A finish and the claim after it, in one call
/// (docs/design/leases-and-fencing.md#finish-and-claim-next), write the
/// rows and events the two calls write and answer what each would: for a
/// success handing on (one transaction where the store can) and for a
/// failure; a stale finish does not refuse the claim, nor a stale claim
/// the finish.
pub async fn finish_and_claim_writes_what_the_two_calls_write<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let w = worker("w");
    // a's success makes c ready and lowers its join d, which still waits
    // on b.
    let handoff = Handoff {
        dependents: vec!["c".to_owned()],
        joins: vec!["d".to_owned()],
        whole: true,
    };
    let call = |a: &Claim, token: i64, outcome: TaskOutcome| FinishCall {
        id: a.task_run_id,
        token,
        worker: &w,
        outcome,
        handoff: &handoff,
        handover: Handover::Sweep,
    };
    for outcome in [succeeded(json!({"n": 1})), failed_for_good("boom")] {
        let (together, a, next) = a_claimed_b_ready(&s).await;
        let (finished, claimed) = s
            .finish_and_claim(call(&a, a.token, outcome.clone()), next)
            .await
            .expect("finish_and_claim");
        let claimed = claimed.expect("the claim").expect("b is claimed");

        let (apart, a, _) = a_claimed_b_ready(&s).await;
        let alone = s
            .finish_and_hand_off(a.task_run_id, a.token, &w, outcome.clone(), &handoff, Handover::Sweep)
            .await
            .expect("finish_and_hand_off");
        let claimed_alone = claim(&s, apart, "b", "w", LONG).await;

        assert_eq!(finished, alone, "{outcome:?}");
        assert_eq!(claimed_as(&claimed), claimed_as(&claimed_alone), "{outcome:?}");
        assert_eq!(claimed.run_id, together);
        assert_eq!(
            written(&s, together).await,
            written(&s, apart).await,
            "{outcome:?}: the same events, in the same order, and dispatches"
        );
        let flagged = s.runs_with_work(Scope::All, 100).await.expect("runs_with_work");
        assert_eq!(
            flagged.contains(&together),
            flagged.contains(&apart),
            "{outcome:?}: flagged alike"
        );
        if matches!(outcome, TaskOutcome::Succeeded { .. }) {
            assert_eq!(view(&s, together, "c").await.state, TaskRunState::Ready, "c handed on");
            assert_eq!(dispatches_of(&s, together, "c").await.len(), 1, "with its dispatch");
            // A lowered join shows only once its last dependency succeeds:
            // b's success, handed on alike in both runs, finds d's counter
            // where a's success left it.
            let last = Handoff {
                dependents: Vec::new(),
                joins: vec!["d".to_owned()],
                whole: true,
            };
            for (run, b) in [(together, &claimed), (apart, &claimed_alone)] {
                // b's claim flagged it (the run is still pending): a flagged
                // success leaves its joins to the pass.
                drain_flags(&s, run).await;
                s.finish_and_hand_off(b.task_run_id, b.token, &w, succeeded(json!({})), &last, Handover::Sweep)
                    .await
                    .expect("b's finish");
                assert_eq!(view(&s, run, "b").await.state, TaskRunState::Succeeded);
            }
            assert_eq!(
                view(&s, together, "d").await.state,
                view(&s, apart, "d").await.state,
                "d lowered alike by a's success"
            );
        }
    }

    // A stale finish (its token taken back) still claims.
    let (run, a, next) = a_claimed_b_ready(&s).await;
    let (finished, claimed) = s
        .finish_and_claim(call(&a, a.token + 1, succeeded(json!({}))), next)
        .await
        .expect("finish_and_claim");
    assert_eq!(finished.result, FinishResult::Stale);
    assert_eq!(claimed.expect("the claim").map(|c| c.task_key), Some("b".to_owned()));
    assert_eq!(view(&s, run, "a").await.state, TaskRunState::Running);
    assert_eq!(view(&s, run, "b").await.state, TaskRunState::Running);
    let history = events(&s, run).await;
    assert_eq!(
        transitions(&history[history.len() - 2..]),
        ["stale_write_rejected", "claim"],
        "the audit, then b's claim"
    );

    // A stale claim (a duplicate dispatch) leaves the finish stored.
    let (run, a, next) = a_claimed_b_ready(&s).await;
    let stale = NextClaim {
        token: next.token + 1,
        ..next
    };
    let (finished, claimed) = s
        .finish_and_claim(call(&a, a.token, succeeded(json!({"n": 2}))), stale)
        .await
        .expect("finish_and_claim");
    assert_eq!(finished.result, FinishResult::Recorded(TaskRunState::Succeeded));
    assert!(claimed.expect("the claim").is_none(), "not ready at that token");
    assert_eq!(view(&s, run, "a").await.output, Some(json!({"n": 2})));
    assert_eq!(view(&s, run, "b").await.state, TaskRunState::Ready);
}

/// A dependent still waiting on another task, or in a cancel-requested
/// run, is left to the pass, and the success is flagged for it; the pass
/// then counts each success once.
pub async fn a_handoff_leaves_what_else_holds_back_to_the_pass<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (run, a, b) = claimed_diamond(&s).await;
    // c waits on a and b: naming it (as no handoff would) moves nothing.
    hand_off(&s, &a, "w", succeeded(json!({})), &naming(&["c"], true)).await;
    assert_eq!(view(&s, run, "c").await.state, TaskRunState::Pending);
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1, "the success is flagged");
    assert!(
        p.satisfy_dependencies(&[("c".to_owned(), 1)])
            .await
            .expect("satisfy")
            .is_empty()
    );
    p.commit().await.expect("commit");
    // A duplicate of a's success finds c at one, held back by b alone: it
    // is stale and hands nothing on.
    assert_eq!(
        hand_off(&s, &a, "w", succeeded(json!({})), &naming(&["c"], true)).await,
        FinishResult::Stale
    );
    assert_eq!(view(&s, run, "c").await.state, TaskRunState::Pending);
    // b's success finds c at one: it hands c on, and the pass that counts
    // b's success finds c no longer pending.
    hand_off(&s, &b, "w", succeeded(json!({})), &naming(&["c"], false)).await;
    assert_eq!(view(&s, run, "c").await.state, TaskRunState::Ready);
    the_pass_counts_it_no_more(&s, run, "c").await;

    // A cancel-requested run: nothing handed on, the success flagged.
    let (run, c) = running_chain(&s).await;
    s.request_cancel(run).await.expect("cancel").expect("the run exists");
    hand_off(&s, &c, "w", succeeded(json!({})), &naming(&["b"], true)).await;
    assert_eq!(view(&s, run, "b").await.state, TaskRunState::Pending);
    let mut p = pass(&s, run).await;
    assert_eq!(p.take_flagged().await.expect("take_flagged").len(), 1);
    p.commit().await.expect("commit");
}

/// Names `joins` as a whole handoff's joins.
fn joining(joins: &[&str]) -> Handoff {
    Handoff {
        dependents: Vec::new(),
        joins: joins.iter().map(|k| (*k).to_owned()).collect(),
        whole: true,
    }
}

/// What the scheduler does for the run's flags: each flagged success of
/// `a` or `b` lowers `c` by one.
async fn pass_counts_flagged_successes<S: Store>(s: &S, run: RunId) {
    let mut p = pass(s, run).await;
    let succeeded = p
        .take_flagged()
        .await
        .expect("take_flagged")
        .into_iter()
        .filter(|t| t.state == TaskRunState::Succeeded && (t.key == "a" || t.key == "b"))
        .count();
    if succeeded > 0 {
        p.satisfy_dependencies(&[("c".to_owned(), u32::try_from(succeeded).expect("two at most"))])
            .await
            .expect("satisfy");
    }
    p.commit().await.expect("commit");
}

/// Hands on the success of `claimed` (the diamond's a or b) naming its
/// join c, lets the pass count what the success left flagged, and
/// returns c's state.
async fn join_after<S: Store>(s: &S, run: RunId, claimed: &Claim) -> TaskRunState {
    hand_off(s, claimed, "w", succeeded(json!({})), &joining(&["c"])).await;
    pass_counts_flagged_successes(s, run).await;
    view(s, run, "c").await.state
}

/// A join named by a whole handoff (docs/design/scheduler.md#joins) is
/// counted once per success, by the success itself or by the pass its
/// flag asks for, never by both: it becomes ready after its last
/// dependency and not before, with the one event and dispatch the pass
/// alone would write. A success already flagged (a first claim's flag)
/// lowers nothing itself, and one whose join is no longer pending (a
/// failure cancelled it) is flagged.
pub async fn a_join_is_counted_once_by_the_success_or_by_the_pass<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (joined, a, b) = claimed_diamond(&s).await;
    assert_eq!(
        join_after(&s, joined, &a).await,
        TaskRunState::Pending,
        "b still holds c back"
    );
    assert_eq!(join_after(&s, joined, &b).await, TaskRunState::Ready);

    // The same successes through the pass alone write the same rows.
    let (passed, a, b) = claimed_diamond(&s).await;
    finish(&s, &a, "w", succeeded(json!({}))).await;
    pass_counts_flagged_successes(&s, passed).await;
    finish(&s, &b, "w", succeeded(json!({}))).await;
    pass_counts_flagged_successes(&s, passed).await;
    let (events, dispatches) = written(&s, joined).await;
    assert_eq!((events.clone(), dispatches.clone()), written(&s, passed).await);
    assert_eq!(
        events.iter().filter(|e| e.contains("dependencies_satisfied")).count(),
        1,
        "{events:?}"
    );
    assert_eq!(
        dispatches_of(&s, joined, "c").await.len(),
        1,
        "one dispatch per readiness"
    );

    // a's success while its first claim's flag is up: the pass counts it,
    // and the success does not count it again.
    let run = start(&s, diamond()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    assert_eq!(
        join_after(&s, run, &a).await,
        TaskRunState::Pending,
        "b still holds c back"
    );
    let b = claim(&s, run, "b", "w", LONG).await;
    assert_eq!(join_after(&s, run, &b).await, TaskRunState::Ready);
    assert_eq!(dispatches_of(&s, run, "c").await.len(), 1, "one dispatch per readiness");

    // A cancel-requested run: the join is left to the pass, the success
    // flagged.
    let run = start(&s, diamond()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    drain_flags(&s, run).await;
    s.request_cancel(run).await.expect("cancel").expect("the run exists");
    hand_off(&s, &a, "w", succeeded(json!({})), &joining(&["c"])).await;
    let mut p = pass(&s, run).await;
    assert_eq!(
        p.take_flagged().await.expect("take_flagged").len(),
        1,
        "the success is flagged"
    );
    p.commit().await.expect("commit");

    // b fails for good and its pass cancels c: a's later success finds its
    // join no longer pending, so it is flagged, and the pass that takes
    // the flag is the one that settles the run (a success left unflagged
    // would be the run's last event, and no pass would ever settle it).
    let (run, a, b) = claimed_diamond(&s).await;
    let failure = failed_for_good("boom");
    finish(&s, &b, "w", failure).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.cancel_pending(&["c".into(), "d".into()], CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    p.commit().await.expect("commit");
    assert_eq!(
        hand_off(&s, &a, "w", succeeded(json!({})), &joining(&["c"])).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    assert_eq!(view(&s, run, "c").await.state, TaskRunState::Cancelled);
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(
        flagged
            .iter()
            .any(|t| t.key == "a" && t.state == TaskRunState::Succeeded),
        "the success is flagged: {flagged:?}"
    );
    p.commit().await.expect("commit");
}

/// Hands `c`'s success on to `b`, whose dispatch `handover` gives to the
/// caller; returns what the store handed back.
async fn hand_b_on<S: Store>(s: &S, c: &Claim, handover: Handover) -> Finished {
    s.finish_and_hand_off(
        c.task_run_id,
        c.token,
        &worker("w"),
        succeeded(json!({})),
        &naming(&["b"], true),
        handover,
    )
    .await
    .expect("finish_and_hand_off")
}

/// Asserts the success was recorded and handed back exactly `b`'s
/// dispatch, `b` now ready; returns it.
async fn b_handed_back<S: Store>(s: &S, run: RunId, finished: &Finished) -> Dispatch {
    assert_eq!(finished.result, FinishResult::Recorded(TaskRunState::Succeeded));
    let b = view(s, run, "b").await;
    assert_eq!(b.state, TaskRunState::Ready);
    let [handed] = finished.held.as_slice() else {
        panic!("b's dispatch is handed back: {:?}", finished.held);
    };
    assert_eq!(
        (
            handed.task_run_id,
            handed.run_id,
            handed.task_key.as_str(),
            handed.task_type.as_str(),
            handed.fencing_token
        ),
        (b.id, run, "b", "echo", b.token)
    );
    handed.clone()
}

/// A finish whose lease was reaped hands `b` on with `handover` and gets
/// nothing back: stale, `b` still pending.
async fn a_stale_finish_hands_back_nothing<S: Store>(s: &S, clock: &ManualClock, handover: Handover) {
    let (run, c) = running_chain(s).await;
    clock.advance(LONG + Duration::from_secs(1));
    assert_eq!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").len(), 1);
    let stale = hand_b_on(s, &c, handover).await;
    assert_eq!((stale.result, stale.held.len()), (FinishResult::Stale, 0));
    assert_eq!(view(s, run, "b").await.state, TaskRunState::Pending);
}

/// A finish that holds its dispatches
/// (docs/design/outbox-and-queues.md#publish-after-commit) returns them and
/// keeps them from the sweep for the hold, and no longer: a committer that
/// dies before publishing loses nothing. A stale one holds nothing.
pub async fn held_dispatches_are_swept_once_their_hold_is_over<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let hold = Duration::from_secs(60);
    let (run, c) = running_chain(&s).await;
    let finished = hand_b_on(&s, &c, Handover::Held(hold)).await;
    let held = b_handed_back(&s, run, &finished).await;
    assert!(dispatches_of(&s, run, "b").await.is_empty(), "held from the sweep");
    let until = s
        .held_for(Scope::Run(run))
        .await
        .expect("held_for")
        .expect("one row is held");
    assert!(until <= hold && until > Duration::ZERO, "{until:?}");
    assert_eq!(
        s.held_for(Scope::Run(RunId(uuid::Uuid::nil())))
            .await
            .expect("held_for"),
        None
    );

    // Its committer never settled it: once the hold is over, it is due,
    // and the sweep takes it.
    clock.advance(hold + Duration::from_secs(1));
    assert_eq!(
        s.held_for(Scope::Run(run)).await.expect("held_for"),
        Some(Duration::ZERO),
        "due now"
    );
    let swept = dispatches_of(&s, run, "b").await;
    assert_eq!(
        swept.iter().map(|d| d.dispatch_id).collect::<Vec<_>>(),
        [held.dispatch_id]
    );

    // A stale finish holds nothing; a finish left to the sweep returns none.
    a_stale_finish_hands_back_nothing(&s, &clock, Handover::Held(hold)).await;
    let (_, c) = running_chain(&s).await;
    assert!(hand_b_on(&s, &c, Handover::Sweep).await.held.is_empty());
}

/// Settling held rows marks the published ones, which no sweep publishes
/// again, and releases the others to the sweep at once, waking the
/// publisher.
pub async fn settling_held_dispatches_marks_or_releases_them<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let hold = Duration::from_secs(60);
    let (published_run, c) = running_chain(&s).await;
    let published = hand_b_on(&s, &c, Handover::Held(hold)).await.held;
    let (released_run, c) = running_chain(&s).await;
    let released = hand_b_on(&s, &c, Handover::Held(hold)).await.held;
    assert_eq!((published.len(), released.len()), (1, 1));
    let notifier = s.notifier().await.expect("notifier");
    s.settle_held(&[published[0].dispatch_id], &[released[0].dispatch_id])
        .await
        .expect("settle_held");
    assert!(woke(&notifier, Topic::Publisher).await, "a release wakes the publisher");
    assert!(dispatches_of(&s, published_run, "b").await.is_empty(), "published");
    assert_eq!(
        dispatches_of(&s, released_run, "b")
            .await
            .iter()
            .map(|d| d.dispatch_id)
            .collect::<Vec<_>>(),
        [released[0].dispatch_id],
        "released to the sweep"
    );
    assert_eq!(s.held_for(Scope::All).await.expect("held_for"), None);
    // Settling again changes nothing: a published row stays published.
    s.settle_held(&[published[0].dispatch_id], &[published[0].dispatch_id])
        .await
        .expect("settle_held");
    assert!(dispatches_of(&s, published_run, "b").await.is_empty());
    s.settle_held(&[], &[]).await.expect("nothing to settle");
}

/// A finish whose caller pushes its dispatches into a queue that dies with
/// its process (docs/design/outbox-and-queues.md#publish-after-commit)
/// returns them committed published: no sweep takes them and nothing is
/// held. If the process dies before the push, the next publisher's start
/// re-arms them and the sweep delivers them. A stale finish pushes nothing.
pub async fn pushed_dispatches_are_committed_published_and_rearmed_when_lost<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let (run, c) = running_chain(&s).await;
    let finished = hand_b_on(&s, &c, Handover::Pushed).await;
    let pushed = b_handed_back(&s, run, &finished).await;
    assert!(dispatches_of(&s, run, "b").await.is_empty(), "committed published");
    assert_eq!(
        s.held_for(Scope::Run(run)).await.expect("held_for"),
        None,
        "nothing is held"
    );

    // The process died before pushing it, and its queue with it: the next
    // publisher's start re-arms it, waking the publisher, and the sweep
    // takes it.
    let notifier = s.notifier().await.expect("notifier");
    assert_eq!(
        s.rearm_lost_dispatches(Scope::Run(run), Duration::ZERO)
            .await
            .expect("rearm_lost_dispatches"),
        1
    );
    assert!(woke(&notifier, Topic::Publisher).await, "a re-arm wakes the publisher");
    assert_eq!(
        dispatches_of(&s, run, "b")
            .await
            .iter()
            .map(|d| d.dispatch_id)
            .collect::<Vec<_>>(),
        [pushed.dispatch_id]
    );

    // A stale finish pushes nothing.
    a_stale_finish_hands_back_nothing(&s, &clock, Handover::Pushed).await;
}
