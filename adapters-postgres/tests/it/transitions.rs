//! The transition protocol on one store: the caller contract
//! (docs/design/state-machines.md#caller-contract), retries, the reaper's two
//! edges, cancellation, the scheduler pass and what reports read back.

use std::time::{Duration, Instant};

use flowforge_adapters_postgres::PgStore;
use flowforge_domain::{CancelReason, RunState, RunTransition, TaskRunState, TaskTransition};
use flowforge_ports::{
    CancelOutcome, DefinitionStore, FinishResult, LeaseStatus, OutboxStore, OutboxSweep, RunPass, RunStore, Scope,
    TaskOutcome, TransitionError, WorkerId, WorkerRegistration, WorkerRegistry, WorkflowId, store,
};
use serde_json::json;

use crate::harness::{LONG_LEASE, def, ready, task};

fn me() -> WorkerId {
    WorkerId("worker-1".to_owned())
}

async fn diamond(store: &PgStore) -> WorkflowId {
    store
        .publish_definition(&def(json!({"name": "diamond", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop", "retry": {"max_attempts": 3, "delay_seconds": 10}},
            {"key": "b", "task_type": "echo", "depends_on": ["a"]},
            {"key": "c", "task_type": "noop", "depends_on": ["a"]},
            {"key": "d", "task_type": "noop", "depends_on": ["b", "c"]},
            {"key": "undo_a", "task_type": "noop", "compensate_for": "a"}
        ]})))
        .await
        .unwrap()
        .id
}

async fn outbox_tokens(store: &PgStore, task_run: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT fencing_token FROM outbox WHERE task_run_id = $1 ORDER BY id")
        .bind(task_run)
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn start_run_materialises_forward_tasks_and_dispatches_the_ready_ones() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let wf = diamond(&store).await;
    let run = store.start_run(wf, json!({"day": 1})).await.unwrap();
    let detail = store.get_run(run).await.unwrap().unwrap();
    assert_eq!(detail.summary.state, RunState::Pending);
    assert_eq!(detail.input, json!({"day": 1}));
    let states: Vec<_> = detail.tasks.iter().map(|t| (t.key.as_str(), t.state)).collect();
    assert_eq!(
        states,
        [
            ("a", TaskRunState::Ready),
            ("b", TaskRunState::Pending),
            ("c", TaskRunState::Pending),
            ("d", TaskRunState::Pending)
        ],
        "compensators are not materialised"
    );
    let sweep = store
        .begin_sweep(Scope::Run(run), 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
        .await
        .unwrap()
        .unwrap();
    let d = &sweep.dispatches()[0];
    assert_eq!(sweep.dispatches().len(), 1);
    assert_eq!(
        (d.task_key.as_str(), d.task_type.as_str(), d.run_id),
        ("a", "noop", run)
    );
    assert_eq!(d.fencing_token, detail.tasks[0].token);
    assert!(matches!(
        store.start_run(WorkflowId(4242), json!({})).await,
        Err(store::Error::Other(_))
    ));
    assert_eq!(store.list_runs(10).await.unwrap()[0].id, run);
}

#[tokio::test]
async fn claims_match_only_a_ready_row_at_the_dispatched_token() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let wf = diamond(&store).await;
    let run = store.start_run(wf, json!({})).await.unwrap();
    let (a, token) = ready(&store, run, "a").await;
    assert!(
        store
            .claim_task_run(a, token + 7, &me(), LONG_LEASE)
            .await
            .unwrap()
            .is_none()
    );
    let claim = store
        .claim_task_run(a, token, &me(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((claim.run_id, claim.task_key.as_str(), claim.attempt), (run, "a", 1));
    assert_eq!(claim.compensate_for, None);
    // A duplicate delivery of the same dispatch claims nothing.
    assert!(
        store
            .claim_task_run(a, token, &me(), LONG_LEASE)
            .await
            .unwrap()
            .is_none()
    );
    let row = task(&store, run, "a").await;
    assert_eq!(row.lease_owner.as_deref(), Some("worker-1"));
    let started = row.started_at.unwrap();
    assert_eq!(
        store.renew_lease(a, claim.token, LONG_LEASE).await.unwrap(),
        LeaseStatus::Held {
            cancel_requested: false
        }
    );
    // The first claim of a task in a pending run flags it for the scheduler.
    let flagged = store.runs_with_work(Scope::All, 10).await.unwrap();
    assert_eq!(flagged, [run]);
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    let taken = pass.take_flagged().await.unwrap();
    assert_eq!((taken[0].key.as_str(), taken[0].state), ("a", TaskRunState::Running));
    assert!(pass.take_flagged().await.unwrap().is_empty(), "read and cleared");
    assert!(pass.transition_run(RunTransition::Start).await.unwrap());
    pass.commit().await.unwrap();
    assert!(store.runs_with_work(Scope::All, 10).await.unwrap().is_empty());
    assert_eq!(task(&store, run, "a").await.started_at, Some(started));
}

#[tokio::test]
async fn a_failure_with_attempts_left_schedules_the_retry_in_the_same_transaction() {
    let db = test_db!();
    let (store, clock) = db.store().await;
    let wf = diamond(&store).await;
    let run = store.start_run(wf, json!({})).await.unwrap();
    let (a, token) = ready(&store, run, "a").await;
    let first = store
        .claim_task_run(a, token, &me(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    let started = task(&store, run, "a").await.started_at;
    let outcome = TaskOutcome::Failed {
        error: "boom".to_owned(),
        retry_in: Some(Duration::from_secs(10)),
    };
    assert_eq!(
        store.finish_task_run(a, first.token, &me(), outcome).await.unwrap(),
        FinishResult::Recorded(TaskRunState::Retrying)
    );
    let row = task(&store, run, "a").await;
    assert_eq!(
        (row.state, row.attempt, row.error.as_deref()),
        (TaskRunState::Retrying, 2, Some("boom"))
    );
    assert!(row.finished_at.is_none() && row.lease_owner.is_none());
    assert!(row.retry_at.is_some());
    let deadline = store.next_deadline(Scope::Run(run)).await.unwrap().unwrap();
    assert!(
        deadline > Duration::from_secs(8) && deadline <= Duration::from_secs(10),
        "{deadline:?}"
    );

    // Not due yet: no work, nothing promoted.
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    pass.take_flagged().await.unwrap();
    assert!(pass.promote_due_retries().await.unwrap().is_empty());
    pass.commit().await.unwrap();
    assert!(store.runs_with_work(Scope::All, 10).await.unwrap().is_empty());

    clock.advance(Duration::from_secs(11));
    assert_eq!(store.next_deadline(Scope::All).await.unwrap(), Some(Duration::ZERO));
    assert_eq!(store.runs_with_work(Scope::All, 10).await.unwrap(), [run]);
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    assert_eq!(pass.promote_due_retries().await.unwrap(), ["a"]);
    pass.commit().await.unwrap();
    let (_, token2) = ready(&store, run, "a").await;
    assert_eq!(
        outbox_tokens(&store, a.0).await,
        [token, token2],
        "one outbox row per readiness"
    );
    let second = store
        .claim_task_run(a, token2, &me(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.attempt, 2);
    assert_eq!(
        task(&store, run, "a").await.started_at,
        started,
        "started_at is the lifecycle's origin"
    );

    let detail = store.get_run(run).await.unwrap().unwrap();
    let history: Vec<_> = detail
        .events
        .iter()
        .map(|e| (e.transition.as_str(), e.attempt))
        .collect();
    assert_eq!(
        history,
        [
            ("claim", Some(1)),
            ("fail", Some(1)),
            ("schedule_retry", Some(2)),
            ("retry_ready", Some(2)),
            ("claim", Some(2))
        ]
    );
    assert_eq!(detail.events[1].error.as_deref(), Some("boom"));
}

#[tokio::test]
async fn the_generic_path_keeps_spec_000s_caller_contract() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let wf = diamond(&store).await;
    let run = store.start_run(wf, json!({})).await.unwrap();
    let b = task(&store, run, "b").await.id;
    use TaskRunState::*;
    assert_eq!(
        store.transition_task_run(b, Succeeded, Pending).await,
        Err(TransitionError::Illegal {
            from: Succeeded,
            to: Pending
        })
    );
    assert_eq!(
        store.transition_task_run(b, Running, Succeeded).await,
        Err(TransitionError::LeaseRequired(TaskTransition::Succeed))
    );
    assert!(matches!(
        store.transition_task_run(b, Ready, Running).await,
        Err(TransitionError::Reserved {
            transition: TaskTransition::Claim,
            ..
        })
    ));
    assert!(matches!(
        store.transition_task_run(b, Running, Ready).await,
        Err(TransitionError::Reserved {
            transition: TaskTransition::ReapLease,
            ..
        })
    ));
    // Legal but lost: b is pending, not ready.
    assert_eq!(store.transition_task_run(b, Ready, Cancelled).await, Ok(false));
    assert_eq!(store.transition_task_run(b, Pending, Ready).await, Ok(true));
    assert_eq!(
        store.transition_task_run(b, Pending, Ready).await,
        Ok(false),
        "the second writer loses"
    );
    let (_, token) = ready(&store, run, "b").await;
    assert_eq!(outbox_tokens(&store, b.0).await, [token]);
    assert_eq!(store.transition_task_run(b, Ready, Cancelled).await, Ok(true));
    let row = task(&store, run, "b").await;
    assert_eq!((row.state, row.cancel_reason), (Cancelled, Some(CancelReason::User)));
    assert!(row.finished_at.is_some());
}

#[tokio::test]
async fn the_reaper_fails_the_final_attempt_and_cancels_for_a_cancelled_run() {
    let db = test_db!();
    let (store, clock) = db.store().await;
    let wf = store
        .publish_definition(&def(json!({"name": "pair", "version": 1, "tasks": [
            {"key": "once", "task_type": "noop"},
            {"key": "twice", "task_type": "noop", "retry": {"max_attempts": 2}}
        ]})))
        .await
        .unwrap()
        .id;
    let lease = Duration::from_secs(5);

    // Final attempt: running → failed, for good, flagged for the scheduler.
    let run = store.start_run(wf, json!({})).await.unwrap();
    let (once, token) = ready(&store, run, "once").await;
    let claim = store.claim_task_run(once, token, &me(), lease).await.unwrap().unwrap();
    assert!(
        store.reap_expired_leases(Scope::All, 10).await.unwrap().is_empty(),
        "not expired yet"
    );
    clock.advance(lease + Duration::from_secs(1));
    let reaped = store.reap_expired_leases(Scope::Run(run), 10).await.unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(
        (reaped[0].task_key.as_str(), reaped[0].transition),
        ("once", TaskTransition::ReapLeaseFinal)
    );
    let row = task(&store, run, "once").await;
    assert_eq!((row.state, row.attempt), (TaskRunState::Failed, 1));
    assert!(row.token > claim.token && row.finished_at.is_some());
    assert_eq!(row.error.as_deref(), Some("lease expired on the final attempt"));
    assert_eq!(
        outbox_tokens(&store, once.0).await.len(),
        1,
        "no dispatch for a final reap"
    );

    // Cancel-requested run: reap_lease then cancel_ready, no dispatch.
    let (twice, token) = ready(&store, run, "twice").await;
    let claim = store.claim_task_run(twice, token, &me(), lease).await.unwrap().unwrap();
    assert_eq!(store.request_cancel(run).await.unwrap(), Some(CancelOutcome::Requested));
    assert_eq!(
        store.request_cancel(run).await.unwrap(),
        Some(CancelOutcome::AlreadyRequested)
    );
    assert_eq!(
        store.renew_lease(twice, claim.token, lease).await.unwrap(),
        LeaseStatus::Held { cancel_requested: true }
    );
    clock.advance(lease * 2);
    let reaped = store.reap_expired_leases(Scope::All, 10).await.unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].transition, TaskTransition::ReapLease);
    assert!(reaped[0].cancelled);
    let row = task(&store, run, "twice").await;
    assert_eq!(
        (row.state, row.cancel_reason),
        (TaskRunState::Cancelled, Some(CancelReason::User))
    );
    assert_eq!(
        outbox_tokens(&store, twice.0).await.len(),
        1,
        "no dispatch for a cancelled run"
    );
    let events: Vec<_> = store
        .get_run(run)
        .await
        .unwrap()
        .unwrap()
        .events
        .into_iter()
        .filter(|e| e.task.as_deref() == Some("twice"))
        .map(|e| e.transition)
        .collect();
    assert_eq!(events, ["claim", "reap_lease", "cancel_ready"]);
}

#[tokio::test]
async fn cancellation_reaches_every_waiting_task_and_claims_stop() {
    let db = test_db!();
    let (store, clock) = db.store().await;
    let wf = diamond(&store).await;
    let run = store.start_run(wf, json!({})).await.unwrap();
    let (a, token) = ready(&store, run, "a").await;
    let claim = store
        .claim_task_run(a, token, &me(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    store
        .finish_task_run(
            a,
            claim.token,
            &me(),
            TaskOutcome::Failed {
                error: "x".into(),
                retry_in: Some(Duration::from_secs(1)),
            },
        )
        .await
        .unwrap();
    clock.advance(Duration::from_secs(2));
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    pass.promote_due_retries().await.unwrap();
    pass.commit().await.unwrap();
    let (_, token) = ready(&store, run, "a").await;

    assert_eq!(store.request_cancel(run).await.unwrap(), Some(CancelOutcome::Requested));
    assert!(
        store
            .claim_task_run(a, token, &me(), LONG_LEASE)
            .await
            .unwrap()
            .is_none(),
        "a claim never succeeds for a cancel-requested run"
    );
    assert_eq!(store.runs_with_work(Scope::Run(run), 10).await.unwrap(), [run]);
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    assert!(pass.run().cancel_requested);
    let mut cancelled = pass.cancel_waiting().await.unwrap();
    cancelled.sort();
    assert_eq!(cancelled, ["a", "b", "c", "d"]);
    let tally = pass.tally().await.unwrap();
    assert_eq!(
        (tally.cancelled_by_user, tally.active(), tally.any_started),
        (4, 0, true)
    );
    assert!(pass.transition_run(RunTransition::Start).await.unwrap());
    assert!(pass.transition_run(RunTransition::Cancel).await.unwrap());
    assert!(matches!(
        pass.transition_run(RunTransition::Succeed).await,
        Err(store::Error::Other(_))
    ));
    pass.commit().await.unwrap();

    let detail = store.get_run(run).await.unwrap().unwrap();
    assert_eq!(detail.summary.state, RunState::Cancelled);
    assert!(detail.summary.finished_at.is_some() && detail.summary.started_at.is_some());
    let edges: Vec<_> = detail
        .events
        .iter()
        .filter(|e| e.transition.starts_with("cancel"))
        .map(|e| (e.task.clone().unwrap_or_default(), e.transition.clone()))
        .collect();
    assert_eq!(
        edges,
        [
            ("a".to_owned(), "cancel_ready".to_owned()),
            ("b".to_owned(), "cancel_pending".to_owned()),
            ("c".to_owned(), "cancel_pending".to_owned()),
            ("d".to_owned(), "cancel_pending".to_owned()),
            (String::new(), "cancel".to_owned()),
        ],
        "task cancellations precede the run's"
    );
    assert_eq!(
        store.request_cancel(run).await.unwrap(),
        Some(CancelOutcome::AlreadyFinished(RunState::Cancelled))
    );
    assert!(
        store.begin_pass(run).await.unwrap().is_none(),
        "terminal runs are not passed"
    );
    assert!(store.runs_with_work(Scope::All, 10).await.unwrap().is_empty());
    assert_eq!(
        store
            .request_cancel(flowforge_ports::RunId(uuid::Uuid::nil()))
            .await
            .unwrap(),
        None
    );
}

async fn complete(store: &PgStore, run: flowforge_ports::RunId, key: &str, outcome: TaskOutcome) {
    let (id, token) = ready(store, run, key).await;
    let claim = store
        .claim_task_run(id, token, &me(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    store.finish_task_run(id, claim.token, &me(), outcome).await.unwrap();
}

#[tokio::test]
async fn a_pass_promotes_cancels_and_compensates_inside_one_transaction() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let wf = diamond(&store).await;
    let run = store.start_run(wf, json!({"n": 1})).await.unwrap();
    complete(
        &store,
        run,
        "a",
        TaskOutcome::Succeeded {
            output: json!({"rows": 3}),
        },
    )
    .await;

    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    let flagged = pass.take_flagged().await.unwrap();
    assert_eq!(flagged.len(), 1);
    assert_eq!(
        (flagged[0].key.as_str(), flagged[0].state),
        ("a", TaskRunState::Succeeded)
    );
    let made_ready = pass
        .satisfy_dependencies(&[("b".into(), 1), ("c".into(), 1), ("d".into(), 0)])
        .await
        .unwrap();
    assert_eq!(made_ready, ["b", "c"]);
    // Uncommitted: nobody else sees the promotion or its outbox rows.
    assert_eq!(task(&store, run, "b").await.state, TaskRunState::Pending);
    assert!(
        store
            .begin_sweep(Scope::Run(run), 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
            .await
            .unwrap()
            .is_some_and(|s| s.dispatches().len() == 1)
    );
    pass.commit().await.unwrap();
    let sweep = store
        .begin_sweep(Scope::Run(run), 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
        .await
        .unwrap()
        .unwrap();
    let keys: Vec<_> = sweep.dispatches().iter().map(|d| d.task_key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    drop(sweep);

    let inputs = store
        .task_inputs(run, &["a".into(), "b".into()], usize::MAX)
        .await
        .unwrap();
    assert_eq!(inputs.run_input, json!({"n": 1}));
    assert_eq!(inputs.outputs.get("a"), Some(&json!({"rows": 3})));
    assert!(!inputs.outputs.contains_key("b"), "only succeeded outputs");

    complete(
        &store,
        run,
        "b",
        TaskOutcome::Failed {
            error: "bad".into(),
            retry_in: None,
        },
    )
    .await;
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    let flagged = pass.take_flagged().await.unwrap();
    assert_eq!((flagged[0].key.as_str(), flagged[0].state), ("b", TaskRunState::Failed));
    assert_eq!(
        pass.cancel_pending(&["d".into(), "c".into()], CancelReason::UpstreamFailed)
            .await
            .unwrap(),
        ["d"],
        "c is ready, not pending"
    );
    assert_eq!(
        pass.succeeded_keys().await.unwrap().into_iter().collect::<Vec<_>>(),
        ["a"]
    );
    assert!(pass.compensator_states().await.unwrap().is_empty());
    assert!(pass.create_compensator("undo_a", "a").await.unwrap());
    assert!(
        !pass.create_compensator("undo_a", "a").await.unwrap(),
        "creating it twice is a no-op"
    );
    assert!(pass.create_compensator("ghost", "a").await.is_err());
    assert_eq!(
        pass.compensator_states().await.unwrap(),
        [("undo_a".to_owned(), TaskRunState::Ready)]
    );
    let tally = pass.tally().await.unwrap();
    assert_eq!(
        (
            tally.succeeded,
            tally.failed,
            tally.ready,
            tally.cancelled_upstream,
            tally.total()
        ),
        (1, 1, 1, 1, 4),
        "compensators are not counted"
    );
    pass.commit().await.unwrap();

    let (undo, token) = ready(&store, run, "undo_a").await;
    let claim = store
        .claim_task_run(undo, token, &me(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.compensate_for.as_deref(), Some("a"));
    let view = task(&store, run, "d").await;
    assert_eq!(
        (view.state, view.cancel_reason),
        (TaskRunState::Cancelled, Some(CancelReason::UpstreamFailed))
    );
}

#[tokio::test]
async fn a_pass_over_a_ten_thousand_task_fan_out_promotes_every_leaf_at_once() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let mut tasks = vec![json!({"key": "root", "task_type": "noop"})];
    tasks
        .extend((0..9_999).map(|i| json!({"key": format!("leaf{i:04}"), "task_type": "noop", "depends_on": ["root"]})));
    let wf = store
        .publish_definition(&def(json!({"name": "fan", "version": 1, "tasks": tasks})))
        .await
        .unwrap()
        .id;
    let run = store.start_run(wf, json!({})).await.unwrap();
    complete(&store, run, "root", TaskOutcome::Succeeded { output: json!({}) }).await;
    let done: Vec<(String, u32)> = (0..9_999).map(|i| (format!("leaf{i:04}"), 1)).collect();

    let started = Instant::now();
    let mut pass = store.begin_pass(run).await.unwrap().unwrap();
    pass.take_flagged().await.unwrap();
    let ready_now = pass.satisfy_dependencies(&done).await.unwrap();
    let tally = pass.tally().await.unwrap();
    pass.commit().await.unwrap();
    let took = started.elapsed();
    println!("pass over a 10 000-task fan-out: {took:?}");
    assert_eq!(ready_now.len(), 9_999);
    assert_eq!(tally.ready, 9_999);
    // How long it takes is the benchmarks' business (BENCHMARKS.md,
    // postgres: the pass over 1 000 runs); a test on a shared machine
    // asserts what the pass did, never how fast.
    let (dispatches,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox WHERE run_id = $1")
        .bind(run.0)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(dispatches, 10_000);
}

#[tokio::test]
async fn workers_register_refresh_and_age_in_store_time() {
    let db = test_db!();
    let (store, clock) = db.store().await;
    let reg = |id: &str, types: &[&str]| WorkerRegistration {
        id: WorkerId(id.to_owned()),
        host: "h".to_owned(),
        pid: 42,
        task_types: types.iter().map(|t| (*t).to_owned()).collect(),
        concurrency: 2,
    };
    store.register_worker(&reg("w1", &["noop", "echo"])).await.unwrap();
    clock.advance(Duration::from_secs(120));
    store.register_worker(&reg("w2", &["command"])).await.unwrap();
    let live = store.live_task_types(Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        live.into_iter().collect::<Vec<_>>(),
        ["command"],
        "w1 was last seen 2 minutes ago"
    );
    store.touch_worker(&WorkerId("w1".into())).await.unwrap();
    assert_eq!(store.live_task_types(Duration::from_secs(60)).await.unwrap().len(), 3);
    let workers = store.list_workers().await.unwrap();
    assert_eq!(workers.len(), 2);
    assert_eq!(workers[0].id.0, "w1", "most recently seen first");
    assert_eq!((workers[0].pid, workers[0].concurrency), (42, 2));
    assert!(workers[0].started_at < workers[0].last_seen_at);
    store.deregister_worker(&WorkerId("w2".into())).await.unwrap();
    let live = store.live_task_types(Duration::from_secs(60)).await.unwrap();
    assert_eq!(live.into_iter().collect::<Vec<_>>(), ["echo", "noop"]);
    // Re-registering revives it and keeps its first start.
    let w2_before = store.list_workers().await.unwrap();
    let first = w2_before.iter().find(|w| w.id.0 == "w2").unwrap().started_at;
    store.register_worker(&reg("w2", &["command"])).await.unwrap();
    let again = store.list_workers().await.unwrap();
    let w2 = again.iter().find(|w| w.id.0 == "w2").unwrap();
    assert_eq!((w2.started_at, w2.stopped_at), (first, None));
}
