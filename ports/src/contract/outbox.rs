//! Contract cases: the outbox sweep.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Barrier;

use crate::queue::Dispatch;
use crate::store::{OutboxStore, OutboxSweep, RunSet, RunStore, Scope};

use super::*;

/// A sweep holds unpublished rows oldest first, bounded by its limit and
/// scope; committed marks publish them, an uncommitted sweep leaves them.
pub async fn outbox_sweeps_oldest_first_within_limit_and_scope<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert!(
        s.begin_sweep(Scope::All, 10, DEFAULT_PRIORITY_AGING)
            .await
            .expect("sweep")
            .is_none()
    );
    let p = publish(&s, diamond()).await;
    let first = s.start_run(p.id, json!({})).await.expect("start");
    let second = s.start_run(p.id, json!({})).await.expect("start");

    let sweep = s
        .begin_sweep(Scope::All, 3, DEFAULT_PRIORITY_AGING)
        .await
        .expect("sweep")
        .expect("rows");
    let held: Vec<Dispatch> = sweep.dispatches().to_vec();
    assert_eq!(held.len(), 3, "the limit bounds a sweep");
    assert!(
        held.windows(2).all(|w| w[0].dispatch_id < w[1].dispatch_id),
        "oldest first"
    );
    assert_eq!(held[0].run_id, first);
    drop(sweep);

    let only = unpublished(&s, Scope::Run(second)).await;
    assert_eq!(only.len(), 2);
    assert!(only.iter().all(|d| d.run_id == second));
    let set = RunSet::default();
    assert!(unpublished(&s, Scope::Runs(set.clone())).await.is_empty());
    set.insert(second);
    assert_eq!(
        unpublished(&s, Scope::Runs(set)).await,
        only,
        "a run set scopes a sweep"
    );

    // Uncommitted marks are lost.
    let mut sweep = s
        .begin_sweep(Scope::All, 10, DEFAULT_PRIORITY_AGING)
        .await
        .expect("sweep")
        .expect("rows");
    let ids: Vec<_> = sweep.dispatches().iter().map(|d| d.dispatch_id).collect();
    sweep.mark_published(&ids).await.expect("mark");
    drop(sweep);
    assert_eq!(unpublished(&s, Scope::All).await.len(), 4, "still unpublished");

    let ids = sweep_published(&s, 2).await;
    let rest = unpublished(&s, Scope::All).await;
    assert_eq!(rest.len(), 2);
    assert!(
        rest.iter().all(|d| !ids.contains(&d.dispatch_id)),
        "published rows are gone"
    );

    // Only the marked rows are published.
    let mut sweep = s
        .begin_sweep(Scope::All, 10, DEFAULT_PRIORITY_AGING)
        .await
        .expect("sweep")
        .expect("rows");
    let one = sweep.dispatches()[0].dispatch_id;
    sweep.mark_published(&[one]).await.expect("mark");
    sweep.commit().await.expect("commit");
    let left = unpublished(&s, Scope::All).await;
    assert_eq!(left.len(), 1);
    assert_ne!(left[0].dispatch_id, one);
}

/// Two sweeps open at once never hold the same row.
pub async fn concurrent_sweeps_never_share_a_row<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    for _ in 0..3 {
        s.start_run(p.id, json!({})).await.expect("start");
    }
    assert_eq!(unpublished(&s, Scope::All).await.len(), 6);

    let opened = Arc::new(Barrier::new(2));
    let compared = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (s, opened, compared) = (s.clone(), opened.clone(), compared.clone());
            tokio::spawn(async move {
                opened.wait().await;
                let sweep = s
                    .begin_sweep(Scope::All, 3, DEFAULT_PRIORITY_AGING)
                    .await
                    .expect("sweep");
                let ids: Vec<_> = sweep
                    .as_ref()
                    .map(|sw| sw.dispatches().iter().map(|d| d.dispatch_id).collect())
                    .unwrap_or_default();
                // Both sweeps stay open until both have chosen their rows.
                compared.wait().await;
                drop(sweep);
                ids
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for h in handles {
        let ids = h.await.expect("sweeper task");
        assert!(!ids.is_empty(), "each sweep finds rows the other does not hold");
        total += ids.len();
        seen.extend(ids);
    }
    assert_eq!(seen.len(), total, "no row was handed to both sweeps");
}

/// Published rows whose task run is still ready at the row's token are
/// unpublished again, within the scope asked and once published at least
/// the age asked, in their dispatch order; a row whose task run was
/// claimed since stays published.
pub async fn lost_dispatches_are_rearmed_within_their_scope<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let p = publish(&s, diamond()).await;
    let first = s.start_run(p.id, json!({})).await.expect("start");
    let second = s.start_run(p.id, json!({})).await.expect("start");
    assert_eq!(
        s.rearm_lost_dispatches(Scope::All, Duration::ZERO)
            .await
            .expect("rearm"),
        0,
        "nothing published, nothing lost"
    );
    let published = unpublished(&s, Scope::All).await;
    assert_eq!(sweep_published(&s, 10).await.len(), 4);
    claim(&s, first, "a", "w", LONG).await;

    assert_eq!(
        s.rearm_lost_dispatches(Scope::Run(second), Duration::ZERO)
            .await
            .expect("rearm"),
        2
    );
    let again = unpublished(&s, Scope::All).await;
    assert!(
        again.iter().all(|d| d.run_id == second),
        "only the scope's rows: {again:?}"
    );
    assert_eq!(again.len(), 2);

    assert_eq!(
        s.rearm_lost_dispatches(Scope::All, Duration::ZERO)
            .await
            .expect("rearm"),
        1,
        "the claimed row stays published"
    );
    let expected: Vec<Dispatch> = published
        .into_iter()
        .filter(|d| !(d.run_id == first && d.task_key == "a"))
        .collect();
    assert_eq!(
        unpublished(&s, Scope::All).await,
        expected,
        "re-armed rows come back as they were, in their dispatch order"
    );
    assert_eq!(
        s.rearm_lost_dispatches(Scope::All, Duration::ZERO)
            .await
            .expect("rearm"),
        0,
        "idempotent"
    );

    // By age: only rows published at least that long ago (store time).
    assert_eq!(sweep_published(&s, 10).await.len(), 3);
    let minute = Duration::from_secs(60);
    assert_eq!(
        s.rearm_lost_dispatches(Scope::All, minute).await.expect("rearm"),
        0,
        "published just now"
    );
    clock.advance(minute + Duration::from_secs(1));
    assert_eq!(s.rearm_lost_dispatches(Scope::All, minute).await.expect("rearm"), 3);
}
