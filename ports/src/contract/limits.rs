//! Contract cases: what a store refuses or keeps changed
//! (docs/design/data-flow.md#limits) — U+0000 in a run input, an output or
//! an error, inputs past their limit, and the cap on stale-write audits.

use flowforge_domain::TaskRunState;
use flowforge_domain::limits::{MAX_STALE_AUDITS_PER_TASK_RUN, Refusal, ValueKind};
use serde_json::json;

use crate::store::{Error, FinishResult, RunStore};

use super::*;

/// A run input holding U+0000 is refused, naming where, and no run exists.
pub async fn start_run_refuses_an_input_holding_nul<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, chain()).await;
    let refused = s.start_run(p.id, json!({"a": ["ok", "x\u{0}y"]})).await;
    assert_eq!(
        refused,
        Err(Error::Refused(Refusal::Nul {
            kind: ValueKind::RunInput,
            path: "$.a[1]".into()
        }))
    );
    assert!(
        s.list_runs(10).await.expect("list_runs").is_empty(),
        "nothing was written"
    );
}

/// An output holding U+0000 is stored as a permanent failure that names
/// where; an error holding it is stored with U+FFFD in its place — on
/// both stores alike, though SQLite could keep the byte.
pub async fn an_unstorable_outcome_is_stored_as_the_domain_says<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, single("nul", 3)).await;
    let c = claim(&s, run, "t", "w", LONG).await;
    assert_eq!(
        finish(&s, &c, "w", succeeded(json!({"a": "\u{0}"}))).await,
        FinishResult::Recorded(TaskRunState::Failed),
        "failed for good although attempts remain"
    );
    let t = view(&s, run, "t").await;
    assert_eq!(t.output, None);
    assert_eq!(
        t.error.as_deref(),
        Some("the task's output holds a NUL character (U+0000) at $.a, which cannot be stored")
    );

    let run = start_again(&s, "nul").await;
    let c = claim(&s, run, "t", "w", LONG).await;
    let failed = failed_for_good("stderr: a\u{0}b");
    assert_eq!(
        finish(&s, &c, "w", failed).await,
        FinishResult::Recorded(TaskRunState::Failed)
    );
    let t = view(&s, run, "t").await;
    assert_eq!(t.error.as_deref(), Some("stderr: a\u{FFFD}b"));
    let last = events_of(&s, run, "t").await.pop().expect("an event");
    assert_eq!(last.error.as_deref(), Some("stderr: a\u{FFFD}b"));
}

/// `task_inputs` refuses outputs that add up past `limit`, counting their
/// compact JSON; at the limit exactly it reads them.
pub async fn task_inputs_past_their_limit_are_refused<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, diamond()).await;
    let a_out = json!({"from": "a", "pad": "x".repeat(100)});
    let b_out = json!(["b", 2]);
    let total = serde_json::to_string(&a_out).expect("json").len() + serde_json::to_string(&b_out).expect("json").len();
    let a = claim(&s, run, "a", "w", LONG).await;
    finish(&s, &a, "w", succeeded(a_out)).await;
    let b = claim(&s, run, "b", "w", LONG).await;
    finish(&s, &b, "w", succeeded(b_out)).await;
    let keys = ["a".to_owned(), "b".to_owned()];
    let read = s.task_inputs(run, &keys, total).await.expect("at the limit");
    assert_eq!(read.outputs.len(), 2);
    // Twice: a store may answer the second read from a cache.
    for _ in 0..2 {
        assert_eq!(
            s.task_inputs(run, &keys, total - 1).await,
            Err(Error::Refused(Refusal::TooLarge {
                kind: ValueKind::TaskInputs,
                bytes: total,
                limit: total - 1
            }))
        );
    }
    // The run input is not counted: it has a limit of its own.
    assert!(s.task_inputs(run, &[], 0).await.is_ok());
}

/// A stale finish is always refused, but only the first
/// `MAX_STALE_AUDITS_PER_TASK_RUN` are recorded per task run.
pub async fn stale_write_audits_are_capped_per_task_run<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let c = claim(&s, run, "a", "w", LONG).await;
    let before = view(&s, run, "a").await;
    let cap = usize::try_from(MAX_STALE_AUDITS_PER_TASK_RUN).expect("a small cap");
    for _ in 0..cap + 5 {
        let result = s
            .finish_task_run(c.task_run_id, c.token + 1, &worker("intruder"), succeeded(json!({})))
            .await
            .expect("finish");
        assert_eq!(result, FinishResult::Stale);
    }
    assert_eq!(view(&s, run, "a").await, before);
    let audits = events_of(&s, run, "a")
        .await
        .into_iter()
        .filter(|e| e.transition == "stale_write_rejected")
        .count();
    assert_eq!(audits, cap);
    // The real owner still finishes.
    assert_eq!(
        finish(&s, &c, "w", succeeded(json!({"ok": true}))).await,
        FinishResult::Recorded(TaskRunState::Succeeded)
    );
}

/// A second run of the published definition `name` (its first run's
/// definition, published again: idempotent).
async fn start_again<S: Store>(s: &S, name: &str) -> RunId {
    start(s, single(name, 3)).await
}
