//! `cargo xtask compose-smoke`: the compose stack, end to end. Builds the
//! images (cached: seconds when nothing changed), brings `compose.yaml` up
//! under a project name of its own with two workers, then:
//!
//! 1. checks the image tunes glibc's allocator and each long-running
//!    process holds a fixed PostgreSQL pool of the size compose gives it;
//! 2. submits `examples/diamond.json` through the containerised CLI
//!    (`submit --wait --output json`) and checks the run succeeded with the
//!    report the embedded engine gives (`flowforge run … --output json` in
//!    the image), compared without ids, times, tokens, workers and event numbers;
//! 3. submits a workflow whose first task sleeps, kills the worker
//!    container running it, and checks the run still succeeds, the task
//!    having been taken back when its lease expired and finished once.
//!
//! The stack and its volumes are removed at the end, pass or fail (its
//! logs are shown first on a failure).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Map, Value, json};

use crate::docker;
use crate::images::{self, FLOWFORGE_IMAGE};
use crate::project_root;

/// Workers in the stack: the killed one and one to take over.
const WORKERS: usize = 2;
/// A short lease, so the killed worker's task is taken back in seconds.
const LEASE_SECONDS: &str = "5";
/// The pool size `.env.example` gives each long-running process.
const POOL: &str = "4";
/// How long the stack gets for anything that should take seconds.
const PATIENCE: Duration = Duration::from_secs(120);

/// `cargo xtask compose-smoke`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("compose-smoke takes no arguments, got `{arg}`");
    }
    let started = Instant::now();
    images::build()?;
    let stack = Stack::new(docker::compose_command()?)?;
    let outcome = smoke(&stack);
    if outcome.is_err() {
        // What the processes said is the first thing a failure needs.
        let _ = docker::run(&mut stack.compose(&["logs", "--no-color", "--tail", "60"]));
    }
    let removed = stack.down();
    outcome?;
    removed?;
    println!("compose-smoke: passed in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

fn smoke(stack: &Stack) -> Result<()> {
    let t0 = Instant::now();
    docker::run(&mut stack.compose(&["up", "--detach", "--scale", &format!("worker={WORKERS}")]))?;
    stack.wait_for_workers()?;
    println!(
        "<== stack up with {WORKERS} workers in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    the_processes_run_as_deployed(stack)?;
    println!(
        "<== every long-running process holds its fixed pool, on the tuned allocator, in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    let distributed = stack.cli_json(&["submit", "/examples/diamond.json", "--wait", "--output", "json"])?;
    ensure!(
        distributed["state"] == "succeeded",
        "the diamond run did not succeed:\n{distributed:#}"
    );
    let embedded = json_of(docker::output(Command::new("docker").args([
        "run",
        "--rm",
        FLOWFORGE_IMAGE,
        "run",
        "/examples/diamond.json",
        "--output",
        "json",
    ]))?)?;
    let distributed_id = distributed["run_id"].clone();
    let (distributed, embedded) = (comparable(&distributed), comparable(&embedded));
    ensure!(
        distributed == embedded,
        "the distributed and embedded reports of diamond differ once ids, times, tokens, workers and event numbers are dropped\n\
         --- distributed ---\n{distributed:#}\n--- embedded ---\n{embedded:#}"
    );
    println!(
        "<== diamond: succeeded, same report as embedded, in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    let run_id = distributed_id.as_str().unwrap_or_default();
    the_api_serves_the_run(stack, run_id)?;
    println!(
        "<== the server answered for the run with a token, in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    worker_killed_mid_run(stack)?;
    println!(
        "<== a worker killed mid-run: its task ran again elsewhere, the run succeeded, in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The image tunes glibc's allocator, and each long-running process
/// (two schedulers, the publisher, the server, the workers) holds the
/// fixed PostgreSQL pool compose gives it: `FLOWFORGE_PG_POOL` sessions
/// from its container's address (docs/design/cli.md#connection-pool).
fn the_processes_run_as_deployed(stack: &Stack) -> Result<()> {
    let env = docker::output(Command::new("docker").args([
        "image",
        "inspect",
        "--format",
        "{{range .Config.Env}}{{println .}}{{end}}",
        FLOWFORGE_IMAGE,
    ]))?;
    ensure!(
        env.lines()
            .any(|l| l.starts_with("GLIBC_TUNABLES=glibc.malloc.arena_max=")),
        "the image does not tune glibc's allocator; its environment:\n{env}"
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let pools = docker::output(&mut stack.compose(&[
            "exec",
            "-T",
            "postgres",
            "psql",
            "-U",
            "postgres",
            "-tAc",
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'flowforge' GROUP BY client_addr",
        ]))?;
        let sizes: Vec<&str> = pools.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        if sizes.len() == 4 + WORKERS && sizes.iter().all(|n| *n == POOL) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "expected {} processes holding {POOL} connections each, found pools of {sizes:?}",
            4 + WORKERS
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The `server` service answers `GET /api/v1/runs/{id}` for the run
/// `cli` submitted, with a token `cli` created, on the port compose
/// published (HTTP/1.0 over a plain socket: xtask links no HTTP client).
fn the_api_serves_the_run(stack: &Stack, run_id: &str) -> Result<()> {
    let token = stack.cli(&[], &["tokens", "create", "--name", "smoke", "--scope", "runs:read"])?;
    let token = token.trim();
    let port = docker::output(&mut stack.compose(&["port", "server", "8080"]))?;
    let addr = port.trim().to_owned();
    let request =
        format!("GET /api/v1/runs/{run_id} HTTP/1.0\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n");
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let answer = (|| -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut socket = std::net::TcpStream::connect(&addr)?;
            socket.write_all(request.as_bytes())?;
            let mut text = String::new();
            socket.read_to_string(&mut text)?;
            Ok(text)
        })();
        match answer {
            Ok(text) if text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200") => {
                ensure!(
                    text.contains("\"state\":\"succeeded\""),
                    "the server's report of {run_id} is not succeeded:\n{text}"
                );
                return Ok(());
            }
            other if Instant::now() >= deadline => {
                anyhow::bail!("the server at {addr} did not answer 200 for run {run_id}: {other:?}")
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(500)),
        }
    }
}

/// A worker dies (SIGKILL) while running a task: the lease expires, the
/// scheduler takes the task back, another worker runs it, the run
/// succeeds, and every task succeeded exactly once.
fn worker_killed_mid_run(stack: &Stack) -> Result<()> {
    let definition = json!({
        "name": "compose-smoke-crash",
        "version": 1,
        "tasks": [
            { "key": "nap", "task_type": "sleep", "config": { "seconds": 8 },
              "retry": { "max_attempts": 3, "delay_seconds": 0.1 } },
            { "key": "after", "task_type": "echo", "depends_on": ["nap"] }
        ]
    });
    std::fs::write(&stack.definition, serde_json::to_string_pretty(&definition)?)
        .with_context(|| format!("writing {}", stack.definition.display()))?;
    let mount = format!("{}:/smoke/crash.json:ro", stack.definition.display());
    let run_id = stack.cli(&["-v", &mount], &["submit", "/smoke/crash.json"])?;
    let run_id = run_id.trim();

    let report = stack.wait_for_report(run_id, "its `nap` task to be running", |r| {
        task(r, "nap").is_some_and(|t| t["state"] == "running")
    })?;
    let worker = report["events"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|e| e["task"] == "nap" && e["to"] == "running")
        .and_then(|e| e["worker"].as_str())
        .context("no worker claimed `nap`")?;
    // A worker's id starts with its host name, which is its container's
    // short id.
    let container = worker.split(':').next().unwrap_or(worker);
    println!("killing worker {worker} (container {container})");
    docker::output(Command::new("docker").args(["kill", container]))?;

    let report = stack.wait_for_report(run_id, "the run to end", |r| {
        matches!(r["state"].as_str(), Some("succeeded" | "failed" | "cancelled"))
    })?;
    ensure!(report["state"] == "succeeded", "the run did not succeed:\n{report:#}");
    let events = report["events"].as_array().context("a report without events")?;
    ensure!(
        events
            .iter()
            .any(|e| e["task"] == "nap" && e["transition"] == "reap_lease"),
        "the killed worker's lease was never taken back:\n{report:#}"
    );
    for key in ["nap", "after"] {
        let successes = events
            .iter()
            .filter(|e| e["task"] == key && e["to"] == "succeeded")
            .count();
        ensure!(successes == 1, "`{key}` succeeded {successes} times:\n{report:#}");
    }
    Ok(())
}

/// The task `key` of a report.
fn task<'a>(report: &'a Value, key: &str) -> Option<&'a Value> {
    report["tasks"].as_array()?.iter().find(|t| t["key"] == key)
}

fn json_of(text: String) -> Result<Value> {
    serde_json::from_str(&text).with_context(|| format!("not a JSON report:\n{text}"))
}

/// One compose project: its name, the compose command, and a folder for
/// the files it mounts.
struct Stack {
    compose: Vec<&'static str>,
    project: String,
    root: PathBuf,
    definition: PathBuf,
}

impl Stack {
    fn new(compose: Vec<&'static str>) -> Result<Self> {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        // Unique per run, so a leftover stack or a concurrent run is never
        // touched; letters, digits and `-` suit both compose tools.
        let project = format!("flowforge-smoke-{secs}-{}", std::process::id());
        let root = project_root();
        let dir = root.join("target/containers").join(&project);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        println!("compose project {project} ({})", compose.join(" "));
        Ok(Self {
            compose,
            project,
            definition: dir.join("crash.json"),
            root,
        })
    }

    /// `<compose> -p project --env-file .env.example <args…>`, in the root.
    fn compose(&self, args: &[&str]) -> Command {
        let (program, pre) = self.compose.split_first().unwrap_or((&"docker-compose", &[]));
        let mut command = Command::new(program);
        command
            .current_dir(&self.root)
            .args(pre)
            .args(["--project-name", &self.project, "--env-file"])
            .arg(Path::new(".env.example"))
            .args(args)
            .env("FLOWFORGE_LEASE_SECONDS", LEASE_SECONDS)
            // Any free host port: the stack must not collide with a server
            // already listening on 8080.
            .env("FLOWFORGE_HTTP_PORT", "0");
        command
    }

    /// The CLI in a one-off container (`run_options` before the service
    /// name, `args` after it); its stdout.
    fn cli(&self, run_options: &[&str], args: &[&str]) -> Result<String> {
        let mut command = self.compose(&["run", "--rm", "-T"]);
        command.args(run_options).arg("cli").args(args);
        docker::output(&mut command)
    }

    fn cli_json(&self, args: &[&str]) -> Result<Value> {
        json_of(self.cli(&[], args)?)
    }

    /// Waits until the workers have registered (`submit` refuses task types
    /// no live worker serves).
    fn wait_for_workers(&self) -> Result<()> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let workers = self.cli_json(&["workers", "list", "--output", "json"])?;
            let live = workers
                .as_array()
                .map_or(0, |w| w.iter().filter(|w| w["stopped_at"].is_null()).count());
            if live >= WORKERS {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "{live} of {WORKERS} workers registered");
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Polls `runs get` until `done` holds for the report.
    fn wait_for_report(&self, run_id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let report = self.cli_json(&["runs", "get", run_id, "--output", "json"])?;
            if done(&report) {
                return Ok(report);
            }
            ensure!(Instant::now() < deadline, "waited in vain for {what}:\n{report:#}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Removes the stack: containers, network, volumes, mounted files.
    fn down(&self) -> Result<()> {
        let downed = docker::run(&mut self.compose(&["--profile", "cli", "down", "--volumes", "--remove-orphans"]));
        if let Some(dir) = self.definition.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
        downed
    }
}

/// A JSON run report without what differs between two runs of the same
/// definition and input: ids, times, tokens, workers and event sequence
/// numbers, at any depth. Events are grouped by task, since parallel tasks
/// may interleave differently (which is also why `seq`, numbered in commit
/// order across the run, cannot be compared); each task keeps its own order. (The report's own
/// `RunReport::comparable_json` does the same; it is not used here so that
/// xtask does not build the engine.)
fn comparable(report: &Value) -> Value {
    let mut v = report.clone();
    if let Some(map) = v.as_object_mut()
        && let Some(Value::Array(events)) = map.remove("events")
    {
        let mut by_task: Map<String, Value> = Map::new();
        for event in events {
            let task = event.get("task").and_then(Value::as_str).unwrap_or("(run)").to_owned();
            if let Value::Array(list) = by_task.entry(task).or_insert_with(|| Value::Array(Vec::new())) {
                list.push(event);
            }
        }
        map.insert("events".to_owned(), Value::Object(by_task));
    }
    strip(&mut v);
    v
}

fn strip(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for key in ["run_id", "started_at", "finished_at", "at", "token", "worker", "seq"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparable_reports_ignore_ids_times_tokens_workers_seq_and_interleaving() {
        let event = |task: &str, to: &str, token: i64, worker: &str, at: &str| json!({ "task": task, "transition": "t", "to": to, "token": token, "worker": worker, "at": at, "seq": at });
        let a = json!({
            "run_id": "1", "state": "succeeded", "started_at": "x", "finished_at": "y",
            "tasks": [{ "key": "l", "started_at": "x", "finished_at": "y", "output": { "n": 1 } }],
            "events": [event("l", "running", 1, "w1", "1"), event("r", "running", 1, "w1", "2"),
                       event("l", "succeeded", 1, "w1", "3")]
        });
        let b = json!({
            "run_id": "2", "state": "succeeded", "started_at": "p", "finished_at": "q",
            "tasks": [{ "key": "l", "started_at": "p", "finished_at": "q", "output": { "n": 1 } }],
            "events": [event("r", "running", 7, "w2", "4"), event("l", "running", 3, "w3", "5"),
                       event("l", "succeeded", 3, "w3", "6")]
        });
        assert_eq!(comparable(&a), comparable(&b));

        // A task's own order, its outputs and the run state still count.
        let reordered = json!({
            "state": "succeeded",
            "tasks": [{ "key": "l", "output": { "n": 1 } }],
            "events": [event("l", "succeeded", 1, "w", "1"), event("l", "running", 1, "w", "2"),
                       event("r", "running", 1, "w", "3")]
        });
        assert_ne!(comparable(&a), comparable(&reordered));
        let mut other_output = a.clone();
        other_output["tasks"][0]["output"]["n"] = json!(2);
        assert_ne!(comparable(&a), comparable(&other_output));
    }
}
