//! Distributed-mode benchmarks (issue 5): real `flowforge` processes from
//! the release binary — `migrate`, one `scheduler`, one `publisher` and two
//! `worker`s (`--concurrency` 4 each: issue 15's 2 workers × 4 slots) — on
//! this benchmark's own PostgreSQL database and RabbitMQ queue, noop
//! tasks, runs started through `PgStore` (publish + start_run, as
//! `flowforge submit` does) and awaited.
//! Prints one JSON object per scenario; `cargo xtask bench distributed`
//! runs it and writes the figures down.
//!
//! * `dist_fanout1000`: issue 15's workload, a 1 → 1 000 → 1 fan-out/fan-in
//!   (1 002 tasks), first when no scenario is named, on processes that
//!   have run nothing else but the warm-up: tasks/s, with the CPU each
//!   part spent per task (our processes, the PostgreSQL backends grouped
//!   by the process they serve, the broker) from `/proc`.
//! * `dist_fanout`: a 9 998-wide fan-out/fan-in (10 000 tasks), the same
//!   figures.
//! * `dist_chain`: a 1 000-deep chain; per-hop latency p50/p99 from the
//!   predecessor's `succeed` event to the successor's `claim` event (both
//!   stored with the database's microsecond clock), with the hop split at
//!   the scheduler's promotion and the dispatch's `published_at`.
//! * `dist_chain40`: the 40-task chain, wall time from start_run to the
//!   wait returning (median of 5).
//! * `dist_concurrent`: 100 concurrent runs of a 40-task DAG, tasks/s,
//!   with the same CPU accounting.
//!
//! And, from the same run, measured while the processes are not running:
//!
//! * `rabbit_confirms`: confirmed publishes/s to a quorum queue through
//!   `RabbitPublisher`, one at a time (batches of 1) and 100 in flight.
//! * `pgbench_update`: the pgbench single-row conditional-UPDATE rate at
//!   1 client (the helper of the `postgres` benchmark).
//! * `hop_floor`: the latencies on a hop's path, each measured alone and
//!   in sequence with nothing to wait for — the finish handing the
//!   dependent on (docs/design/scheduler.md#handoff), outbox sweep (its SQL
//!   and commit, and the publish + confirm), claim commit — their sum, how
//!   close the chain's p50 hop comes, and off the path the pass that
//!   settles the run
//!   (measured before the processes start and after they stop; the lower
//!   median of each step counts).
//!
//! Usage: `cargo bench -p flowforge-bins --bench distributed -- [fanout1000]
//! [fanout] [chain] [chain40] [concurrent]` (all when none given; the ceilings
//! always run). Environment: `BENCH_SECS` (pgbench window, default 10),
//! `BENCH_WORKER_CONCURRENCY` (default 4),
//! `AMQP_URL` (default amqp://guest:guest@127.0.0.1:5672/%2f), `PGHOST`,
//! `PGPORT`, `PGUSER`. The database `ff_bench_<random>` and the queues
//! `ff_bench_<random>*` are dropped/deleted at the end, and the processes
//! stopped (SIGTERM, then SIGKILL, each by its own pid).

#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "distributed/cpu.rs"]
mod cpu;
mod support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cpu::CpuProbe;
use flowforge::RunState;
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_adapters_rabbit::{RabbitConfig, RabbitPublisher, RabbitQueue};
use flowforge_app::after_commit::DEFAULT_HOLD;
use flowforge_app::cache::DefinitionCache;
use flowforge_app::observers::Observers;
use flowforge_app::scheduler::{Scheduler, SchedulerConfig};
use flowforge_domain::TaskRunState;
use flowforge_domain::plan;
use flowforge_ports::store::{
    FinishResult, Handover, Notifier, OutboxStore, OutboxSweep, RunStore, RunSummary, TaskOutcome, Topic,
    WorkerRegistry,
};
use flowforge_ports::{
    Dispatch, DispatchId, DispatchPublisher, RunId, Scope, SystemClock, TaskRunId, WorkerId, WorkflowId,
};
use serde_json::{Value, json};
use support::cluster::{Broker, Processes};
use support::{
    BenchDb, LEASE, Server, chain, chain_key, dag40, env_number, fanout, median, ms, percentile, pgbench_prepare,
    pgbench_update, publish, round,
};

const DEFAULT_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Hops sampled for the floor.
const FLOOR_SAMPLES: usize = 100;
/// The scenarios, in the order they run when none is named. Issue 15's
/// fan-out goes first: the same fan-out measured after the chains, on the
/// same processes, costs more CPU per task, for a cause not yet found
/// (BENCHMARKS.md, "Group commit, measured again after publish after
/// commit").
const SCENARIOS: [&str; 5] = ["fanout1000", "chain40", "chain", "fanout", "concurrent"];
/// Worker slots per process unless `BENCH_WORKER_CONCURRENCY` says
/// otherwise: issue 15 states its distributed fan-out at 2 workers × 4.
const WORKER_CONCURRENCY: u64 = 4;

/// Waits until every run of `runs` is terminal, woken by the store's
/// run-settled notifications (and a slow re-check); returns their summaries.
async fn wait_settled<N: Notifier>(
    store: &PgStore,
    notifier: &N,
    runs: &[RunId],
    timeout: Duration,
    procs: &Processes,
) -> Vec<RunSummary> {
    let deadline = Instant::now() + timeout;
    loop {
        let listed = store.list_runs(runs.len() as u32 + 100).await.expect("list_runs");
        let by_id: HashMap<RunId, &RunSummary> = listed.iter().map(|r| (r.id, r)).collect();
        let terminal = |r: &RunSummary| r.state.is_terminal();
        if runs.iter().all(|id| by_id.get(id).is_some_and(|r| terminal(r))) {
            let summaries: Vec<RunSummary> = runs.iter().map(|id| by_id[id].clone()).collect();
            for s in &summaries {
                assert_eq!(s.state, RunState::Succeeded, "benchmark run {} did not succeed", s.id);
            }
            return summaries;
        }
        assert!(
            Instant::now() < deadline,
            "runs did not finish within {timeout:?}; process logs:\n{}",
            procs.all_tails()
        );
        tokio::select! {
            () = notifier.notified(Topic::RunSettled) => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Store time from a run's creation to its end, seconds.
fn store_span(s: &RunSummary) -> f64 {
    s.finished_at.map_or(f64::NAN, |f| (f - s.created_at).as_seconds_f64())
}

/// The benchmark's view of the system under test.
struct Bench<N> {
    store: PgStore,
    notifier: N,
}

impl<N: Notifier> Bench<N> {
    /// Starts one run of `wf` and waits for it: (wall from start_run to the
    /// wait returning, the run's summary).
    async fn run_one(&self, wf: WorkflowId, timeout: Duration, procs: &Processes) -> (Duration, RunSummary) {
        let start = Instant::now();
        let run = self.store.start_run(wf, json!({})).await.expect("start_run");
        let mut done = wait_settled(&self.store, &self.notifier, &[run], timeout, procs).await;
        (start.elapsed(), done.remove(0))
    }
}

/// A 1 → `width` → 1 fan-out/fan-in, reported as `scenario`.
async fn bench_fanout<N: Notifier>(
    b: &Bench<N>,
    db: &BenchDb,
    procs: &mut Processes,
    scenario: &str,
    width: usize,
) -> Value {
    let wf = publish(&b.store, &fanout(width)).await;
    let probe = CpuProbe::start(db, procs);
    let (wall, summary) = b.run_one(wf, Duration::from_secs(900), procs).await;
    // The fan-out's tasks, the first and the join.
    let tasks = width + 2;
    let (cpu, cpu_text) = probe.per_task(db, tasks as f64);
    procs.check_alive();
    json!({
        "scenario": scenario,
        "tasks": tasks,
        "wall_s": round(wall.as_secs_f64(), 3),
        "store_s": round(store_span(&summary), 3),
        "tasks_per_s": round(tasks as f64 / wall.as_secs_f64(), 1),
        "cpu_ms_per_task": cpu,
        "notes": format!(
            "A 1 → {width} → 1 fan-out/fan-in of noop tasks ({tasks} tasks) through the separate scheduler, publisher \
             and two worker processes ({} slots in all, prefetch 1 each); wall time from start_run to the wait \
             returning (store_s: the run's created_at to finished_at). {cpu_text}.",
            procs.slots
        ),
    })
}

/// Microseconds since the epoch of a store timestamp.
fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

async fn bench_chain<N: Notifier>(b: &Bench<N>, db: &BenchDb, procs: &mut Processes) -> Value {
    let len = 1_000;
    let wf = publish(&b.store, &chain(len)).await;
    let (wall, summary) = b.run_one(wf, Duration::from_secs(600), procs).await;
    procs.check_alive();
    let detail = b.store.get_run(summary.id).await.expect("get_run").expect("the run");
    // First `claim`, `succeed` and `dependencies_satisfied` of each task.
    let mut at: HashMap<(&str, &str), i64> = HashMap::new();
    for e in &detail.events {
        if let Some(task) = e.task.as_deref() {
            at.entry((task, e.transition.as_str())).or_insert_with(|| micros(e.at));
        }
    }
    // When each dispatch was marked published (the sweep's statement time,
    // after its confirm), by task.
    let published: HashMap<String, i64> = db
        .sql(&format!(
            "SELECT task_key || ' ' || (extract(epoch FROM published_at) * 1000000)::bigint FROM outbox \
             WHERE run_id = '{}' AND published_at IS NOT NULL",
            summary.id
        ))
        .lines()
        .filter_map(|l| {
            let (k, t) = l.split_once(' ')?;
            Some((k.to_owned(), t.parse().ok()?))
        })
        .collect();
    let (mut hops, mut to_promotion, mut to_published, mut to_claim) = (vec![], vec![], vec![], vec![]);
    for i in 1..len {
        let (prev, next) = (chain_key(i - 1), chain_key(i));
        let (Some(succeed), Some(claim)) = (at.get(&(prev.as_str(), "succeed")), at.get(&(next.as_str(), "claim")))
        else {
            continue;
        };
        hops.push((claim - succeed) as f64 / 1000.0);
        if let (Some(promoted), Some(marked)) =
            (at.get(&(next.as_str(), "dependencies_satisfied")), published.get(&next))
        {
            to_promotion.push((promoted - succeed) as f64 / 1000.0);
            to_published.push((marked - promoted) as f64 / 1000.0);
            to_claim.push((claim - marked) as f64 / 1000.0);
        }
    }
    assert_eq!(hops.len(), len - 1, "every hop has its succeed and claim events");
    hops.sort_by(f64::total_cmp);
    let p50 = percentile(&hops, 50.0);
    json!({
        "scenario": "dist_chain",
        "tasks": len,
        "wall_s": round(wall.as_secs_f64(), 3),
        "tasks_per_s": round(len as f64 / wall.as_secs_f64(), 1),
        "hop_ms_p50": round(p50, 3),
        "hop_ms_p90": round(percentile(&hops, 90.0), 3),
        "hop_ms_p99": round(percentile(&hops, 99.0), 3),
        "hop_ms_max": round(percentile(&hops, 100.0), 3),
        "to_promotion_ms_p50": round(median(&to_promotion), 3),
        "to_published_ms_p50": round(median(&to_published), 3),
        "to_claim_ms_p50": round(median(&to_claim), 3),
        "notes": format!(
            "A 1 000-deep chain of noop tasks; {} hops, each from the predecessor's `succeed` event to the \
             successor's `claim` event (store time, µs; each event is dated at its statement's start). Medians of \
             the hop's three legs: succeed → the successor's `dependencies_satisfied` ({:.3} ms: zero when the \
             finish hands it on in its own statement, docs/design/scheduler.md#handoff; else the NOTIFY, the \
             scheduler's wake-up and its pass up to the promotion); → the dispatch marked published (the commit, \
             then the worker's own publish + confirm and settle_held, \
             docs/design/outbox-and-queues.md#publish-after-commit; for a dispatch the finishing slot kept, \
             docs/design/outbox-and-queues.md#continuing-a-chain, the settle after its claim; else the NOTIFY, \
             publisher wake-up, sweep, publish + confirm) {:.3} ms; → the claim (broker delivery, worker; the mark \
             may land after it, and a kept dispatch's always does) {:.3} ms.",
            hops.len(),
            median(&to_promotion),
            median(&to_published),
            median(&to_claim)
        ),
    })
}

async fn bench_chain40<N: Notifier>(b: &Bench<N>, procs: &mut Processes) -> Value {
    let wf = publish(&b.store, &chain(40)).await;
    let (mut walls, mut spans) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (wall, summary) = b.run_one(wf, Duration::from_secs(120), procs).await;
        walls.push(wall.as_secs_f64());
        spans.push(store_span(&summary));
    }
    procs.check_alive();
    json!({
        "scenario": "dist_chain40",
        "tasks": 40,
        "wall_s": round(median(&walls), 4),
        "wall_s_min": round(walls.iter().copied().fold(f64::INFINITY, f64::min), 4),
        "store_s": round(median(&spans), 4),
        "notes": format!(
            "The 40-task sequential chain, 5 runs one after another; wall_s is the median from start_run to the \
             wait returning (runs: {:?} s); store_s the median of created_at → finished_at in store time.",
            walls.iter().map(|w| round(*w, 3)).collect::<Vec<_>>()
        ),
    })
}

async fn bench_concurrent<N: Notifier>(b: &Bench<N>, db: &BenchDb, procs: &mut Processes) -> Value {
    let wf = publish(&b.store, &dag40()).await;
    let probe = CpuProbe::start(db, procs);
    let start = Instant::now();
    let mut starting = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let store = b.store.clone();
        starting.spawn(async move { store.start_run(wf, json!({})).await.expect("start_run") });
    }
    let mut runs = Vec::new();
    while let Some(r) = starting.join_next().await {
        runs.push(r.expect("starting a run"));
    }
    wait_settled(&b.store, &b.notifier, &runs, Duration::from_secs(900), procs).await;
    let wall = start.elapsed();
    let (cpu, cpu_text) = probe.per_task(db, 4_000.0);
    procs.check_alive();
    json!({
        "scenario": "dist_concurrent",
        "runs": 100,
        "tasks": 4_000,
        "wall_s": round(wall.as_secs_f64(), 3),
        "tasks_per_s": round(4_000.0 / wall.as_secs_f64(), 1),
        "cpu_ms_per_task": cpu,
        "notes": format!(
            "100 runs of a 40-task DAG (8 levels of 5, each task depending on two above) started at once; wall \
             time from the first start_run to the last run settled. {cpu_text}."
        ),
    })
}

/// A dispatch payload for the broker ceiling (nothing consumes it).
fn dummy_dispatch(i: i64) -> Dispatch {
    Dispatch {
        dispatch_id: DispatchId(i),
        task_run_id: TaskRunId(i),
        run_id: "01900000-0000-7000-8000-000000000000".parse().expect("a uuid"),
        task_key: format!("t{i:05}"),
        task_type: "noop".to_owned(),
        fencing_token: 0,
        ready_at: None,
        priority: flowforge_domain::Priority::DEFAULT,
    }
}

/// Confirmed publishes to a quorum queue: one at a time, and 100 in flight.
/// Returns the scenario and the median confirm latency of a single publish.
async fn bench_rabbit(publisher: &RabbitPublisher) -> (Value, f64) {
    for i in 0..50 {
        let r = publisher.publish(&[dummy_dispatch(i)]).await;
        assert!(r.iter().all(Result::is_ok), "warm-up publish failed: {r:?}");
    }
    let (n_single, mut latencies) = (1_000, Vec::new());
    let start = Instant::now();
    for i in 0..n_single {
        let t = Instant::now();
        let r = publisher.publish(&[dummy_dispatch(i)]).await;
        latencies.push(ms(t.elapsed()));
        assert!(r.iter().all(Result::is_ok), "publish failed: {r:?}");
    }
    let single = f64::from(n_single as u32) / start.elapsed().as_secs_f64();
    let batches = 100;
    let start = Instant::now();
    for b in 0..batches {
        let batch: Vec<Dispatch> = (0..100).map(|i| dummy_dispatch(b * 100 + i)).collect();
        let r = publisher.publish(&batch).await;
        assert!(r.iter().all(Result::is_ok), "batch publish failed");
    }
    let in_flight = (batches * 100) as f64 / start.elapsed().as_secs_f64();
    let confirm_ms = median(&latencies);
    let value = json!({
        "scenario": "rabbit_confirms",
        "one_at_a_time_per_s": round(single, 1),
        "in_flight_100_per_s": round(in_flight, 1),
        "confirm_ms_p50": round(confirm_ms, 3),
        "notes": format!(
            "RabbitPublisher (mandatory, persistent, confirm mode) to a quorum queue of this benchmark's own: \
             {n_single} publishes each awaiting its confirm ({single:.0}/s, median {confirm_ms:.3} ms per \
             publish + confirm), then {batches} batches of 100 with all 100 confirms in flight ({in_flight:.0}/s)."
        ),
    });
    (value, confirm_ms)
}

/// The latencies on a hop's path, measured alone and in sequence (before
/// the processes start, so nothing else drives these runs): the finish
/// handing the dependent on with its dispatch held, the publish of that
/// dispatch and its confirm right after the commit, the claim; and off the
/// path, the statement that marks the dispatch published and the pass that
/// settles the run. Medians, in ms.
struct Floor {
    finish: f64,
    settling_pass: f64,
    settle: f64,
    publish_confirm: f64,
    claim: f64,
}

async fn measure_floor(store: &PgStore, publisher: &RabbitPublisher) -> Floor {
    let scheduler = Scheduler::new(
        store.clone(),
        Arc::new(DefinitionCache::new(store.clone())),
        Observers::default(),
        SchedulerConfig::default(),
    );
    let pair_def = chain(2);
    let pair = publish(store, &pair_def).await;
    let handoff = plan::handoff(&pair_def, &chain_key(0));
    assert!(handoff.whole, "a chain's hop is handed on whole: {handoff:?}");
    let worker = WorkerId("bench-floor".to_owned());
    let (mut finish, mut settling_pass, mut settle, mut publish_confirm, mut claim) =
        (vec![], vec![], vec![], vec![], vec![]);
    let ready = async |run: RunId| -> (TaskRunId, i64) {
        let detail = store.get_run(run).await.expect("get_run").expect("the run");
        let t = detail
            .tasks
            .iter()
            .find(|t| t.state == TaskRunState::Ready)
            .expect("a ready task");
        (t.id, t.token)
    };
    // The sweep of one run's rows: (SQL + commit time, publish + confirm time).
    let sweep = async |run: RunId| -> (Duration, Duration) {
        let t0 = Instant::now();
        let mut sweep = store
            .begin_sweep(Scope::Run(run), 10, flowforge_ports::store::DEFAULT_PRIORITY_AGING)
            .await
            .expect("begin_sweep")
            .expect("a dispatch to sweep");
        let rows = sweep.dispatches().to_vec();
        let t1 = Instant::now();
        let results = publisher.publish(&rows).await;
        let t2 = Instant::now();
        assert!(results.iter().all(Result::is_ok), "publish failed: {results:?}");
        let ids: Vec<DispatchId> = rows.iter().map(|d| d.dispatch_id).collect();
        sweep.mark_published(&ids).await.expect("mark_published");
        sweep.commit().await.expect("commit");
        ((t1 - t0) + t2.elapsed(), t2 - t1)
    };
    for i in 0..FLOOR_SAMPLES + 10 {
        let run = store.start_run(pair, json!({})).await.expect("start_run");
        sweep(run).await;
        let (root, token) = ready(run).await;
        let c = store
            .claim_task_run(root, token, &worker, LEASE)
            .await
            .expect("claim")
            .expect("ready");
        // The hop's finish hands the dependent on and holds its dispatch,
        // which it publishes right after the commit, as a worker's does
        // (docs/design/scheduler.md#handoff,
        // docs/design/outbox-and-queues.md#publish-after-commit): no pass
        // and no sweep on the path.
        let t = Instant::now();
        let finished = store
            .finish_and_hand_off(
                root,
                c.token,
                &worker,
                TaskOutcome::Succeeded { output: json!({}) },
                &handoff,
                Handover::Held(DEFAULT_HOLD),
            )
            .await
            .expect("finish");
        let finish_t = t.elapsed();
        assert_eq!(finished.result, FinishResult::Recorded(TaskRunState::Succeeded));
        let t = Instant::now();
        let results = publisher.publish(&finished.held).await;
        let publish_t = t.elapsed();
        assert!(results.iter().all(Result::is_ok), "publish failed: {results:?}");
        let ids: Vec<DispatchId> = finished.held.iter().map(|d| d.dispatch_id).collect();
        let t = Instant::now();
        store.settle_held(&ids, &[]).await.expect("settle_held");
        let settle_t = t.elapsed();
        let (child, token) = ready(run).await;
        let t = Instant::now();
        let c = store
            .claim_task_run(child, token, &worker, LEASE)
            .await
            .expect("claim")
            .expect("ready");
        let claim_t = t.elapsed();
        store
            .finish_task_run(child, c.token, &worker, TaskOutcome::Succeeded { output: json!({}) })
            .await
            .expect("finish");
        // Off the hop's path: the pass that settles the run.
        let t = Instant::now();
        scheduler.advance_run(run).await.expect("settling pass");
        let pass_t = t.elapsed();
        if i >= 10 {
            finish.push(ms(finish_t));
            settling_pass.push(ms(pass_t));
            settle.push(ms(settle_t));
            publish_confirm.push(ms(publish_t));
            claim.push(ms(claim_t));
        }
    }
    Floor {
        finish: median(&finish),
        settling_pass: median(&settling_pass),
        settle: median(&settle),
        publish_confirm: median(&publish_confirm),
        claim: median(&claim),
    }
}

fn hop_floor_value(floor: &Floor, pgbench_latency_ms: f64, confirm_ms: f64, hop_p50: Option<f64>) -> Value {
    let sum = floor.finish + floor.publish_confirm + floor.claim;
    // The hop is measured from the finish statement's start to the claim
    // statement's start: the claim's own commit lies outside it.
    let within = sum - floor.claim;
    let physical = 2.0 * pgbench_latency_ms + confirm_ms;
    let mut value = json!({
        "scenario": "hop_floor",
        "finish_commit_ms": round(floor.finish, 3),
        "settling_pass_ms": round(floor.settling_pass, 3),
        "settle_commit_ms": round(floor.settle, 3),
        "publish_confirm_ms": round(floor.publish_confirm, 3),
        "claim_commit_ms": round(floor.claim, 3),
        "floor_ms": round(sum, 3),
        "floor_within_hop_ms": round(within, 3),
        "commit_confirm_floor_ms": round(physical, 3),
    });
    let mut notes = format!(
        "Each step of a hop's path measured alone, in sequence, {FLOOR_SAMPLES} times with nothing else driving \
         those runs, before the processes start and after they stop (the lower of the two medians, ms): \
         finish_and_hand_off {:.3} (the success, the dependent made ready with its event and its outbox row held, \
         the commit), the publish + confirm of its one dispatch right after the commit {:.3}, claim_task_run \
         {:.3}. Sum: {sum:.3} ms ({within:.3} ms without the claim, whose statement starts the measured hop's \
         end). Off the path: settle_held, which marks the dispatch published, {:.3} ms, and the pass that settles \
         the run after its last task, {:.3} ms. The bare physical floor, 2 single-row commits (pgbench 1-client \
         latency {pgbench_latency_ms:.3} ms each) + 1 confirm ({confirm_ms:.3} ms): {physical:.3} ms.",
        floor.finish, floor.publish_confirm, floor.claim, floor.settle, floor.settling_pass
    );
    if let Some(p50) = hop_p50 {
        value["hop_ms_p50"] = json!(round(p50, 3));
        value["ratio"] = json!(round(p50 / sum, 3));
        let tail = if p50 >= within {
            format!(
                "the other {:.3} ms are the worker's hand-over to its publishing task, the window's room check and \
                 the broker's delivery",
                p50 - within
            )
        } else {
            "below the floor within the hop: the components were measured at other moments of a noisy machine"
                .to_owned()
        };
        notes.push_str(&format!(
            " The chain's measured p50 hop, {p50:.3} ms, is {:.2}× this floor ({:.2}× the floor within the hop): \
             {tail}.",
            p50 / sum,
            p50 / within
        ));
    }
    value["notes"] = json!(notes);
    value
}

#[tokio::main]
async fn main() {
    let mut wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if wanted.is_empty() {
        wanted = SCENARIOS.map(String::from).to_vec();
    }
    for w in &wanted {
        if !SCENARIOS.contains(&w.as_str()) {
            eprintln!("unknown scenario {w}; the scenarios are {}", SCENARIOS.join(", "));
            std::process::exit(2);
        }
    }
    let secs = env_number("BENCH_SECS", 10);
    let amqp_url = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP.to_owned());
    let server = Server::from_env();

    // Guards, dropped in reverse: processes, then broker objects, then the database.
    let db = BenchDb::create(&server, "");
    let tag = db.name.clone();
    let queue = tag.clone();
    let ceiling_queue = format!("{tag}_ceiling");
    let ceiling_exchange = format!("{tag}_x");
    let _broker = Broker {
        url: amqp_url.clone(),
        queues: vec![queue.clone(), ceiling_queue.clone()],
        exchanges: vec![ceiling_exchange.clone()],
    };
    let mut procs = Processes::new(vec![
        "--db".into(),
        db.url(),
        "--amqp".into(),
        amqp_url.clone(),
        "--queue".into(),
        queue.clone(),
    ]);
    procs.run("migrate", &["migrate"]);
    let store = PgStore::connect(
        &db.url(),
        Arc::new(SystemClock),
        PgOptions {
            max_connections: 10,
            application_name: "flowforge-bench".to_owned(),
            ..PgOptions::default()
        },
    )
    .await
    .expect("connecting to the benchmark database");

    // The ceilings and the floor, before anything else runs here.
    pgbench_prepare(&db);
    let sync = support::synchronous_commit(&db);
    let pgbench = pgbench_update(&db, 1, secs);
    println!(
        "{}",
        json!({
            "scenario": "pgbench_update",
            "clients": 1,
            "tps": round(pgbench.tps, 1),
            "latency_ms": round(pgbench.latency_ms, 3),
            "notes": format!(
                "pgbench, 1 client, {secs} s, -M prepared, synchronous_commit = {sync}: the single-row conditional \
                 UPDATE of the postgres benchmark ({}), i.e. one commit round trip.",
                support::PGBENCH_SCRIPT.lines().nth(1).unwrap_or_default().trim()
            ),
        })
    );
    let mut rabbit = RabbitConfig::new(amqp_url.clone());
    rabbit.exchange.clone_from(&ceiling_exchange);
    rabbit.queue.clone_from(&ceiling_queue);
    rabbit.routing_key.clone_from(&ceiling_queue);
    rabbit.connection_name = "flowforge-bench".to_owned();
    RabbitQueue::new(rabbit.clone())
        .expect("rabbit config")
        .declare()
        .await
        .expect("declaring the ceiling queue");
    let publisher = RabbitPublisher::new(rabbit).expect("rabbit config");
    let (rabbit_value, confirm_ms) = bench_rabbit(&publisher).await;
    println!("{rabbit_value}");
    let floor_before = measure_floor(&store, &publisher).await;

    // The processes under test.
    let slots = env_number("BENCH_WORKER_CONCURRENCY", WORKER_CONCURRENCY);
    let concurrency = slots.to_string();
    procs.slots = 2 * slots as usize;
    procs.spawn("scheduler", &["scheduler"]);
    procs.spawn("publisher", &["publisher"]);
    let pids = [
        procs.spawn("worker-1", &["worker", "--concurrency", &concurrency]),
        procs.spawn("worker-2", &["worker", "--concurrency", &concurrency]),
    ];
    let ready_by = Instant::now() + Duration::from_secs(60);
    loop {
        procs.check_alive();
        let workers = store.list_workers().await.expect("list_workers");
        let live = workers
            .iter()
            .filter(|w| w.stopped_at.is_none() && pids.contains(&w.pid))
            .count();
        if live == pids.len() {
            break;
        }
        assert!(
            Instant::now() < ready_by,
            "the workers did not register:\n{}",
            procs.all_tails()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bench = Bench {
        notifier: store.notifier().await.expect("notifier"),
        store: store.clone(),
    };
    // Warm-up: every process connected, caches and pools filled.
    let warm = publish(&store, &chain(5)).await;
    for _ in 0..3 {
        bench.run_one(warm, Duration::from_secs(60), &procs).await;
    }

    let mut hop_p50 = None;
    for w in &wanted {
        let result = match w.as_str() {
            "fanout1000" => bench_fanout(&bench, &db, &mut procs, "dist_fanout1000", 1_000).await,
            "fanout" => bench_fanout(&bench, &db, &mut procs, "dist_fanout", 9_998).await,
            "chain" => {
                let v = bench_chain(&bench, &db, &mut procs).await;
                hop_p50 = v["hop_ms_p50"].as_f64();
                v
            }
            "chain40" => bench_chain40(&bench, &mut procs).await,
            "concurrent" => bench_concurrent(&bench, &db, &mut procs).await,
            _ => unreachable!("checked above"),
        };
        println!("{result}");
    }
    // The floor again once the processes are gone: noise only ever adds,
    // so each component's lower median of the two is its floor.
    procs.stop();
    let after = measure_floor(&store, &publisher).await;
    let floor = Floor {
        finish: floor_before.finish.min(after.finish),
        settling_pass: floor_before.settling_pass.min(after.settling_pass),
        settle: floor_before.settle.min(after.settle),
        publish_confirm: floor_before.publish_confirm.min(after.publish_confirm),
        claim: floor_before.claim.min(after.claim),
    };
    println!("{}", hop_floor_value(&floor, pgbench.latency_ms, confirm_ms, hop_p50));
}
