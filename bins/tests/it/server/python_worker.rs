//! A remote worker in another language (examples/python-worker/worker.py)
//! serves `py.square` over the worker API: one copy hangs on a task and is
//! SIGKILLed, its lease runs out, the reaper makes the task ready again, a
//! second copy runs it; the first copy's token is refused afterwards.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::run::task;

use super::{Api, PATIENCE, definition, json_of, on_both};

/// The example, from the workspace root.
const WORKER_PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python-worker/worker.py");

/// A running worker.py; killed (and reaped) on drop if still running.
struct PyWorker {
    id: &'static str,
    child: Child,
    stderr: PathBuf,
}

impl PyWorker {
    fn start(api: &Api, token: &str, id: &'static str, hang_on: Option<&str>) -> Self {
        let stderr = api.dir.join(format!("{id}.stderr.log"));
        let mut cmd = Command::new("python3");
        cmd.arg(WORKER_PY)
            .env("FLOWFORGE_URL", &api.base)
            .env("FLOWFORGE_TOKEN", token)
            .env("WORKER_ID", id)
            .env("CONCURRENCY", "4")
            .env_remove("HANG_ON")
            .stdin(Stdio::null())
            .stdout(File::create(api.dir.join(format!("{id}.stdout.log"))).expect("a log file"))
            .stderr(File::create(&stderr).expect("a log file"));
        if let Some(key) = hang_on {
            cmd.env("HANG_ON", key);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn python3 {WORKER_PY}: {e}"));
        Self { id, child, stderr }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `signal` to the worker's own pid (our child).
    fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        assert!(pid > 1);
        kill(Pid::from_raw(pid), signal).expect("signal the worker");
    }

    /// Polls `probe` (given the worker's log) until it answers `Ok`,
    /// failing the test when the worker exits first or after [`PATIENCE`]
    /// with the last `Err` it gave.
    async fn watch<T>(&mut self, what: &str, mut probe: impl AsyncFnMut(&str) -> Result<T, String>) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let last = match probe(&self.log()).await {
                Ok(found) => return found,
                Err(last) => last,
            };
            assert!(
                self.child.try_wait().expect("try_wait").is_none(),
                "{} exited while waiting for {what}:\n{}",
                self.id,
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "no {what} within {PATIENCE:?}: {last}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to `within` for the worker to exit.
    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}:\n{}",
                self.id,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PyWorker {
    #[allow(clippy::print_stderr)] // shown by the harness only when the test fails
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}'s log:\n{}", self.id, self.log());
        }
    }
}

// A 3 s lease (the least allowed): the reaper takes a dead worker's task
// back within seconds. On PostgreSQL the scheduler process reaps it.
const LEASE: &[&str] = &["--lease-seconds", "3"];

on_both!(a_killed_workers_task_is_finished_by_another, LEASE, |api| {
    let python = Command::new("python3").arg("--version").output();
    assert!(
        python.as_ref().is_ok_and(|o| o.status.success()),
        "this test needs python3 on PATH to run {WORKER_PY}: {python:?}"
    );
    let token = api.token("py", &["worker"]);

    // The worker scope is needed to claim.
    let reader = api.token("reader", &["runs:read"]);
    let claim = json!({"worker": "nobody", "task_types": ["py.square"]});
    let response = api
        .http
        .post(api.url("/api/v1/worker/claims"))
        .bearer_auth(&reader)
        .json(&claim)
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 403).await["required_scope"], "worker");

    // Worker A serves py.square, but hangs on sq3. Its first claim
    // registers the type, which publishing then accepts.
    let mut a = PyWorker::start(&api, &token, "py-a", Some("sq3"));
    a.watch("py-a to register", async |_| {
        let workers = api.get_json("/api/v1/workers", 200).await;
        let listed = workers["items"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["id"] == "py-a"));
        if listed { Ok(()) } else { Err(format!("{workers:#}")) }
    })
    .await;
    let squares: Vec<String> = (0..8).map(|i| format!("sq{i}")).collect();
    let square_refs: Vec<&str> = squares.iter().map(String::as_str).collect();
    let seed: (&str, &str, &[&str], Value) = ("seed", "noop", &[], json!({}));
    let mut tasks = vec![seed];
    for (i, key) in square_refs.iter().enumerate() {
        tasks.push((*key, "py.square", &["seed"], json!({"x": i})));
    }
    tasks.push(("sum", "echo", &square_refs, json!({})));
    let mut def = definition("squares", 1, &tasks);
    def["defaults"] = json!({"retry": {"max_attempts": 3}});
    api.publish(&def).await;
    let run = api.start_run("squares", json!({})).await;

    // sq3 hangs in A; the other squares succeed.
    let report = a
        .watch("sq3 to hang with the other squares done", async |log| {
            let report = api.get_json(&format!("/api/v1/runs/{run}"), 200).await;
            let others_done = square_refs
                .iter()
                .filter(|k| **k != "sq3")
                .all(|k| task(&report, k)["state"] == "succeeded");
            if others_done && task(&report, "sq3")["state"] == "running" && log.contains("hanging") {
                Ok(report)
            } else {
                Err(format!("{report:#}"))
            }
        })
        .await;
    // Reported with a heartbeat before it began to hang.
    assert_eq!(
        task(&report, "sq3")["progress"],
        json!({"stage": "computing"}),
        "{report:#}"
    );
    let first = api
        .get_json(&format!("/api/v1/runs/{run}/tasks/sq3/attempts"), 200)
        .await;
    assert_eq!(first["items"].as_array().map(Vec::len), Some(1), "{first:#}");
    assert_eq!(first["items"][0]["worker"], "py-a", "{first:#}");
    let stale_token = first["items"][0]["token"].as_i64().expect("a token");
    // The task run id is only in the claim: A logs it when it hangs.
    let log = a.log();
    let task_run_id: i64 = log
        .split("sq3 (task run ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no task run id for sq3 in py-a's log:\n{log}"));
    assert!(log.contains(&format!("token {stale_token})")), "{log}");

    // A dies without a word; its lease runs out and B takes sq3 over.
    a.signal(Signal::SIGKILL);
    a.wait_exit(PATIENCE).await;
    let mut b = PyWorker::start(&api, &token, "py-b", None);
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "succeeded", "{report:#}\n{}", b.log());
    for (i, key) in square_refs.iter().enumerate() {
        assert_eq!(task(&report, key)["output"], json!({"square": i * i}), "{key}");
    }
    assert_eq!(task(&report, "sq3")["attempt"], 2, "{report:#}");
    let attempts = api
        .get_json(&format!("/api/v1/runs/{run}/tasks/sq3/attempts"), 200)
        .await;
    let items = attempts["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{attempts:#}");
    assert_eq!(
        (&items[0]["attempt"], &items[0]["state"], &items[0]["worker"]),
        (&json!(1), &json!("lease_expired"), &json!("py-a")),
        "{attempts:#}"
    );
    assert_eq!(
        (&items[1]["attempt"], &items[1]["state"], &items[1]["worker"]),
        (&json!(2), &json!("succeeded"), &json!("py-b")),
        "{attempts:#}"
    );
    assert!(
        report["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["task"] == "sq3" && e["transition"] == "reap_lease"),
        "no reap_lease for sq3: {report:#}"
    );

    // A's late result, with its first-attempt token: refused.
    let late = json!({"worker": "py-a", "results": [{
        "task_run_id": task_run_id, "run_id": run, "token": stale_token,
        "outcome": "succeeded", "output": {"square": -1}
    }]});
    let response = api
        .http
        .post(api.url("/api/v1/worker/results"))
        .bearer_auth(&token)
        .json(&late)
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 409).await["code"], "stale_token");
    let report = api.get_json(&format!("/api/v1/runs/{run}"), 200).await;
    assert_eq!(task(&report, "sq3")["output"], json!({"square": 9}));

    // SIGTERM: B ends its long poll, finishes and exits 0.
    b.signal(Signal::SIGTERM);
    let status = b.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "py-b's exit:\n{}", b.log());
    assert!(b.log().contains("sq3 (task run"), "{}", b.log());
});
