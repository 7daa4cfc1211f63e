//! Contract cases: workers that poll for ready task runs by type instead of
//! consuming dispatches, and the progress an attempt reports.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::TaskRunState;
use serde_json::json;
use tokio::sync::Barrier;

use crate::ids::TaskRunId;
use crate::store::{Error, LeaseStatus, RunStore, Scope};

use super::*;

fn types(names: &[&str]) -> Vec<String> {
    names.iter().map(|&n| n.to_owned()).collect()
}

/// A poll claims ready rows of the asked types only, oldest first, at most
/// `max`, each with the `claim` edge; the dispatch of a polled row is no
/// longer current and claims nothing.
pub async fn claim_ready_takes_ready_rows_of_the_asked_types<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    let (a, b) = (view(&s, run, "a").await, view(&s, run, "b").await);
    let w = worker("poller");
    assert!(
        s.claim_ready(&types(&["noop"]), &w, LONG, 0, DEFAULT_PRIORITY_AGING)
            .await
            .expect("poll")
            .is_empty()
    );
    assert!(
        s.claim_ready(&[], &w, LONG, 10, DEFAULT_PRIORITY_AGING)
            .await
            .expect("poll")
            .is_empty()
    );
    assert!(
        s.claim_ready(&types(&["undo", "nothing"]), &w, LONG, 10, DEFAULT_PRIORITY_AGING)
            .await
            .expect("poll")
            .is_empty(),
        "pending tasks and unmaterialised compensators are not ready"
    );
    assert!(s.dispatch_is_current(b.id, b.token).await.expect("current"));

    let got = s
        .claim_ready(&types(&["echo"]), &w, LONG, 10, DEFAULT_PRIORITY_AGING)
        .await
        .expect("poll");
    assert_eq!(got.len(), 1, "only the asked type");
    let c = &got[0];
    assert_eq!((c.task_run_id, c.run_id, c.task_key.as_str()), (b.id, run, "b"));
    assert_eq!(c.attempt, 1);
    assert!(c.token > b.token, "a polled claim bumps the token");
    let now = view(&s, run, "b").await;
    assert_eq!((now.state, now.token), (TaskRunState::Running, c.token));
    assert_eq!(now.lease_owner.as_deref(), Some("poller"));
    assert_eq!(transitions(&events_of(&s, run, "b").await), ["claim"]);

    assert!(!s.dispatch_is_current(b.id, b.token).await.expect("current"));
    assert!(
        s.claim_task_run(b.id, b.token, &worker("consumer"), LONG)
            .await
            .expect("claim")
            .is_none(),
        "the dispatch of a polled row claims nothing"
    );
    assert!(s.dispatch_is_current(a.id, a.token).await.expect("current"));
    assert!(!s.dispatch_is_current(TaskRunId(i64::MAX), 0).await.expect("current"));

    let got = s
        .claim_ready(&types(&["noop", "echo"]), &w, LONG, 1, DEFAULT_PRIORITY_AGING)
        .await
        .expect("poll");
    assert_eq!(got.iter().map(|c| c.task_key.as_str()).collect::<Vec<_>>(), ["a"]);
    assert!(
        s.claim_ready(&types(&["noop", "echo"]), &w, LONG, 10, DEFAULT_PRIORITY_AGING)
            .await
            .expect("poll")
            .is_empty()
    );
}

/// A cancel request stops polled claims of forward tasks as it stops
/// dispatched ones.
pub async fn claim_ready_skips_forward_tasks_of_cancel_requested_runs<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    s.request_cancel(run).await.expect("cancel").expect("the run exists");
    let got = s
        .claim_ready(
            &types(&["noop", "echo"]),
            &worker("w"),
            LONG,
            10,
            DEFAULT_PRIORITY_AGING,
        )
        .await
        .expect("poll");
    assert!(got.is_empty(), "no forward task of a cancel-requested run is claimed");
}

/// Pollers and dispatch consumers racing for the same rows: each row is
/// claimed exactly once.
pub async fn pollers_and_consumers_claim_each_row_once<F: StoreFactory>(factory: &F) {
    const RUNS: usize = 6;
    const POLLERS: usize = 3;
    let (s, _) = fresh(factory).await;
    let p = publish(&s, single("polled", 1)).await;
    let mut rows = Vec::new();
    for _ in 0..RUNS {
        let run = s.start_run(p.id, json!({})).await.expect("start_run");
        rows.push((run, view(&s, run, "t").await));
    }
    let barrier = Arc::new(Barrier::new(POLLERS + RUNS));
    let mut handles = Vec::new();
    for i in 0..POLLERS {
        let (s, barrier) = (s.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            s.claim_ready(
                &types(&["flaky"]),
                &worker(&format!("poller{i}")),
                LONG,
                2,
                DEFAULT_PRIORITY_AGING,
            )
            .await
            .expect("claim_ready")
        }));
    }
    for (i, (_, row)) in rows.iter().enumerate() {
        let (s, barrier, row) = (s.clone(), barrier.clone(), row.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            s.claim_task_run(row.id, row.token, &worker(&format!("consumer{i}")), LONG)
                .await
                .expect("claim_task_run")
                .into_iter()
                .collect()
        }));
    }
    let mut won = Vec::new();
    for h in handles {
        won.extend(h.await.expect("claimer").into_iter().map(|c| c.task_run_id));
    }
    let distinct: BTreeSet<TaskRunId> = won.iter().copied().collect();
    assert_eq!(distinct.len(), won.len(), "no row claimed twice: {won:?}");
    for (run, _) in &rows {
        let history = events(&s, *run).await;
        assert!(transitions(&history).iter().filter(|t| **t == "claim").count() <= 1);
    }
    // Whatever the race left ready is claimed by the next poll.
    let rest = s
        .claim_ready(&types(&["flaky"]), &worker("late"), LONG, 100, DEFAULT_PRIORITY_AGING)
        .await
        .expect("poll");
    assert_eq!(won.len() + rest.len(), RUNS, "every row claimed once in the end");
}

/// Progress is stored with a renewal of the lease while the token holds
/// it, kept after the attempt ends, refused from a stale token, and
/// cleared by the next claim.
pub async fn progress_is_fenced_and_cleared_by_the_next_claim<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("progress", 3)).await;
    let c = claim(&s, run, "t", "w", Duration::from_secs(10)).await;
    assert_eq!(view(&s, run, "t").await.progress, None);
    clock.advance(Duration::from_secs(8));
    let status = s
        .report_progress(
            c.task_run_id,
            c.token,
            &json!({"done": 3, "of": 10}),
            Duration::from_secs(10),
        )
        .await
        .expect("report_progress");
    assert_eq!(
        status,
        LeaseStatus::Held {
            cancel_requested: false
        }
    );
    assert_eq!(view(&s, run, "t").await.progress, Some(json!({"done": 3, "of": 10})));
    match s.report_progress(c.task_run_id, c.token, &json!("a\u{0}b"), LONG).await {
        Err(Error::Refused(_)) => {}
        other => panic!("a NUL in progress must be refused, got {other:?}"),
    }

    // The report, 8 s into a 10 s lease, renewed it: 3 s later (past the
    // claim's expiry) it still holds.
    clock.advance(Duration::from_secs(3));
    assert!(
        s.reap_expired_leases(Scope::All, 10).await.expect("reap").is_empty(),
        "renewed by the report"
    );
    clock.advance(Duration::from_secs(10));
    assert_eq!(s.reap_expired_leases(Scope::All, 10).await.expect("reap").len(), 1);

    let stale = s
        .report_progress(c.task_run_id, c.token, &json!({"done": 9}), LONG)
        .await
        .expect("report_progress");
    assert_eq!(stale, LeaseStatus::Lost, "a reaped attempt reports nothing");
    assert_eq!(view(&s, run, "t").await.progress, Some(json!({"done": 3, "of": 10})));
    let again = claim(&s, run, "t", "w2", LONG).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(
        view(&s, run, "t").await.progress,
        None,
        "the next claim starts with none"
    );
}
