//! Properties of the embedded engine over random workflow shapes with
//! planned failures (docs/design/testing.md#property-tests): every run
//! settles as the derivation rules say, dependents of a failure are
//! cancelled `upstream_failed`, compensators run in reverse dependency
//! order; and the same definitions give the same report on SQLite and on
//! PostgreSQL.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flowforge_adapters_inproc::InprocQueue;
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_app::{Engine, EngineConfig, HandlerRegistry, RunReport};
use flowforge_domain::derive::{CompensationProgress, TaskTally, Verdict, derive_run_state};
use flowforge_domain::{CancelReason, RunState, TaskRunState};
use flowforge_ports::{HandlerError, Store, SystemClock, TaskContext};
use flowforge_testkit::TestDatabase;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::{definition, store};

/// What a task's handler does, planned by the case.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Succeed,
    /// Fails retryably on its first `n` attempts, then succeeds.
    FailFirst(u32),
    /// Fails permanently: no retry.
    Permanent,
}

#[derive(Debug, Clone)]
struct TaskPlan {
    /// Earlier tasks it depends on (so the index order is topological).
    deps: Vec<usize>,
    max_attempts: u32,
    behaviour: Behaviour,
    compensated: bool,
}

#[derive(Debug, Clone)]
struct Shape {
    tasks: Vec<TaskPlan>,
}

fn shapes(max_tasks: usize) -> impl Strategy<Value = Shape> {
    let behaviour = prop_oneof![
        3 => Just(Behaviour::Succeed),
        2 => (1..=3u32).prop_map(Behaviour::FailFirst),
        1 => Just(Behaviour::Permanent),
    ];
    let task = (
        proptest::collection::vec(prop::bool::weighted(0.3), max_tasks),
        1..=3u32,
        behaviour,
        prop::bool::weighted(0.5),
    );
    proptest::collection::vec(task, 1..=max_tasks).prop_map(|tasks| Shape {
        tasks: tasks
            .into_iter()
            .enumerate()
            .map(|(i, (edges, max_attempts, behaviour, compensated))| TaskPlan {
                deps: (0..i).filter(|j| edges[*j]).collect(),
                max_attempts,
                behaviour,
                compensated,
            })
            .collect(),
    })
}

fn key(i: usize) -> String {
    format!("t{i}")
}

fn undo(i: usize) -> String {
    format!("undo_t{i}")
}

impl Shape {
    /// The definition: each task's plan travels in its `config`, so any
    /// engine over any store runs it alike.
    fn definition(&self) -> Value {
        let mut tasks = Vec::new();
        for (i, t) in self.tasks.iter().enumerate() {
            let (fail_first, permanent) = match t.behaviour {
                Behaviour::Succeed => (0, false),
                Behaviour::FailFirst(n) => (n, false),
                Behaviour::Permanent => (0, true),
            };
            let deps: Vec<String> = t.deps.iter().map(|d| key(*d)).collect();
            tasks.push(json!({"key": key(i), "task_type": "work", "depends_on": deps,
                "config": {"fail_first": fail_first, "permanent": permanent},
                "retry": {"max_attempts": t.max_attempts, "delay_seconds": 0}}));
            if t.compensated {
                tasks.push(json!({"key": undo(i), "task_type": "undo", "compensate_for": key(i)}));
            }
        }
        json!({"name": "shape", "version": 1, "tasks": tasks})
    }

    /// The expected end of each task: (state, attempt, cancel reason).
    fn expected(&self) -> Vec<(TaskRunState, u32, Option<CancelReason>)> {
        let mut out: Vec<(TaskRunState, u32, Option<CancelReason>)> = Vec::new();
        for t in &self.tasks {
            let blocked = t.deps.iter().any(|d| out[*d].0 != TaskRunState::Succeeded);
            out.push(if blocked {
                (TaskRunState::Cancelled, 1, Some(CancelReason::UpstreamFailed))
            } else {
                match t.behaviour {
                    Behaviour::Succeed => (TaskRunState::Succeeded, 1, None),
                    Behaviour::FailFirst(n) if n < t.max_attempts => (TaskRunState::Succeeded, n + 1, None),
                    Behaviour::FailFirst(_) => (TaskRunState::Failed, t.max_attempts, None),
                    Behaviour::Permanent => (TaskRunState::Failed, 1, None),
                }
            });
        }
        out
    }

    /// Whether task `later` depends on task `earlier`, directly or not.
    fn depends_on(&self, later: usize, earlier: usize) -> bool {
        let mut todo = vec![later];
        let mut seen = BTreeSet::new();
        while let Some(k) = todo.pop() {
            for d in &self.tasks[k].deps {
                if *d == earlier {
                    return true;
                }
                if seen.insert(*d) {
                    todo.push(*d);
                }
            }
        }
        false
    }
}

/// `work` follows the plan in its config; `undo` notes that it ran.
fn registry(undone: Arc<Mutex<Vec<String>>>) -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    registry.register_fn("work", |ctx: TaskContext| async move {
        let fail_first = ctx.config.get("fail_first").and_then(Value::as_u64).unwrap_or(0);
        if ctx.config.get("permanent").and_then(Value::as_bool) == Some(true) {
            return Err(HandlerError::permanent("planned permanent failure"));
        }
        if u64::from(ctx.attempt) <= fail_first {
            return Err(HandlerError::retryable(format!("planned failure {}", ctx.attempt)));
        }
        Ok(json!({"key": ctx.task_key, "attempt": ctx.attempt}))
    });
    registry.register_fn("undo", move |ctx: TaskContext| {
        let undone = undone.clone();
        async move {
            undone.lock().unwrap_or_else(PoisonError::into_inner).push(ctx.task_key);
            Ok::<_, HandlerError>(json!({}))
        }
    });
    registry
}

/// Generous: a bound that turns a run that never settles into a failure,
/// not a race against the machine.
const SETTLE: Duration = Duration::from_secs(120);

/// Runs `shape` to its end in an embedded engine over `store`; returns the
/// report and the compensators in the order they ran.
async fn run_on<S: Store>(store: S, shape: &Shape) -> (RunReport, Vec<String>) {
    let undone = Arc::new(Mutex::new(Vec::new()));
    let config = EngineConfig {
        concurrency: 2,
        ..EngineConfig::default()
    };
    let engine = Engine::new(store, InprocQueue::new(), registry(undone.clone()), Vec::new(), config);
    let report = tokio::time::timeout(SETTLE, engine.run(&definition(shape.definition()), json!({})))
        .await
        .expect("the run settles")
        .expect("the engine runs it");
    let undone = undone.lock().unwrap_or_else(PoisonError::into_inner).clone();
    (report, undone)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn check_settled(shape: &Shape, report: &RunReport, undone: &[String]) -> Result<(), TestCaseError> {
    let expected = shape.expected();
    let mut tally = TaskTally::default();
    prop_assert_eq!(report.tasks.len(), shape.tasks.len());
    for t in &report.tasks {
        let i: usize = t.key[1..].parse().expect("a planned key");
        let state: TaskRunState = t.state.parse().expect("a task state");
        let reason: Option<CancelReason> = t.cancel_reason.as_deref().map(|r| r.parse().expect("a reason"));
        prop_assert_eq!((state, t.attempt, reason), expected[i], "task {}", t.key);
        tally.add(state, reason, t.started_at.is_some());
    }

    // The run state is what the derivation rules make of the tasks, once
    // the rollback (if any) is over.
    let state = report.run_state().expect("a run state");
    prop_assert_eq!(
        derive_run_state(&tally, CompensationProgress::Finished),
        Verdict::Settled(state)
    );
    let failed = expected.iter().any(|e| e.0 == TaskRunState::Failed);
    prop_assert_eq!(state, if failed { RunState::Failed } else { RunState::Succeeded });

    // Compensators: exactly those of the succeeded tasks, each once, when
    // the run failed; a dependent is undone before what it depends on.
    let due: BTreeSet<String> = if failed {
        (0..shape.tasks.len())
            .filter(|i| shape.tasks[*i].compensated && expected[*i].0 == TaskRunState::Succeeded)
            .map(undo)
            .collect()
    } else {
        BTreeSet::new()
    };
    prop_assert_eq!(undone.iter().cloned().collect::<BTreeSet<_>>(), due.clone());
    prop_assert_eq!(undone.len(), due.len(), "each compensator runs once");
    let reported: Vec<&str> = report.compensations.iter().map(|c| c.key.as_str()).collect();
    prop_assert_eq!(reported, undone.iter().map(String::as_str).collect::<Vec<_>>());
    prop_assert!(report.compensations.iter().all(|c| c.state == "succeeded"));
    let index = |k: &str| -> usize { k["undo_t".len()..].parse().expect("a planned compensator") };
    for (p, first) in undone.iter().enumerate() {
        for second in &undone[p + 1..] {
            prop_assert!(
                !shape.depends_on(index(second), index(first)),
                "{} ran before {}, which depends on it",
                first,
                second
            );
        }
    }
    Ok(())
}

/// `default` cases, unless `PROPTEST_CASES` asks for more or fewer.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(24), ..ProptestConfig::default() })]

    /// Random shapes with random failures run to a terminal state in the
    /// embedded engine, as the derivation and compensation rules say.
    #[test]
    fn random_shapes_settle_as_the_rules_say(shape in shapes(8)) {
        let (report, undone) = runtime().block_on(async { run_on(store().await, &shape).await });
        check_settled(&shape, &report, &undone)?;
    }
}

/// The report of `shape` run on a fresh PostgreSQL database of the server
/// at `admin`, dropped afterwards.
async fn run_on_postgres(admin: &str, shape: &Shape) -> (RunReport, Vec<String>) {
    let db = TestDatabase::create(admin, "props").await;
    let store = PgStore::connect_unchecked(&db.url, Arc::new(SystemClock), PgOptions::default())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let ran = run_on(store.clone(), shape).await;
    store.pool().close().await;
    ran
}

/// The same random definitions with the same planned failures give the
/// same report on SQLite and on PostgreSQL, once ids, times, tokens and
/// workers are dropped and events are grouped by task
/// ([`RunReport::comparable`]); compensators run in the same order.
#[test]
fn random_shapes_report_alike_on_sqlite_and_postgresql() {
    let Some(admin) = flowforge_testkit::postgres_url() else {
        return;
    };
    let config = ProptestConfig {
        cases: cases(8),
        ..ProptestConfig::default()
    };
    proptest!(config, |(shape in shapes(6))| {
        let rt = runtime();
        let (lite, lite_undone) = rt.block_on(async { run_on(store().await, &shape).await });
        let (pg, pg_undone) = rt.block_on(run_on_postgres(&admin, &shape));
        check_settled(&shape, &pg, &pg_undone)?;
        let text = |r: &RunReport| serde_json::to_string_pretty(&r.comparable()).expect("a report serialises");
        prop_assert_eq!(text(&lite), text(&pg), "comparable reports, SQLite then PostgreSQL");
        prop_assert_eq!(lite_undone, pg_undone, "compensation order");
    });
}
