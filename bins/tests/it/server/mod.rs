//! `flowforge server` end to end (docs/design/server.md): a real server
//! process driven with reqwest, every test on SQLite (the server runs the
//! engine in process) and on PostgreSQL (the server beside separate
//! scheduler, publisher and worker processes).

mod api;
mod auth;
mod events;
mod http_tasks;
mod python_worker;
mod runs;
mod schedules;
mod worker_api;

use std::ffi::OsStr;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::Outcome;
use crate::distributed::cluster::{Cluster, ProcId};

/// How long a test waits for a run or the server.
pub(crate) const PATIENCE: Duration = Duration::from_secs(90);

/// A server under test, its store, and an admin token.
pub(crate) struct Api {
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    /// A token with every scope.
    pub(crate) admin: String,
    server: Child,
    /// The server's arguments, to start it again (`restart`).
    args: Vec<String>,
    stderr: PathBuf,
    db_url: String,
    dir: PathBuf,
    // Dropped after the server: the PostgreSQL loops, database and queue.
    cluster: Option<Cluster>,
    /// The scheduler, publisher and worker on PostgreSQL.
    loops: Vec<ProcId>,
    _tmp: Option<TempDir>,
}

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum On {
    Sqlite,
    Postgres,
}

impl Api {
    /// A server on `on` with `extra` arguments; `None` (after a notice)
    /// when PostgreSQL or RabbitMQ is absent and not required.
    pub(crate) async fn start(on: On, test: &str, extra: &[&str]) -> Option<Self> {
        Self::start_with(on, test, extra, &[]).await
    }

    /// [`Api::start`] with `env` set in the server's environment.
    pub(crate) async fn start_with(on: On, test: &str, extra: &[&str], env: &[(&str, &str)]) -> Option<Self> {
        let (cluster, tmp, db_url, dir) = match on {
            On::Sqlite => {
                let tmp = tempfile::Builder::new()
                    .prefix(&format!("ff-api-{test}-"))
                    .tempdir()
                    .expect("a temp folder");
                let url = format!("sqlite://{}", tmp.path().join("ff.db").display());
                let dir = tmp.path().to_path_buf();
                (None, Some(tmp), url, dir)
            }
            On::Postgres => {
                let mut cluster = Cluster::migrated(test).await?;
                // The loops serve their own metrics (`--metrics-listen`):
                // on PostgreSQL the server runs none of them.
                let loops = vec![
                    cluster.spawn("scheduler", ["scheduler", "--metrics-listen", "127.0.0.1:0"]),
                    cluster.spawn("publisher", ["publisher"]),
                    cluster.spawn(
                        "worker",
                        ["worker", "--concurrency", "4", "--metrics-listen", "127.0.0.1:0"],
                    ),
                ];
                let url = cluster.db.url.clone();
                let dir = cluster.dir().to_path_buf();
                (Some((cluster, loops)), None, url, dir)
            }
        };
        let stderr = dir.join("server.stderr.log");
        let mut args = vec!["server", "--listen", "127.0.0.1:0", "--concurrency", "4"];
        if on == On::Postgres {
            args.truncate(3);
        }
        args.extend_from_slice(extra);
        let server = Self::command_in(cluster.as_ref().map(|(c, _)| c), &db_url, &dir, &args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).expect("a log file"))
            .spawn()
            .expect("spawn flowforge server");
        let mut api = Self {
            base: String::new(),
            http: crate::http_client(),
            admin: String::new(),
            server,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stderr,
            db_url,
            dir,
            loops: cluster.as_ref().map(|(_, l)| l.clone()).unwrap_or_default(),
            cluster: cluster.map(|(c, _)| c),
            _tmp: tmp,
        };
        api.base = api.wait_listening().await;
        api.admin = api.token("admin", &["admin"]);
        Some(api)
    }

    fn command_in(cluster: Option<&Cluster>, db_url: &str, dir: &std::path::Path, args: &[&str]) -> Command {
        match cluster {
            Some(c) => c.command(args),
            None => {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowforge"));
                for (key, _) in std::env::vars_os() {
                    if key.to_string_lossy().starts_with("FLOWFORGE_") {
                        cmd.env_remove(key);
                    }
                }
                cmd.current_dir(dir)
                    .args(args)
                    .env("FLOWFORGE_DB", db_url)
                    .env("NO_COLOR", "1")
                    .env_remove("RUST_LOG")
                    .stdin(Stdio::null());
                cmd
            }
        }
    }

    async fn wait_listening(&mut self) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let log = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            // The address counts once its line is whole: read mid-write,
            // "http://127.0.0." would be taken for the address.
            if let Some((line, _)) = log
                .split("flowforge server listening on ")
                .nth(1)
                .and_then(|rest| rest.split_once('\n'))
            {
                return line.trim().to_owned();
            }
            if let Some(status) = self.server.try_wait().expect("try_wait") {
                panic!("the server exited ({status}) before listening:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "the server did not listen within {PATIENCE:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `flowforge ARGS…` on the server's store.
    pub(crate) fn cli<I, S>(&self, args: I) -> Outcome
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<String> = args
            .into_iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = Self::command_in(self.cluster.as_ref(), &self.db_url, &self.dir, &refs)
            .output()
            .expect("flowforge runs");
        Outcome {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// A new token's secret.
    pub(crate) fn token(&self, name: &str, scopes: &[&str]) -> String {
        let mut args = vec!["tokens", "create", "--name", name];
        for s in scopes {
            args.extend(["--scope", s]);
        }
        let out = self.cli(&args);
        assert_eq!(out.code, 0, "tokens create: {out:?}");
        out.stdout.trim().to_owned()
    }

    /// Every process's Prometheus text: the server's, and on PostgreSQL
    /// the scheduler's and worker's `--metrics-listen` too.
    pub(crate) async fn metrics(&self) -> String {
        let mut text = self
            .get("/metrics")
            .send()
            .await
            .expect("answers")
            .text()
            .await
            .expect("text");
        let Some(cluster) = &self.cluster else {
            return text;
        };
        for id in &self.loops {
            let log = cluster.stderr(*id);
            let Some(addr) = log
                .split("serving /metrics listen=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
            else {
                continue;
            };
            let own = self
                .http
                .get(format!("http://{addr}/metrics"))
                .send()
                .await
                .expect("a loop's metrics answer");
            text.push_str(&own.text().await.expect("text"));
        }
        text
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with the admin token.
    pub(crate) fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(self.url(path)).bearer_auth(&self.admin)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> reqwest::RequestBuilder {
        self.http.post(self.url(path)).bearer_auth(&self.admin).json(body)
    }

    /// GET as JSON with the admin token, asserting the status.
    pub(crate) async fn get_json(&self, path: &str, status: u16) -> Value {
        let response = self.get(path).send().await.expect("the server answers");
        json_of(response, status).await
    }

    /// Publishes `def`; returns the response body.
    pub(crate) async fn publish(&self, def: &Value) -> Value {
        let response = self.post("/api/v1/definitions", def).send().await.expect("answers");
        let status = response.status().as_u16();
        assert!(status == 201 || status == 200, "publish: {status}");
        response.json().await.expect("JSON")
    }

    /// Starts a run of `workflow`; returns its id.
    pub(crate) async fn start_run(&self, workflow: &str, input: Value) -> String {
        let response = self
            .post("/api/v1/runs", &json!({"workflow": workflow, "input": input}))
            .send()
            .await
            .expect("answers");
        let body = json_of(response, 201).await;
        body["id"].as_str().expect("an id").to_owned()
    }

    /// Waits until the run is terminal; returns its report.
    pub(crate) async fn wait_run(&self, id: &str) -> Value {
        self.wait_run_within(id, PATIENCE).await
    }

    /// [`Self::wait_run`] for a run whose size calls for more patience
    /// than [`PATIENCE`] on a busy machine running a debug build.
    pub(crate) async fn wait_run_within(&self, id: &str, patience: Duration) -> Value {
        let deadline = Instant::now() + patience;
        loop {
            let report = self.get_json(&format!("/api/v1/runs/{id}"), 200).await;
            if matches!(report["state"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
                return report;
            }
            assert!(
                Instant::now() < deadline,
                "run {id} did not end: {report:#}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM to the server's own pid.
    pub(crate) fn sigterm(&self) {
        let pid = i32::try_from(self.server.id()).expect("a pid");
        assert!(pid > 1);
        kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the server");
    }

    /// Waits for the server to exit; its exit code.
    pub(crate) async fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.server.try_wait().expect("try_wait") {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "the server did not exit:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the server (SIGTERM, exit 0) and starts it again on the same
    /// address and store: what a deploy does to a page that is open.
    pub(crate) async fn restart(&mut self) {
        self.sigterm();
        assert_eq!(self.wait_exit().await, 0, "the server's exit:\n{}", self.logs());
        let addr = self.base.trim_start_matches("http://").to_owned();
        let args: Vec<&str> = self
            .args
            .iter()
            .map(|a| if a == "127.0.0.1:0" { addr.as_str() } else { a.as_str() })
            .collect();
        let old = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        std::fs::write(self.dir.join("server.before-restart.log"), old).expect("keep the first log");
        self.server = Self::command_in(self.cluster.as_ref(), &self.db_url, &self.dir, &args)
            .stdout(Stdio::null())
            .stderr(File::create(&self.stderr).expect("a log file"))
            .spawn()
            .expect("spawn flowforge server again");
        let base = self.wait_listening().await;
        assert_eq!(base, self.base, "the server came back elsewhere");
    }

    /// The server's working folder (a `command` task's base folder).
    pub(crate) fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub(crate) fn logs(&self) -> String {
        let mut text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        if let Some(c) = &self.cluster {
            text.push_str(&c.logs());
        }
        text
    }
}

impl Drop for Api {
    #[allow(clippy::print_stderr)] // shown by the harness only when the test fails
    fn drop(&mut self) {
        if matches!(self.server.try_wait(), Ok(None)) {
            let _ = self.server.kill();
            let _ = self.server.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "the server's log:\n{}",
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            );
        }
    }
}

/// The body as JSON after asserting the status.
pub(crate) async fn json_of(response: reqwest::Response, status: u16) -> Value {
    let got = response.status().as_u16();
    let text = response.text().await.expect("a body");
    assert_eq!(got, status, "unexpected status; body: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A definition of `name` whose tasks are `tasks` (`[key, type, deps, config]`).
pub(crate) fn definition(name: &str, version: u32, tasks: &[(&str, &str, &[&str], Value)]) -> Value {
    json!({
        "name": name,
        "version": version,
        "tasks": tasks.iter().map(|(key, kind, deps, config)| json!({
            "key": key, "task_type": kind, "depends_on": deps, "config": config
        })).collect::<Vec<_>>()
    })
}

/// Runs `$body` (an async block using `api`) once on each store.
macro_rules! on_both {
    ($(#[$meta:meta])* $name:ident, $extra:expr, |$api:ident| $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn body($api: $crate::server::Api) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let api = $crate::server::Api::start($crate::server::On::Sqlite, stringify!($name), $extra)
                    .await
                    .expect("SQLite needs no service");
                body(api).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(api) = $crate::server::Api::start($crate::server::On::Postgres, stringify!($name), $extra).await {
                    body(api).await;
                }
            }
        }
    };
}
pub(crate) use on_both;
