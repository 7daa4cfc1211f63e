//! PostgreSQL benchmarks (issue 4). Prints one JSON object per scenario;
//! `cargo xtask bench postgres` runs it and writes the figures down.
//!
//! * `claim_finish_{1,4,16}`: raw `pgbench` running a single-row
//!   conditional UPDATE (each client on its own rows, `-M prepared`) as the
//!   ceiling, against FlowForge's claim + finish cycles through `PgStore`
//!   at the same client count, each client on its own ready task runs
//!   (distinct rows). A cycle is two transactions, so `ratio_pct = 100 ×
//!   cycles/s ÷ (pgbench TPS ÷ 2)`. Both run under the server's
//!   `synchronous_commit` (neither sets it; printed). A third contender
//!   splits the gap: FlowForge's own CLAIM and FINISH statements run by
//!   pgbench. The three take turns in short slices, so load from other
//!   users of a shared machine hits them alike. The notes add the
//!   server-side cost of one claim, one finish and one pgbench UPDATE
//!   (EXPLAIN ANALYZE with BUFFERS and WAL).
//! * `pass_history`: `Scheduler::schedule_once()` over 1 000 active runs,
//!   each with a finished root whose dependent the pass must promote, in a
//!   database with no history and in one with 1 000 000 finished task runs
//!   (bulk-inserted with generate_series, every index in place); rounds
//!   alternate between the two with fresh active runs; `ratio` is the
//!   median of the rounds' with/without ratios. The notes carry which
//!   prepared statements the server re-plans on every execution and the
//!   EXPLAIN ANALYZE plans of the scheduler's hot queries on the 1 M-row
//!   database (custom plans checked, generic plans shown).
//!
//! Usage: `cargo bench -p flowforge-bins --bench postgres -- [claim_finish]
//! [pass_history]` (both when none given). Tuning by environment:
//! `BENCH_SECS` (each contender's time per client count, default 10, cut
//! into 5 slices), `BENCH_ROUNDS` (pass rounds, default 5), `BENCH_HISTORY`
//! (finished task runs, default 1 000 000). The server: `PGHOST`, `PGPORT`,
//! `PGUSER` (default 127.0.0.1:5432, postgres; `psql` and `pgbench` on the
//! PATH); each run creates `ff_bench_<random>_*` databases and drops them
//! (WITH (FORCE)) at the end, on a panic too.

#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "postgres/plans.rs"]
mod plans;
mod support;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge::WorkflowDefinition;
use flowforge_adapters_postgres::{PgOptions, PgStore, queries};
use flowforge_app::cache::DefinitionCache;
use flowforge_app::observers::Observers;
use flowforge_app::scheduler::{Scheduler, SchedulerConfig};
use flowforge_domain::TaskRunState;
use flowforge_ports::store::{FinishResult, RunStore, TaskOutcome};
use flowforge_ports::{RunId, Scope, SystemClock, TaskRunId, WorkerId, WorkflowId};
use plans::{explain_hot_queries, plan_cache_report};
use serde_json::{Value, json};
use support::{
    BenchDb, LEASE, Server, definition, env_number, median, ms, pgbench_cmd, pgbench_prepare, pgbench_update, publish,
    round, synchronous_commit,
};

/// Independent tasks per provisioning run of the claim+finish scenario.
const TASKS_PER_RUN: usize = 2_000;
/// Active runs per scheduler pass.
const ACTIVE_RUNS: usize = 1_000;
/// Spare rows per client beyond the sizing (the warm-up slice uses some).
const WARMUP_CYCLES: usize = 20;

fn independent(name: &str, n: usize) -> WorkflowDefinition {
    let tasks = (0..n)
        .map(|i| json!({"key": format!("t{i:05}"), "task_type": "noop"}))
        .collect();
    definition(name, tasks)
}

fn chain(name: &str, n: usize, prefix: &str) -> WorkflowDefinition {
    let tasks = (0..n)
        .map(|i| {
            let deps: Vec<String> = if i == 0 {
                vec![]
            } else {
                vec![format!("{prefix}{}", i - 1)]
            };
            json!({"key": format!("{prefix}{i}"), "task_type": "noop", "depends_on": deps})
        })
        .collect();
    definition(name, tasks)
}

async fn open(db: &BenchDb, pool: u32) -> PgStore {
    let options = PgOptions {
        max_connections: pool,
        application_name: "flowforge-bench".to_owned(),
        ..PgOptions::default()
    };
    let store = PgStore::connect_unchecked(&db.url(), Arc::new(SystemClock), options)
        .await
        .expect("connecting to the benchmark database");
    store.migrate().await.expect("migrating the benchmark database");
    store
}

/// The ready task runs (id, token) of `run`.
async fn ready_tasks(store: &PgStore, run: RunId) -> Vec<(TaskRunId, i64)> {
    let detail = store.get_run(run).await.expect("get_run").expect("the run exists");
    detail
        .tasks
        .iter()
        .filter(|t| t.state == TaskRunState::Ready)
        .map(|t| (t.id, t.token))
        .collect()
}

/// One claim + finish(Succeeded) cycle: two transactions. Returns how long
/// the claim and the finish took.
async fn cycle(store: &PgStore, worker: &WorkerId, (id, token): (TaskRunId, i64)) -> (Duration, Duration) {
    let start = Instant::now();
    let claim = store
        .claim_task_run(id, token, worker, LEASE)
        .await
        .expect("claim")
        .expect("the task run is ready at its token");
    let claimed = Instant::now();
    let result = store
        .finish_task_run(id, claim.token, worker, TaskOutcome::Succeeded { output: json!({}) })
        .await
        .expect("finish");
    assert_eq!(result, FinishResult::Recorded(TaskRunState::Succeeded));
    (claimed - start, claimed.elapsed())
}

/// Runs of `wf` until at least `rows` ready task runs exist, each run
/// already `running` as in steady state: one task of it claimed and
/// finished and a scheduler pass made (so later claims owe no wake-up).
/// The remaining ready task runs.
async fn provision(
    store: &PgStore,
    scheduler: &Scheduler<PgStore>,
    wf: WorkflowId,
    rows: usize,
) -> Vec<(TaskRunId, i64)> {
    let worker = WorkerId("bench-provisioner".to_owned());
    let mut ready = Vec::with_capacity(rows + TASKS_PER_RUN);
    while ready.len() < rows {
        let run = store.start_run(wf, json!({})).await.expect("start_run");
        let mut tasks = ready_tasks(store, run).await.into_iter();
        let first = tasks.next().expect("a ready task");
        cycle(store, &worker, first).await;
        scheduler.advance_run(run).await.expect("starting the run");
        ready.extend(tasks);
    }
    ready
}

/// Time slices each claim+finish measurement is cut into: the three
/// contenders (pgbench's UPDATE, FlowForge through PgStore, FlowForge's SQL
/// through pgbench) take turns slice by slice, so a burst of load from other
/// users of a shared machine hits all three alike.
const SLICES: u64 = 5;

/// One FlowForge client's ready rows, the next one last.
type Rows = Vec<(TaskRunId, i64)>;

/// What FlowForge's cycles through PgStore measured, over all slices.
#[derive(Default)]
struct Cycles {
    cycles: usize,
    elapsed: Duration,
    /// A client ran out of rows (the rate would then be low).
    exhausted: bool,
    claims: Vec<f64>,
    finishes: Vec<f64>,
}

impl Cycles {
    fn per_s(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }
}

/// One slice of claim+finish cycles: every client on its own rows at once
/// for `window`; returns the rows left.
async fn ff_slice(store: &PgStore, rows: Vec<Rows>, window: Duration, into: &mut Cycles) -> Vec<Rows> {
    let barrier = Arc::new(tokio::sync::Barrier::new(rows.len() + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut rows) in rows.into_iter().enumerate() {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.spawn(async move {
            let worker = WorkerId(format!("bench-client-{i}"));
            barrier.wait().await;
            let deadline = Instant::now() + window;
            let (mut claims, mut finishes, mut exhausted) = (Vec::new(), Vec::new(), false);
            while Instant::now() < deadline {
                let Some(row) = rows.pop() else {
                    exhausted = true;
                    break;
                };
                let (claim, finish) = cycle(&store, &worker, row).await;
                claims.push(ms(claim));
                finishes.push(ms(finish));
            }
            (i, rows, claims, finishes, exhausted)
        });
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut left = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (i, rows, claims, finishes, exhausted) = r.expect("client");
        into.cycles += claims.len();
        into.claims.extend(claims);
        into.finishes.extend(finishes);
        into.exhausted |= exhausted;
        left.push((i, rows));
    }
    into.elapsed += start.elapsed();
    left.sort_by_key(|(i, _)| *i);
    left.into_iter().map(|(_, rows)| rows).collect()
}

/// What one statement cost the server, from EXPLAIN (ANALYZE, BUFFERS,
/// WAL) in a rolled-back transaction: a one-line summary.
fn explain_cost(db: &BenchDb, prepare: &str, execute: &str) -> String {
    let plan = db.sql(&format!(
        "{prepare};\nBEGIN;\nEXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF, TIMING OFF, SUMMARY ON) EXECUTE {execute};\n\
         ROLLBACK;"
    ));
    // Sum the WAL and buffers of the writing nodes (Update/Insert), each
    // counted once: the first such lines below each of them.
    let lines: Vec<&str> = plan.lines().collect();
    let (mut records, mut bytes, mut hits, mut writers) = (0u64, 0u64, 0u64, Vec::new());
    let number = |line: &str, key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for (i, line) in lines.iter().enumerate() {
        let node = line.trim_start().trim_start_matches("->").trim();
        if !(node.starts_with("Update on ") || node.starts_with("Insert on ")) {
            continue;
        }
        writers.push(node.split(" (").next().unwrap_or(node).to_owned());
        let body = lines[i + 1..].iter().take_while(|l| !l.contains("->"));
        let (mut wal_seen, mut buf_seen) = (false, false);
        for l in body {
            if !wal_seen && l.contains("WAL: ") {
                records += number(l, "records=");
                bytes += number(l, "bytes=");
                wal_seen = true;
            }
            if !buf_seen && l.contains("Buffers: shared") {
                hits += number(l, "hit=");
                buf_seen = true;
            }
        }
    }
    let triggers: u64 = lines
        .iter()
        .filter(|l| l.starts_with("Trigger for constraint"))
        .map(|l| number(l, "calls="))
        .sum();
    let exec = lines
        .iter()
        .find_map(|l| l.strip_prefix("Execution Time: "))
        .unwrap_or("?");
    format!(
        "{exec} executing, {records} WAL records / {bytes} bytes, {hits} buffer hits, {triggers} FK trigger call(s) \
         ({})",
        writers.join(", ")
    )
}

/// The server-side cost of a claim, a finish and pgbench's UPDATE, and
/// which plans the server settles on for the prepared claim and finish.
async fn diagnose_cycle(db: &BenchDb, store: &PgStore, wf: WorkflowId) -> String {
    let run = store.start_run(wf, json!({})).await.expect("start_run");
    let (id, token) = ready_tasks(store, run).await[0];
    let claim = explain_cost(
        db,
        &format!(
            "PREPARE claim(interval, bigint, bigint, text, interval) AS {}",
            queries::CLAIM
        ),
        &format!("claim('0', {}, {token}, 'bench-diag', '600 s')", id.0),
    );
    let claimed = store
        .claim_task_run(id, token, &WorkerId("bench-diag".to_owned()), LEASE)
        .await
        .expect("claim")
        .expect("ready");
    let finish = explain_cost(
        db,
        &format!(
            "PREPARE finish(interval, bigint, bigint, text, text, text, jsonb, text, text) AS {}",
            queries::FINISH
        ),
        &format!(
            "finish('0', {}, {}, 'bench-diag', 'succeeded', 'succeed', '{{}}', NULL, NULL)",
            id.0, claimed.token
        ),
    );
    let update = explain_cost(
        db,
        "PREPARE upd(integer) AS UPDATE bench_rows SET state = CASE state WHEN 'ready' THEN 'running' ELSE 'ready' \
         END, token = token + 1 WHERE id = $1 AND state IN ('ready', 'running')",
        "upd(12345)",
    );
    // After the five custom plans the server always tries first, does it
    // settle on a generic plan (no planning per execution)?
    let mut script = format!(
        "PREPARE claim(interval, bigint, bigint, text, interval) AS {};\n\
         PREPARE finish(interval, bigint, bigint, text, text, text, jsonb, text, text) AS {};\nBEGIN;\n",
        queries::CLAIM,
        queries::FINISH
    );
    for _ in 0..12 {
        let _ = writeln!(
            script,
            "EXECUTE claim('0', {id}, {token}, 'w', '600 s');\n\
             EXECUTE finish('0', {id}, 99, 'w', 'succeeded', 'succeed', '{{}}', NULL, NULL);",
            id = id.0
        );
    }
    script.push_str(
        "\\o /dev/null\nSELECT 1;\n\\o\nSELECT string_agg(name || ' ' || generic_plans || ' generic / ' || custom_plans \
         || ' custom', ', ' ORDER BY name) FROM pg_prepared_statements;\nROLLBACK;",
    );
    let plans = db.sql(&script);
    let plans = plans.lines().last().unwrap_or_default();
    format!(
        "Server-side cost of one statement (EXPLAIN ANALYZE, BUFFERS, WAL; rolled back): claim {claim}; finish \
         {finish}; pgbench's UPDATE {update}. Every task_run transition changes indexed columns or partial-index \
         predicates (state, lease_expires_at, needs_pass), so it is never a HOT update: each writes a new entry in \
         every task_run index, plus the event row and its indexes and foreign-key check. Plan cache after 12 \
         executions of each prepared statement: {plans} (no planning per execution in steady state)."
    )
}

/// `sql` with its `$n` parameters replaced by `values[n - 1]` (literals or
/// pgbench variables), highest first so `$1` never eats `$10`.
fn bind_literally(sql: &str, values: &[&str]) -> String {
    let mut out = sql.to_owned();
    for (i, v) in values.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), v);
    }
    out
}

/// FlowForge's own claim and finish statements run by pgbench (a C client,
/// no pool, no wake-ups), each transaction on the next fresh ready task run
/// of a consecutive range (a sequence hands them out): the cycle rate the
/// SQL allows, apart from the Rust client around it.
struct FfSql {
    first: i64,
    last: i64,
    script: tempfile::NamedTempFile,
    secs: f64,
}

impl FfSql {
    /// Provisions `rows` ready task runs with consecutive ids.
    async fn prepare(db: &BenchDb, store: &PgStore, wf: WorkflowId, rows: usize) -> Self {
        let mut ids = Vec::with_capacity(rows + TASKS_PER_RUN);
        while ids.len() < rows {
            let run = store.start_run(wf, json!({})).await.expect("start_run");
            ids.extend(ready_tasks(store, run).await.into_iter().map(|(id, _)| id.0));
        }
        ids.sort_unstable();
        let (first, last) = (ids[0], ids[ids.len() - 1]);
        assert_eq!(
            last - first + 1,
            ids.len() as i64,
            "the provisioned rows are consecutive"
        );
        db.sql(&format!(
            "DROP SEQUENCE IF EXISTS bench_claim_seq; CREATE SEQUENCE bench_claim_seq START {first} MAXVALUE {last}"
        ));
        let claim = bind_literally(
            queries::CLAIM,
            &["'0'::interval", ":id", "0", "'pgbench'", "'600 s'::interval"],
        );
        let finish = bind_literally(
            queries::FINISH,
            &[
                "'0'::interval",
                ":id",
                "1",
                "'pgbench'",
                "'succeeded'",
                "'succeed'",
                "'{}'::jsonb",
                "NULL::text",
                "NULL::text",
            ],
        );
        let mut script = tempfile::NamedTempFile::new().expect("a temporary pgbench script");
        let text = format!("SELECT nextval('bench_claim_seq') AS id \\gset\n{claim};\n{finish};\n");
        std::io::Write::write_all(&mut script, text.as_bytes()).expect("writing the script");
        Self {
            first,
            last,
            script,
            secs: 0.0,
        }
    }

    /// One slice of `secs` seconds with `clients` clients. A client whose
    /// sequence ran out stops with an error; the count of finished rows
    /// tells.
    fn slice(&mut self, db: &BenchDb, clients: u32, secs: u64) {
        let _ = pgbench_cmd(db, clients, secs, self.script.path())
            .output()
            .expect("running pgbench");
        self.secs += secs as f64;
    }

    /// Cycles per second over the slices, and whether the rows ran out.
    fn rate(&self, db: &BenchDb) -> (f64, bool) {
        let done: i64 = db
            .sql(&format!(
                "SELECT count(*) FROM task_run WHERE id BETWEEN {} AND {} AND state = 'succeeded'",
                self.first, self.last
            ))
            .parse()
            .expect("a count");
        (done as f64 / self.secs, done > self.last - self.first)
    }
}

fn scheduler_over(store: &PgStore) -> Scheduler<PgStore> {
    Scheduler::new(
        store.clone(),
        Arc::new(DefinitionCache::new(store.clone())),
        Observers::default(),
        SchedulerConfig {
            scope: Scope::All,
            batch: 10_000,
            ..SchedulerConfig::default()
        },
    )
}

async fn bench_claim_finish(server: &Server, secs: u64) -> Vec<Value> {
    let db = BenchDb::create(server, "cycles");
    let store = open(&db, 20).await;
    let scheduler = Arc::new(scheduler_over(&store));
    pgbench_prepare(&db);
    let sync = synchronous_commit(&db);
    eprintln!("synchronous_commit = {sync} (pgbench and PgStore alike)");
    let wf = publish(&store, &independent("cycles", TASKS_PER_RUN)).await;
    let diagnosis = diagnose_cycle(&db, &store, wf).await;
    let slice_secs = (secs / SLICES).max(1);
    let mut out = Vec::new();
    for clients in [1usize, 4, 16] {
        // Size the provisioning from a short probe of the ceiling: twice the
        // rows FlowForge would need to match pgbench/2 all the time.
        let probe = pgbench_update(&db, clients as u32, 1);
        let rows = (probe.tps / 2.0 * (slice_secs * SLICES) as f64 * 2.0) as usize + 1_000;
        let mut provisioning = tokio::task::JoinSet::new();
        for _ in 0..clients {
            let (store, scheduler) = (store.clone(), scheduler.clone());
            let each = rows / clients + WARMUP_CYCLES;
            provisioning.spawn(async move {
                let mut rows = provision(&store, &scheduler, wf, each).await;
                rows.reverse();
                rows
            });
        }
        let mut per_client = Vec::new();
        while let Some(rows) = provisioning.join_next().await {
            per_client.push(rows.expect("provisioning"));
        }
        let mut ff_sql = FfSql::prepare(&db, &store, wf, rows).await;
        db.sql("VACUUM ANALYZE");
        db.sql("CHECKPOINT");
        // Warm-up: connections and statement caches.
        per_client = ff_slice(&store, per_client, Duration::from_millis(500), &mut Cycles::default()).await;
        let mut cycles = Cycles::default();
        let (mut tps, mut latency) = (Vec::new(), Vec::new());
        for _ in 0..SLICES {
            let p = pgbench_update(&db, clients as u32, slice_secs);
            tps.push(p.tps);
            latency.push(p.latency_ms);
            per_client = ff_slice(&store, per_client, Duration::from_secs(slice_secs), &mut cycles).await;
            ff_sql.slice(&db, clients as u32, slice_secs);
        }
        let pgbench_tps = tps.iter().sum::<f64>() / tps.len() as f64;
        let per_s = cycles.per_s();
        let ratio = 100.0 * per_s / (pgbench_tps / 2.0);
        let (sql_rate, sql_exhausted) = ff_sql.rate(&db);
        let sql_ratio = 100.0 * sql_rate / (pgbench_tps / 2.0);
        let (claim_p50, finish_p50) = (median(&cycles.claims), median(&cycles.finishes));
        let mut notes = format!(
            "{clients} client(s), synchronous_commit = {sync}; {SLICES} slices of {slice_secs} s each, the three \
             taking turns. Ceiling, pgbench: `UPDATE bench_rows SET state = CASE …, token = token + 1 WHERE id = \
             :id AND state IN ('ready', 'running')`, each client on its own 10 000 rows, -M prepared -c {clients} \
             -j {clients}: {pgbench_tps:.0} TPS (slices: {:?}; median latency {:.3} ms). FlowForge: claim_task_run \
             + finish_task_run(Succeeded) through PgStore (pool of 20), each client on its own ready task runs of \
             already-running runs: {per_s:.0} cycles/s = {ratio:.1} % of pgbench/2; median claim {claim_p50:.3} \
             ms, median finish {finish_p50:.3} ms (the finish includes the NOTIFY it owes the scheduler, a second \
             round trip). The same CLAIM and FINISH statements run by pgbench itself (-M prepared, plus a nextval \
             handing each transaction the next fresh ready row): {sql_rate:.0} cycles/s = {sql_ratio:.1} % of \
             pgbench/2, what the SQL alone allows.{}{}",
            tps.iter().map(|t| t.round()).collect::<Vec<_>>(),
            median(&latency),
            if cycles.exhausted {
                " A PgStore client ran out of provisioned rows: its figure is a lower bound."
            } else {
                ""
            },
            if sql_exhausted {
                " The pgbench run of FlowForge's SQL ran out of rows: its figure is a lower bound."
            } else {
                ""
            }
        );
        if clients == 1 {
            notes.push(' ');
            notes.push_str(&diagnosis);
        }
        let result = json!({
            "scenario": format!("claim_finish_{clients}"),
            "clients": clients,
            "pgbench_tps": round(pgbench_tps, 1),
            "pgbench_latency_ms": round(median(&latency), 3),
            "cycles_per_s": round(per_s, 1),
            "claim_ms_p50": round(claim_p50, 3),
            "finish_ms_p50": round(finish_p50, 3),
            "ratio_pct": round(ratio, 1),
            "sql_via_pgbench_cycles_per_s": round(sql_rate, 1),
            "sql_via_pgbench_ratio_pct": round(sql_ratio, 1),
            "notes": notes,
        });
        println!("{result}");
        out.push(result);
    }
    out
}

/// One database of the pass benchmark: its store and scheduler.
struct PassDb {
    db: BenchDb,
    store: PgStore,
    scheduler: Scheduler<PgStore>,
    pair: WorkflowId,
}

impl PassDb {
    async fn new(server: &Server, tag: &str) -> Self {
        let db = BenchDb::create(server, tag);
        let store = open(&db, 10).await;
        let scheduler = scheduler_over(&store);
        let pair = publish(&store, &chain("pair", 2, "t")).await;
        Self {
            db,
            store,
            scheduler,
            pair,
        }
    }

    /// Starts [`ACTIVE_RUNS`] runs of the pair and finishes each root, so
    /// every run has a flagged change whose dependent a pass must promote.
    async fn prepare_round(&self) -> Vec<RunId> {
        let mut jobs = tokio::task::JoinSet::new();
        let per_job = ACTIVE_RUNS / 8;
        for j in 0..8 {
            let (store, pair) = (self.store.clone(), self.pair);
            jobs.spawn(async move {
                let worker = WorkerId(format!("bench-{j}"));
                let mut runs = Vec::with_capacity(per_job);
                for _ in 0..per_job {
                    let run = store.start_run(pair, json!({"n": j})).await.expect("start_run");
                    for row in ready_tasks(&store, run).await {
                        cycle(&store, &worker, row).await;
                    }
                    runs.push(run);
                }
                runs
            });
        }
        let mut runs = Vec::with_capacity(ACTIVE_RUNS);
        while let Some(r) = jobs.join_next().await {
            runs.extend(r.expect("preparing runs"));
        }
        assert_eq!(runs.len(), ACTIVE_RUNS);
        runs
    }

    /// The timed pass, in ms (after an untimed ANALYZE of the run tables,
    /// so both databases are planned with current statistics).
    async fn timed_pass(&self) -> f64 {
        self.db
            .sql("ANALYZE workflow_run, task_run, outbox, task_run_event, workflow_run_event");
        let start = Instant::now();
        let report = self.scheduler.schedule_once().await.expect("schedule_once");
        let elapsed = ms(start.elapsed());
        assert_eq!(report.passes, ACTIVE_RUNS, "the pass must act on every run");
        elapsed
    }

    /// Finishes the round's dependents and settles its runs (they join the
    /// history), then marks their dispatches published.
    async fn settle_round(&self, runs: Vec<RunId>) {
        let mut jobs = tokio::task::JoinSet::new();
        for (j, chunk) in runs.chunks(ACTIVE_RUNS.div_ceil(8)).enumerate() {
            let (store, chunk) = (self.store.clone(), chunk.to_vec());
            jobs.spawn(async move {
                let worker = WorkerId(format!("bench-{j}"));
                for run in chunk {
                    for row in ready_tasks(&store, run).await {
                        cycle(&store, &worker, row).await;
                    }
                }
            });
        }
        while let Some(r) = jobs.join_next().await {
            r.expect("settling runs");
        }
        let report = self.scheduler.schedule_once().await.expect("settling pass");
        assert_eq!(report.settled.len(), ACTIVE_RUNS, "every run of the round settles");
        self.db
            .sql("UPDATE outbox SET published_at = now() WHERE published_at IS NULL");
    }

    /// Empties every run table: the database holds no history again.
    fn truncate(&self) {
        self.db
            .sql("TRUNCATE workflow_run_event, task_run_event, outbox, task_run, workflow_run");
    }
}

/// Bulk-inserts `task_runs` finished task runs (runs of a 10-task chain,
/// each with its claim/succeed/dependencies_satisfied events, its published
/// dispatch and its run's start/succeed events) with every index in place.
fn insert_history(db: &BenchDb, history_wf: WorkflowId, task_runs: u64) {
    let runs = task_runs.div_ceil(10);
    // UUIDv7-like ids, a month old and in time order, as FlowForge makes them.
    db.sql(&format!(
        "SET maintenance_work_mem = '256MB';
         CREATE TABLE hist_runs AS
         SELECT g, (lpad(to_hex(t0 + g * 20), 12, '0') || '7' || substr(md5(g::text), 1, 3) || '8'
                    || substr(md5(g::text), 4, 15))::uuid AS id,
                to_timestamp((t0 + g * 20) / 1000.0) AS t
         FROM (SELECT (extract(epoch FROM now() - interval '30 days') * 1000)::bigint AS t0) AS base,
              generate_series(1, {runs}) AS g;
         INSERT INTO workflow_run (id, workflow_id, state, input, needs_pass, created_at, started_at, finished_at)
         SELECT id, {wf}, 'succeeded', jsonb_build_object('batch', g), false, t, t + interval '1 ms',
                t + interval '60 ms'
         FROM hist_runs ORDER BY g;
         INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at)
         SELECT id, e.transition, e.from_state, e.to_state, t + e.dt
         FROM hist_runs, (VALUES ('start', 'pending', 'running', interval '1 ms'),
                                 ('succeed', 'running', 'succeeded', interval '60 ms'))
                         AS e(transition, from_state, to_state, dt)
         ORDER BY g, e.dt;
         INSERT INTO task_run (run_id, task_key, state, attempt, fencing_token, pending_deps, needs_pass,
                               created_at, started_at, finished_at, result)
         SELECT r.id, 'h' || k, 'succeeded', 1, 1, 0, false, r.t, r.t + k * interval '5 ms',
                r.t + k * interval '5 ms' + interval '2 ms', jsonb_build_object('ok', true, 'k', k)
         FROM hist_runs AS r CROSS JOIN generate_series(0, 9) AS k
         WHERE (r.g - 1) * 10 + k < {task_runs}
         ORDER BY r.g, k;
         INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, attempt,
                                     fencing_token, worker, at, error)
         SELECT tr.id, tr.run_id, tr.task_key, e.transition, e.from_state, e.to_state, 1, e.token, e.worker,
                tr.started_at + e.dt, NULL
         FROM task_run AS tr,
              (VALUES ('dependencies_satisfied', 'pending', 'ready', 0, NULL, interval '-1 ms'),
                      ('claim', 'ready', 'running', 1, 'bench-worker', interval '0'),
                      ('succeed', 'running', 'succeeded', 1, 'bench-worker', interval '2 ms'))
              AS e(transition, from_state, to_state, token, worker, dt)
         WHERE e.transition <> 'dependencies_satisfied' OR tr.task_key <> 'h0'
         ORDER BY tr.id, e.dt;
         INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, published_at)
         SELECT id, run_id, task_key, 'noop', 0, started_at - interval '1 ms', started_at - interval '500 us'
         FROM task_run ORDER BY id;
         DROP TABLE hist_runs;
         VACUUM ANALYZE;",
        wf = history_wf.0
    ));
}

async fn bench_pass_history(server: &Server, rounds: usize, history: u64) -> Value {
    let without = PassDb::new(server, "pass0").await;
    let with = PassDb::new(server, "pass1m").await;
    let history_wf = publish(&with.store, &chain("history", 10, "h")).await;
    let started = Instant::now();
    insert_history(&with.db, history_wf, history);
    let insert_s = started.elapsed().as_secs_f64();
    let counted = with.db.sql(
        "SELECT (SELECT count(*) FROM task_run) || ' task runs, ' || (SELECT count(*) FROM task_run_event) \
         || ' events, ' || (SELECT count(*) FROM outbox) || ' dispatches, ' || (SELECT count(*) FROM workflow_run) \
         || ' runs'",
    );
    eprintln!("history: {counted} in {insert_s:.1} s");
    without.db.sql("VACUUM ANALYZE");

    // An untimed warm-up round on each (connections, plan and buffer caches).
    for db in [&without, &with] {
        let runs = db.prepare_round().await;
        db.timed_pass().await;
        db.settle_round(runs).await;
    }
    without.truncate();
    let (mut ms_without, mut ms_with) = (Vec::new(), Vec::new());
    for round_no in 0..rounds {
        // Alternate which goes first, so drift on a shared machine hits both.
        let order: [(&PassDb, bool); 2] = if round_no % 2 == 0 {
            [(&without, false), (&with, true)]
        } else {
            [(&with, true), (&without, false)]
        };
        for (db, has_history) in order {
            let runs = db.prepare_round().await;
            let t = db.timed_pass().await;
            eprintln!(
                "round {round_no}: pass over {ACTIVE_RUNS} runs {} history: {t:.1} ms",
                if has_history { "with" } else { "without" }
            );
            if has_history {
                ms_with.push(t);
                db.settle_round(runs).await;
            } else {
                ms_without.push(t);
                db.truncate();
            }
        }
    }
    let runs = with.prepare_round().await;
    let (plans, all_ok) = explain_hot_queries(&with.db, runs[0], with.pair);
    let plan_cache = plan_cache_report(&with.db, runs[0], with.pair);
    eprintln!("{plan_cache}");
    let (m0, m1) = (median(&ms_without), median(&ms_with));
    // Each round's two passes ran back to back: their ratio is immune to
    // the load drifting between rounds on a shared machine.
    let paired: Vec<f64> = ms_with.iter().zip(&ms_without).map(|(w, wo)| w / wo).collect();
    let ratio = median(&paired);
    let notes = format!(
        "Scheduler::schedule_once() over {ACTIVE_RUNS} active runs of a 2-task chain, each with its root just \
         finished (the pass promotes the dependent, writes its event and outbox row, starts the run). Without \
         history vs with {counted} of finished history (bulk-inserted in {insert_s:.0} s with every index in \
         place, then VACUUM ANALYZE). {rounds} rounds alternating between the databases, fresh active runs each \
         round; ratio = the median of each round's with/without ratio ({:?}), ms_* the medians. Per round (ms) without: \
         {:?}; with: {:?}. Partial indexes used by every hot query: {}.\n\n\
         {plan_cache}\n\n{plans}",
        paired.iter().map(|x| round(*x, 3)).collect::<Vec<_>>(),
        ms_without.iter().map(|x| round(*x, 1)).collect::<Vec<_>>(),
        ms_with.iter().map(|x| round(*x, 1)).collect::<Vec<_>>(),
        if all_ok { "yes" } else { "NO" },
    );
    json!({
        "scenario": "pass_history",
        "active_runs": ACTIVE_RUNS,
        "history_task_runs": history,
        "rounds": rounds,
        "ms_without": round(m0, 2),
        "ms_with": round(m1, 2),
        "ratio": round(ratio, 3),
        "ratio_of_medians": round(m1 / m0, 3),
        "plans_use_partial_indexes": u8::from(all_ok),
        "notes": notes,
    })
}

#[tokio::main]
async fn main() {
    let mut wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if wanted.is_empty() {
        wanted = vec!["claim_finish".to_owned(), "pass_history".to_owned()];
    }
    let secs = env_number("BENCH_SECS", 10);
    let rounds = env_number("BENCH_ROUNDS", 5) as usize;
    let history = env_number("BENCH_HISTORY", 1_000_000);
    let server = Server::from_env();
    for w in wanted {
        match w.as_str() {
            "claim_finish" => {
                bench_claim_finish(&server, secs).await;
            }
            "pass_history" => {
                let result = bench_pass_history(&server, rounds, history).await;
                println!("{result}");
            }
            other => {
                eprintln!("unknown scenario {other}; the scenarios are claim_finish, pass_history");
                std::process::exit(2);
            }
        }
    }
}
