//! Contract cases: the scheduler pass: promotion, cancellation, compensation, run state.

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_domain::derive::TaskTally;
use flowforge_domain::{CancelReason, RunState, RunTransition, TaskRunState};
use serde_json::json;

use crate::ids::RunId;
use crate::store::{CancelOutcome, DefinitionStore, LeaseStatus, RunPass, RunStore, Scope, TaskOutcome, Topic};

use super::*;

/// `take_flagged` returns each flagged row once and clears it; a rolled
/// back pass leaves the flags for the next one.
pub async fn take_flagged_reads_and_clears_in_one_step<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &c, "w", succeeded(json!({}))).await;

    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert_eq!(flagged.len(), 1);
    let a = &flagged[0];
    assert_eq!(
        (a.id, a.key.as_str(), a.state),
        (c.task_run_id, "a", TaskRunState::Succeeded)
    );
    assert!(a.cancel_reason.is_none() && a.compensate_for.is_none());
    assert!(p.take_flagged().await.expect("take_flagged").is_empty(), "cleared");
    drop(p);

    assert_eq!(
        s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"),
        [run],
        "a dropped pass rolls back"
    );
    let mut p = pass(&s, run).await;
    assert_eq!(p.take_flagged().await.expect("take_flagged").len(), 1);
    p.commit().await.expect("commit");
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );

    // A cancelled row carries its reason.
    let b = view(&s, run, "b").await;
    assert_eq!(
        s.transition_task_run(b.id, TaskRunState::Pending, TaskRunState::Cancelled)
            .await,
        Ok(true)
    );
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(
        flagged
            .iter()
            .any(|t| t.key == "b" && t.cancel_reason == Some(CancelReason::User))
    );
}

/// `satisfy_dependencies` lowers the counts and promotes exactly the rows
/// that reach zero, with one dispatch each.
pub async fn satisfy_dependencies_promotes_at_zero_with_dispatch<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    let mut p = pass(&s, run).await;
    assert!(
        p.satisfy_dependencies(&[("c".into(), 1)])
            .await
            .expect("satisfy")
            .is_empty(),
        "c still waits for one dependency"
    );
    assert_eq!(
        p.satisfy_dependencies(&[("c".into(), 1)]).await.expect("satisfy"),
        ["c"]
    );
    assert!(p.satisfy_dependencies(&[]).await.expect("satisfy").is_empty());
    p.commit().await.expect("commit");
    let c = view(&s, run, "c").await;
    assert_eq!(c.state, TaskRunState::Ready);
    assert_eq!(view(&s, run, "d").await.state, TaskRunState::Pending);
    assert!(
        dispatches_of(&s, run, "c")
            .await
            .iter()
            .any(|d| d.fencing_token == c.token)
    );
    assert_eq!(transitions(&events_of(&s, run, "c").await), ["dependencies_satisfied"]);
    assert!(
        tasks(&s, run).await.iter().all(|t| t.key != "undo_a"),
        "a compensator is never promoted"
    );

    // Several entries for one key add up.
    let run = s
        .start_run(
            s.find_definition("diamond", 1).await.expect("find").expect("stored").id,
            json!({}),
        )
        .await
        .expect("start");
    let mut p = pass(&s, run).await;
    assert_eq!(
        p.satisfy_dependencies(&[("c".into(), 1), ("c".into(), 1)])
            .await
            .expect("satisfy"),
        ["c"]
    );
    p.commit().await.expect("commit");
}

/// `cancel_pending` cancels those of the keys still pending, with the
/// given reason.
pub async fn cancel_pending_applies_the_given_reason<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let mut p = pass(&s, run).await;
    let keys = ["c".to_owned(), "b".to_owned(), "a".to_owned(), "ghost".to_owned()];
    let mut cancelled = p
        .cancel_pending(&keys, CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    cancelled.sort();
    assert_eq!(cancelled, ["b", "c"], "a is ready, not pending");
    p.commit().await.expect("commit");
    for key in ["b", "c"] {
        let t = view(&s, run, key).await;
        assert_eq!(
            (t.state, t.cancel_reason),
            (TaskRunState::Cancelled, Some(CancelReason::UpstreamFailed))
        );
        assert!(t.finished_at.is_some());
        let ev = events_of(&s, run, key).await;
        assert_eq!(transitions(&ev), ["cancel_pending"]);
        assert_eq!(
            (ev[0].from.as_deref(), ev[0].to.as_deref()),
            (Some("pending"), Some("cancelled"))
        );
    }
    assert_eq!(view(&s, run, "a").await.state, TaskRunState::Ready);
}

/// `cancel_waiting` cancels every pending, ready and retrying forward row
/// (reason user), leaving running rows and compensators alone.
pub async fn cancel_waiting_cancels_waiting_forward_rows_only<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let doc = json!({"name": "mixed", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop"},
        {"key": "b", "task_type": "noop", "depends_on": ["a"]},
        {"key": "r", "task_type": "flaky", "retry": {"max_attempts": 3}},
        {"key": "x", "task_type": "noop"},
        {"key": "s", "task_type": "noop"},
        {"key": "undo_s", "task_type": "undo", "compensate_for": "s"}
    ]});
    let run = start(&s, doc).await;
    claim(&s, run, "x", "w", LONG).await;
    let r = claim(&s, run, "r", "w", LONG).await;
    let retry = TaskOutcome::Failed {
        error: "e".into(),
        retry_in: Some(Duration::from_secs(3_600)),
    };
    finish(&s, &r, "w", retry).await;
    let sc = claim(&s, run, "s", "w", LONG).await;
    finish(&s, &sc, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    assert!(p.create_compensator("undo_s", "s").await.expect("create_compensator"));
    p.commit().await.expect("commit");

    let mut p = pass(&s, run).await;
    let mut cancelled = p.cancel_waiting().await.expect("cancel_waiting");
    cancelled.sort();
    assert_eq!(cancelled, ["a", "b", "r"]);
    p.commit().await.expect("commit");
    for (key, transition) in [("a", "cancel_ready"), ("b", "cancel_pending"), ("r", "cancel_retrying")] {
        let t = view(&s, run, key).await;
        assert_eq!(
            (t.state, t.cancel_reason),
            (TaskRunState::Cancelled, Some(CancelReason::User))
        );
        assert!(t.finished_at.is_some() && t.retry_at.is_none());
        assert_eq!(
            transitions(&events_of(&s, run, key).await).last().copied(),
            Some(transition)
        );
    }
    assert_eq!(view(&s, run, "x").await.state, TaskRunState::Running);
    assert_eq!(view(&s, run, "s").await.state, TaskRunState::Succeeded);
    assert_eq!(
        view(&s, run, "undo_s").await.state,
        TaskRunState::Ready,
        "a cancel does not interrupt a rollback"
    );
}

/// `tally` counts forward rows by state (cancellations by reason, whether
/// anything started); `succeeded_keys` lists the succeeded forward rows.
pub async fn tally_and_succeeded_keys_count_forward_tasks<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let doc = json!({"name": "counts", "version": 1, "tasks": [
        {"key": "ok", "task_type": "noop"},
        {"key": "bad", "task_type": "noop"},
        {"key": "run", "task_type": "noop"},
        {"key": "again", "task_type": "flaky", "retry": {"max_attempts": 2}},
        {"key": "wait", "task_type": "noop"},
        {"key": "p1", "task_type": "noop", "depends_on": ["wait"]},
        {"key": "p2", "task_type": "noop", "depends_on": ["wait"]},
        {"key": "p3", "task_type": "noop", "depends_on": ["wait"]},
        {"key": "undo_ok", "task_type": "undo", "compensate_for": "ok"}
    ]});
    let run = start(&s, doc).await;
    let mut p = pass(&s, run).await;
    let empty = p.tally().await.expect("tally");
    assert_eq!((empty.ready, empty.pending, empty.any_started), (5, 3, false));
    drop(p);

    let ok = claim(&s, run, "ok", "w", LONG).await;
    finish(&s, &ok, "w", succeeded(json!({}))).await;
    let bad = claim(&s, run, "bad", "w", LONG).await;
    let fail = failed_for_good("no");
    finish(&s, &bad, "w", fail).await;
    claim(&s, run, "run", "w", LONG).await;
    let again = claim(&s, run, "again", "w", LONG).await;
    let retry = TaskOutcome::Failed {
        error: "later".into(),
        retry_in: Some(Duration::from_secs(3_600)),
    };
    finish(&s, &again, "w", retry).await;
    let mut p = pass(&s, run).await;
    p.cancel_pending(&["p1".into()], CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    p.cancel_pending(&["p2".into()], CancelReason::User)
        .await
        .expect("cancel_pending");
    assert!(p.create_compensator("undo_ok", "ok").await.expect("create"));
    let tally = p.tally().await.expect("tally");
    let expected = TaskTally {
        pending: 1,
        ready: 1,
        running: 1,
        retrying: 1,
        succeeded: 1,
        failed: 1,
        cancelled_by_user: 1,
        cancelled_upstream: 1,
        skipped: 0,
        any_started: true,
    };
    assert_eq!(tally, expected, "the compensator is not a forward task");
    assert_eq!(
        p.succeeded_keys().await.expect("succeeded_keys"),
        BTreeSet::from(["ok".to_owned()])
    );
}

/// A compensator row is created ready with its dispatch, once; it carries
/// the task it undoes into its claim and inputs.
pub async fn compensators_are_created_once_and_dispatched<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({"made": "x"}))).await;
    let mut p = pass(&s, run).await;
    assert!(p.compensator_states().await.expect("states").is_empty());
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    assert!(
        !p.create_compensator("undo_a", "a").await.expect("create again"),
        "idempotent"
    );
    assert_eq!(
        p.compensator_states().await.expect("states"),
        [("undo_a".to_owned(), TaskRunState::Ready)]
    );
    assert!(p.succeeded_keys().await.expect("succeeded").contains("a"));
    p.commit().await.expect("commit");

    let undo = view(&s, run, "undo_a").await;
    assert_eq!(undo.compensate_for.as_deref(), Some("a"));
    let d = dispatches_of(&s, run, "undo_a").await;
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].task_type.as_str(), d[0].fencing_token), ("undo", undo.token));
    let c = claim(&s, run, "undo_a", "w", LONG).await;
    assert_eq!(c.compensate_for.as_deref(), Some("a"));
    let inputs = s.task_inputs(run, &["a".into()], usize::MAX).await.expect("inputs");
    assert_eq!(inputs.outputs.get("a"), Some(&json!({"made": "x"})));
    finish(&s, &c, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(
        flagged
            .iter()
            .any(|t| t.key == "undo_a" && t.compensate_for.as_deref() == Some("a"))
    );
    assert_eq!(
        p.compensator_states().await.expect("states"),
        [("undo_a".to_owned(), TaskRunState::Succeeded)]
    );
}

/// docs/design/cancellation.md#rollbacks-are-not-interrupted: a cancel that
/// arrives during a rollback does not interrupt it. A compensator of a
/// cancel-requested run still claims, its heartbeat does not ask it to stop,
/// and its expired lease re-dispatches it instead of cancelling it.
pub async fn a_cancel_request_does_not_stop_a_rollback<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let mut def = chain();
    def["tasks"][3]["retry"] = json!({"max_attempts": 2});
    let run = start(&s, def).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    p.commit().await.expect("commit");
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );

    let undo = claim(&s, run, "undo_a", "w1", Duration::from_secs(10)).await;
    assert_eq!(
        s.renew_lease(undo.task_run_id, undo.token, Duration::from_secs(10))
            .await
            .expect("renew"),
        LeaseStatus::Held {
            cancel_requested: false
        },
        "a compensator is not told to stop"
    );
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::Run(run), 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert!(!reaped[0].cancelled, "a compensator's lease is reaped, not cancelled");
    assert_eq!(
        (reaped[0].task_type.as_str(), reaped[0].compensate_for.as_deref()),
        ("undo", Some("a")),
        "the reaper says what it reaped"
    );
    assert_eq!(reaped[0].transition, flowforge_domain::TaskTransition::ReapLease);
    let again = view(&s, run, "undo_a").await;
    assert_eq!(again.state, TaskRunState::Ready);
    assert!(again.token > undo.token);
    assert!(
        dispatches_of(&s, run, "undo_a")
            .await
            .iter()
            .any(|d| d.fencing_token == again.token),
        "re-dispatched at the new token"
    );
    let redo = claim(&s, run, "undo_a", "w2", LONG).await;
    finish(&s, &redo, "w2", succeeded(json!({"undone": true}))).await;
    assert_eq!(view(&s, run, "undo_a").await.state, TaskRunState::Succeeded);
}

/// `activity` agrees with `tally`: anything pending, ready, running or
/// retrying among the forward tasks keeps the run moving; compensators do
/// not count; `any_started` follows the first claim.
pub async fn activity_says_whether_forward_tasks_still_move<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, single("one", 1)).await;
    let mut p = pass(&s, run).await;
    let first = p.activity().await.expect("activity");
    assert!(first.any_active && !first.any_started, "{first:?}");
    p.commit().await.expect("commit");

    let c = claim(&s, run, "t", "w", LONG).await;
    let mut p = pass(&s, run).await;
    let running = p.activity().await.expect("activity");
    assert!(running.any_active && running.any_started, "{running:?}");
    p.commit().await.expect("commit");

    finish(&s, &c, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    let done = p.activity().await.expect("activity");
    let tally = p.tally().await.expect("tally");
    assert!(!done.any_active && done.any_started, "{done:?}");
    assert_eq!(tally.active(), 0);
    assert_eq!(tally.succeeded, 1);
    p.commit().await.expect("commit");

    // A ready compensator is not forward work: the rollback does not keep
    // the run's forward tasks "moving".
    let run = start(&s, chain()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(json!({}))).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let mut cancelled = p
        .cancel_pending(&["b".to_owned(), "c".to_owned()], CancelReason::User)
        .await
        .expect("cancel_pending");
    cancelled.sort();
    assert_eq!(cancelled, ["b", "c"]);
    assert!(p.create_compensator("undo_a", "a").await.expect("create"));
    let rolling_back = p.activity().await.expect("activity");
    assert!(!rolling_back.any_active && rolling_back.any_started, "{rolling_back:?}");
    assert_eq!(p.tally().await.expect("tally").active(), 0);
    p.commit().await.expect("commit");
}

/// `transition_run` applies WorkflowRun edges legal from the stored state,
/// refuses illegal ones, records history, sets the timestamps; a terminal
/// run gets no more passes.
pub async fn run_transitions_follow_the_workflow_run_machine<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, chain()).await;
    let run = s.start_run(p.id, json!({})).await.expect("start");
    let notifier = s.notifier().await.expect("notifier");
    let mut pass1 = pass(&s, run).await;
    assert_eq!(pass1.run().state, RunState::Pending);
    assert_eq!(pass1.run().workflow_id, p.id);
    assert!(
        pass1.transition_run(RunTransition::Succeed).await.is_err(),
        "pending cannot succeed"
    );
    assert_eq!(pass1.run().state, RunState::Pending);
    assert!(pass1.transition_run(RunTransition::Start).await.expect("start"));
    assert_eq!(pass1.run().state, RunState::Running);
    assert!(
        pass1.transition_run(RunTransition::Start).await.is_err(),
        "running cannot start"
    );
    pass1.commit().await.expect("commit");
    let summary = s.get_run(run).await.expect("get_run").expect("exists").summary;
    assert_eq!(summary.state, RunState::Running);
    assert!(summary.started_at.is_some() && summary.finished_at.is_none());

    let mut pass2 = pass(&s, run).await;
    assert_eq!(pass2.run().state, RunState::Running);
    assert!(pass2.transition_run(RunTransition::Fail).await.expect("fail"));
    pass2.commit().await.expect("commit");
    assert!(
        woke(&notifier, Topic::RunSettled).await,
        "a terminal run wakes its waiters"
    );
    let detail = s.get_run(run).await.expect("get_run").expect("exists");
    assert_eq!(detail.summary.state, RunState::Failed);
    assert!(detail.summary.finished_at.is_some());
    let run_events: Vec<(&str, Option<&str>, Option<&str>)> = detail
        .events
        .iter()
        .filter(|e| e.task.is_none())
        .map(|e| (e.transition.as_str(), e.from.as_deref(), e.to.as_deref()))
        .collect();
    assert_eq!(
        run_events,
        [
            ("start", Some("pending"), Some("running")),
            ("fail", Some("running"), Some("failed"))
        ]
    );
    assert!(
        s.begin_pass(run).await.expect("begin_pass").is_none(),
        "terminal runs get no pass"
    );

    let never = s.start_run(p.id, json!({})).await.expect("start");
    let mut pass3 = pass(&s, never).await;
    assert!(
        pass3
            .transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel")
    );
    pass3.commit().await.expect("commit");
    let summary = s.get_run(never).await.expect("get_run").expect("exists").summary;
    assert_eq!(summary.state, RunState::Cancelled);
    assert!(summary.started_at.is_none() && summary.finished_at.is_some());
}

/// While one pass holds a run, another `begin_pass` on it is `None`; an
/// unknown run is `None` too.
pub async fn begin_pass_skips_a_run_already_held<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    assert!(
        s.begin_pass(RunId(uuid::Uuid::nil()))
            .await
            .expect("begin_pass")
            .is_none()
    );
    let held = pass(&s, run).await;
    assert!(
        s.begin_pass(run).await.expect("begin_pass").is_none(),
        "the run is held"
    );
    drop(held);
    let again = s.begin_pass(run).await.expect("begin_pass");
    assert!(again.is_some(), "free again after the first pass ended");
}

/// Nothing a pass does is visible before commit; dropping it rolls back.
pub async fn a_pass_is_invisible_until_commit_and_rolls_back_on_drop<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    let before = s.get_run(run).await.expect("get_run").expect("exists");
    let mut p = pass(&s, run).await;
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    assert_eq!(
        p.satisfy_dependencies(&[("c".into(), 2)]).await.expect("satisfy"),
        ["c"]
    );
    assert_eq!(
        p.cancel_pending(&["d".into()], CancelReason::User)
            .await
            .expect("cancel"),
        ["d"]
    );
    assert_eq!(
        s.get_run(run).await.expect("get_run").expect("exists"),
        before,
        "uncommitted changes are invisible"
    );
    drop(p);
    assert_eq!(
        s.get_run(run).await.expect("get_run").expect("exists"),
        before,
        "rolled back"
    );
    assert_eq!(unpublished(&s, Scope::Run(run)).await.len(), 2, "no dispatch was kept");

    let mut p = pass(&s, run).await;
    p.satisfy_dependencies(&[("c".into(), 2)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    assert_eq!(view(&s, run, "c").await.state, TaskRunState::Ready);
}

/// Writes wake the loops that wait for them, and a wake-up sent while
/// nobody waits is kept for the next wait.
pub async fn writes_wake_the_loops_that_wait_for_them<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let notifier = s.notifier().await.expect("notifier");
    let second = s.notifier().await.expect("notifier");
    let run = start(&s, chain()).await;
    assert!(woke(&notifier, Topic::Publisher).await, "start_run wakes the publisher");

    let c = claim(&s, run, "a", "w", LONG).await;
    assert!(
        woke(&notifier, Topic::Scheduler).await,
        "a first start wakes the scheduler"
    );
    drain_flags(&s, run).await;
    finish(&s, &c, "w", succeeded(json!({}))).await;
    assert!(woke(&notifier, Topic::Scheduler).await, "a finish wakes the scheduler");

    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    assert!(p.transition_run(RunTransition::Start).await.expect("start"));
    assert_eq!(
        p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy"),
        ["b"]
    );
    p.commit().await.expect("commit");
    assert!(
        woke(&notifier, Topic::Publisher).await,
        "a pass's dispatch wakes the publisher"
    );

    let mut p = pass(&s, run).await;
    p.cancel_waiting().await.expect("cancel_waiting");
    assert!(p.transition_run(RunTransition::Cancel).await.expect("cancel"));
    p.commit().await.expect("commit");
    // Both waiters see the settle, though neither was waiting when it happened.
    assert!(woke(&notifier, Topic::RunSettled).await, "a settle wakes every waiter");
    assert!(woke(&second, Topic::RunSettled).await, "a settle wakes every waiter");
}
