//! The fault matrix (issue 16): real `flowforge` processes from the
//! release binary — two schedulers, two publishers and five workers — on
//! this run's own PostgreSQL database and RabbitMQ queue, a steady workload
//! of mixed runs, one fault injected per scenario, and a checker that reads
//! the history back. `cargo xtask chaos` runs it and writes RELIABILITY.md.
//!
//! Every task is a `command` that records, in a ledger outside FlowForge,
//! each **attempt** (allowed to repeat) and its **effect**: written once
//! per idempotency key under a file lock, as an idempotent handler would
//! (docs/design/data-flow.md#idempotency-key). The checker compares the
//! ledger with what FlowForge reports:
//!
//! * `lost`: a submitted run missing from the store, or a task run
//!   reported succeeded whose effect never happened;
//! * `duplicate_effects`: a key whose effect happened more than once;
//! * `stuck`: a run not terminal within the bound after the fault healed;
//! * `wrong`: a run that ended other than its shape says (a chain, a
//!   fan-out and a retried task succeed; a saga fails with its compensator
//!   succeeded; a cancelled run is cancelled, or succeeded if it won the
//!   race);
//! * `stale_writes_rejected`: late writes the fencing token discarded
//!   (evidence, not a failure: a stopped worker's late finish must be one);
//! * `recovery_s`: from the fault healing until completions per second are
//!   back to 90 % of the rate before it.
//!
//! A scenario passes when lost, duplicate effects, stuck and wrong are all 0.
//!
//! Scenarios: `worker-kill` (SIGKILL a fifth of the workers every few
//! seconds, each started again at once), `worker-stop` (SIGSTOP a worker
//! past its lease, then SIGCONT), `worker-term` (SIGTERM a worker mid-task:
//! it drains and exits 0, and is started again), `control-kill` (SIGKILL a
//! scheduler or a publisher at random, started again at once),
//! `rabbitmq-stop` and `postgres-stop` (this machine's RabbitMQ app or
//! PostgreSQL cluster stopped for the whole fault, started again when it
//! heals, and by a guard whatever way the run ends: `rabbitmqctl`,
//! `pg_ctlcluster`, so run as a user allowed to), `queue-delete` (every
//! worker held still for 6 s so dispatches wait ready in the queue, then
//! the queue deleted under them; the publishers publish a dispatch again
//! once it has waited 5 s unclaimed).
//!
//! Usage: `cargo bench -p flowforge-bins --bench chaos -- [--quick]
//! [--seconds N] [scenario…]`. Prints one JSON object per scenario.
//! Environment: `AMQP_URL` (default amqp://guest:guest@127.0.0.1:5672/%2f),
//! `PGHOST`, `PGPORT`, `PGUSER`. Each scenario's database `ff_bench_*` and
//! queue are dropped at its end, and its processes stopped by their pids.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowforge::WorkflowDefinition;
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_ports::{RunId, RunStore, SystemClock, WorkflowId};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::cluster::{Broker, Processes};
use support::{BenchDb, Server, definition, median, publish, round};

const DEFAULT_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const SCENARIOS: [&str; 7] = [
    "worker-kill",
    "worker-stop",
    "worker-term",
    "control-kill",
    "rabbitmq-stop",
    "postgres-stop",
    "queue-delete",
];
/// How long a dispatch stays unclaimed before the publishers publish it
/// again (`--redispatch-after-seconds`): short, so a deleted queue's
/// losses are found within the scenario.
const REDISPATCH_SECS: &str = "5";
const WORKERS: usize = 5;
/// Short, so a killed worker's task is reaped soon; a stopped worker is
/// held well past it.
const LEASE_SECS: u64 = 3;
/// Runs started per second, all phases long.
const RATE: f64 = 2.0;
/// How long the runs may take to settle once the fault has healed and
/// submission has stopped.
const SETTLE: Duration = Duration::from_secs(120);

/// What one task does: record the attempt, work a little, fail where its
/// shape says, then make its effect once per idempotency key.
const TASK_SCRIPT: &str = r#"set -eu
printf '%s %s\n' "$FLOWFORGE_IDEMPOTENCY_KEY" "$FLOWFORGE_ATTEMPT" >> "$LEDGER/attempts"
sleep "$WORK"
if [ -n "${FAIL_FIRST:-}" ] && [ "$FLOWFORGE_ATTEMPT" -lt 2 ]; then exit 1; fi
if [ -n "${FAIL_ALWAYS:-}" ]; then exit 3; fi
flock "$LEDGER/effects.lock" sh -c 'grep -qxF "$FLOWFORGE_IDEMPOTENCY_KEY" "$LEDGER/effects" 2>/dev/null || printf "%s\n" "$FLOWFORGE_IDEMPOTENCY_KEY" >> "$LEDGER/effects"'
printf '{"done":"%s"}\n' "$FLOWFORGE_IDEMPOTENCY_KEY"
"#;

/// The phases of one scenario.
#[derive(Debug, Clone, Copy)]
struct Phases {
    warm: Duration,
    fault: Duration,
    after: Duration,
}

/// The workload's shapes and how each must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Chain,
    Fan,
    Retry,
    Saga,
    Cancel,
}

impl Shape {
    const ALL: [Self; 5] = [Self::Chain, Self::Fan, Self::Retry, Self::Saga, Self::Cancel];

    fn definition(self, ledger: &Path) -> WorkflowDefinition {
        let task = |key: &str, deps: &[&str], extra: &[(&str, &str)]| {
            let mut env = json!({"LEDGER": ledger.display().to_string(), "WORK": "0.2"});
            for (k, v) in extra {
                env[*k] = json!(v);
            }
            json!({
                "key": key, "task_type": "command", "depends_on": deps,
                "timeout_seconds": 60,
                // Reaping a killed worker's lease spends an attempt.
                "retry": {"max_attempts": 50, "delay_seconds": 0.2},
                "config": {"argv": ["sh", "-c", TASK_SCRIPT], "env": env}
            })
        };
        let tasks = match self {
            Self::Chain => vec![
                task("a", &[], &[]),
                task("b", &["a"], &[]),
                task("c", &["b"], &[]),
                task("d", &["c"], &[]),
            ],
            Self::Fan => {
                let mut tasks = vec![task("root", &[], &[])];
                let wide: Vec<String> = (1..=6).map(|i| format!("f{i}")).collect();
                tasks.extend(wide.iter().map(|k| task(k, &["root"], &[])));
                let deps: Vec<&str> = wide.iter().map(String::as_str).collect();
                tasks.push(task("join", &deps, &[]));
                tasks
            }
            Self::Retry => vec![
                task("flaky", &[], &[("FAIL_FIRST", "1")]),
                task("after", &["flaky"], &[]),
            ],
            Self::Saga => {
                let mut undo = task("undo_book", &[], &[]);
                undo["compensate_for"] = json!("book");
                let mut charge = task("charge", &["book"], &[("FAIL_ALWAYS", "1")]);
                charge["retry"] = json!({"max_attempts": 1});
                vec![task("book", &[], &[]), charge, undo]
            }
            Self::Cancel => (0..6)
                .map(|i| match i {
                    0 => task("s0", &[], &[]),
                    _ => task(&format!("s{i}"), &[format!("s{}", i - 1).as_str()], &[]),
                })
                .collect(),
        };
        definition(&format!("chaos-{self:?}").to_lowercase(), tasks)
    }
}

/// One started run.
struct Started {
    id: RunId,
    shape: Shape,
    at: Instant,
    cancelled: bool,
}

/// One scenario's processes, database and ledger.
struct Bench {
    store: PgStore,
    procs: Processes,
    db: BenchDb,
    ledger: tempfile::TempDir,
    workflows: Vec<(Shape, WorkflowId)>,
    broker: Broker,
}

impl Bench {
    async fn start(server: &Server, amqp_url: &str, tag: &str) -> Self {
        let db = BenchDb::create(server, tag);
        let queue = db.name.clone();
        let broker = Broker {
            url: amqp_url.to_owned(),
            queues: vec![queue.clone()],
            exchanges: Vec::new(),
        };
        let lease = LEASE_SECS.to_string();
        let mut procs = Processes::new(vec![
            "--db".into(),
            db.url(),
            "--amqp".into(),
            amqp_url.to_owned(),
            "--queue".into(),
            queue,
            "--lease-seconds".into(),
            lease,
        ]);
        procs.run("migrate", &["migrate"]);
        let store = PgStore::connect(
            &db.url(),
            Arc::new(SystemClock),
            PgOptions {
                max_connections: 4,
                application_name: "flowforge-chaos".to_owned(),
                ..PgOptions::default()
            },
        )
        .await
        .expect("connecting to the scenario's database");
        let ledger = tempfile::tempdir().expect("a ledger folder");
        let mut workflows = Vec::new();
        for shape in Shape::ALL {
            workflows.push((shape, publish(&store, &shape.definition(ledger.path())).await));
        }
        for i in 1..=2 {
            procs.spawn(&format!("scheduler-{i}"), &["scheduler"]);
            procs.spawn(
                &format!("publisher-{i}"),
                &["publisher", "--redispatch-after-seconds", REDISPATCH_SECS],
            );
        }
        for i in 1..=WORKERS {
            procs.spawn(
                &format!("worker-{i}"),
                &["worker", "--concurrency", "2", "--allow-command"],
            );
        }
        Self {
            store,
            procs,
            db,
            ledger,
            workflows,
            broker,
        }
    }

    /// Starts the next run of the workload (shapes in turn); a cancel-shaped
    /// run is cancelled by [`Bench::cancel_due`] a little later.
    /// `None` when the store refused (it is down): the client knows the run
    /// was not started, and it does not count as submitted.
    async fn submit(&self, n: usize) -> Option<Started> {
        let (shape, wf) = self.workflows[n % self.workflows.len()];
        match self.store.start_run(wf, json!({})).await {
            Ok(id) => Some(Started {
                id,
                shape,
                at: Instant::now(),
                cancelled: false,
            }),
            Err(e) => {
                eprintln!("start_run refused: {e}");
                None
            }
        }
    }

    /// Requests the cancels that are due; one the store refuses is asked
    /// again next time.
    async fn cancel_due(&self, runs: &mut [Started]) {
        for run in runs.iter_mut().filter(|r| r.shape == Shape::Cancel && !r.cancelled) {
            if run.at.elapsed() >= Duration::from_millis(500) {
                run.cancelled = self.store.request_cancel(run.id).await.is_ok();
            }
        }
    }

    /// Runs not yet terminal (all of them while the store cannot say).
    fn unfinished(&self) -> u64 {
        self.db
            .server
            .psql(
                &self.db.name,
                "SELECT count(*) FROM workflow_run WHERE state NOT IN ('succeeded', 'failed', 'cancelled')",
            )
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX)
    }
}

/// This machine's services a scenario may stop.
#[derive(Debug, Clone, Copy)]
enum Service {
    Rabbitmq,
    Postgres,
}

/// One of this machine's services, stopped for the whole fault and started
/// again when it heals — or when this guard drops, however the run ends.
struct Outage {
    service: Service,
    start: Vec<String>,
}

impl Outage {
    fn begin(service: Service) -> Self {
        let (stop, start): (Vec<String>, Vec<String>) = match service {
            Service::Rabbitmq => (
                ["rabbitmqctl", "stop_app"].map(String::from).to_vec(),
                ["rabbitmqctl", "start_app"].map(String::from).to_vec(),
            ),
            Service::Postgres => {
                let version = std::fs::read_dir("/etc/postgresql")
                    .ok()
                    .and_then(|mut d| d.next())
                    .and_then(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .expect("a PostgreSQL cluster under /etc/postgresql");
                let ctl = |action: &str| {
                    ["pg_ctlcluster", "--skip-systemctl-redirect", &version, "main", action]
                        .map(String::from)
                        .to_vec()
                };
                (ctl("stop"), ctl("start"))
            }
        };
        run_tool(&stop);
        eprintln!("stopped {service:?}");
        Self { service, start }
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        run_tool(&self.start);
        eprintln!("started {:?} again", self.service);
    }
}

/// Runs a service tool, panicking with its output when it fails.
fn run_tool(argv: &[String]) {
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", argv[0]));
    assert!(
        out.status.success(),
        "{} failed ({}): {}{}",
        argv.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fault a scenario injects, stepped while its phase lasts.
struct Injector {
    scenario: &'static str,
    next: Instant,
    /// A stopped worker and when to continue it.
    stopped: Option<(String, Instant)>,
    outage: Option<Outage>,
    /// The broker's URL and the scenario's queue.
    queue: (String, String),
    /// Whether every worker is stopped (`queue-delete`).
    held: bool,
}

impl Injector {
    fn new(scenario: &'static str, queue: (String, String)) -> Self {
        Self {
            scenario,
            next: Instant::now(),
            stopped: None,
            outage: None,
            queue,
            held: false,
        }
    }

    /// Ends the fault: a stopped worker is continued, a stopped service
    /// started again.
    fn heal(&mut self, procs: &mut Processes) {
        if let Some((victim, _)) = self.stopped.take() {
            procs.signal(&victim, Signal::SIGCONT);
            eprintln!("continued {victim}");
        }
        self.outage = None;
        if std::mem::take(&mut self.held) {
            for w in procs.names("worker-") {
                procs.signal(&w, Signal::SIGCONT);
            }
        }
    }

    /// Injects what is due now; never blocks the workload for long.
    fn tick(&mut self, procs: &mut Processes) {
        if self.stopped.as_ref().is_some_and(|(_, until)| Instant::now() >= *until) {
            self.heal(procs);
        }
        if Instant::now() < self.next || self.stopped.is_some() {
            return;
        }
        let workers = procs.names("worker-");
        let pick = |list: &[String]| list[fastrand::usize(..list.len())].clone();
        match self.scenario {
            "worker-kill" => {
                // A fifth of the workers, every 3 s.
                for _ in 0..WORKERS.div_ceil(5) {
                    let victim = pick(&workers);
                    procs.signal(&victim, Signal::SIGKILL);
                    let pid = procs.respawn(&victim);
                    eprintln!("killed {victim}; started again as pid {pid}");
                }
                self.next = Instant::now() + Duration::from_secs(3);
            }
            "worker-stop" => {
                // Stopped for twice the lease: its tasks are reaped and run
                // elsewhere, and its late finishes must be rejected.
                let victim = pick(&workers);
                procs.signal(&victim, Signal::SIGSTOP);
                eprintln!("stopped {victim}");
                self.stopped = Some((victim, Instant::now() + Duration::from_secs(2 * LEASE_SECS)));
                self.next = Instant::now() + Duration::from_secs(2);
            }
            "worker-term" => {
                let victim = pick(&workers);
                procs.signal(&victim, Signal::SIGTERM);
                let status = procs.wait_exit(&victim, Duration::from_secs(30));
                assert!(
                    status.is_some_and(|s| s.success()),
                    "{victim} did not drain and exit 0 on SIGTERM ({status:?}):\n{}",
                    procs.tail(&victim)
                );
                let pid = procs.respawn(&victim);
                eprintln!("{victim} drained and exited 0; started again as pid {pid}");
                self.next = Instant::now() + Duration::from_secs(2);
            }
            "control-kill" => {
                let mut control = procs.names("scheduler-");
                control.extend(procs.names("publisher-"));
                let victim = pick(&control);
                procs.signal(&victim, Signal::SIGKILL);
                let pid = procs.respawn(&victim);
                eprintln!("killed {victim}; started again as pid {pid}");
                self.next = Instant::now() + Duration::from_secs(2);
            }
            "rabbitmq-stop" | "postgres-stop" => {
                // Down for the whole fault phase.
                if self.outage.is_none() {
                    let service = if self.scenario == "rabbitmq-stop" {
                        Service::Rabbitmq
                    } else {
                        Service::Postgres
                    };
                    self.outage = Some(Outage::begin(service));
                }
                self.next = Instant::now() + Duration::from_secs(3600);
            }
            "queue-delete" => {
                // Deleted under the publisher and the consumers with the
                // dispatches it held: the workers are held still for 6 s
                // first, so new runs fill every prefetch slot and the rest
                // wait ready in the queue.
                if self.held {
                    let (url, queue) = &self.queue;
                    match support::amqp::delete_queue(url, queue) {
                        Ok(n) => eprintln!("deleted queue {queue} holding {n} ready messages"),
                        Err(e) => eprintln!("could not delete queue {queue}: {e}"),
                    }
                    for w in &workers {
                        procs.signal(w, Signal::SIGCONT);
                    }
                    self.held = false;
                    self.next = Instant::now() + Duration::from_secs(4);
                } else {
                    for w in &workers {
                        procs.signal(w, Signal::SIGSTOP);
                    }
                    self.held = true;
                    self.next = Instant::now() + Duration::from_secs(6);
                }
                self.next = Instant::now() + Duration::from_secs(5);
            }
            other => unreachable!("unknown scenario {other}"),
        }
    }
}

/// Completions (task `succeed` events) per whole second since `origin`.
fn completions_per_second(db: &BenchDb, origin: f64) -> BTreeMap<i64, u64> {
    let out = db.sql(&format!(
        "SELECT floor(extract(epoch FROM at) - {origin})::bigint AS s, count(*) FROM task_run_event \
         WHERE transition = 'succeed' GROUP BY s ORDER BY s"
    ));
    out.lines()
        .filter_map(|l| {
            let (s, n) = l.split_once('|')?;
            Some((s.parse().ok()?, n.parse().ok()?))
        })
        .collect()
}

/// Seconds from `healed` until a whole second's completions are back to
/// 90 % of the median rate of the warm phase; `None` if they never were.
fn recovery(rates: &BTreeMap<i64, u64>, warm: Duration, healed: f64, end: f64) -> Option<f64> {
    // The first second is the pipeline filling up.
    let before: Vec<f64> = (1..warm.as_secs() as i64)
        .map(|s| rates.get(&s).copied().unwrap_or(0) as f64)
        .collect();
    let normal = median(&before);
    let from = healed.floor() as i64;
    (from..end.ceil() as i64)
        .find(|s| rates.get(s).copied().unwrap_or(0) as f64 >= 0.9 * normal)
        .map(|s| (s as f64 - healed).max(0.0))
}

/// Checks the ledger and the store against each other.
fn check(bench: &Bench, runs: &[Started]) -> Value {
    let read = |name: &str| std::fs::read_to_string(bench.ledger.path().join(name)).unwrap_or_default();
    let mut effects: HashMap<String, u32> = HashMap::new();
    for key in read("effects").lines() {
        *effects.entry(key.to_owned()).or_default() += 1;
    }
    let attempts = read("attempts").lines().count();
    let duplicates = effects.values().filter(|n| **n > 1).count();

    let tasks = bench.db.sql("SELECT run_id || ':' || task_key, state FROM task_run");
    let mut task_states: HashMap<String, String> = HashMap::new();
    for line in tasks.lines() {
        if let Some((key, state)) = line.split_once('|') {
            task_states.insert(key.to_owned(), state.to_owned());
        }
    }
    let no_effect = task_states
        .iter()
        .filter(|(key, state)| *state == "succeeded" && !effects.contains_key(*key))
        .count();
    let stored = bench.db.sql("SELECT id, state FROM workflow_run");
    let run_states: HashMap<String, String> = stored
        .lines()
        .filter_map(|l| l.split_once('|').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .collect();
    let mut missing = 0;
    let mut stuck = 0;
    let mut wrong = Vec::new();
    let mut ended: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    for run in runs {
        let id = run.id.to_string();
        let Some(state) = run_states.get(&id) else {
            missing += 1;
            continue;
        };
        let state = state.as_str();
        *ended
            .entry(format!("{:?}", run.shape).to_lowercase())
            .or_default()
            .entry(state.to_owned())
            .or_default() += 1;
        let fine = match run.shape {
            Shape::Chain | Shape::Fan | Shape::Retry => state == "succeeded",
            Shape::Saga => {
                state == "failed"
                    && task_states.get(&format!("{id}:undo_book")).map(String::as_str) == Some("succeeded")
            }
            Shape::Cancel => matches!(state, "cancelled" | "succeeded"),
        };
        if !matches!(state, "succeeded" | "failed" | "cancelled") {
            stuck += 1;
        } else if !fine {
            wrong.push(format!("{id} ({:?}) ended {state}", run.shape));
        }
    }
    let stale: u64 = bench
        .db
        .sql("SELECT count(*) FROM task_run_event WHERE transition = 'stale_write_rejected'")
        .parse()
        .unwrap_or(0);
    let finished = runs.len() - missing - stuck;
    json!({
        "submitted": runs.len(),
        "finished": finished,
        "lost": missing + no_effect,
        "duplicate_effects": duplicates,
        "stuck": stuck,
        "wrong": wrong.len(),
        "wrong_runs": wrong.into_iter().take(5).collect::<Vec<_>>(),
        "stale_writes_rejected": stale,
        "attempts": attempts,
        "effects": effects.len(),
        "ended": ended,
    })
}

async fn scenario(name: &'static str, phases: Phases, server: &Server, amqp_url: &str) -> Value {
    eprintln!("==> scenario {name}");
    let mut bench = Bench::start(server, amqp_url, "chaos").await;
    let origin = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let begun = Instant::now();
    let mut runs: Vec<Started> = Vec::new();
    let mut attempts_to_start = 0;
    let mut injector = Injector::new(name, (bench.broker.url.clone(), bench.broker.queues[0].clone()));
    let total = phases.warm + phases.fault + phases.after;
    let interval = Duration::from_secs_f64(1.0 / RATE);
    let mut next_submit = Instant::now();
    let mut healed = None;
    while begun.elapsed() < total {
        let now = begun.elapsed();
        if now >= phases.warm && now < phases.warm + phases.fault {
            injector.tick(&mut bench.procs);
        } else if now >= phases.warm + phases.fault && healed.is_none() {
            injector.heal(&mut bench.procs);
            healed = Some(now.as_secs_f64());
            eprintln!("fault healed at {:.1} s", now.as_secs_f64());
        }
        if Instant::now() >= next_submit {
            attempts_to_start += 1;
            runs.extend(bench.submit(attempts_to_start).await);
            next_submit += interval;
        }
        bench.cancel_due(&mut runs).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let submitted_for = begun.elapsed().as_secs_f64();
    let settle_by = Instant::now() + SETTLE;
    while bench.unfinished() > 0 && Instant::now() < settle_by {
        bench.cancel_due(&mut runs).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut result = check(&bench, &runs);
    let rates = completions_per_second(&bench.db, origin);
    let healed = healed.unwrap_or(submitted_for);
    result["recovery_s"] = json!(recovery(&rates, phases.warm, healed, submitted_for).map(|r| round(r, 1)));
    result["scenario"] = json!(name);
    result["seconds"] = json!(phases.fault.as_secs());
    let passed = ["lost", "duplicate_effects", "stuck", "wrong"]
        .iter()
        .all(|k| result[*k].as_u64() == Some(0));
    result["passed"] = json!(passed);
    if !passed {
        eprintln!("{}", bench.procs.all_tails());
    }
    bench.procs.stop();
    result
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("--seconds takes a whole number, not {s}"))
        });
    let named: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with('-') && (*i == 0 || args[i - 1] != "--seconds"))
        .map(|(_, a)| a.as_str())
        .collect();
    for n in &named {
        if !SCENARIOS.contains(n) {
            eprintln!("unknown scenario {n}; the scenarios are {}", SCENARIOS.join(", "));
            std::process::exit(2);
        }
    }
    let fault = Duration::from_secs(seconds.unwrap_or(if quick { 10 } else { 30 }));
    let phases = if quick {
        Phases {
            warm: Duration::from_secs(5),
            fault,
            after: Duration::from_secs(8),
        }
    } else {
        Phases {
            warm: Duration::from_secs(10),
            fault,
            after: Duration::from_secs(20),
        }
    };
    let amqp_url = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP.to_owned());
    let server = Server::from_env();
    let mut failed = false;
    for name in SCENARIOS {
        if !named.is_empty() && !named.contains(&name) {
            continue;
        }
        let result = scenario(name, phases, &server, &amqp_url).await;
        failed |= result["passed"] != json!(true);
        println!("{result}");
    }
    if failed {
        std::process::exit(1);
    }
}
