//! Real `flowforge` processes over one test's own database and queue: each
//! child gets `FLOWFORGE_DB`, `FLOWFORGE_AMQP` and `FLOWFORGE_QUEUE` (and
//! nothing else of the caller's `FLOWFORGE_*`), runs in the test's temp
//! folder, and writes its stdout and stderr to files there for diagnostics
//! (printed when the test fails; the folder is kept then, and always with
//! `FF_IT_KEEP_LOGS=1`). Every child still running when the
//! [`Cluster`] is dropped is killed — by its own pid only, never a process
//! group, never pid 0 — before the queue and the database are removed.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flowforge_ports::RunId;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::{Broker, PATIENCE, TestDb, both_services};
use crate::Outcome;

/// Which child of a [`Cluster`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcId(usize);

struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    exit: Option<i32>,
}

/// A test's processes, its temp folder, its queue and its database.
/// Fields drop in order: the children are killed first (in `Drop`), then
/// the queue is deleted, then the database dropped.
pub(crate) struct Cluster {
    procs: Vec<Proc>,
    /// The queue the processes use (deleted at the end).
    pub(crate) broker: Broker,
    /// The database the processes use (dropped at the end).
    pub(crate) db: TestDb,
    amqp_url: String,
    dir: TempDir,
}

/// An SDK worker ([`flowforge::Worker`]) serving in this test process
/// until [`SdkWorker::stop`].
pub(crate) struct SdkWorker {
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<Result<(), flowforge::WorkerError>>,
}

impl SdkWorker {
    /// Serves `worker` until stopped.
    pub(crate) fn serve(worker: flowforge::RunningWorker) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(worker.run_until(async move {
            let _ = stopped.await;
        }));
        Self { stop, serving }
    }

    /// Stops it and waits for its drain, which must end cleanly.
    pub(crate) async fn stop(self) {
        self.stop.send(()).expect("the worker listens");
        super::within("the worker's drain", self.serving)
            .await
            .expect("join")
            .expect("a clean stop");
    }
}

impl Cluster {
    /// A worker builder on this cluster's database, broker and queue, with
    /// `slots` slots and the id `id`; the test adds its handlers.
    pub(crate) fn worker(&self, id: &str, slots: usize) -> flowforge::WorkerBuilder {
        flowforge::Worker::builder()
            .database(self.db.url.clone())
            .broker(self.broker.url.clone())
            .queue(self.broker.queue.clone())
            .concurrency(slots)
            .worker_id(flowforge::WorkerId(id.to_owned()))
    }

    /// A cluster over a fresh, empty database and a fresh queue; `None`
    /// (after a notice) when a service is absent.
    pub(crate) async fn empty(test: &str) -> Option<Self> {
        let (postgres, amqp) = both_services()?;
        Some(Self::on(&postgres, &amqp, test).await)
    }

    /// A cluster over a fresh, empty database on the server at `postgres`
    /// and a fresh queue on the broker at `amqp` (a test's own containers).
    pub(crate) async fn on(postgres: &str, amqp: &str, test: &str) -> Self {
        let db = TestDb::empty(postgres).await;
        let broker = Broker::for_processes(amqp, test).await;
        let dir = tempfile::Builder::new()
            .prefix(&format!("ff-it-{test}-"))
            .tempdir()
            .expect("a temp folder");
        std::fs::create_dir(dir.path().join("tmp")).expect("a tmp folder");
        Self {
            procs: Vec::new(),
            broker,
            db,
            amqp_url: amqp.to_owned(),
            dir,
        }
    }

    /// A cluster whose database `flowforge migrate` has migrated.
    pub(crate) async fn migrated(test: &str) -> Option<Self> {
        let cluster = Self::empty(test).await?;
        cluster.migrate().await;
        Some(cluster)
    }

    /// Runs `flowforge migrate` on the cluster's database.
    pub(crate) async fn migrate(&self) {
        let out = self.run(["migrate"]).await;
        assert_eq!(out.code, 0, "flowforge migrate: {out:?}");
    }

    /// The temp folder the processes run in.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a JSON file into the temp folder; returns its path.
    pub(crate) fn json(&self, name: &str, value: &serde_json::Value) -> PathBuf {
        let path = self.dir().join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(value).expect("serialise")).expect("write a file");
        path
    }

    /// `flowforge ARGS…` configured for this cluster.
    pub(crate) fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowforge"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FLOWFORGE_") {
                cmd.env_remove(key);
            }
        }
        cmd.current_dir(self.dir())
            .args(args)
            .env("FLOWFORGE_DB", &self.db.url)
            .env("FLOWFORGE_AMQP", &self.amqp_url)
            .env("FLOWFORGE_QUEUE", &self.broker.queue)
            .env("TMPDIR", self.dir().join("tmp"))
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `flowforge ARGS…` to its end (killed after [`PATIENCE`]).
    pub(crate) async fn run<I, S>(&self, args: I) -> Outcome
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let cmd = self.command(args);
        let shown = format!("{:?}", cmd.get_args().collect::<Vec<_>>());
        let output = tokio::task::spawn_blocking(move || {
            assert_cmd::Command::from_std(cmd)
                .timeout(PATIENCE)
                .output()
                .expect("flowforge runs")
        })
        .await
        .expect("join the command");
        Outcome {
            code: output
                .status
                .code()
                .unwrap_or_else(|| panic!("flowforge {shown} did not exit with a code (killed after {PATIENCE:?}?)")),
            stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
            stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
        }
    }

    /// `flowforge submit FILE` (no wait): publishes and starts a run;
    /// returns its id.
    pub(crate) async fn submit(&self, file: &Path) -> RunId {
        let out = self.run(["submit".as_ref(), file.as_os_str()]).await;
        assert_eq!(out.code, 0, "flowforge submit: {out:?}");
        out.stdout
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("submit printed no run id ({e:?}): {out:?}"))
    }

    /// Starts `flowforge ARGS…` as a long-running child named `name`.
    pub(crate) fn spawn<I, S>(&mut self, name: &str, args: I) -> ProcId
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let stdout = self.dir().join(format!("{name}.stdout.log"));
        let stderr = self.dir().join(format!("{name}.stderr.log"));
        let child = self
            .command(args)
            .stdout(File::create(&stdout).expect("a log file"))
            .stderr(File::create(&stderr).expect("a log file"))
            .spawn()
            .expect("spawn flowforge");
        self.procs.push(Proc {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
            exit: None,
        });
        ProcId(self.procs.len() - 1)
    }

    /// The child's pid.
    pub(crate) fn pid(&self, id: ProcId) -> u32 {
        self.procs[id.0].child.id()
    }

    /// Sends `signal` to this child's pid only.
    pub(crate) fn signal(&self, id: ProcId, signal: Signal) {
        let pid = i32::try_from(self.pid(id)).expect("a pid");
        assert!(pid > 1, "refusing to signal pid {pid}");
        kill(Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to {} ({pid}): {e}", self.procs[id.0].name));
    }

    /// Whether the child is still running (reaps it if it exited).
    pub(crate) fn running(&mut self, id: ProcId) -> bool {
        let proc = &mut self.procs[id.0];
        if proc.exit.is_some() {
            return false;
        }
        match proc.child.try_wait().expect("try_wait") {
            Some(status) => {
                // A death by signal has no code: -1 marks it.
                proc.exit = Some(status.code().unwrap_or(-1));
                false
            }
            None => true,
        }
    }

    /// Waits (polling, at most [`PATIENCE`]) for the child to exit; returns
    /// its exit code, or -1 for a death by signal.
    pub(crate) async fn wait_exit(&mut self, id: ProcId) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        while self.running(id) {
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {PATIENCE:?}; its stderr:\n{}",
                self.procs[id.0].name,
                self.stderr(id)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.procs[id.0].exit.expect("exited")
    }

    /// Everything the child wrote on stderr so far.
    pub(crate) fn stderr(&self, id: ProcId) -> String {
        std::fs::read_to_string(&self.procs[id.0].stderr).unwrap_or_default()
    }

    /// The last lines of every child's output, for a failure message.
    pub(crate) fn logs(&self) -> String {
        let mut text = String::new();
        for proc in &self.procs {
            for (stream, path) in [("stdout", &proc.stdout), ("stderr", &proc.stderr)] {
                let content = std::fs::read_to_string(path).unwrap_or_default();
                let lines: Vec<&str> = content.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                text.push_str(&format!(
                    "----- {} (pid {}) {stream}, last {} lines -----\n{}\n",
                    proc.name,
                    proc.child.id(),
                    tail.len(),
                    tail.join("\n")
                ));
            }
        }
        text
    }
}

impl Drop for Cluster {
    #[allow(clippy::print_stderr)] // shown by the harness only when the test fails
    fn drop(&mut self) {
        for proc in &mut self.procs {
            if proc.exit.is_none() && matches!(proc.child.try_wait(), Ok(None)) {
                // SIGKILL to this child's own pid (also ends a stopped one).
                let _ = proc.child.kill();
                let _ = proc.child.wait();
            }
        }
        if std::thread::panicking() || std::env::var_os("FF_IT_KEEP_LOGS").is_some() {
            eprintln!(
                "the processes' logs (kept in {}):\n{}",
                self.dir().display(),
                self.logs()
            );
            // Keep the folder for a look afterwards.
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("a temp folder"));
            let _ = dir.keep();
        }
    }
}

/// The pid in a distributed worker's id (`host:pid:suffix`).
pub(crate) fn worker_pid(worker: &str) -> Option<u32> {
    worker.rsplit(':').nth(1)?.parse().ok()
}
