//! Contract cases: dispatch priorities (docs/design/priorities.md) — what
//! a run and its tasks are dispatched at, and the order a sweep and a poll
//! serve.

use flowforge_domain::Priority;
use serde_json::json;

use crate::store::{DefinitionStore, OutboxSweep, RunStore, Scope, StartOptions};

use super::*;

fn at(p: u8) -> Priority {
    Priority::new(i64::from(p)).expect("on the scale")
}

fn starting_at(p: u8) -> StartOptions {
    StartOptions {
        priority: at(p),
        gates: Vec::new(),
    }
}

/// A workflow of one `noop` task.
async fn one_task<S: Store>(s: &S) -> Published {
    publish(
        s,
        json!({"name": "one", "version": 1, "tasks": [{"key": "t", "task_type": "noop"}]}),
    )
    .await
}

/// Starts a run at each of `priorities`, in order.
async fn start_at<S: Store>(s: &S, p: &Published, priorities: &[u8]) -> Vec<RunId> {
    let mut runs = Vec::new();
    for &priority in priorities {
        runs.push(
            s.start_run_with(p.id, json!({}), &starting_at(priority))
                .await
                .expect("start")
                .id,
        );
    }
    runs
}

/// The run ids and priorities of a sweep, in its order.
async fn swept<S: Store>(s: &S, aging: Duration) -> Vec<(RunId, u8)> {
    let sweep = s
        .begin_sweep(Scope::All, 100, aging)
        .await
        .expect("sweep")
        .expect("rows");
    sweep
        .dispatches()
        .iter()
        .map(|d| (d.run_id, d.priority.get()))
        .collect()
}

/// A sweep serves the highest priority first and, within a priority, the
/// oldest first; the run and its task runs report the priority they were
/// started at.
pub async fn a_sweep_serves_the_highest_priority_first_and_fifo_within_one<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = one_task(&s).await;
    let runs = start_at(&s, &p, &[1, 9, 5, 9, 1]).await;
    let default = s.start_run(p.id, json!({})).await.expect("start");
    assert_eq!(
        swept(&s, DEFAULT_PRIORITY_AGING).await,
        [
            (runs[1], 9),
            (runs[3], 9),
            (runs[2], 5),
            (default, 5),
            (runs[0], 1),
            (runs[4], 1)
        ]
    );
    let summary = s.run_summary(runs[1]).await.expect("read").expect("the run");
    assert_eq!(summary.priority, at(9));
    assert_eq!(view(&s, runs[4], "t").await.priority, at(1));
    assert_eq!(view(&s, default, "t").await.priority, Priority::DEFAULT);
}

/// A task whose definition names a priority is dispatched at it, whatever
/// its run's; the others at the run's. Promotion and compensation keep it.
pub async fn a_task_keeps_its_own_priority_over_its_runs<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(
        &s,
        json!({"name": "mixed", "version": 1, "tasks": [
            {"key": "urgent", "task_type": "noop", "priority": 8},
            {"key": "plain", "task_type": "noop"},
            {"key": "after", "task_type": "noop", "depends_on": ["urgent", "plain"]},
            {"key": "undo", "task_type": "noop", "compensate_for": "urgent", "priority": 0}
        ]}),
    )
    .await;
    let loaded = s.load_definition(p.id).await.expect("load");
    assert_eq!(
        loaded.definition.task("urgent").and_then(|t| t.priority()),
        Some(at(8)),
        "a stored definition keeps its tasks' priorities"
    );
    let run = s
        .start_run_with(p.id, json!({}), &starting_at(2))
        .await
        .expect("start")
        .id;
    let first: Vec<(String, u8)> = unpublished(&s, Scope::Run(run))
        .await
        .iter()
        .map(|d| (d.task_key.clone(), d.priority.get()))
        .collect();
    assert_eq!(first, [("urgent".to_owned(), 8), ("plain".to_owned(), 2)]);
    assert_eq!(view(&s, run, "after").await.priority, at(2));

    // Through a pass: "after" is promoted at its run's priority, and the
    // compensator is created at its own.
    let mut pass = pass(&s, run).await;
    pass.satisfy_dependencies(&[("after".to_owned(), 2)])
        .await
        .expect("promote");
    assert!(
        pass.create_compensator("undo", "urgent").await.expect("create"),
        "the compensator is made"
    );
    pass.commit().await.expect("commit");
    let promoted: Vec<(String, u8)> = dispatches_of(&s, run, "after")
        .await
        .into_iter()
        .chain(dispatches_of(&s, run, "undo").await)
        .map(|d| (d.task_key, d.priority.get()))
        .collect();
    assert_eq!(promoted, [("after".to_owned(), 2), ("undo".to_owned(), 0)]);
}

/// Waiting work gains a level per `aging`: work that became ready more
/// than (difference of priorities) × aging after a waiting dispatch is
/// served after it, whatever its priority.
pub async fn waiting_work_ages_ahead_of_later_urgent_work<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let p = one_task(&s).await;
    let old = s
        .start_run_with(p.id, json!({}), &starting_at(0))
        .await
        .expect("start")
        .id;
    clock.advance(Duration::from_secs(600));
    let new = s
        .start_run_with(p.id, json!({}), &starting_at(9))
        .await
        .expect("start")
        .id;
    // Ten minutes apart: with a level per five minutes the nine levels
    // between them outweigh the wait; with a level per minute they do not.
    assert_eq!(swept(&s, Duration::from_secs(300)).await, [(new, 9), (old, 0)]);
    assert_eq!(swept(&s, Duration::from_secs(60)).await, [(old, 0), (new, 9)]);
}

/// A worker that polls claims in the sweep's order: the highest priority
/// first, the oldest first within one, and waiting work ahead of urgent
/// work that came more than the levels between them × `aging` later.
pub async fn a_poll_claims_in_dispatch_order<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let p = one_task(&s).await;
    let noop = ["noop".to_owned()];
    let w = worker("poller");
    let claim = async |max: u32, aging: Duration| -> Vec<RunId> {
        let got = s.claim_ready(&noop, &w, LONG, max, aging).await.expect("poll");
        got.iter().map(|c| c.run_id).collect()
    };
    let runs = start_at(&s, &p, &[1, 9, 5, 9, 1]).await;
    assert_eq!(
        claim(10, DEFAULT_PRIORITY_AGING).await,
        [runs[1], runs[3], runs[2], runs[0], runs[4]]
    );

    let old = s
        .start_run_with(p.id, json!({}), &starting_at(0))
        .await
        .expect("start")
        .id;
    clock.advance(Duration::from_secs(600));
    let new = s
        .start_run_with(p.id, json!({}), &starting_at(9))
        .await
        .expect("start")
        .id;
    assert_eq!(
        claim(1, Duration::from_secs(300)).await,
        [new],
        "nine levels outweigh ten minutes"
    );
    clock.advance(Duration::from_secs(600));
    let newer = s
        .start_run_with(p.id, json!({}), &starting_at(9))
        .await
        .expect("start")
        .id;
    assert_eq!(
        claim(1, Duration::from_secs(60)).await,
        [old],
        "twenty minutes outweigh nine levels"
    );
    assert_eq!(claim(1, Duration::from_secs(60)).await, [newer]);
}
