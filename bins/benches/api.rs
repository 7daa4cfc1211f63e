//! HTTP API benchmarks (issue 12): a release `flowforge server` process
//! driven over HTTP with reqwest. Prints one JSON object per scenario;
//! `cargo xtask bench api` runs it and writes the figures down. Usage:
//! `cargo bench -p flowforge-bins --bench api -- [start_sqlite|start_pg|get_run|sse|remote_sqlite|remote_pg]...`
//! (all when none given). `API_BENCH_SECONDS` sets each load phase's
//! length (default 5).

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use support::{BenchDb, Server as PgServer, env_number, fanout, percentile, round};
use tokio::sync::Semaphore;

/// A server process, killed when dropped.
struct ServerProc {
    child: Child,
    base: String,
    token: String,
    db: String,
    _dir: tempfile::TempDir,
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn flowforge(db: &str, dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowforge"));
    cmd.current_dir(dir)
        .env("FLOWFORGE_DB", db)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

fn start_server(db: &str) -> ServerProc {
    let dir = tempfile::tempdir().expect("a temp folder");
    if db.starts_with("postgres") {
        let status = flowforge(db, dir.path()).arg("migrate").status().expect("migrate");
        assert!(status.success(), "flowforge migrate failed");
    }
    let out = flowforge(db, dir.path())
        .args(["tokens", "create", "--name", "bench", "--scope", "admin"])
        .output()
        .expect("tokens create");
    assert!(out.status.success(), "tokens create: {out:?}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let log = dir.path().join("server.log");
    let child = flowforge(db, dir.path())
        .args(["server", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(File::create(&log).expect("a log"))
        .spawn()
        .expect("spawn the server");
    let deadline = Instant::now() + Duration::from_secs(60);
    let base = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // Only a whole line: read mid-write, the address would be cut short.
        if let Some((line, _)) = text
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_once('\n'))
        {
            break line.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "the server did not start:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    ServerProc {
        child,
        base,
        token,
        db: db.to_owned(),
        _dir: dir,
    }
}

fn kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

struct Api {
    http: reqwest::Client,
    server: ServerProc,
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.base)
    }

    async fn publish(&self, def: &flowforge::WorkflowDefinition) {
        let body = serde_json::to_value(def.document()).expect("JSON");
        let r = self
            .http
            .post(self.url("/api/v1/definitions"))
            .bearer_auth(&self.server.token)
            .json(&body)
            .send()
            .await
            .expect("publish");
        assert!(r.status().is_success(), "publish: {}", r.status());
    }

    async fn start(&self, workflow: &str) -> (u16, Duration) {
        let t0 = Instant::now();
        let r = self
            .http
            .post(self.url("/api/v1/runs"))
            .bearer_auth(&self.server.token)
            .json(&json!({"workflow": workflow, "input": {}}))
            .send()
            .await;
        let status = r.map_or(0, |r| r.status().as_u16());
        (status, t0.elapsed())
    }

    /// Starts a run of `workflow`: its id.
    async fn start_run(&self, workflow: &str) -> String {
        let started: Value = self
            .http
            .post(self.url("/api/v1/runs"))
            .bearer_auth(&self.server.token)
            .json(&json!({"workflow": workflow}))
            .send()
            .await
            .expect("start")
            .json()
            .await
            .expect("JSON");
        started["id"].as_str().expect("id").to_owned()
    }

    /// One claim request for `bench.remote` task runs.
    async fn claim(&self, worker: &str, max: u32, wait: f64) -> Vec<Value> {
        let body: Value = self
            .http
            .post(self.url("/api/v1/worker/claims"))
            .bearer_auth(&self.server.token)
            .json(&json!({"worker": worker, "task_types": ["bench.remote"], "max": max, "wait_seconds": wait}))
            .send()
            .await
            .expect("claim")
            .json()
            .await
            .expect("JSON");
        body["claims"].as_array().cloned().unwrap_or_default()
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(self.url(path))
            .bearer_auth(&self.server.token)
            .send()
            .await
            .expect("GET")
            .json()
            .await
            .expect("JSON")
    }

    /// Waits until no run is left to run: a SQLite server's engine has
    /// finished what the warm-up started (on PostgreSQL nothing runs them
    /// here, and nothing is waited for).
    async fn drain(&self) {
        if self.server.db.starts_with("postgres") {
            return;
        }
        loop {
            let page = self.get("/api/v1/runs?state=pending&state=running&limit=1").await;
            if page["items"].as_array().is_some_and(Vec::is_empty) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_run(&self, id: &str) {
        loop {
            let report = self.get(&format!("/api/v1/runs/{id}")).await;
            if matches!(report["state"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `POST /runs` at a fixed `rate` for `secs`: the rate it sustained and
/// its latencies. Requests are sent on schedule whether or not earlier
/// ones have answered (open loop), up to 1 024 outstanding; one that finds
/// 1 024 outstanding is not sent and counts as an error.
///
/// The rate sustained is the requests answered 201 over the time it took
/// to send them all (first send to last, plus one interval): the server
/// kept that rate when every request was sent on schedule and answered,
/// and the latencies say how late. Dividing by the time until the last
/// answer instead would put any rate a hair below itself (the last
/// request's latency added to the window), however fast the server.
async fn open_loop(api: &Arc<Api>, workflow: &str, rate: u64, secs: u64) -> Value {
    let gate = Arc::new(Semaphore::new(1024));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = rate * secs;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut dropped = 0u64;
    for _ in 0..total {
        tick.tick().await;
        let Ok(permit) = Arc::clone(&gate).try_acquire_owned() else {
            dropped += 1;
            continue;
        };
        let api = Arc::clone(api);
        let workflow = workflow.to_owned();
        tasks.spawn(async move {
            let r = api.start(&workflow).await;
            drop(permit);
            r
        });
    }
    let sending = started.elapsed().as_secs_f64() + 1.0 / rate as f64;
    let mut latencies = Vec::new();
    let mut errors = 0u64;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((201, took)) => latencies.push(took.as_secs_f64() * 1000.0),
            _ => errors += 1,
        }
    }
    let wall = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    json!({
        "rate_offered": rate,
        "achieved_per_s": round(latencies.len() as f64 / sending, 1),
        "sending_s": round(sending, 3),
        "drained_s": round(wall, 3),
        "p50_ms": round(percentile(&latencies, 50.0), 2),
        "p99_ms": round(percentile(&latencies, 99.0), 2),
        "errors": errors + dropped,
    })
}

/// `POST /runs` with `clients` requests always in flight: the most it serves.
async fn closed_loop(api: &Arc<Api>, workflow: &str, clients: usize, secs: u64) -> Value {
    let until = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let api = Arc::clone(api);
        let workflow = workflow.to_owned();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let (status, took) = api.start(&workflow).await;
                if status == 201 {
                    latencies.push(took.as_secs_f64() * 1000.0);
                }
            }
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(r) = tasks.join_next().await {
        latencies.extend(r.expect("a client"));
    }
    let wall = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    json!({
        "clients": clients,
        "max_per_s": round(latencies.len() as f64 / wall, 1),
        "p99_ms": round(percentile(&latencies, 99.0), 2),
    })
}

async fn start_scenario(name: &str, db: &str, rate: u64) -> Value {
    let secs = env_number("API_BENCH_SECONDS", 5);
    let api = Arc::new(Api {
        http: http_client(),
        server: start_server(db),
    });
    api.publish(&support::definition(
        "one",
        vec![json!({"key": "a", "task_type": "noop"})],
    ))
    .await;
    // Warm up: connections, caches.
    closed_loop(&api, "one", 8, 1).await;
    api.drain().await;
    // The fixed rate first: after the closed loop, the engine of a SQLite
    // server would still be running the thousands of runs it let in, and
    // the fixed rate would measure that backlog rather than the rate.
    // Offered 2 % above the target, so that a server keeping up shows a
    // rate at or above it (jitter in the sender's ticks costs a few
    // requests per thousand).
    let offered = rate + rate / 50;
    let fixed = open_loop(&api, "one", offered, secs).await;
    let max = closed_loop(&api, "one", 32, secs).await;
    json!({
        "scenario": name,
        "store": if api.server.db.starts_with("postgres") { "postgres" } else { "sqlite" },
        "achieved_per_s": fixed["achieved_per_s"],
        "p99_ms": fixed["p99_ms"],
        "p50_ms": fixed["p50_ms"],
        "rate_target": rate,
        "rate_offered": offered,
        "errors": fixed["errors"],
        "sending_s": fixed["sending_s"],
        "drained_s": fixed["drained_s"],
        "max_per_s": max["max_per_s"],
        "max_p99_ms": max["p99_ms"],
    })
}

/// A server on a SQLite file of its own (kept in the returned folder)
/// with a fan-out of `width` parallel tasks published.
async fn fanout_server(width: usize) -> (Api, flowforge::WorkflowDefinition, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp folder");
    let db = format!("sqlite://{}", dir.path().join("fanout.db").display());
    let api = Api {
        http: http_client(),
        server: start_server(&db),
    };
    let def = fanout(width);
    api.publish(&def).await;
    (api, def, dir)
}

async fn get_run() -> Value {
    let (api, def, _db) = fanout_server(998).await;
    let id = api.start_run(def.name()).await;
    api.wait_run(&id).await;
    let mut latencies = Vec::new();
    for _ in 0..300 {
        let t0 = Instant::now();
        let r = api
            .http
            .get(api.url(&format!("/api/v1/runs/{id}")))
            .bearer_auth(&api.server.token)
            .send()
            .await
            .expect("GET");
        let _ = r.bytes().await.expect("body");
        latencies.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    json!({
        "scenario": "get_run_1000",
        "tasks": def.tasks().len(),
        "p50_ms": round(percentile(&latencies, 50.0), 2),
        "p99_ms": round(percentile(&latencies, 99.0), 2),
    })
}

async fn sse() -> Value {
    let (api, def, _db) = fanout_server(9_998).await;
    let pid = api.server.child.id();
    let rss_before = kib(pid, "VmRSS:");
    let (anon_before, file_before) = (kib(pid, "RssAnon:"), kib(pid, "RssFile:"));
    let t0 = Instant::now();
    let id = api.start_run(def.name()).await;
    let response = api
        .http
        .get(api.url(&format!("/api/v1/runs/{id}/events")))
        .bearer_auth(&api.server.token)
        .send()
        .await
        .expect("stream");
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let (mut events, mut ended) = (0u64, false);
    while let Some(chunk) = stream.next().await {
        buffer.extend_from_slice(&chunk.expect("a chunk"));
        while let Some(at) = buffer.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..at + 2).collect();
            let text = String::from_utf8_lossy(&block);
            if text.contains("event: transition") {
                events += 1;
            } else if text.contains("event: end") {
                ended = true;
            }
        }
        if ended {
            break;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    // The stream's own peak, read before the check below fetches the whole
    // report (30 000 events at once), which is another request's memory.
    let peak = kib(pid, "VmHWM:");
    let (anon, file) = (kib(pid, "RssAnon:"), kib(pid, "RssFile:"));
    let report = api.get(&format!("/api/v1/runs/{id}")).await;
    let stored = report["events"].as_array().map_or(0, Vec::len) as u64;
    let peak_with_report = kib(pid, "VmHWM:");
    let mib = |after: u64, before: u64| round(after.saturating_sub(before) as f64 / 1024.0, 1);
    json!({
        "scenario": "sse_10000",
        "tasks": def.tasks().len(),
        "events_delivered": events,
        "events_stored": stored,
        "every_event": events == stored && ended,
        "wall_s": round(wall, 2),
        "rss_growth_mib": mib(peak, rss_before),
        "rss_anon_growth_mib": mib(anon, anon_before),
        "rss_file_growth_mib": mib(file, file_before),
        "rss_growth_with_report_mib": mib(peak_with_report, rss_before),
    })
}

/// Remote workers over the API: `clients` pollers claim up to `batch`
/// task runs at a time and post every outcome of a batch in one request,
/// over `run_count` runs of independent tasks of a type only they
/// serve (2 000 tasks in all). Throughput is task runs claimed and finished per second, from
/// the first claim to the last outcome stored.
async fn remote(name: &str, db: &str, run_count: usize, clients: usize, batch: u32) -> Value {
    let total = usize::try_from(env_number("API_BENCH_REMOTE_TASKS", 2_000)).unwrap_or(2_000);
    let width = total / run_count.max(1);
    let total = width * run_count;
    let api = Arc::new(Api {
        http: http_client(),
        server: start_server(db),
    });
    // A first (empty) claim registers the type, so the definition publishes.
    api.claim("bench-0", 1, 0.0).await;
    let tasks: Vec<Value> = (0..width)
        .map(|i| json!({"key": format!("t{i}"), "task_type": "bench.remote"}))
        .collect();
    api.publish(&support::definition("remote", tasks)).await;
    let mut runs = Vec::with_capacity(run_count);
    for _ in 0..run_count {
        runs.push(api.start_run("remote").await);
    }
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut pollers = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (api, done) = (Arc::clone(&api), Arc::clone(&done));
        pollers.spawn(async move {
            let worker = format!("bench-{c}");
            let mut requests = 0u64;
            while done.load(std::sync::atomic::Ordering::Relaxed) < total {
                let claims = api.claim(&worker, batch, 0.5).await;
                requests += 1;
                if claims.is_empty() {
                    continue;
                }
                let results: Vec<Value> = claims
                    .iter()
                    .map(|c| {
                        json!({"task_run_id": c["task_run_id"], "run_id": c["run_id"], "token": c["token"],
                                    "outcome": "succeeded", "output": {"ok": true}})
                    })
                    .collect();
                let stored: Value = api
                    .http
                    .post(api.url("/api/v1/worker/results"))
                    .bearer_auth(&api.server.token)
                    .json(&json!({"worker": worker, "results": results}))
                    .send()
                    .await
                    .expect("results")
                    .json()
                    .await
                    .expect("JSON");
                requests += 1;
                let recorded = stored["results"]
                    .as_array()
                    .map_or(0, |r| r.iter().filter(|r| r["status"] == "recorded").count());
                assert_eq!(recorded, claims.len(), "every outcome stored: {stored}");
                done.fetch_add(recorded, std::sync::atomic::Ordering::Relaxed);
            }
            requests
        });
    }
    let mut requests = 0;
    while let Some(r) = pollers.join_next().await {
        requests += r.expect("a poller");
    }
    let secs = started.elapsed().as_secs_f64();
    // On SQLite the server's own scheduler ends the run; on PostgreSQL no
    // scheduler runs here, and only claims and outcomes are measured.
    if !db.starts_with("postgres") {
        for run in &runs {
            api.wait_run(run).await;
        }
    }
    json!({
        "scenario": name,
        "store": if db.starts_with("postgres") { "postgres" } else { "sqlite" },
        "tasks": total,
        "runs": run_count,
        "clients": clients,
        "batch": batch,
        "requests": requests,
        "tasks_per_s": round(total as f64 / secs, 1),
        "seconds": round(secs, 2),
    })
}

// One thread generates the load: on a two-core machine a second one only
// takes a core from the server it measures (BENCHMARKS.md, api).
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    if want("start_sqlite") {
        let dir = tempfile::tempdir().expect("a temp folder");
        let db = format!("sqlite://{}", dir.path().join("start.db").display());
        println!("{}", start_scenario("start_sqlite", &db, 2_000).await);
    }
    if want("start_pg") {
        let server = PgServer::from_env();
        let bench_db = BenchDb::create(&server, "api");
        println!("{}", start_scenario("start_pg", &bench_db.url(), 1_000).await);
    }
    if want("get_run") {
        println!("{}", get_run().await);
    }
    if want("sse") {
        println!("{}", sse().await);
    }
    if want("remote_sqlite") {
        let dir = tempfile::tempdir().expect("a temp folder");
        let db = format!("sqlite://{}", dir.path().join("remote.db").display());
        println!("{}", remote("remote_sqlite", &db, 20, 8, 50).await);
        let dir = tempfile::tempdir().expect("a temp folder");
        let db = format!("sqlite://{}", dir.path().join("remote1.db").display());
        println!("{}", remote("remote_sqlite_one_run", &db, 1, 4, 50).await);
    }
    if want("remote_pg") {
        let server = PgServer::from_env();
        let bench_db = BenchDb::create(&server, "remote");
        println!("{}", remote("remote_pg", &bench_db.url(), 20, 8, 50).await);
        let bench_db = BenchDb::create(&server, "remote1");
        println!("{}", remote("remote_pg_one_run", &bench_db.url(), 1, 4, 50).await);
    }
}

/// An HTTP client (see `install_default_tls_provider` for why it installs one first).
fn http_client() -> reqwest::Client {
    flowforge_adapters_http::task::install_default_tls_provider();
    reqwest::Client::new()
}
