//! Contract cases: mapped tasks (docs/design/map.md): a mapped task
//! expands once into children that claim, dispatch and reap as tasks of
//! their mapped task's type, is collected in index order within the output
//! limit, and ends `fail_map` or skipped `empty_map` as told.

use std::time::Duration;

use flowforge_domain::map::Children;
use flowforge_domain::{SkipReason, TaskRunState, TaskTransition};
use serde_json::json;

use crate::store::{Collect, RunPass, RunStore, Scope};

use super::*;

/// `src` → `m`, mapped over `src`'s output, of type `work`, two attempts.
fn mapped() -> Value {
    json!({"name": "mapped", "version": 1, "tasks": [
        {"key": "src", "task_type": "noop"},
        {"key": "m", "task_type": "work", "depends_on": ["src"], "retry": {"max_attempts": 2},
         "map": {"over": "$.tasks.src.output", "concurrency": 2}}
    ]})
}

/// A run of [`mapped`] whose source succeeded with `output`, and its first
/// pass, which has lowered `m`'s counter for it.
async fn source_done<S: Store>(s: &S, output: Value) -> (RunId, S::Pass) {
    let run = start(s, mapped()).await;
    let src = claim(s, run, "src", "w", LONG).await;
    finish(s, &src, "w", succeeded(output)).await;
    let mut p = pass(s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let released = p.satisfy_dependencies(&[("m".into(), 1)]).await.expect("satisfy");
    assert!(released.is_empty(), "the mapped task is held");
    (run, p)
}

/// Expanding puts in the children once, pending; a mapped task once
/// expanded is decided (left out of `pending_counts`) and never made
/// ready; children released are dispatched, claimed and reaped as tasks of
/// the mapped task's type, with its retry policy.
pub async fn a_mapped_task_expands_once_into_children_of_its_type<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    let (run, mut p) = source_done(&s, json!(["a", "b", "c"])).await;
    assert_eq!(
        p.pending_counts(&["m".into()]).await.expect("pending_counts"),
        [("m".into(), 1)],
        "the mapped task waits on its hold"
    );
    assert!(p.expand_map("m", 3).await.expect("expand_map"));
    assert!(!p.expand_map("m", 3).await.expect("expand_map"), "once only");
    assert_eq!(
        p.pending_counts(&["m".into()]).await.expect("pending_counts"),
        Vec::<(String, u32)>::new(),
        "expanded, it is decided"
    );
    let released = p
        .satisfy_dependencies(&[("m[0]".into(), 1), ("m[1]".into(), 1)])
        .await
        .expect("satisfy");
    assert_eq!(released, ["m[0]", "m[1]"]);
    assert_eq!(
        p.map_children("m", 5).await.expect("map_children"),
        Children {
            size: Some(3),
            succeeded: 0,
            active: 2,
            failed: None,
            waiting: vec![2],
        }
    );
    p.commit().await.expect("commit");
    assert_eq!(view(&s, run, "m").await.state, TaskRunState::Pending);
    let types: Vec<(String, String)> = unpublished(&s, Scope::All)
        .await
        .into_iter()
        .filter(|d| d.task_key.starts_with("m["))
        .map(|d| (d.task_key, d.task_type))
        .collect();
    assert_eq!(
        types,
        [("m[0]".into(), "work".into()), ("m[1]".into(), "work".into())],
        "a child's dispatch names its mapped task's type"
    );
    let claims = s
        .claim_ready(
            &["work".into()],
            &worker("w"),
            Duration::from_secs(10),
            1,
            Duration::ZERO,
        )
        .await
        .expect("claim_ready");
    assert_eq!(claims.len(), 1, "a child is claimed by its mapped task's type");
    clock.advance(Duration::from_secs(11));
    let reaped = s.reap_expired_leases(Scope::All, 10).await.expect("reap");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].task_key, claims[0].task_key);
    assert_eq!(reaped[0].task_type, "work");
    assert_eq!(
        reaped[0].transition,
        TaskTransition::ReapLease,
        "the mapped task's second attempt is left"
    );
}

/// Every child succeeded: `collect` stores their outputs in index order,
/// unless the array would pass the limit; a child failed for good is
/// reported with its error, `fail_map` and an `empty_map` skip are stored
/// as told, and the children still waiting are cancelled
/// `upstream_failed`.
pub async fn a_mapped_task_collects_in_index_order_within_the_limit_or_fails<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let (run, mut p) = source_done(&s, json!(["a", "b", "c"])).await;
    assert!(p.expand_map("m", 2).await.expect("expand_map"));
    p.satisfy_dependencies(&[("m[0]".into(), 1), ("m[1]".into(), 1)])
        .await
        .expect("satisfy");
    assert_eq!(
        p.collect_map("m", 1 << 20).await.expect("collect_map"),
        Collect::NotReady
    );
    p.commit().await.expect("commit");
    for (key, output) in [("m[1]", json!({"i": 1})), ("m[0]", json!({"i": 0}))] {
        let c = claim(&s, run, key, "w", LONG).await;
        finish(&s, &c, "w", succeeded(output)).await;
    }
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let children = p.map_children("m", 0).await.expect("map_children");
    assert_eq!((children.succeeded, children.active), (2, 0));
    // `[{"i":0},{"i":1}]` is 17 bytes.
    assert_eq!(
        p.collect_map("m", 16).await.expect("collect_map"),
        Collect::TooLarge(17)
    );
    assert_eq!(p.collect_map("m", 17).await.expect("collect_map"), Collect::Collected);
    let flagged = p.take_flagged().await.expect("take_flagged");
    assert!(
        flagged
            .iter()
            .any(|t| t.key == "m" && t.state == TaskRunState::Succeeded)
    );
    p.commit().await.expect("commit");
    let m = view(&s, run, "m").await;
    assert_eq!(m.output, Some(json!([{"i": 0}, {"i": 1}])), "index order");
    let inputs = s.task_inputs(run, &["m".into()], 17).await.expect("task_inputs");
    assert_eq!(
        inputs.outputs["m"],
        json!([{"i": 0}, {"i": 1}]),
        "the collected output counts at its compact size"
    );
    assert_eq!(transitions(&events_of(&s, run, "m").await), ["collect"]);

    let (run, mut p) = source_done(&s, json!(["a", "b", "c"])).await;
    assert!(p.expand_map("m", 3).await.expect("expand_map"));
    p.satisfy_dependencies(&[("m[0]".into(), 1), ("m[1]".into(), 1)])
        .await
        .expect("satisfy");
    p.commit().await.expect("commit");
    let c = claim(&s, run, "m[0]", "w", LONG).await;
    let failure = failed_for_good("bad item");
    finish(&s, &c, "w", failure).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    let children = p.map_children("m", 5).await.expect("map_children");
    assert_eq!(children.failed, Some((0, Some("bad item".into()))));
    assert_eq!(children.waiting, [2]);
    assert!(
        p.fail_pending("m", TaskTransition::FailMap, "child m[0] failed: bad item")
            .await
            .expect("fail_pending")
    );
    let cancelled = p.cancel_children("m").await.expect("cancel_children");
    assert_eq!(cancelled.len(), 2, "the ready and the held-back child: {cancelled:?}");
    p.commit().await.expect("commit");
    assert_eq!(transitions(&events_of(&s, run, "m").await), ["fail_map"]);
    assert_eq!(view(&s, run, "m").await.state, TaskRunState::Failed);
    assert_eq!(
        transitions(&events_of(&s, run, "m[1]").await),
        ["dependencies_satisfied", "cancel_ready"]
    );
    assert_eq!(transitions(&events_of(&s, run, "m[2]").await), ["cancel_pending"]);
    let m2 = view(&s, run, "m[2]").await;
    assert_eq!(m2.cancel_reason, Some(flowforge_domain::CancelReason::UpstreamFailed));

    let (run, mut p) = source_done(&s, json!([])).await;
    let skipped = p
        .skip_pending(&["m".into()], SkipReason::EmptyMap)
        .await
        .expect("skip_pending");
    assert_eq!(skipped, ["m"]);
    p.commit().await.expect("commit");
    assert_eq!(view(&s, run, "m").await.skip_reason, Some(SkipReason::EmptyMap));
}
