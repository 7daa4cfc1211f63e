//! Contract cases: the event history row by row — every column but the
//! timestamp, written out once here, so the stores cannot drift apart in
//! what an operator reads (docs/design/testing.md#store-contract-suite).

use std::time::Duration;

use flowforge_domain::{CancelReason, RunTransition, TaskRunState};
use serde_json::json;

use crate::ids::{RunId, TaskRunId, WorkflowId};
use crate::store::{DefinitionStore, FinishResult, LeaseStatus, RunPass, RunStore, Scope};

use super::*;

const FINAL: &str = "lease expired on the final attempt";

/// One history entry, whole: `(seq, task, transition, from, to, attempt,
/// token, worker, error)`.
type Row = (
    u64,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    Option<u32>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

async fn rows<S: Store>(s: &S, run: RunId) -> Vec<Row> {
    events(s, run)
        .await
        .into_iter()
        .map(|e| {
            (
                e.seq,
                e.task,
                e.transition,
                e.from,
                e.to,
                e.attempt,
                e.token,
                e.worker,
                e.error,
            )
        })
        .collect()
}

/// Builds the expected rows from `(task, transition, from, to, attempt,
/// token, worker, error)`, numbering them 1, 2, 3, ….
#[allow(clippy::type_complexity)]
fn expect(
    steps: &[(
        Option<&str>,
        &str,
        Option<&str>,
        Option<&str>,
        Option<u32>,
        Option<i64>,
        Option<&str>,
        Option<&str>,
    )],
) -> Vec<Row> {
    let owned = |s: Option<&str>| s.map(str::to_owned);
    steps
        .iter()
        .zip(1..)
        .map(|(&(task, transition, from, to, attempt, token, worker, error), seq)| {
            (
                seq,
                owned(task),
                transition.to_owned(),
                owned(from),
                owned(to),
                attempt,
                token,
                owned(worker),
                owned(error),
            )
        })
        .collect()
}

/// Every kind of event a task run's life writes, with its worker and
/// error: claims, a retryable failure and its retry, a stale finish's audit,
/// a lease reaped with attempts left and on the final attempt, the
/// cancellation of a blocked dependent, and the run's own edges.
pub async fn every_store_writes_the_same_event_rows<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let doc = json!({"name": "rows", "version": 1, "tasks": [
        {"key": "a", "task_type": "flaky", "retry": {"max_attempts": 3, "delay_seconds": 5}},
        {"key": "b", "task_type": "noop", "depends_on": ["a"]}
    ]});
    let run = start(&s, doc).await;
    let first = first_attempt_flakes(&s, &clock, run).await;
    let second = claim(&s, run, "a", "w2", Duration::from_secs(10)).await;
    // The first attempt's worker, late: audited, changes nothing.
    assert_eq!(
        finish(&s, &first, "w1", succeeded(json!({}))).await,
        FinishResult::Stale
    );
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(
        reaped
            .iter()
            .map(|r| (r.task_type.as_str(), r.compensate_for.as_deref(), r.error.as_deref()))
            .collect::<Vec<_>>(),
        [("flaky", None, None)],
        "the reaper says what it reaped"
    );
    let third = claim(&s, run, "a", "w3", Duration::from_secs(10)).await;
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(
        reaped
            .iter()
            .map(|r| (r.task_type.as_str(), r.attempt, r.error.as_deref()))
            .collect::<Vec<_>>(),
        [("flaky", 3, Some(FINAL))],
        "a final reap carries the error the task failed with"
    );
    // The reaped attempt's worker, late: stale as well.
    assert_eq!(
        finish(&s, &second, "w2", succeeded(json!({}))).await,
        FinishResult::Stale
    );
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.cancel_pending(&["b".to_owned()], CancelReason::UpstreamFailed)
        .await
        .expect("cancel_pending");
    p.transition_run(RunTransition::Fail).await.expect("fail");
    p.commit().await.expect("commit");
    assert!(third.token > second.token);

    let (a, b) = (Some("a"), Some("b"));
    let (ready, running, failed) = (Some("ready"), Some("running"), Some("failed"));
    assert_eq!(
        rows(&s, run).await,
        expect(&[
            (a, "claim", ready, running, Some(1), Some(1), Some("w1"), None),
            (None, "start", Some("pending"), running, None, None, None, None),
            (a, "fail", running, failed, Some(1), Some(1), Some("w1"), Some("flake")),
            (
                a,
                "schedule_retry",
                failed,
                Some("retrying"),
                Some(2),
                Some(1),
                Some("w1"),
                None
            ),
            (a, "retry_ready", Some("retrying"), ready, Some(2), Some(1), None, None),
            (a, "claim", ready, running, Some(2), Some(2), Some("w2"), None),
            (
                a,
                "stale_write_rejected",
                None,
                None,
                Some(2),
                Some(1),
                Some("w1"),
                Some("rejected succeed with fencing token 1: the row is running at token 2"),
            ),
            (
                a,
                "reap_lease",
                running,
                ready,
                Some(3),
                Some(3),
                Some("w2"),
                Some("lease expired")
            ),
            (a, "claim", ready, running, Some(3), Some(4), Some("w3"), None),
            (
                a,
                "reap_lease_final",
                running,
                failed,
                Some(3),
                Some(5),
                Some("w3"),
                Some(FINAL)
            ),
            (
                a,
                "stale_write_rejected",
                None,
                None,
                Some(3),
                Some(2),
                Some("w2"),
                Some("rejected succeed with fencing token 2: the row is failed at token 5"),
            ),
            (
                b,
                "cancel_pending",
                Some("pending"),
                Some("cancelled"),
                Some(1),
                Some(0),
                None,
                None
            ),
            (None, "fail", running, failed, None, None, None, None),
        ])
    );
}

/// A lease reaped in a cancel-requested run: `reap_lease` names the worker
/// that lost it, then `cancel_ready` in the same transaction.
pub async fn a_reap_in_a_cancelled_run_writes_the_same_rows<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let run = start(&s, single("rows", 1)).await;
    claim(&s, run, "t", "w1", Duration::from_secs(10)).await;
    assert!(s.request_cancel(run).await.expect("cancel").is_some());
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(
        reaped
            .iter()
            .map(|r| (r.cancelled, r.task_type.as_str(), r.error.as_deref()))
            .collect::<Vec<_>>(),
        [(true, "flaky", None)]
    );
    let t = Some("t");
    assert_eq!(
        rows(&s, run).await,
        expect(&[
            (
                t,
                "claim",
                Some("ready"),
                Some("running"),
                Some(1),
                Some(1),
                Some("w1"),
                None
            ),
            (
                t,
                "reap_lease",
                Some("running"),
                Some("ready"),
                Some(2),
                Some(2),
                Some("w1"),
                Some("lease expired"),
            ),
            (
                t,
                "cancel_ready",
                Some("ready"),
                Some("cancelled"),
                Some(2),
                Some(2),
                None,
                None
            ),
        ])
    );
}

/// What the stores answer about ids they never had, answer by answer, error
/// texts included: a caller (the CLI, the API) reports the same thing
/// whichever store it runs on.
pub async fn unknown_ids_are_answered_alike<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (workflow, run, task_run) = (WorkflowId(999_999), RunId(uuid::Uuid::nil()), TaskRunId(999_999));
    let w = worker("w");
    let text = |e: &dyn std::fmt::Display| e.to_string();
    assert_eq!(
        s.load_definition(workflow).await.map(|_| ()).map_err(|e| text(&e)),
        Err("workflow definition id 999999 not found".to_owned())
    );
    assert!(s.find_definition("nothing", 1).await.expect("find").is_none());
    assert_eq!(
        s.start_run(workflow, json!({})).await.map_err(|e| text(&e)),
        Err("store error: workflow definition id 999999 not found".to_owned())
    );
    assert_eq!(
        s.task_inputs(run, &["a".to_owned()], 1024)
            .await
            .map(|_| ())
            .map_err(|e| text(&e)),
        Err(format!("store error: run {run} not found"))
    );
    assert_eq!(s.request_cancel(run).await.expect("request_cancel"), None);
    assert!(s.get_run(run).await.expect("get_run").is_none());
    assert!(s.run_summary(run).await.expect("run_summary").is_none());
    assert!(s.run_events(run, 0, 10).await.expect("run_events").is_empty());
    assert!(s.claim_task_run(task_run, 1, &w, LONG).await.expect("claim").is_none());
    assert!(!s.dispatch_is_current(task_run, 1).await.expect("dispatch_is_current"));
    assert_eq!(
        s.renew_lease(task_run, 1, LONG).await.expect("renew"),
        LeaseStatus::Lost
    );
    assert_eq!(
        s.report_progress(task_run, 1, &json!({"p": 1}), LONG)
            .await
            .expect("progress"),
        LeaseStatus::Lost
    );
    assert_eq!(
        s.finish_task_run(task_run, 1, &w, succeeded(json!({})))
            .await
            .expect("finish"),
        FinishResult::Stale
    );
    assert_eq!(
        s.transition_task_run(task_run, TaskRunState::Pending, TaskRunState::Ready)
            .await
            .map_err(|e| text(&e)),
        Ok(false)
    );
}
