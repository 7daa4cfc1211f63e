//! Races across separate pools, released together by barriers and repeated
//! enough to matter: the database decides every winner
//! (docs/design/state-machines.md#transition-protocol), so no test widens a
//! window with a sleep.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use flowforge_adapters_postgres::PgStore;
use flowforge_domain::{RunTransition, TaskRunState, TaskTransition};
use flowforge_ports::{
    DefinitionStore, FinishResult, Handover, LeaseStatus, OutboxStore, OutboxSweep, RunId, RunPass, RunStore, Scope,
    TaskOutcome, WorkerId, WorkflowId,
};
use serde_json::json;
use tokio::sync::Barrier;

use crate::harness::{LONG_LEASE, bounded, def, ready, task};

const ROUNDS: usize = 30;

async fn single_task(store: &PgStore, max_attempts: u32) -> WorkflowId {
    store
        .publish_definition(&def(json!({
            "name": "single", "version": max_attempts,
            "tasks": [{"key": "t", "task_type": "noop", "retry": {"max_attempts": max_attempts}}]
        })))
        .await
        .unwrap()
        .id
}

fn worker(name: &str) -> WorkerId {
    WorkerId(name.to_owned())
}

fn succeeded(by: &str) -> TaskOutcome {
    TaskOutcome::Succeeded {
        output: json!({ "by": by }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_eight_concurrent_claimers_wins() {
    let db = test_db!();
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(db.store().await.0);
    }
    let wf = single_task(&stores[0], 1).await;
    for round in 0..ROUNDS {
        let run = stores[0].start_run(wf, json!({})).await.unwrap();
        let (id, token) = ready(&stores[0], run, "t").await;
        let barrier = Arc::new(Barrier::new(stores.len()));
        let handles: Vec<_> = stores
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, store)| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .claim_task_run(id, token, &worker(&format!("w{i}")), LONG_LEASE)
                        .await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for h in handles {
            if let Some(claim) = bounded("claim race", h).await.unwrap().unwrap() {
                winners.push(claim);
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one claimer wins, the others get Ok(None)"
        );
        let won = &winners[0];
        assert!(won.token > token, "the claim bumps the token");
        let row = task(&stores[0], run, "t").await;
        assert_eq!((row.state, row.token), (TaskRunState::Running, won.token));
        let detail = stores[0].get_run(run).await.unwrap().unwrap();
        let claims = detail.events.iter().filter(|e| e.transition == "claim").count();
        assert_eq!(claims, 1, "round {round}: one claim event");
    }
}

/// Spec 000's sequence: A claims, A's lease expires, the reaper takes it
/// back, B claims, A's late finish is discarded (with an audit event), B's
/// is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaped_worker_cannot_overwrite_the_next_attempt() {
    let db = test_db!();
    let (a, clock) = db.store().await;
    let b = db.store_with(clock.clone()).await;
    let wf = single_task(&a, 3).await;
    for _ in 0..5 {
        let run = a.start_run(wf, json!({})).await.unwrap();
        let (id, dispatched) = ready(&a, run, "t").await;
        let lease = Duration::from_secs(30);
        let claim_a = a
            .claim_task_run(id, dispatched, &worker("A"), lease)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claim_a.attempt, 1);

        clock.advance(lease + Duration::from_secs(1));
        let reaped = b.reap_expired_leases(Scope::Run(run), 10).await.unwrap();
        assert_eq!(reaped.len(), 1);
        assert_eq!(reaped[0].transition, TaskTransition::ReapLease);
        assert!(!reaped[0].cancelled);

        let (_, redispatched) = ready(&b, run, "t").await;
        assert!(redispatched > claim_a.token, "the reaper bumps the token");
        // The stale dispatch claims nothing; the new one does.
        assert!(
            b.claim_task_run(id, dispatched, &worker("B"), lease)
                .await
                .unwrap()
                .is_none()
        );
        let claim_b = b
            .claim_task_run(id, redispatched, &worker("B"), lease)
            .await
            .unwrap()
            .unwrap();
        assert!(claim_b.token > claim_a.token);
        assert_eq!(claim_b.attempt, 2);

        assert_eq!(
            a.renew_lease(id, claim_a.token, lease).await.unwrap(),
            LeaseStatus::Lost
        );
        assert_eq!(
            a.finish_task_run(id, claim_a.token, &worker("A"), succeeded("A"))
                .await
                .unwrap(),
            FinishResult::Stale,
            "A's write matches 0 rows"
        );
        assert_eq!(
            b.finish_task_run(id, claim_b.token, &worker("B"), succeeded("B"))
                .await
                .unwrap(),
            FinishResult::Recorded(TaskRunState::Succeeded)
        );
        let detail = a.get_run(run).await.unwrap().unwrap();
        let row = &detail.tasks[0];
        assert_eq!(row.output, Some(json!({"by": "B"})));
        assert_eq!(row.token, claim_b.token);
        let audit: Vec<_> = detail
            .events
            .iter()
            .filter(|e| e.transition == "stale_write_rejected")
            .collect();
        assert_eq!(audit.len(), 1);
        assert_eq!(
            audit[0].token,
            Some(claim_a.token),
            "the audit carries the presented token"
        );
        assert_eq!(audit[0].worker.as_deref(), Some("A"));
        assert_eq!((audit[0].from.as_deref(), audit[0].to.as_deref()), (None, None));
        let transitions: Vec<&str> = detail
            .events
            .iter()
            .filter(|e| e.task.is_some())
            .map(|e| e.transition.as_str())
            .collect();
        assert_eq!(
            transitions,
            ["claim", "reap_lease", "claim", "stale_write_rejected", "succeed"]
        );
    }
}

/// The reaper and a finishing worker on one expired lease: exactly one
/// outcome, and a finished row is never reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_and_finishing_worker_have_exactly_one_outcome() {
    let db = test_db!();
    let (reaper, clock) = db.store().await;
    let finisher = db.store_with(clock.clone()).await;
    let wf = single_task(&reaper, 2).await;
    let (mut finished_first, mut reaped_first) = (0, 0);
    for round in 0..ROUNDS {
        let run = reaper.start_run(wf, json!({})).await.unwrap();
        let (id, token) = ready(&reaper, run, "t").await;
        let lease = Duration::from_secs(10);
        let claim = finisher
            .claim_task_run(id, token, &worker("w"), lease)
            .await
            .unwrap()
            .unwrap();
        clock.advance(lease + Duration::from_secs(1));

        let barrier = Arc::new(Barrier::new(2));
        let reap = {
            let (store, barrier) = (reaper.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store.reap_expired_leases(Scope::Run(run), 10).await
            })
        };
        let finish = {
            let (store, barrier) = (finisher.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .finish_task_run(id, claim.token, &worker("w"), succeeded("w"))
                    .await
            })
        };
        let reaped = bounded("reap", reap).await.unwrap().unwrap();
        let finished = bounded("finish", finish).await.unwrap().unwrap();
        let row = task(&reaper, run, "t").await;
        match (reaped.len(), finished) {
            (0, FinishResult::Recorded(TaskRunState::Succeeded)) => {
                finished_first += 1;
                assert_eq!(
                    (row.state, row.token, row.attempt),
                    (TaskRunState::Succeeded, claim.token, 1)
                );
            }
            (1, FinishResult::Stale) => {
                reaped_first += 1;
                assert_eq!((row.state, row.attempt), (TaskRunState::Ready, 2));
                assert!(row.token > claim.token);
            }
            other => panic!("round {round}: not exactly one outcome: {other:?}"),
        }
        // However the race went, a later reaper finds nothing to reset.
        clock.advance(lease * 2);
        assert!(
            reaper
                .reap_expired_leases(Scope::Run(run), 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(task(&reaper, run, "t").await.state, row.state);
    }
    println!("reaper vs finisher: finish won {finished_first}, reaper won {reaped_first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_outbox_sweepers_take_each_row_exactly_once() {
    let db = test_db!();
    let (a, _) = db.store().await;
    let (b, _) = db.store().await;
    let tasks: Vec<_> = (0..40)
        .map(|i| json!({"key": format!("t{i:02}"), "task_type": "noop"}))
        .collect();
    let wf = a
        .publish_definition(&def(json!({"name": "wide", "version": 1, "tasks": tasks})))
        .await
        .unwrap()
        .id;

    // Held rows are skipped, not waited for.
    a.start_run(wf, json!({})).await.unwrap();
    let held = a
        .begin_sweep(Scope::All, 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
        .await
        .unwrap()
        .unwrap();
    let other = bounded(
        "sweep past a held batch",
        b.begin_sweep(Scope::All, 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING),
    )
    .await
    .unwrap()
    .unwrap();
    let first: BTreeSet<_> = held.dispatches().iter().map(|d| d.dispatch_id).collect();
    let second: BTreeSet<_> = other.dispatches().iter().map(|d| d.dispatch_id).collect();
    assert_eq!((first.len(), second.len()), (10, 10));
    assert!(first.is_disjoint(&second));
    assert!(first.iter().max() < second.iter().min(), "oldest first");
    drop(held); // rolled back: still unpublished
    drop(other);

    for round in 0..5 {
        for _ in 0..5 {
            a.start_run(wf, json!({})).await.unwrap();
        }
        let barrier = Arc::new(Barrier::new(2));
        let sweepers: Vec<_> = [a.clone(), b.clone()]
            .into_iter()
            .map(|store| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut taken = Vec::new();
                    while let Some(mut sweep) = store
                        .begin_sweep(Scope::All, 7, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
                        .await
                        .unwrap()
                    {
                        assert!(sweep.dispatches().len() <= 7, "a sweep never takes more than its limit");
                        let ids: Vec<_> = sweep.dispatches().iter().map(|d| d.dispatch_id).collect();
                        sweep.mark_published(&ids).await.unwrap();
                        sweep.commit().await.unwrap();
                        taken.extend(ids);
                    }
                    taken
                })
            })
            .collect();
        let mut all = Vec::new();
        for s in sweepers {
            all.extend(bounded("sweepers", s).await.unwrap());
        }
        let unique: BTreeSet<_> = all.iter().copied().collect();
        assert_eq!(unique.len(), all.len(), "round {round}: a row was taken twice");
        let (unpublished,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(a.pool())
            .await
            .unwrap();
        assert_eq!(unpublished, 0, "round {round}");
        let expected = if round == 0 { 240 } else { 200 };
        assert_eq!(all.len(), expected, "round {round}: every row taken");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_is_held_by_one_scheduler_at_a_time() {
    let db = test_db!();
    let (a, _) = db.store().await;
    let (b, _) = db.store().await;
    let wf = single_task(&a, 1).await;
    for round in 0..ROUNDS {
        let run = a.start_run(wf, json!({})).await.unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let after = Arc::new(Barrier::new(2));
        let passes: Vec<_> = [a.clone(), b.clone()]
            .into_iter()
            .map(|store| {
                let (barrier, after) = (Arc::clone(&barrier), Arc::clone(&after));
                tokio::spawn(async move {
                    barrier.wait().await;
                    let pass = store.begin_pass(run).await.unwrap();
                    // Both have tried before either lets go.
                    after.wait().await;
                    let held = pass.is_some();
                    if let Some(pass) = pass {
                        pass.commit().await.unwrap();
                    }
                    held
                })
            })
            .collect();
        let mut held = 0;
        for p in passes {
            held += usize::from(bounded("begin_pass race", p).await.unwrap());
        }
        assert_eq!(held, 1, "round {round}: the second scheduler must get None");
        // Released at commit: the next pass gets it.
        assert!(b.begin_pass(run).await.unwrap().is_some());
    }
}

/// A minimal scheduler pass over the ports (the app's real one lives in
/// `app`): promotes dependents of finished tasks and moves the run.
async fn pass_once(store: &PgStore, run: RunId, dependents: &BTreeMap<&str, Vec<&str>>) -> bool {
    let Some(mut pass) = store.begin_pass(run).await.unwrap() else {
        return false;
    };
    let flagged = pass.take_flagged().await.unwrap();
    let done: Vec<(String, u32)> = flagged
        .iter()
        .filter(|t| t.state == TaskRunState::Succeeded)
        .flat_map(|t| dependents.get(t.key.as_str()).into_iter().flatten())
        .map(|k| ((*k).to_owned(), 1))
        .collect();
    pass.satisfy_dependencies(&done).await.unwrap();
    let tally = pass.tally().await.unwrap();
    if tally.any_started && pass.run().state == flowforge_domain::RunState::Pending {
        assert!(pass.transition_run(RunTransition::Start).await.unwrap());
    }
    if tally.active() == 0 && tally.succeeded == tally.total() {
        assert!(pass.transition_run(RunTransition::Succeed).await.unwrap());
    }
    pass.commit().await.unwrap();
    true
}

/// Two schedulers and a worker loop drive diamond runs to the end: every
/// readiness has one outbox row and one event, every run one start and
/// one succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schedulers_drive_runs_without_duplicates() {
    let db = test_db!();
    let (s1, _) = db.store().await;
    let (s2, _) = db.store().await;
    let (w, _) = db.store().await;
    let wf = s1
        .publish_definition(&def(json!({"name": "diamond", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]},
            {"key": "c", "task_type": "noop", "depends_on": ["a"]},
            {"key": "d", "task_type": "noop", "depends_on": ["b", "c"]}
        ]})))
        .await
        .unwrap()
        .id;
    let mut runs = Vec::new();
    for _ in 0..10 {
        runs.push(s1.start_run(wf, json!({})).await.unwrap());
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let schedulers: Vec<_> = [s1.clone(), s2.clone()]
        .into_iter()
        .map(|store| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let dependents: BTreeMap<&str, Vec<&str>> =
                    BTreeMap::from([("a", vec!["b", "c"]), ("b", vec!["d"]), ("c", vec!["d"])]);
                while !stop.is_cancelled() {
                    for run in store.runs_with_work(Scope::All, 100).await.unwrap() {
                        pass_once(&store, run, &dependents).await;
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let worker_loop = {
        let (store, stop) = (w.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let Some(mut sweep) = store
                    .begin_sweep(Scope::All, 16, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
                    .await
                    .unwrap()
                else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let batch = sweep.dispatches().to_vec();
                let ids: Vec<_> = batch.iter().map(|d| d.dispatch_id).collect();
                sweep.mark_published(&ids).await.unwrap();
                sweep.commit().await.unwrap();
                for d in batch {
                    let me = worker("w");
                    if let Some(c) = store
                        .claim_task_run(d.task_run_id, d.fencing_token, &me, LONG_LEASE)
                        .await
                        .unwrap()
                    {
                        store
                            .finish_task_run(c.task_run_id, c.token, &me, succeeded("w"))
                            .await
                            .unwrap();
                    }
                }
            }
        })
    };
    bounded("diamond runs", async {
        loop {
            let mut finished = 0;
            for run in &runs {
                let detail = s1.get_run(*run).await.unwrap().unwrap();
                if detail.summary.state == flowforge_domain::RunState::Succeeded {
                    finished += 1;
                }
            }
            if finished == runs.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.cancel();
    for s in schedulers {
        s.await.unwrap();
    }
    worker_loop.await.unwrap();
    for run in runs {
        let detail = s1.get_run(run).await.unwrap().unwrap();
        let count = |task: Option<&str>, transition: &str| {
            detail
                .events
                .iter()
                .filter(|e| e.task.as_deref() == task && e.transition == transition)
                .count()
        };
        for key in ["b", "c", "d"] {
            assert_eq!(count(Some(key), "dependencies_satisfied"), 1, "{key}");
        }
        for key in ["a", "b", "c", "d"] {
            assert_eq!(
                (count(Some(key), "claim"), count(Some(key), "succeed")),
                (1, 1),
                "{key}"
            );
        }
        assert_eq!((count(None, "start"), count(None, "succeed")), (1, 1));
        let (rows, distinct): (i64, i64) =
            sqlx::query_as("SELECT count(*), count(DISTINCT task_run_id) FROM outbox WHERE run_id = $1")
                .bind(run.0)
                .fetch_one(s1.pool())
                .await
                .unwrap();
        assert_eq!((rows, distinct), (4, 4), "one outbox row per readiness");
    }
}

/// Waits until some backend of this database waits on a row lock: the
/// statement under test has reached the lock the test holds.
async fn until_a_backend_waits_on_a_lock(raw: &sqlx::PgPool) {
    bounded("a backend to wait on the held lock", async {
        loop {
            let (waiting,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(raw)
            .await
            .unwrap();
            if waiting > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// The run row's lock as a cancel request takes it.
const AS_A_CANCEL_REQUEST: &str = "SELECT id FROM workflow_run WHERE id = $1 FOR UPDATE";
/// The run row's lock as a finish handing on takes it.
const AS_A_HANDOFF: &str = "SELECT id FROM workflow_run WHERE id = $1 FOR KEY SHARE";

/// A transaction holding the run's row by `lock` (one of the above),
/// until it is committed.
async fn holding_run_row(
    raw: &sqlx::PgPool,
    run: RunId,
    lock: &'static str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = raw.begin().await.unwrap();
    sqlx::query(lock).bind(run.0).execute(&mut *tx).await.unwrap();
    tx
}

async fn claimed_chain(store: &PgStore) -> (RunId, flowforge_ports::Claim) {
    let wf = store
        .publish_definition(&def(json!({
            "name": "handoff", "version": 1,
            "tasks": [{"key": "a", "task_type": "noop"}, {"key": "b", "task_type": "noop", "depends_on": ["a"]}]
        })))
        .await
        .unwrap()
        .id;
    let run = store.start_run(wf, json!({})).await.unwrap();
    let (id, token) = ready(store, run, "a").await;
    let claim = store
        .claim_task_run(id, token, &worker("w"), LONG_LEASE)
        .await
        .unwrap()
        .expect("the claim wins");
    (run, claim)
}

/// A handoff and a cancel request are serialized on the run row
/// (docs/design/scheduler.md#handoff): a finish that meets a cancel request
/// still in flight waits for it and then hands nothing on, so no dependent
/// becomes ready behind the back of the pass that cancels waiting tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handoff_waits_for_a_cancel_request_in_flight_and_then_hands_on_nothing() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let raw = db.raw().await;
    let (run, claim) = claimed_chain(&store).await;
    // The cancel request, held open: its lock as REQUEST_CANCEL takes it.
    let mut cancel = holding_run_row(&raw, run, AS_A_CANCEL_REQUEST).await;
    sqlx::query("UPDATE workflow_run SET cancel_requested_at = now(), needs_pass = true WHERE id = $1")
        .bind(run.0)
        .execute(&mut *cancel)
        .await
        .unwrap();
    let finishing = {
        let store = store.clone();
        let handoff = flowforge_domain::plan::Handoff {
            dependents: vec!["b".to_owned()],
            joins: Vec::new(),
            whole: true,
        };
        tokio::spawn(async move {
            store
                .finish_and_hand_off(
                    claim.task_run_id,
                    claim.token,
                    &worker("w"),
                    succeeded("w"),
                    &handoff,
                    Handover::Sweep,
                )
                .await
                .map(|finished| finished.result)
        })
    };
    until_a_backend_waits_on_a_lock(&raw).await;
    cancel.commit().await.unwrap();
    assert_eq!(
        bounded("the finish", finishing).await.unwrap().unwrap(),
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
    assert_eq!(task(&store, run, "b").await.state, TaskRunState::Pending);
    let mut pass = store.begin_pass(run).await.unwrap().expect("the run is free");
    let flagged = pass.take_flagged().await.unwrap();
    assert!(
        flagged.iter().any(|t| t.key == "a"),
        "the success is left to the pass: {flagged:?}"
    );
}

/// The other order: a cancel request waits for a finish that holds the run
/// row as a handoff does, while a scheduler pass does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_request_waits_for_a_handoff_and_a_pass_does_not() {
    let db = test_db!();
    let (store, _) = db.store().await;
    let raw = db.raw().await;
    let (run, _claim) = claimed_chain(&store).await;
    let finish = holding_run_row(&raw, run, AS_A_HANDOFF).await;
    // A pass takes the run at once.
    let pass = bounded("begin_pass", store.begin_pass(run)).await.unwrap();
    assert!(pass.is_some(), "a handoff's lock does not stop a pass");
    drop(pass);
    let cancelling = {
        let store = store.clone();
        tokio::spawn(async move { store.request_cancel(run).await })
    };
    until_a_backend_waits_on_a_lock(&raw).await;
    assert!(!cancelling.is_finished(), "the cancel request waits for the handoff");
    finish.commit().await.unwrap();
    assert!(
        bounded("the cancel request", cancelling)
            .await
            .unwrap()
            .unwrap()
            .is_some()
    );
}

/// A schedule's `cancel_previous` is a cancel request too: it waits for a
/// finish handing on in a run it cancels, as request_cancel does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedules_cancel_previous_waits_for_a_handoff() {
    use flowforge_domain::schedule::Overlap;
    use flowforge_ports::store::{Fire, FireStart, Fired, NewSchedule, ScheduleStore, StartOptions};

    let db = test_db!();
    let (store, _) = db.store().await;
    let raw = db.raw().await;
    let (_, _) = claimed_chain(&store).await;
    let view = store
        .create_schedule(&NewSchedule {
            name: "hourly".to_owned(),
            workflow: "handoff".to_owned(),
            version: Some(1),
            cron: "0 * * * *".to_owned(),
            timezone: "UTC".to_owned(),
            input: json!({}),
            overlap: Overlap::CancelPrevious,
            catchup_window: Duration::from_secs(3600),
        })
        .await
        .unwrap()
        .expect("a new name");
    let start = FireStart {
        workflow: store
            .find_definition("handoff", 1)
            .await
            .unwrap()
            .expect("published")
            .id,
        input: json!({}),
        options: StartOptions::default(),
    };
    let fire = |hours: i64| Fire {
        schedule: view.id,
        missed: &[],
        due: Some((view.cursor + chrono::TimeDelta::hours(hours), &start)),
    };
    let Fired::Recorded { run: Some(first), .. } = store.fire_schedule(&fire(1)).await.unwrap() else {
        panic!("the first fire starts a run");
    };
    let finish = holding_run_row(&raw, first, AS_A_HANDOFF).await;
    let firing = {
        let store = store.clone();
        let start = start.clone();
        let (id, at) = (view.id, view.cursor + chrono::TimeDelta::hours(2));
        tokio::spawn(async move {
            store
                .fire_schedule(&Fire {
                    schedule: id,
                    missed: &[],
                    due: Some((at, &start)),
                })
                .await
        })
    };
    until_a_backend_waits_on_a_lock(&raw).await;
    assert!(!firing.is_finished(), "cancel_previous waits for the handoff");
    finish.commit().await.unwrap();
    let fired = bounded("the fire", firing).await.unwrap().unwrap();
    assert!(
        matches!(fired, Fired::Recorded { cancelled: 1, .. }),
        "the first run is asked to cancel: {fired:?}"
    );
}
