//! Embedded-mode benchmarks (issue 3): noop tasks through the embedding API
//! over SQLite (WAL, synchronous=NORMAL) and the in-process queue. Prints
//! one JSON object per scenario; `cargo xtask bench` runs it and writes the
//! figures down. Usage: `cargo bench -p flowforge-bins --bench embedded --
//! [fanout|chain|chain40|concurrent|memory]...` (all when none given);
//! `BENCH_EMBEDDED_CONCURRENCY` sets the worker slots (default: CPUs).
//! `chain40` reports the median of 5 runs, each on a fresh engine, and
//! every run's engine time for the spread.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flowforge::{Embedded, EmbeddedEngine, Observer, TaskEvent, WorkflowDefinition};
use serde_json::{Value, json};
use support::{chain, chain_key, dag40, definition, fanout, median, percentile};

/// Records when each task's finish and claim were stored (monotonic clock,
/// at the hooks, which run right after the store commits).
#[derive(Default)]
struct Stamps {
    started: Mutex<HashMap<String, Instant>>,
    succeeded: Mutex<HashMap<String, Instant>>,
}

impl Observer for Stamps {
    fn on_task_start(&self, e: &TaskEvent) {
        self.started
            .lock()
            .expect("lock")
            .insert(e.task_key.clone(), Instant::now());
    }
    fn on_task_succeeded(&self, e: &TaskEvent) {
        self.succeeded
            .lock()
            .expect("lock")
            .insert(e.task_key.clone(), Instant::now());
    }
}

async fn engine(dir: &tempfile::TempDir, stamps: Option<Arc<Stamps>>) -> EmbeddedEngine {
    let cpus = support::env_number(
        "BENCH_EMBEDDED_CONCURRENCY",
        std::thread::available_parallelism().map_or(2, |n| n.get() as u64),
    ) as usize;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let mut builder = Embedded::builder().database(url).concurrency(cpus);
    if let Some(s) = stamps {
        builder = builder.observer(s);
    }
    builder.build().await.expect("engine")
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

async fn run_one(engine: &EmbeddedEngine, def: &WorkflowDefinition) -> Duration {
    let start = Instant::now();
    let report = engine.run(def, json!({})).await.expect("run");
    assert_eq!(report.state, "succeeded", "benchmark run failed: {report:?}");
    start.elapsed()
}

async fn bench_fanout() -> Value {
    let dir = tempfile::tempdir().expect("tmp");
    let engine = engine(&dir, None).await;
    let def = fanout(9_998);
    let wall = run_one(&engine, &def).await;
    let tasks = 10_000.0;
    json!({"scenario": "fanout", "tasks": 10_000, "wall_s": wall.as_secs_f64(), "tasks_per_s": tasks / wall.as_secs_f64(), "peak_rss_kib": peak_rss_kib()})
}

/// A chain of `len` tasks, `runs` times, each on a fresh engine and
/// database: the figures are the runs' medians, with each run's engine time
/// for the spread; the hop and task percentiles pool every run's.
async fn bench_chain(len: usize, name: &str, runs: usize) -> Value {
    let (mut walls, mut engines, mut tasks, mut hops) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let dir = tempfile::tempdir().expect("tmp");
        let stamps = Arc::new(Stamps::default());
        let engine = engine(&dir, Some(stamps.clone())).await;
        let def = chain(len);
        let start = Instant::now();
        let report = engine.run(&def, json!({})).await.expect("run");
        walls.push(start.elapsed().as_secs_f64());
        assert_eq!(report.state, "succeeded", "benchmark run failed: {report:?}");
        engines.push(engine_seconds(&report));
        let started = stamps.started.lock().expect("lock");
        let succeeded = stamps.succeeded.lock().expect("lock");
        // From the claim's commit to the finish's: the task's own cost.
        tasks.extend((0..len).filter_map(|i| {
            let claimed = started.get(&chain_key(i))?;
            let finished = succeeded.get(&chain_key(i))?;
            Some(finished.saturating_duration_since(*claimed).as_secs_f64() * 1000.0)
        }));
        hops.extend((1..len).filter_map(|i| {
            let prev = succeeded.get(&chain_key(i - 1))?;
            let next = started.get(&chain_key(i))?;
            Some(next.saturating_duration_since(*prev).as_secs_f64() * 1000.0)
        }));
    }
    tasks.sort_by(f64::total_cmp);
    hops.sort_by(f64::total_cmp);
    let wall = median(&walls);
    json!({"scenario": name, "tasks": len, "runs": runs, "wall_s": wall, "engine_s": median(&engines),
           "engine_s_runs": engines, "tasks_per_s": len as f64 / wall,
           "hop_ms_p50": percentile(&hops, 50.0), "hop_ms_p99": percentile(&hops, 99.0), "hop_ms_max": percentile(&hops, 100.0),
           "task_ms_p50": percentile(&tasks, 50.0)})
}

/// Engine time: from the run's first event to its end, in store time (the
/// wall time adds publishing the definition and reading the report).
fn engine_seconds(report: &flowforge::RunReport) -> f64 {
    let at = |s: Option<&str>| s.and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    match (
        at(report.events.first().map(|e| e.at.as_str())),
        at(report.finished_at.as_deref()),
    ) {
        (Some(first), Some(end)) => (end - first).as_seconds_f64(),
        _ => f64::NAN,
    }
}

async fn bench_concurrent() -> Value {
    let dir = tempfile::tempdir().expect("tmp");
    let engine = Arc::new(engine(&dir, None).await);
    let def = Arc::new(dag40());
    let start = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (engine, def) = (engine.clone(), def.clone());
        runs.spawn(async move { run_one(&engine, &def).await });
    }
    while let Some(r) = runs.join_next().await {
        r.expect("run task");
    }
    let wall = start.elapsed();
    json!({"scenario": "concurrent", "runs": 100, "tasks": 4_000, "wall_s": wall.as_secs_f64(), "tasks_per_s": 4_000.0 / wall.as_secs_f64()})
}

/// Resets the peak RSS to the current RSS (Linux: `clear_refs` 5), so a
/// scenario's peak is its own, not an earlier scenario's in this process.
fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("cannot reset the peak RSS ({e}); the memory figures include earlier scenarios");
    }
}

async fn bench_memory() -> Value {
    reset_peak_rss();
    let dir = tempfile::tempdir().expect("tmp");
    let engine = engine(&dir, None).await;
    let def = definition(
        "small",
        vec![
            json!({"key": "a", "task_type": "noop"}),
            json!({"key": "b", "task_type": "noop", "depends_on": ["a"]}),
            json!({"key": "c", "task_type": "echo", "depends_on": ["a"]}),
        ],
    );
    let start = Instant::now();
    let mut at_1000 = 0;
    for i in 1..=10_000 {
        run_one(&engine, &def).await;
        if i == 1_000 {
            at_1000 = peak_rss_kib();
        }
    }
    let at_10000 = peak_rss_kib();
    json!({"scenario": "memory", "runs": 10_000, "wall_s": start.elapsed().as_secs_f64(),
           "peak_rss_kib_after_1000": at_1000, "peak_rss_kib_after_10000": at_10000,
           "growth_pct": (at_10000 as f64 / at_1000 as f64 - 1.0) * 100.0})
}

/// Claim + finish cycles on independent ready tasks, one after another:
/// the store's own cost per task, without the loops around it.
async fn bench_cycles() -> Value {
    use flowforge_ports::store::{DefinitionStore, RunStore, TaskOutcome};
    let dir = tempfile::tempdir().expect("tmp");
    let engine = engine(&dir, None).await;
    let store = engine.store().clone();
    let tasks: Vec<Value> = (0..2_000)
        .map(|i| json!({"key": format!("t{i:05}"), "task_type": "noop"}))
        .collect();
    let def = definition("cycles", tasks);
    let published = store.publish_definition(&def).await.expect("publish");
    let run = store.start_run(published.id, json!({})).await.expect("start");
    let detail = store.get_run(run).await.expect("get").expect("run");
    let worker = flowforge_ports::WorkerId("bench".into());
    let start = Instant::now();
    for t in &detail.tasks {
        let claim = store
            .claim_task_run(t.id, t.token, &worker, Duration::from_secs(300))
            .await
            .expect("claim")
            .expect("ready");
        store
            .finish_task_run(t.id, claim.token, &worker, TaskOutcome::Succeeded { output: json!({}) })
            .await
            .expect("finish");
    }
    let wall = start.elapsed();
    json!({"scenario": "cycles", "cycles": detail.tasks.len(), "wall_s": wall.as_secs_f64(),
           "us_per_cycle": wall.as_secs_f64() * 1e6 / detail.tasks.len() as f64})
}

#[tokio::main]
async fn main() {
    let mut wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if wanted.is_empty() {
        wanted = ["fanout", "chain", "chain40", "concurrent", "memory"]
            .map(String::from)
            .to_vec();
    }
    for w in wanted {
        let result = match w.as_str() {
            "fanout" => bench_fanout().await,
            "chain" => bench_chain(1_000, "chain", 1).await,
            "chain40" => bench_chain(40, "chain40", 5).await,
            "concurrent" => bench_concurrent().await,
            "memory" => bench_memory().await,
            "cycles" => bench_cycles().await,
            other => {
                eprintln!("unknown scenario {other}");
                std::process::exit(2);
            }
        };
        println!("{result}");
    }
}
