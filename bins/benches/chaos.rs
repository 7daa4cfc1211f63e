//! The fault matrix (issue 16): real `flowforge` processes from the
//! release binary — two schedulers, two publishers and five workers — on
//! this run's own PostgreSQL database and RabbitMQ queue, each process
//! reaching each service through a proxy of its own, a steady workload of
//! mixed runs, one fault injected per scenario, and a checker that reads
//! the history back. `cargo xtask chaos` runs it and writes RELIABILITY.md,
//! where every scenario is described.
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
//! * `duplicate_attempts`: one attempt (key and attempt number) run more
//!   than once — two workers holding one claim;
//! * `stuck`: a run not terminal within the bound after the fault healed;
//! * `wrong`: a run that ended other than its shape says (a chain, a
//!   fan-out and a retried task succeed; a saga fails with its compensator
//!   succeeded; a poison task's run fails; a run asked to cancel may end
//!   cancelled instead), or a hostile input `flowforge submit` took;
//! * `down`: a process that exited when nothing killed it;
//! * `stale_writes_rejected`: late writes the fencing token discarded
//!   (evidence, not a failure: a stopped worker's late finish must be one);
//! * `faults`: how many times the fault was injected;
//! * `recovery_s`: from the fault healing until completions per second are
//!   back to 90 % of the rate before it.
//!
//! A scenario passes when lost, duplicate effects and attempts, stuck,
//! wrong and down are all 0 and its fault was injected at least once. The
//! soak also needs every process that ran throughout to end within 10 % of
//! the memory it held at the end of the warm-up (30 s calm, then every
//! fault once) and of the most sockets it held during it.
//!
//! Usage: `cargo bench -p flowforge-bins --bench chaos -- [--quick]
//! [--seconds N] [scenario…]` (`soak` only when named). Prints one JSON
//! object per scenario. Environment: `AMQP_URL` (default
//! amqp://guest:guest@127.0.0.1:5672/%2f), `PGHOST`, `PGPORT`, `PGUSER`.
//! Each scenario's database `ff_bench_*` and queue are dropped at its end,
//! and its processes stopped by their pids. The service scenarios stop
//! this machine's RabbitMQ app and PostgreSQL cluster (`rabbitmqctl`,
//! `pg_ctlcluster`, so run as a user allowed to) and start them again
//! however the run ends; `clock-skew` needs libfaketime.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flowforge::WorkflowDefinition;
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_ports::{RunId, RunStore, SystemClock, WorkflowId};
use futures_util::StreamExt as _;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::cluster::{Broker, Processes};
use support::proxy::{self, Proxy};
use support::{BenchDb, Server, definition, median, publish, round};

const DEFAULT_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const SCENARIOS: [&str; 18] = [
    "worker-kill",
    "worker-stop",
    "worker-term",
    "control-kill",
    "publisher-kill-confirmed",
    "rabbitmq-stop",
    "rabbitmq-pause",
    "postgres-stop",
    "postgres-pause",
    "worker-cut-postgres",
    "worker-cut-rabbitmq",
    "queue-delete",
    "consumer-timeout",
    "duplicate-delivery",
    "clock-skew",
    "cancel-race",
    "poison-tasks",
    "hostile-input",
];
/// The faults the soak draws from, one at a time: those that leave every
/// process running, so each one's memory and sockets can be followed
/// through all of them (the matrix covers the ones that restart it).
const SOAK_FAULTS: [&str; 9] = [
    "worker-stop",
    "rabbitmq-stop",
    "rabbitmq-pause",
    "postgres-stop",
    "postgres-pause",
    "worker-cut-postgres",
    "worker-cut-rabbitmq",
    "queue-delete",
    "duplicate-delivery",
];
/// The calm start of the soak's warm-up, before its round of every fault.
const SOAK_CALM: f64 = 30.0;
/// How long a dispatch stays unclaimed before the publishers publish it
/// again (`--redispatch-after-seconds`): short, so a deleted queue's
/// losses are found within the scenario.
const REDISPATCH_SECS: &str = "5";
/// The AMQP heartbeat every process asks for: a silent broker is noticed
/// after two of them, well within a pause.
const HEARTBEAT_SECS: u64 = 3;
const WORKERS: usize = 5;
/// Short, so a killed worker's task is reaped soon; a stopped worker is
/// held well past it.
const LEASE_SECS: u64 = 3;
/// Every process's PostgreSQL pool, of a fixed size as in production
/// (docs/design/cli.md#connection-pool): nine processes of four
/// connections each, and their notifiers, stay well within the server's
/// 100.
const PG_POOL: u32 = 4;
/// Runs started per second, all phases long.
const RATE: f64 = 2.0;
/// How long the runs may take to settle once the fault has healed and
/// submission has stopped.
const SETTLE: Duration = Duration::from_secs(120);
/// How far `clock-skew` moves two workers' clocks, one each way.
const SKEW: &str = "5m";
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// The broker's consumer timeout during `consumer-timeout`.
const CONSUMER_TIMEOUT_MS: u64 = 3000;
/// Extra copies `duplicate-delivery` puts in the queue of every dispatch.
const STORM_COPIES: usize = 2;

/// glibc's allocator as the image tunes it (docs/design/cli.md#memory),
/// read from the Dockerfile so the two cannot drift apart.
fn image_glibc_tunables() -> String {
    include_str!("../../Dockerfile")
        .lines()
        .find_map(|line| line.strip_prefix("ENV GLIBC_TUNABLES="))
        .expect("the Dockerfile sets GLIBC_TUNABLES")
        .to_owned()
}

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

/// A task that must fail without harming the worker that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Poison {
    /// An output holding `\u0000`, which no store can keep.
    Nul,
    /// Two megabytes on stdout, over the output limit.
    Huge,
    /// Ignores SIGTERM past its timeout, so it has to be SIGKILLed.
    Stubborn,
    /// Dies of SIGSEGV.
    Segfault,
}

/// The workload's shapes and how each must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Chain,
    Fan,
    Retry,
    Saga,
    Cancel,
    /// One task working longer than the broker's consumer timeout during
    /// `consumer-timeout`.
    Slow,
    Poison(Poison),
}

impl Shape {
    const ALL: [Self; 5] = [Self::Chain, Self::Fan, Self::Retry, Self::Saga, Self::Cancel];
    const POISON: [Self; 4] = [
        Self::Poison(Poison::Nul),
        Self::Poison(Poison::Huge),
        Self::Poison(Poison::Stubborn),
        Self::Poison(Poison::Segfault),
    ];

    fn name(self) -> String {
        match self {
            Self::Poison(p) => format!("poison-{p:?}").to_lowercase(),
            other => format!("{other:?}").to_lowercase(),
        }
    }

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
            Self::Slow => vec![task("slow", &[], &[("WORK", "6")])],
            Self::Poison(kind) => {
                let script = match kind {
                    Poison::Nul => r#"printf '%s\n' '{"s":"\u0000"}'"#,
                    Poison::Huge => "head -c 2000000 /dev/zero | tr '\\0' a",
                    Poison::Stubborn => "trap '' TERM; sleep 30",
                    Poison::Segfault => "kill -SEGV $$",
                };
                vec![json!({
                    "key": "poison", "task_type": "command",
                    "timeout_seconds": 2,
                    "retry": {"max_attempts": 2, "delay_seconds": 0.2},
                    "config": {"argv": ["sh", "-c", script]}
                })]
            }
        };
        definition(&format!("chaos-{}", self.name()), tasks)
    }
}

/// A definition file and run input no store may take, submitted with
/// `flowforge submit` while the workload runs: each must be refused with
/// exit 2 and an error, never a panic, and start no run.
struct Hostile {
    case: &'static str,
    file: Vec<u8>,
    input: Option<String>,
}

fn hostile_cases() -> Vec<Hostile> {
    let def = |name: &str, tasks: Value| json!({"name": format!("hostile-{name}"), "version": 1, "tasks": tasks});
    let noop = |key: &str, deps: &[&str]| json!({"key": key, "task_type": "noop", "depends_on": deps});
    let file = |v: Value| serde_json::to_vec(&v).expect("JSON");
    let case = |case, file, input: Option<String>| Hostile { case, file, input };
    let deep = format!(
        r#"{{"name":"hostile-deep","version":1,"tasks":[{{"key":"a","task_type":"noop","config":{{"x":{}1{}}}}}]}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    vec![
        case(
            "cycle",
            file(def("cycle", json!([noop("a", &["b"]), noop("b", &["a"])]))),
            None,
        ),
        case(
            "unknown-dependency",
            file(def("ghost", json!([noop("a", &["ghost"])]))),
            None,
        ),
        case(
            "duplicate-keys",
            file(def("twice", json!([noop("a", &[]), noop("a", &[])]))),
            None,
        ),
        case("nul-in-key", file(def("nul-key", json!([noop("a\u{0}b", &[])]))), None),
        case(
            "unknown-task-type",
            file(def("type", json!([{"key": "a", "task_type": "rm -rf /"}]))),
            None,
        ),
        case(
            "timeout-past-consumer-timeout",
            file(def(
                "timeout",
                json!([{"key": "a", "task_type": "noop", "timeout_seconds": 1e9}]),
            )),
            None,
        ),
        case(
            "huge-version",
            br#"{"name":"hostile-version","version":1e30,"tasks":[]}"#.to_vec(),
            None,
        ),
        case("nesting-10000-deep", deep.into_bytes(), None),
        case(
            "not-utf8",
            b"{\"name\":\"hostile-\xff\xfe\",\"version\":1,\"tasks\":[]}".to_vec(),
            None,
        ),
        case("not-json", b"name: hostile\n".to_vec(), None),
        case("empty", Vec::new(), None),
        case(
            "input-over-the-limit",
            file(def("big-input", json!([noop("a", &[])]))),
            Some(json!({"blob": "x".repeat(2 * 1024 * 1024)}).to_string()),
        ),
        case(
            "nul-in-input",
            file(def("nul-input", json!([noop("a", &[])]))),
            Some(r#"{"s":"\u0000"}"#.to_owned()),
        ),
        case(
            "input-not-json",
            file(def("bad-input", json!([noop("a", &[])]))),
            Some("{".to_owned()),
        ),
    ]
}

/// Submits `case`; what was wrong with the answer, if anything.
fn submit_hostile(procs: &Processes, db_url: &str, dir: &Path, case: &Hostile) -> Option<String> {
    let path = dir.join(format!("hostile-{}.json", case.case));
    std::fs::write(&path, &case.file).expect("writing a hostile definition");
    let path = path.display().to_string();
    let mut args = vec!["--db", db_url, "submit", path.as_str()];
    let input_file;
    if let Some(input) = &case.input {
        // From a file: a 2 MB argument would hit the kernel's limit first.
        let file = dir.join(format!("hostile-{}.input", case.case));
        std::fs::write(&file, input).expect("writing a hostile input");
        input_file = format!("@{}", file.display());
        args.extend(["--input", input_file.as_str()]);
    }
    let out = procs.output(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fine = out.status.code() == Some(2) && !stderr.trim().is_empty() && !stderr.contains("panicked");
    (!fine).then(|| {
        format!(
            "hostile {}: {} — {}",
            case.case,
            out.status,
            stderr.lines().take(3).collect::<Vec<_>>().join(" / ")
        )
    })
}

/// One started run.
struct Started {
    id: RunId,
    shape: Shape,
    /// When to ask for its cancel, if it is to be cancelled.
    cancel_at: Option<Instant>,
    cancelled: bool,
}

/// One process's own paths to the two services.
struct Paths {
    postgres: Proxy,
    rabbitmq: Proxy,
}

/// One scenario's processes, proxies, database and ledger.
struct Bench {
    store: PgStore,
    procs: Processes,
    paths: BTreeMap<String, Paths>,
    db: BenchDb,
    ledger: tempfile::TempDir,
    workflows: BTreeMap<Shape, WorkflowId>,
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
        let procs = Processes::new(vec![
            "--queue".into(),
            queue,
            "--lease-seconds".into(),
            LEASE_SECS.to_string(),
            "--pg-pool-size".into(),
            PG_POOL.to_string(),
            "--pg-pool-min".into(),
            PG_POOL.to_string(),
        ])
        .with_env(vec![("GLIBC_TUNABLES".to_owned(), image_glibc_tunables())]);
        procs.run("migrate", &["migrate", "--db", &db.url(), "--amqp", amqp_url]);
        let store = PgStore::connect(
            &db.url(),
            Arc::new(SystemClock),
            PgOptions {
                max_connections: 4,
                application_name: "flowforge-chaos".to_owned(),
                // A start refused while PostgreSQL is down must not hold
                // the harness's loop (and the fault's healing) for long.
                acquire_timeout: Duration::from_secs(1),
                ..PgOptions::default()
            },
        )
        .await
        .expect("connecting to the scenario's database");
        let ledger = tempfile::tempdir().expect("a ledger folder");
        let mut workflows = BTreeMap::new();
        for shape in Shape::ALL.into_iter().chain(Shape::POISON).chain([Shape::Slow]) {
            workflows.insert(shape, publish(&store, &shape.definition(ledger.path())).await);
        }
        let mut bench = Self {
            store,
            procs,
            paths: BTreeMap::new(),
            db,
            ledger,
            workflows,
            broker,
        };
        for i in 1..=2 {
            bench.spawn(&format!("scheduler-{i}"), &["scheduler"]).await;
            bench
                .spawn(
                    &format!("publisher-{i}"),
                    &["publisher", "--redispatch-after-seconds", REDISPATCH_SECS],
                )
                .await;
        }
        for i in 1..=WORKERS {
            bench
                .spawn(
                    &format!("worker-{i}"),
                    &["worker", "--concurrency", "2", "--allow-command"],
                )
                .await;
        }
        bench
    }

    /// Starts `flowforge <args>` as `name`, through proxies of its own.
    async fn spawn(&mut self, name: &str, args: &[&str]) {
        let postgres = Proxy::start(&proxy::upstream(&self.db.url(), 5432), false).await;
        let rabbitmq = Proxy::start(&proxy::upstream(&self.broker.url, 5672), true).await;
        let amqp = proxy::via(&self.broker.url, rabbitmq.addr);
        let amqp = format!(
            "{amqp}{}heartbeat={HEARTBEAT_SECS}",
            if amqp.contains('?') { '&' } else { '?' }
        );
        let db = proxy::via(&self.db.url(), postgres.addr);
        let mut argv = vec!["--db", db.as_str(), "--amqp", amqp.as_str()];
        argv.extend_from_slice(args);
        self.procs.spawn(name, &argv);
        self.paths.insert(name.to_owned(), Paths { postgres, rabbitmq });
    }

    /// Starts a run of `shape`; `None` when the store refused (it is
    /// down): the client knows the run was not started, and it does not
    /// count as submitted.
    async fn submit(&self, shape: Shape, cancel_after: Option<Duration>) -> Option<Started> {
        match self.store.start_run(self.workflows[&shape], json!({})).await {
            Ok(id) => Some(Started {
                id,
                shape,
                cancel_at: cancel_after.map(|d| Instant::now() + d),
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
        let now = Instant::now();
        for run in runs.iter_mut().filter(|r| !r.cancelled) {
            if run.cancel_at.is_some_and(|at| now >= at) {
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

    fn path(&self, name: &str) -> &Paths {
        &self.paths[name]
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

/// Evaluates an Erlang expression in this machine's broker; its result.
fn rabbit_eval(expression: &str) -> Result<String, String> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["eval", expression])
        .output()
        .map_err(|e| format!("cannot run rabbitmqctl: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "rabbitmqctl eval {expression} failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout.lines().last().unwrap_or_default().trim().to_owned())
}

/// Settings of this machine's broker changed for a scenario (new channels
/// take them), put back when this guard drops, however the run ends. The
/// old values are also kept in a file until then, so a harness killed
/// before it could put them back has the next run do it
/// ([`BrokerSettings::recover`]).
struct BrokerSettings {
    saved: Vec<(String, String)>,
}

impl BrokerSettings {
    fn file() -> std::path::PathBuf {
        std::env::temp_dir().join("flowforge-chaos-broker-settings")
    }

    fn set(settings: &[(&str, u64)]) -> Self {
        let mut guard = Self { saved: Vec::new() };
        for (key, value) in settings {
            let old = rabbit_eval(&format!("application:get_env(rabbit, {key}).")).unwrap_or_else(|e| panic!("{e}"));
            guard.saved.push(((*key).to_owned(), old.clone()));
            let lines: Vec<String> = guard.saved.iter().map(|(k, v)| format!("{k} {v}")).collect();
            std::fs::write(Self::file(), lines.join("\n")).expect("writing the broker settings to put back");
            rabbit_eval(&format!("application:set_env(rabbit, {key}, {value}).")).unwrap_or_else(|e| panic!("{e}"));
            eprintln!("broker setting {key} = {value} (was {old})");
        }
        guard
    }

    /// Puts back what a harness that did not end cleanly left changed.
    fn recover() {
        if let Ok(text) = std::fs::read_to_string(Self::file()) {
            let saved = text
                .lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            drop(Self { saved });
        }
    }
}

impl Drop for BrokerSettings {
    fn drop(&mut self) {
        // Never panics: it may run while a panic unwinds.
        let mut all_back = true;
        for (key, old) in &self.saved {
            let put = match old.strip_prefix("{ok,").and_then(|v| v.strip_suffix('}')) {
                Some(value) => rabbit_eval(&format!("application:set_env(rabbit, {key}, {value}).")),
                None => rabbit_eval(&format!("application:unset_env(rabbit, {key}).")),
            };
            match put {
                Ok(_) => eprintln!("broker setting {key} put back to {old}"),
                Err(e) => {
                    all_back = false;
                    eprintln!("could not put broker setting {key} back to {old}: {e}");
                }
            }
        }
        if all_back {
            let _ = std::fs::remove_file(Self::file());
        }
    }
}

/// A duplicate-delivery storm: a queue of its own bound like the
/// scenario's, so it gets a copy of every dispatch published, each put
/// back into the scenario's queue [`STORM_COPIES`] more times; it ends
/// (and its queue with it) when dropped.
struct Storm {
    task: tokio::task::JoinHandle<()>,
    copies: Arc<AtomicU64>,
}

impl Storm {
    fn begin(url: &str, queue: &str) -> Self {
        let copies = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (url, queue, copies) = (url.to_owned(), queue.to_owned(), Arc::clone(&copies));
            async move {
                if let Err(e) = storm(&url, &queue, &copies).await {
                    eprintln!("the duplicate-delivery storm stopped: {e}");
                }
            }
        });
        Self { task, copies }
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn storm(url: &str, queue: &str, copies: &AtomicU64) -> Result<(), lapin::Error> {
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::FieldTable;
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let mirror = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    // The workers' exchange and routing key (`--queue` names both).
    channel
        .queue_bind(
            mirror.name().clone(),
            "flowforge".into(),
            queue.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut consumer = channel
        .basic_consume(
            mirror.name().clone(),
            "chaos-storm".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        for _ in 0..STORM_COPIES {
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &delivery.data,
                    delivery.properties.clone(),
                )
                .await?;
            copies.fetch_add(1, Ordering::Relaxed);
        }
        delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// The fault a scenario injects: begun once, stepped while it lasts,
/// healed once.
struct Injector {
    fault: &'static str,
    next: Instant,
    /// A stopped worker and when to continue it.
    stopped: Option<(String, Instant)>,
    outage: Option<Outage>,
    storm: Option<Storm>,
    /// Whether every worker is stopped (`queue-delete`).
    held: bool,
    /// The publisher whose confirm trap is armed.
    trapped: Option<String>,
    /// How many times the fault was injected.
    injected: u64,
    /// What the fault showed to be wrong (a hostile input taken).
    findings: Vec<String>,
}

impl Injector {
    fn new(fault: &'static str) -> Self {
        Self {
            fault,
            next: Instant::now(),
            stopped: None,
            outage: None,
            storm: None,
            held: false,
            trapped: None,
            injected: 0,
            findings: Vec::new(),
        }
    }

    /// The workers a cut or a skew hits.
    fn victims(&self) -> &'static [&'static str] {
        match self.fault {
            "clock-skew" => &["worker-1", "worker-2"],
            _ => &["worker-1"],
        }
    }

    /// Starts a fault that lasts its whole phase.
    fn begin(&mut self, bench: &mut Bench) {
        let everyone: Vec<String> = bench.paths.keys().cloned().collect();
        match self.fault {
            "rabbitmq-stop" => self.outage = Some(Outage::begin(Service::Rabbitmq)),
            "postgres-stop" => self.outage = Some(Outage::begin(Service::Postgres)),
            "rabbitmq-pause" => everyone.iter().for_each(|n| bench.path(n).rabbitmq.silence(true)),
            "postgres-pause" => everyone.iter().for_each(|n| bench.path(n).postgres.silence(true)),
            "worker-cut-postgres" => bench.path(self.victims()[0]).postgres.silence(true),
            "worker-cut-rabbitmq" => bench.path(self.victims()[0]).rabbitmq.silence(true),
            "duplicate-delivery" => self.storm = Some(Storm::begin(&bench.broker.url, &bench.broker.queues[0])),
            "clock-skew" => {
                let env = skewed_env();
                for (victim, sign) in self.victims().iter().zip(['+', '-']) {
                    let env = env
                        .iter()
                        .cloned()
                        .chain([("FAKETIME".to_owned(), format!("{sign}{SKEW}"))]);
                    bench.procs.set_env(victim, env.collect());
                    restart_drained(&mut bench.procs, victim);
                }
            }
            _ => return,
        }
        self.injected = 1;
        eprintln!("fault {} begun", self.fault);
    }

    /// Ends the fault.
    fn heal(&mut self, bench: &mut Bench) {
        if let Some((victim, _)) = self.stopped.take() {
            bench.procs.signal(&victim, Signal::SIGCONT);
            eprintln!("continued {victim}");
        }
        self.outage = None;
        if let Some(storm) = self.storm.take() {
            self.injected = storm.copies.load(Ordering::Relaxed);
        }
        if std::mem::take(&mut self.held) {
            for w in bench.procs.names("worker-") {
                bench.procs.signal(&w, Signal::SIGCONT);
            }
        }
        if let Some(victim) = self.trapped.take()
            && !bench.path(&victim).rabbitmq.disarm()
        {
            self.restart_trapped(bench, &victim);
        }
        for paths in bench.paths.values() {
            paths.postgres.silence(false);
            paths.rabbitmq.silence(false);
        }
        if self.fault == "consumer-timeout" {
            // The workers' logs tell how often the broker took deliveries back.
            self.injected = bench
                .procs
                .names("worker-")
                .iter()
                .map(|w| bench.procs.log(w).matches("acknowledgement failed").count() as u64)
                .sum();
        }
        if self.fault == "clock-skew" {
            for victim in self.victims() {
                bench.procs.set_env(victim, Vec::new());
                restart_drained(&mut bench.procs, victim);
            }
        }
    }

    fn restart_trapped(&mut self, bench: &mut Bench, victim: &str) {
        let status = bench.procs.wait_exit(victim, Duration::from_secs(5));
        let pid = bench.procs.respawn(victim);
        self.injected += 1;
        eprintln!("{victim} killed as its publish was confirmed ({status:?}); started again as pid {pid}");
    }

    /// Injects what is due now; never blocks the workload for long.
    fn tick(&mut self, bench: &mut Bench) {
        if self.stopped.as_ref().is_some_and(|(_, until)| Instant::now() >= *until)
            && let Some((victim, _)) = self.stopped.take()
        {
            bench.procs.signal(&victim, Signal::SIGCONT);
            eprintln!("continued {victim}");
        }
        if Instant::now() < self.next || self.stopped.is_some() {
            return;
        }
        let procs = &mut bench.procs;
        let workers = procs.names("worker-");
        let pick = |list: &[String]| list[fastrand::usize(..list.len())].clone();
        match self.fault {
            "worker-kill" => {
                // A fifth of the workers, every 3 s.
                for _ in 0..WORKERS.div_ceil(5) {
                    let victim = pick(&workers);
                    procs.signal(&victim, Signal::SIGKILL);
                    let pid = procs.respawn(&victim);
                    self.injected += 1;
                    eprintln!("killed {victim}; started again as pid {pid}");
                }
                self.next = Instant::now() + Duration::from_secs(3);
            }
            "worker-stop" => {
                // Stopped for twice the lease: its tasks are reaped and run
                // elsewhere, and its late finishes must be rejected.
                let victim = pick(&workers);
                procs.signal(&victim, Signal::SIGSTOP);
                self.injected += 1;
                eprintln!("stopped {victim}");
                self.stopped = Some((victim, Instant::now() + Duration::from_secs(2 * LEASE_SECS)));
                self.next = Instant::now() + Duration::from_secs(2);
            }
            "worker-term" => {
                let victim = pick(&workers);
                restart_drained(procs, &victim);
                self.injected += 1;
                self.next = Instant::now() + Duration::from_secs(2);
            }
            "control-kill" => {
                let mut control = procs.names("scheduler-");
                control.extend(procs.names("publisher-"));
                let victim = pick(&control);
                procs.signal(&victim, Signal::SIGKILL);
                let pid = procs.respawn(&victim);
                self.injected += 1;
                eprintln!("killed {victim}; started again as pid {pid}");
                self.next = Instant::now() + Duration::from_secs(2);
            }
            "publisher-kill-confirmed" => {
                // Armed on one publisher at a time; once it has sprung, the
                // publisher is started again and the next one armed 1 s on.
                if let Some(victim) = self.trapped.clone() {
                    if !bench.path(&victim).rabbitmq.trap_armed() {
                        self.trapped = None;
                        self.restart_trapped(bench, &victim);
                        self.next = Instant::now() + Duration::from_secs(1);
                    }
                } else {
                    let publishers = procs.names("publisher-");
                    let victim = publishers[self.injected as usize % publishers.len()].clone();
                    let pid = procs.pid(&victim);
                    bench.path(&victim).rabbitmq.arm_confirm_trap(pid);
                    self.trapped = Some(victim);
                }
            }
            "queue-delete" => {
                // Deleted under the publisher and the consumers with the
                // dispatches it held: the workers are held still for 6 s
                // first, so new runs fill every prefetch slot and the rest
                // wait ready in the queue.
                if self.held {
                    let (url, queue) = (&bench.broker.url, &bench.broker.queues[0]);
                    match support::amqp::delete_queue(url, queue) {
                        Ok(n) => eprintln!("deleted queue {queue} holding {n} ready messages"),
                        Err(e) => eprintln!("could not delete queue {queue}: {e}"),
                    }
                    for w in &workers {
                        procs.signal(w, Signal::SIGCONT);
                    }
                    self.held = false;
                    self.injected += 1;
                    self.next = Instant::now() + Duration::from_secs(4);
                } else {
                    for w in &workers {
                        procs.signal(w, Signal::SIGSTOP);
                    }
                    self.held = true;
                    self.next = Instant::now() + Duration::from_secs(6);
                }
            }
            "hostile-input" => {
                let cases = hostile_cases();
                let case = &cases[self.injected as usize % cases.len()];
                let finding = submit_hostile(&bench.procs, &bench.db.url(), bench.ledger.path(), case);
                self.findings.extend(finding);
                self.injected += 1;
                self.next = Instant::now() + Duration::from_millis(500);
            }
            // The rest last their whole phase (see `begin`) or change the
            // workload rather than the processes.
            _ => self.next = Instant::now() + Duration::from_secs(3600),
        }
    }
}

/// SIGTERMs `victim`, which must finish its in-flight tasks and exit 0
/// within 30 s, then starts it again.
fn restart_drained(procs: &mut Processes, victim: &str) {
    procs.signal(victim, Signal::SIGTERM);
    let status = procs.wait_exit(victim, Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "{victim} did not drain and exit 0 on SIGTERM ({status:?}):\n{}",
        procs.tail(victim)
    );
    let pid = procs.respawn(victim);
    eprintln!("{victim} drained and exited 0; started again as pid {pid}");
}

/// The environment that runs a process under libfaketime; checked to move
/// the clock, so a skew scenario cannot pass without one.
fn skewed_env() -> Vec<(String, String)> {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "clock-skew needs libfaketime at {LIBFAKETIME} (Debian: apt-get install faketime)"
    );
    let env = vec![("LD_PRELOAD".to_owned(), LIBFAKETIME.to_owned())];
    let out = std::process::Command::new("date")
        .arg("+%s")
        .envs(env.iter().cloned())
        .env("FAKETIME", format!("+{SKEW}"))
        .output()
        .expect("running date under libfaketime");
    let faked: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    assert!(
        faked - real >= 240,
        "libfaketime did not move the clock ({faked} vs {real})"
    );
    env
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
fn check(bench: &mut Bench, runs: &[Started]) -> Value {
    let read = |name: &str| std::fs::read_to_string(bench.ledger.path().join(name)).unwrap_or_default();
    let mut effects: HashMap<String, u32> = HashMap::new();
    for key in read("effects").lines() {
        *effects.entry(key.to_owned()).or_default() += 1;
    }
    let attempt_lines = read("attempts");
    let attempts = attempt_lines.lines().count();
    // Each claim is a new attempt number: the same one run twice means two
    // workers held one claim.
    let mut seen: HashMap<&str, u32> = HashMap::new();
    for line in attempt_lines.lines() {
        *seen.entry(line).or_default() += 1;
    }
    let duplicate_attempts = seen.values().filter(|n| **n > 1).count();
    let duplicates = effects.values().filter(|n| **n > 1).count();

    let tasks = bench.db.sql("SELECT run_id || ':' || task_key, state FROM task_run");
    let mut task_states: HashMap<String, String> = HashMap::new();
    for line in tasks.lines() {
        if let Some((key, state)) = line.split_once('|') {
            task_states.insert(key.to_owned(), state.to_owned());
        }
    }
    let poisoned: std::collections::HashSet<String> = runs
        .iter()
        .filter(|r| matches!(r.shape, Shape::Poison(_)))
        .map(|r| format!("{}:poison", r.id))
        .collect();
    let no_effect = task_states
        .iter()
        .filter(|(key, state)| *state == "succeeded" && !effects.contains_key(*key) && !poisoned.contains(*key))
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
            .entry(run.shape.name())
            .or_default()
            .entry(state.to_owned())
            .or_default() += 1;
        let natural = match run.shape {
            Shape::Chain | Shape::Fan | Shape::Retry | Shape::Cancel | Shape::Slow => state == "succeeded",
            Shape::Saga => {
                state == "failed"
                    && task_states.get(&format!("{id}:undo_book")).map(String::as_str) == Some("succeeded")
            }
            Shape::Poison(_) => state == "failed",
        };
        let fine = natural || (run.cancel_at.is_some() && state == "cancelled");
        if !matches!(state, "succeeded" | "failed" | "cancelled") {
            stuck += 1;
        } else if !fine {
            wrong.push(format!("{id} ({}) ended {state}", run.shape.name()));
        }
    }
    let stale: u64 = bench
        .db
        .sql("SELECT count(*) FROM task_run_event WHERE transition = 'stale_write_rejected'")
        .parse()
        .unwrap_or(0);
    let down: Vec<String> = bench
        .procs
        .exited()
        .into_iter()
        .map(|(name, status)| format!("{name} ({status})"))
        .collect();
    let finished = runs.len() - missing - stuck;
    json!({
        "submitted": runs.len(),
        "finished": finished,
        "lost": missing + no_effect,
        "duplicate_effects": duplicates,
        "duplicate_attempts": duplicate_attempts,
        "stuck": stuck,
        "wrong": wrong.len(),
        "wrong_runs": wrong.into_iter().take(5).collect::<Vec<_>>(),
        "down": down.len(),
        "down_processes": down,
        "stale_writes_rejected": stale,
        "attempts": attempts,
        "effects": effects.len(),
        "ended": ended,
    })
}

/// What a process holds at one moment: resident memory and its open
/// sockets by peer.
#[derive(Debug, Clone, Copy)]
struct Footprint {
    rss_kib: u64,
    /// Sockets connected to the process's PostgreSQL proxy.
    postgres: u64,
    /// Sockets connected to its RabbitMQ proxy.
    rabbitmq: u64,
    /// Any other socket (listeners, the log, a half-closed peer).
    other: u64,
}

impl Footprint {
    fn sockets(self) -> u64 {
        self.postgres + self.rabbitmq + self.other
    }
}

/// Socket inode → remote port, for every TCP socket on this host.
fn remote_ports() -> HashMap<u64, u16> {
    let mut ports = HashMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // `sl local rem st tx:rx tr:when retrnsmt uid timeout inode …`
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields
                .get(2)
                .and_then(|rem| rem.rsplit_once(':'))
                .and_then(|(_, port)| u16::from_str_radix(port, 16).ok());
            let inode = fields.get(9).and_then(|i| i.parse().ok());
            if let (Some(port), Some(inode)) = (port, inode) {
                ports.insert(inode, port);
            }
        }
    }
    ports
}

/// The footprint of process `pid`, whose proxies listen on `postgres` and
/// `rabbitmq`.
fn footprint(pid: u32, ports: &HashMap<u64, u16>, postgres: u16, rabbitmq: u16) -> Option<Footprint> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let mut held = Footprint {
        rss_kib,
        postgres: 0,
        rabbitmq: 0,
        other: 0,
    };
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(Result::ok)
    {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let Some(inode) = target.strip_prefix("socket:[").and_then(|t| t.strip_suffix(']')) else {
            continue;
        };
        match inode.parse().ok().and_then(|i: u64| ports.get(&i)) {
            Some(&port) if port == postgres => held.postgres += 1,
            Some(&port) if port == rabbitmq => held.rabbitmq += 1,
            _ => held.other += 1,
        }
    }
    Some(held)
}

/// One sample: seconds since the start, the pid, what it held.
type Sample = (f64, u32, Footprint);

/// Footprints of every process, taken while a soak runs.
#[derive(Default)]
struct Footprints {
    samples: BTreeMap<String, Vec<Sample>>,
}

impl Footprints {
    fn sample(&mut self, bench: &mut Bench, at: f64) {
        let ports = remote_ports();
        for name in bench.procs.names("") {
            let pid = bench.procs.pid(&name);
            let path = bench.path(&name);
            let (postgres, rabbitmq) = (path.postgres.addr.port(), path.rabbitmq.addr.port());
            if let Some(held) = footprint(pid, &ports, postgres, rabbitmq) {
                self.samples.entry(name).or_default().push((at, pid, held));
            }
        }
    }

    /// Each process's growth, for the processes that ran through it all:
    /// memory from the `base` window to the `last` window (the median of
    /// each); sockets from the most it held during the `warm_up` to the
    /// median of `last` — a connection pool grows and shrinks with demand
    /// within the range the warm-up's faults took it through, and only a
    /// leak leaves that range. With it, the footprint every `step` seconds
    /// from the end of `base`.
    fn growth(&self, warm_up: (f64, f64), base: (f64, f64), last: (f64, f64), step: f64) -> Value {
        let mut rows = BTreeMap::new();
        let (mut worst_rss, mut worst_sockets) = (0.0_f64, 0.0_f64);
        for (name, samples) in &self.samples {
            let window = |(from, to): (f64, f64)| -> Vec<&Sample> {
                samples.iter().filter(|s| s.0 >= from && s.0 < to).collect()
            };
            let (warm, first, end) = (window(warm_up), window(base), window(last));
            let Some(start) = warm.first() else {
                continue;
            };
            // One pid from the warm-up to the end: a restarted process's
            // footprint starts afresh.
            let restarted = samples
                .iter()
                .filter(|s| s.0 >= warm_up.0 && s.0 < last.1)
                .any(|s| s.1 != start.1);
            if first.is_empty() || end.is_empty() || restarted {
                continue;
            }
            let med =
                |w: &[&Sample], f: fn(Footprint) -> u64| median(&w.iter().map(|s| f(s.2) as f64).collect::<Vec<_>>());
            let rss = (med(&first, |f| f.rss_kib), med(&end, |f| f.rss_kib));
            let most = warm.iter().map(|s| s.2.sockets()).max().unwrap_or(0) as f64;
            let sockets = (most, med(&end, Footprint::sockets));
            let pct = |(a, b): (f64, f64)| match a {
                a if a > 0.0 => 100.0 * (b - a) / a,
                _ if b > 0.0 => 100.0,
                _ => 0.0,
            };
            worst_rss = worst_rss.max(pct(rss));
            worst_sockets = worst_sockets.max(pct(sockets));
            let by_peer = |w: &[&Sample]| {
                json!({
                    "postgres": med(w, |f| f.postgres),
                    "rabbitmq": med(w, |f| f.rabbitmq),
                    "other": med(w, |f| f.other),
                })
            };
            // The footprint over time: the sample nearest each step.
            let mut over_time = Vec::new();
            let mut at = base.1;
            while at <= last.1 {
                if let Some(s) = samples
                    .iter()
                    .min_by(|x, y| (x.0 - at).abs().total_cmp(&(y.0 - at).abs()))
                {
                    over_time.push(json!([(at - base.1).round() as u64, s.2.rss_kib, s.2.sockets()]));
                }
                at += step;
            }
            rows.insert(
                name.clone(),
                json!({
                    "rss_kib": [rss.0, rss.1],
                    "sockets": [sockets.0, sockets.1],
                    "sockets_by_peer": by_peer(&end),
                    "over_time": over_time,
                }),
            );
        }
        json!({
            "processes_measured": rows.len(),
            "rss_growth_pct": round(worst_rss, 1),
            "socket_growth_pct": round(worst_sockets, 1),
            "per_process": rows,
        })
    }
}

/// When each fault of a scenario begins and ends (seconds from its start).
fn fault_windows(name: &'static str, phases: Phases) -> Vec<(f64, f64, &'static str)> {
    let (warm, fault) = (phases.warm.as_secs_f64(), phases.fault.as_secs_f64());
    if name != "soak" {
        return vec![(warm, warm + fault, name)];
    }
    // The warm-up: calm, then every fault once in a random order, so each
    // process has grown its pools and buffers to what each fault asks of
    // them before its footprint is taken; then the soak proper.
    let mut deck = SOAK_FAULTS.to_vec();
    fastrand::shuffle(&mut deck);
    let mut windows = Vec::new();
    let mut at = SOAK_CALM;
    for fault in deck {
        windows.push((at, at + 15.0, fault));
        at += 30.0;
    }
    // One random fault every 30 s: 15 s of it, then 15 s of calm.
    while at + 15.0 <= warm + fault {
        windows.push((at, at + 15.0, SOAK_FAULTS[fastrand::usize(..SOAK_FAULTS.len())]));
        at += 30.0;
    }
    windows
}

async fn scenario(name: &'static str, phases: Phases, server: &Server, amqp_url: &str) -> Value {
    eprintln!("==> scenario {name}");
    // The workers' channels time a delivery out after CONSUMER_TIMEOUT_MS,
    // checked every second, from their start to the scenario's end.
    let _settings = (name == "consumer-timeout").then(|| {
        BrokerSettings::set(&[
            ("consumer_timeout", CONSUMER_TIMEOUT_MS),
            ("channel_tick_interval", 1000),
        ])
    });
    let mut bench = Bench::start(server, amqp_url, "chaos").await;
    let origin = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let begun = Instant::now();
    let mut runs: Vec<Started> = Vec::new();
    let windows = fault_windows(name, phases);
    let mut window = 0;
    let mut injector: Option<Injector> = None;
    let mut injected: BTreeMap<&str, u64> = BTreeMap::new();
    let mut findings: Vec<String> = Vec::new();
    let mut footprints = Footprints::default();
    let mut next_sample = 0.0;
    let total = phases.warm + phases.fault + phases.after;
    let interval = Duration::from_secs_f64(1.0 / RATE);
    let mut next_submit = Instant::now();
    let mut submitted = 0;
    let mut healed = None;
    while begun.elapsed() < total {
        let now = begun.elapsed().as_secs_f64();
        if let Some(&(from, to, fault)) = windows.get(window) {
            if now >= to {
                if let Some(mut active) = injector.take() {
                    active.heal(&mut bench);
                    *injected.entry(fault).or_default() += active.injected;
                    findings.append(&mut active.findings);
                    eprintln!("fault {fault} healed at {now:.1} s");
                }
                healed = Some(now);
                window += 1;
            } else if now >= from {
                let active = injector.get_or_insert_with(|| {
                    let mut new = Injector::new(fault);
                    new.begin(&mut bench);
                    new
                });
                active.tick(&mut bench);
            }
        }
        let workload = injector.as_ref().map(|i| i.fault);
        if Instant::now() >= next_submit {
            let shape = Shape::ALL[submitted % Shape::ALL.len()];
            // Within a run's lifetime (about a second): racing its tasks'
            // completions, the retried task's retry and the saga's
            // compensation.
            let cancel_after = match (shape, workload) {
                (_, Some("cancel-race")) => Some(Duration::from_millis(fastrand::u64(..1200))),
                (Shape::Cancel, _) => Some(Duration::from_millis(500)),
                _ => None,
            };
            runs.extend(bench.submit(shape, cancel_after).await);
            match workload {
                Some("poison-tasks") => {
                    let poison = Shape::POISON[submitted % Shape::POISON.len()];
                    runs.extend(bench.submit(poison, None).await);
                }
                Some("consumer-timeout") => runs.extend(bench.submit(Shape::Slow, None).await),
                _ => {}
            }
            if let Some(active) = injector
                .as_mut()
                .filter(|i| matches!(i.fault, "cancel-race" | "poison-tasks"))
            {
                active.injected += 1;
            }
            submitted += 1;
            next_submit += interval;
        }
        bench.cancel_due(&mut runs).await;
        if name == "soak" && now >= next_sample {
            footprints.sample(&mut bench, now);
            next_sample = now + 5.0;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // An iteration that blocked past the end (a drain, a restart) leaves
    // its fault to heal here, before anything settles or is checked.
    if let Some(mut active) = injector.take() {
        active.heal(&mut bench);
        *injected.entry(active.fault).or_default() += active.injected;
        findings.append(&mut active.findings);
        healed = Some(begun.elapsed().as_secs_f64());
    }
    let submitted_for = begun.elapsed().as_secs_f64();
    let settle_by = Instant::now() + SETTLE;
    while bench.unfinished() > 0 && Instant::now() < settle_by {
        bench.cancel_due(&mut runs).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let hostile_runs: u64 = bench
        .db
        .sql(
            "SELECT count(*) FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id WHERE w.name LIKE 'hostile-%'",
        )
        .parse()
        .unwrap_or(0);
    if hostile_runs > 0 {
        findings.push(format!("{hostile_runs} runs of hostile definitions were started"));
    }
    let mut result = check(&mut bench, &runs);
    if !findings.is_empty() {
        result["wrong"] = json!(result["wrong"].as_u64().unwrap_or(0) + findings.len() as u64);
        if let Some(list) = result["wrong_runs"].as_array_mut() {
            list.extend(findings.into_iter().take(10).map(Value::from));
        }
    }
    let rates = completions_per_second(&bench.db, origin);
    let healed = healed.unwrap_or(submitted_for);
    result["recovery_s"] = json!(recovery(&rates, phases.warm, healed, submitted_for).map(|r| round(r, 1)));
    result["scenario"] = json!(name);
    result["seconds"] = json!(phases.fault.as_secs());
    result["faults"] = json!(injected.values().sum::<u64>());
    // A fault that never happened proves nothing.
    let mut passed = [
        "lost",
        "duplicate_effects",
        "duplicate_attempts",
        "stuck",
        "wrong",
        "down",
    ]
    .iter()
    .all(|k| result[*k].as_u64() == Some(0))
        && result["faults"].as_u64().is_some_and(|n| n > 0);
    if name == "soak" {
        let warm = phases.warm.as_secs_f64();
        // The end of the warm-up: the calm after its round of every fault.
        let growth = footprints.growth(
            (0.0, warm),
            (warm - 15.0, warm),
            (submitted_for - 30.0, submitted_for),
            120.0,
        );
        passed &= growth["rss_growth_pct"].as_f64().is_some_and(|g| g <= 10.0)
            && growth["socket_growth_pct"].as_f64().is_some_and(|g| g <= 10.0)
            && growth["processes_measured"].as_u64().is_some_and(|n| n > 0);
        result["footprint"] = growth;
        result["faults_by_kind"] = json!(injected);
    }
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
        if !SCENARIOS.contains(n) && *n != "soak" {
            eprintln!(
                "unknown scenario {n}; the scenarios are {} and soak",
                SCENARIOS.join(", ")
            );
            std::process::exit(2);
        }
    }
    BrokerSettings::recover();
    let amqp_url = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP.to_owned());
    let server = Server::from_env();
    let mut failed = false;
    for name in SCENARIOS.into_iter().chain(["soak"]) {
        let chosen = if named.is_empty() {
            name != "soak"
        } else {
            named.contains(&name)
        };
        if !chosen {
            continue;
        }
        let phases = match (name, quick) {
            ("soak", _) => Phases {
                warm: Duration::from_secs_f64(SOAK_CALM + 30.0 * SOAK_FAULTS.len() as f64),
                fault: Duration::from_secs(seconds.unwrap_or(if quick { 90 } else { 600 })),
                after: Duration::from_secs(60),
            },
            (_, true) => Phases {
                warm: Duration::from_secs(5),
                fault: Duration::from_secs(seconds.unwrap_or(10)),
                after: Duration::from_secs(8),
            },
            (_, false) => Phases {
                warm: Duration::from_secs(10),
                fault: Duration::from_secs(seconds.unwrap_or(30)),
                after: Duration::from_secs(20),
            },
        };
        let result = scenario(name, phases, &server, &amqp_url).await;
        failed |= result["passed"] != json!(true);
        println!("{result}");
    }
    if failed {
        std::process::exit(1);
    }
}
