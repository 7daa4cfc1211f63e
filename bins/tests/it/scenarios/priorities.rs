//! Dispatch priorities in the embedded engine (docs/design/priorities.md):
//! one worker slot serves queued work highest priority first, FIFO within
//! a priority, and waiting work ages past later urgent work within the
//! starvation bound.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_domain::Priority;
use flowforge_ports::Scope;
use serde_json::{Value, json};

use super::{PATIENCE, Scenario, scenario};

const AGING: Duration = Duration::from_secs(60);

/// A scenario with one worker slot and a `job` task type that records the
/// `n` of each run it serves, in the order it serves them.
async fn single_slot() -> (Scenario, Arc<Mutex<Vec<u64>>>) {
    let served = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&served);
    let s = scenario(move |b| {
        b.concurrency(1)
            .priority_aging(AGING)
            .handler_fn("job", move |ctx: TaskContext| {
                let record = Arc::clone(&record);
                async move {
                    let n = ctx.run_input["n"]
                        .as_u64()
                        .ok_or_else(|| HandlerError::permanent("no n"))?;
                    record.lock().unwrap_or_else(PoisonError::into_inner).push(n);
                    Ok::<Value, HandlerError>(json!({}))
                }
            })
    })
    .await;
    (s, served)
}

fn at(p: u8) -> Priority {
    Priority::new(i64::from(p)).expect("on the scale")
}

/// Starts every run (`n` = its index) before the slot serves any, then
/// serves them all and returns the order they ran in.
async fn serve_all(s: &Scenario, served: &Mutex<Vec<u64>>, priorities: &[u8], between: Duration) -> Vec<u64> {
    let workflow = s
        .publish_def(&json!({"name": "job", "version": 1, "tasks": [{"key": "t", "task_type": "job"}]}))
        .await;
    let mut runs = Vec::new();
    for (n, p) in priorities.iter().enumerate() {
        runs.push(
            s.engine
                .start_with_priority(workflow, json!({"n": n}), at(*p))
                .await
                .expect("start"),
        );
        s.clock.advance(between);
    }
    let serving = s.engine.serve(Scope::All);
    for run in runs {
        let state = tokio::time::timeout(PATIENCE, s.engine.wait(run))
            .await
            .expect("the run ends in time")
            .expect("wait");
        assert_eq!(state, RunState::Succeeded);
    }
    serving.stop().await.expect("a clean stop");
    served.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_serves_the_highest_priority_first_and_fifo_within_one() {
    let (s, served) = single_slot().await;
    let order = serve_all(&s, &served, &[0, 3, 9, 5, 9, 1, 5], Duration::ZERO).await;
    assert_eq!(order, [2, 4, 3, 6, 1, 5, 0]);
}

/// A steady stream of priority-9 work, one run a minute, behind one
/// priority-0 run: with a level gained per minute of waiting, the
/// priority-0 run goes before every priority-9 run that became ready nine
/// minutes or more after it, and after those that came sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_low_priority_run_starts_within_the_starvation_bound() {
    let (s, served) = single_slot().await;
    let mut priorities = vec![0];
    priorities.extend([9; 14]);
    let order = serve_all(&s, &served, &priorities, AGING).await;
    let low = order.iter().position(|n| *n == 0).expect("the low-priority run ran");
    // Run n (n ≥ 1) became ready n minutes after run 0: runs 1 to 8 are
    // within the bound and go first; run 9 ties on the order key and goes
    // after (the older dispatch wins a tie); the rest follow.
    assert_eq!(order[..low], [1, 2, 3, 4, 5, 6, 7, 8], "{order:?}");
    assert_eq!(order[low + 1..], [9, 10, 11, 12, 13, 14], "{order:?}");
}
