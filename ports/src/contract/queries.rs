//! Contract cases: cancel requests and the queries the scheduler plans with.

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_domain::{RunState, RunTransition};
use serde_json::json;

use crate::ids::RunId;
use crate::store::{CancelOutcome, RunPass, RunSet, RunStore, Scope, Topic};

use super::*;

/// A cancel request is recorded once, flags the run for a pass, and is
/// refused for a finished run; an unknown run is `None`.
pub async fn request_cancel_reports_each_outcome<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert_eq!(s.request_cancel(RunId(uuid::Uuid::nil())).await.expect("cancel"), None);
    let run = start(&s, chain()).await;
    let notifier = s.notifier().await.expect("notifier");
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::Requested)
    );
    assert!(
        woke(&notifier, Topic::Scheduler).await,
        "a cancel request wakes the scheduler"
    );
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::AlreadyRequested)
    );
    let detail = s.get_run(run).await.expect("get_run").expect("exists");
    assert!(detail.summary.cancel_requested);
    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [run]);

    let mut p = pass(&s, run).await;
    assert!(p.run().cancel_requested);
    p.take_flagged().await.expect("take_flagged");
    let mut cancelled = p.cancel_waiting().await.expect("cancel_waiting");
    cancelled.sort();
    assert_eq!(cancelled, ["a", "b", "c"]);
    assert!(
        p.transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel")
    );
    p.commit().await.expect("commit");
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(
        s.request_cancel(run).await.expect("cancel"),
        Some(CancelOutcome::AlreadyFinished(RunState::Cancelled))
    );
}

/// `runs_with_work` lists runs with a flagged row, a due retry or an
/// unhandled cancel request, in scope and up to the limit;
/// `next_deadline` is the earliest lease end or retry in scope.
pub async fn runs_with_work_and_next_deadline_follow_active_work<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(s.next_deadline(Scope::All).await.expect("deadline"), None);
    let p = publish(&s, chain()).await;
    let first = s.start_run(p.id, json!({})).await.expect("start");
    let second = s.start_run(p.id, json!({})).await.expect("start");
    assert!(
        s.runs_with_work(Scope::All, 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );

    claim(&s, first, "a", "w", LONG).await;
    assert_eq!(s.runs_with_work(Scope::All, 10).await.expect("runs_with_work"), [first]);
    assert!(
        s.runs_with_work(Scope::Run(second), 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    assert_eq!(
        s.runs_with_work(Scope::Run(first), 10).await.expect("runs_with_work"),
        [first]
    );
    // A run set is read at each query: its owner changes it between them.
    let set = RunSet::default();
    let tracked = Scope::Runs(set.clone());
    assert!(
        s.runs_with_work(tracked.clone(), 10)
            .await
            .expect("runs_with_work")
            .is_empty(),
        "an empty set holds no run"
    );
    set.insert(second);
    assert!(
        s.runs_with_work(tracked.clone(), 10)
            .await
            .expect("runs_with_work")
            .is_empty()
    );
    set.insert(first);
    assert_eq!(
        s.runs_with_work(tracked.clone(), 10).await.expect("runs_with_work"),
        [first]
    );
    claim(&s, second, "a", "w", Duration::from_secs(100)).await;
    set.remove(first);
    assert_eq!(
        s.runs_with_work(tracked.clone(), 10).await.expect("runs_with_work"),
        [second]
    );
    // Only the run in the set counts: its 300 s lease, not the other's 100 s.
    set.insert(first);
    set.remove(second);
    let in_set = s.next_deadline(tracked).await.expect("deadline").expect("a lease");
    assert!(in_set <= LONG && in_set >= Duration::from_secs(295), "{in_set:?}");
    let both: BTreeSet<RunId> = s
        .runs_with_work(Scope::All, 10)
        .await
        .expect("runs_with_work")
        .into_iter()
        .collect();
    assert_eq!(both, BTreeSet::from([first, second]));
    assert_eq!(s.runs_with_work(Scope::All, 1).await.expect("runs_with_work").len(), 1);

    let all = s.next_deadline(Scope::All).await.expect("deadline").expect("leases");
    assert!(
        all <= Duration::from_secs(100) && all >= Duration::from_secs(95),
        "{all:?}"
    );
    let one = s
        .next_deadline(Scope::Run(first))
        .await
        .expect("deadline")
        .expect("a lease");
    assert!(
        one <= Duration::from_secs(300) && one >= Duration::from_secs(295),
        "{one:?}"
    );
}
