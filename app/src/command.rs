//! The `command` built-in: a child process in its own process group, fed
//! `{"inputs", "run_input"}` (and a mapped task's child's `item` and
//! `index`) on stdin, whose stdout becomes the output.
//! On cancel or timeout the whole group gets SIGTERM, a grace period, then
//! SIGKILL, so no grandchild outlives its task.
//!
//! The child is confined: its working directory must resolve inside the
//! base folder, its environment is a short allow-list of the worker's plus
//! the definition's `env` (never the worker's secrets, never `LD_*`), and
//! it carries a marker variable so that a descendant that left the group
//! (`setsid`) is found under `/proc` and killed with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flowforge_domain::limits::DEFAULT_TASK_OUTPUT_BYTES;
use flowforge_ports::{HandlerError, TaskContext};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// How much of stderr's tail a failure reports.
const STDERR_TAIL: usize = 4 * 1024;
/// How long the pipes are still read once the leader has exited and its
/// descendants were killed: a writer that escaped both the group and the
/// marker must not turn a finished command into a timeout.
const PIPE_DRAIN: Duration = Duration::from_secs(2);
/// The variable that marks every process started for one attempt.
const MARKER_VAR: &str = "FLOWFORGE_TASK_MARKER";
/// The worker's variables a child may see; everything else (database URLs
/// with passwords, tokens) stays in the worker.
const INHERITED_ENV: [&str; 11] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
];

/// A validated `command` config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Working directory: canonical, and inside the base folder.
    pub cwd: PathBuf,
    /// The most stdout kept: the task output limit
    /// (docs/design/data-flow.md#limits), enforced while reading, so a
    /// command printing without end costs no more memory than that.
    pub stdout_limit: usize,
}

impl CommandSpec {
    /// Reads `argv`, `env` and `cwd` from a task config. A bad config is a
    /// permanent failure: no retry can fix it. `cwd` is resolved against
    /// `base_dir` (symlinks and `..` included) and must stay inside it.
    pub fn from_config(config: &Map<String, Value>, base_dir: &Path) -> Result<Self, HandlerError> {
        let bad = |what: &str| HandlerError::permanent(format!("command: {what}"));
        let argv: Vec<String> = config
            .get("argv")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("config.argv must be a non-empty array of strings"))?
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .filter(|a: &Vec<String>| !a.is_empty() && !a[0].is_empty())
            .ok_or_else(|| bad("config.argv must be a non-empty array of strings"))?;
        let env: BTreeMap<String, String> = match config.get("env") {
            None => BTreeMap::new(),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("config.env values must be strings"))?,
            Some(_) => return Err(bad("config.env must be an object of strings")),
        };
        // A NUL cannot reach exec: refusing it here makes it permanent
        // instead of a spawn error retried forever.
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(bad("config.argv must not contain a NUL byte"));
        }
        for (name, value) in &env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(bad(&format!(
                    "config.env name {name:?} or its value is not a valid variable (empty, '=' or NUL)"
                )));
            }
            // The dynamic loader's variables would let a definition inject
            // code into any program the worker's host runs for it.
            if name.starts_with("LD_") {
                return Err(bad(&format!(
                    "config.env must not set {name} (LD_* variables are refused)"
                )));
            }
            if name == MARKER_VAR {
                return Err(bad(&format!("config.env must not set {MARKER_VAR}")));
            }
        }
        let dir = match config.get("cwd") {
            None => None,
            Some(Value::String(dir)) if dir.contains('\0') => {
                return Err(bad("config.cwd must not contain a NUL byte"));
            }
            Some(Value::String(dir)) => Some(dir.as_str()),
            Some(_) => return Err(bad("config.cwd must be a string")),
        };
        let cwd = confine(base_dir, dir)?;
        Ok(Self {
            argv,
            env,
            cwd,
            stdout_limit: DEFAULT_TASK_OUTPUT_BYTES,
        })
    }
}

/// Resolves `dir` (default: the base itself) against `base` and requires
/// the result inside `base`, both canonical so neither `..` nor a symlink
/// can leave it.
fn confine(base: &Path, dir: Option<&str>) -> Result<PathBuf, HandlerError> {
    // The base is this process's (its folder vanished, say), not the
    // task's: another attempt, maybe on another worker, may succeed.
    let root = base.canonicalize().map_err(|e| {
        HandlerError::retryable(format!("command: the base folder {} is unusable: {e}", base.display()))
    })?;
    let Some(dir) = dir else { return Ok(root) };
    let wanted = root.join(dir);
    let resolved = wanted.canonicalize().map_err(|e| {
        HandlerError::permanent(format!(
            "command: config.cwd {dir:?} ({}) is unusable: {e}",
            wanted.display()
        ))
    })?;
    if resolved.starts_with(&root) {
        Ok(resolved)
    } else {
        Err(HandlerError::permanent(format!(
            "command: config.cwd {dir:?} resolves to {}, outside the allowed folder {}",
            resolved.display(),
            root.display()
        )))
    }
}

/// A marker unique to one attempt in this host's lifetime of this worker.
fn new_marker(ctx: &TaskContext) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        ctx.run_id,
        ctx.attempt
    )
}

/// How many times the marker scan looks again: after it killed something
/// (a child forked meanwhile), or while a process that may be ours is
/// between two programs.
const MARK_ROUNDS: u32 = 32;
/// The pause before looking again at a process caught between two programs.
const UNSETTLED_PAUSE: Duration = Duration::from_millis(1);
/// `PF_KTHREAD` in `/proc/<pid>/stat`'s flags: a kernel thread has no
/// environment and is never ours.
const PF_KTHREAD: u64 = 0x0020_0000;

/// What `/proc/<pid>/stat` tells the marker scan.
struct Stat {
    /// A zombie (`Z`) or dead (`X`) process has no memory, so no
    /// environment, and needs no kill.
    exited: bool,
    kernel_thread: bool,
    /// Clock ticks from boot to the process's start.
    started: u64,
}

impl Stat {
    /// Whether an empty environment may hide one of ours: a live user
    /// process no older than the attempt's leader, caught between two
    /// programs.
    fn may_be_ours(&self, since: u64) -> bool {
        !self.exited && !self.kernel_thread && self.started >= since
    }
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The command name is in parentheses and may hold either parenthesis
    // or a space; the fields after the last `)` are plain.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        exited: matches!(*fields.first()?, "Z" | "X"),
        kernel_thread: fields.get(6)?.parse::<u64>().ok()? & PF_KTHREAD != 0,
        started: fields.get(19)?.parse().ok()?,
    })
}

/// SIGKILLs every process whose environment carries `MARKER_VAR=marker`:
/// the descendants that left the process group. `since` is when the
/// attempt's leader started (clock ticks from boot): no process older is a
/// descendant.
///
/// A process in the middle of an `execve` has, for a moment, an empty
/// `/proc/<pid>/environ` (its new program's environment is not yet mapped);
/// an escaped descendant caught there (`setsid sleep`, exactly when `setsid`
/// runs `sleep`) would be missed. So a live user process younger than the
/// leader with an empty environment is looked at again, briefly, until it
/// shows one or exits.
fn kill_marked(marker: &str, since: u64) {
    let needle = format!("{MARKER_VAR}={marker}");
    let me = std::process::id();
    for _ in 0..MARK_ROUNDS {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        let (mut found, mut unsettled) = (false, false);
        for pid in entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid > 1 && u32::try_from(pid).is_ok_and(|p| p != me))
        {
            // Unreadable (another user's, or gone): not one of ours.
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            if environ.is_empty() {
                unsettled |= stat(pid).is_some_and(|s| s.may_be_ours(since));
            } else if environ.split(|&b| b == 0).any(|var| var == needle.as_bytes()) {
                found = true;
                match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(e) => tracing::warn!(pid, error = %e, "could not kill an escaped descendant"),
                }
            }
        }
        // Another round catches a child forked between our reading of
        // /proc and its parent's death; a process already killed may be
        // found again, which is harmless.
        if found {
            continue;
        }
        if !unsettled {
            return;
        }
        std::thread::sleep(UNSETTLED_PAUSE);
    }
}

/// Kills the process group, and the marked descendants that left it, when
/// dropped while armed: a handler future the worker abandons (timeout)
/// must not leave its processes behind.
struct GroupGuard {
    pgid: Option<Pid>,
    marker: String,
    /// When the leader started, in clock ticks from boot (0 when unknown:
    /// every process is then a candidate).
    since: u64,
}

impl GroupGuard {
    fn new(pid: u32, marker: String) -> Option<Self> {
        // A new group's id is its leader's pid. Never 0 or 1: killpg(0)
        // would signal our own group and 1 is init.
        let pid = i32::try_from(pid).ok().filter(|&p| p > 1)?;
        // Read before the leader is waited for: until then its pid cannot
        // be reused.
        let since = stat(pid).map_or(0, |s| s.started);
        Some(Self {
            pgid: Some(Pid::from_raw(pid)),
            marker,
            since,
        })
    }

    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            match killpg(pgid, signal) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => tracing::warn!(pgid = pgid.as_raw(), %signal, error = %e, "could not signal process group"),
            }
        }
    }

    /// SIGKILLs the group and every marked process, then disarms.
    fn kill_all(&mut self) {
        if self.pgid.is_some() {
            self.signal(Signal::SIGKILL);
            kill_marked(&self.marker, self.since);
            self.pgid = None;
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// What a reader task has read so far: kept outside the task so that a
/// reader given up on (pipe held open by an escaped process) still yields
/// what it read.
type Captured = Arc<Mutex<Vec<u8>>>;

fn take(captured: &Captured) -> Vec<u8> {
    std::mem::take(&mut *captured.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Reads `pipe` into `into` up to `limit` bytes; `true` if it overflowed.
async fn read_limited(mut pipe: impl AsyncRead + Unpin, into: Captured, limit: usize) -> std::io::Result<bool> {
    let mut chunk = [0u8; 8192];
    let mut overflow = false;
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok(overflow);
        }
        let mut buf = into.lock().unwrap_or_else(PoisonError::into_inner);
        if buf.len() + n > limit {
            overflow = true;
            // Keep draining so the child never blocks on a full pipe.
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads `pipe` into `into`, keeping about the last `keep` bytes.
async fn read_tail(mut pipe: impl AsyncRead + Unpin, into: Captured, keep: usize) -> std::io::Result<bool> {
    let mut chunk = [0u8; 8192];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok(false);
        }
        let mut buf = into.lock().unwrap_or_else(PoisonError::into_inner);
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 2 * keep {
            let excess = buf.len() - keep;
            buf.drain(..excess);
        }
    }
}

fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&bytes[start..]).trim().to_owned()
}

/// A pipe being read by its own task.
struct Reader {
    captured: Captured,
    task: tokio::task::JoinHandle<std::io::Result<bool>>,
}

impl Reader {
    fn stdout(pipe: impl AsyncRead + Unpin + Send + 'static, limit: usize) -> Self {
        let captured = Captured::default();
        let task = tokio::spawn(read_limited(pipe, Arc::clone(&captured), limit));
        Self { captured, task }
    }

    fn stderr(pipe: impl AsyncRead + Unpin + Send + 'static) -> Self {
        let captured = Captured::default();
        let task = tokio::spawn(read_tail(pipe, Arc::clone(&captured), STDERR_TAIL));
        Self { captured, task }
    }

    /// What was read, and whether it overflowed, once the pipe closes or
    /// `deadline` passes (then whatever was read by then).
    async fn finish(mut self, deadline: tokio::time::Instant) -> Result<(Vec<u8>, bool), HandlerError> {
        let overflow = match tokio::time::timeout_at(deadline, &mut self.task).await {
            Ok(joined) => joined
                .map_err(|e| HandlerError::retryable(format!("command: a pipe reader failed: {e}")))?
                .map_err(|e| HandlerError::retryable(format!("command: reading a pipe failed: {e}")))?,
            Err(_) => {
                tracing::warn!("a process outside the task's group still holds its pipe; not waiting for it");
                self.task.abort();
                false
            }
        };
        Ok((take(&self.captured), overflow))
    }
}

/// Runs one attempt of a command task.
pub async fn run_command(ctx: &TaskContext, spec: &CommandSpec, grace: Duration) -> Result<Value, HandlerError> {
    let marker = new_marker(ctx);
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]).env_clear();
    for name in INHERITED_ENV {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.envs(&spec.env)
        .env("FLOWFORGE_RUN_ID", ctx.run_id.to_string())
        .env("FLOWFORGE_TASK_KEY", &ctx.task_key)
        .env("FLOWFORGE_ATTEMPT", ctx.attempt.to_string())
        .env("FLOWFORGE_IDEMPOTENCY_KEY", &ctx.idempotency_key)
        .env(MARKER_VAR, &marker)
        .current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| {
        let msg = format!(
            "command: cannot start {:?} in {}: {e}",
            spec.argv[0],
            spec.cwd.display()
        );
        match e.kind() {
            // InvalidInput: a NUL byte (in the task key, say); no retry fixes it.
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::InvalidInput => {
                HandlerError::permanent(msg)
            }
            _ => HandlerError::retryable(msg),
        }
    })?;
    let mut guard = child
        .id()
        .and_then(|pid| GroupGuard::new(pid, marker))
        .ok_or_else(|| HandlerError::retryable("command: the child exited before its process group was known"))?;

    let mut stdin = json!({ "inputs": ctx.inputs, "run_input": ctx.run_input });
    // A child of a mapped task reads what it runs for.
    if let Some(item) = &ctx.item {
        stdin["index"] = json!(item.index);
        stdin["item"] = item.item.clone();
    }
    let stdin_json = serde_json::to_vec(&stdin)
        .map_err(|e| HandlerError::permanent(format!("command: cannot encode stdin: {e}")))?;
    let stdin = child.stdin.take();
    let writer = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A child that does not read stdin closes it: not an error.
            let _ = stdin.write_all(&stdin_json).await;
        }
    });
    let stdout = child.stdout.take().map(|pipe| Reader::stdout(pipe, spec.stdout_limit));
    let stderr = child.stderr.take().map(Reader::stderr);

    let status = tokio::select! {
        status = child.wait() => status,
        () = ctx.cancel.cancelled() => {
            guard.signal(Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                guard.signal(Signal::SIGKILL);
                let _ = child.wait().await;
            }
            // Leftover members of the group (a backgrounded grandchild)
            // and descendants that left it.
            guard.kill_all();
            writer.abort();
            return Err(HandlerError::retryable("command was terminated (timeout or cancellation)"));
        }
    };
    // The leader is gone; anything it left running would hold the pipes
    // open and outlive the task. Its status is the attempt's, whatever the
    // leftovers were doing.
    guard.kill_all();
    let status = status.map_err(|e| HandlerError::retryable(format!("command: waiting for the child failed: {e}")))?;
    writer.abort();
    let drained_by = tokio::time::Instant::now() + PIPE_DRAIN;
    let (out, overflow) = match stdout {
        Some(r) => r.finish(drained_by).await?,
        None => (Vec::new(), false),
    };
    let err = match stderr {
        Some(r) => r.finish(drained_by).await.map(|(err, _)| err).unwrap_or_default(),
        None => Vec::new(),
    };
    if !status.success() {
        let how = match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => "was killed by a signal".to_owned(),
        };
        let stderr = tail(&err);
        return Err(HandlerError::retryable(if stderr.is_empty() {
            format!("command {how}")
        } else {
            format!("command {how}: {stderr}")
        }));
    }
    if overflow {
        return Err(HandlerError::permanent(format!(
            "command printed more than {} bytes on stdout; the limit (max_task_output_bytes) is {} bytes",
            spec.stdout_limit, spec.stdout_limit
        )));
    }
    let text = String::from_utf8_lossy(&out);
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Ok(json!({ "exit_code": status.code().unwrap_or(0), "stdout": text })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tests::ctx;

    fn spec(argv: &[&str]) -> CommandSpec {
        CommandSpec {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: std::env::temp_dir(),
            stdout_limit: DEFAULT_TASK_OUTPUT_BYTES,
        }
    }

    fn cfg(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn config_is_validated() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("data")).unwrap();
        let s = CommandSpec::from_config(
            &cfg(json!({"argv": ["ls", "-l"], "cwd": "data", "env": {"A": "1"}})),
            base.path(),
        )
        .unwrap();
        assert_eq!(s.cwd, base.path().canonicalize().unwrap().join("data"));
        assert_eq!(s.env["A"], "1");
        for bad in [
            json!({}),
            json!({"argv": []}),
            json!({"argv": [1]}),
            json!({"argv": ["x"], "env": {"A": 1}}),
        ] {
            assert!(
                CommandSpec::from_config(&cfg(bad), base.path())
                    .unwrap_err()
                    .is_permanent()
            );
        }
    }

    #[test]
    fn cwd_must_resolve_inside_the_base_folder() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("defs");
        std::fs::create_dir_all(base.join("inner")).unwrap();
        std::os::unix::fs::symlink("/etc", base.join("link")).unwrap();
        let from = |cwd: &str| CommandSpec::from_config(&cfg(json!({"argv": ["true"], "cwd": cwd})), &base);
        assert_eq!(
            from("inner/../inner").unwrap().cwd,
            base.canonicalize().unwrap().join("inner")
        );
        assert_eq!(from(".").unwrap().cwd, base.canonicalize().unwrap());
        for (escape, resolved) in [("/etc", "/etc"), ("../../..", "/"), ("link", "/etc"), ("..", "")] {
            let err = from(escape).unwrap_err();
            assert!(err.is_permanent(), "{escape}");
            assert!(
                err.message.contains("outside the allowed folder") && err.message.contains(&format!("{escape:?}")),
                "{escape}: {}",
                err.message
            );
            if !resolved.is_empty() {
                assert!(
                    err.message.contains(&format!("resolves to {resolved},")),
                    "{}",
                    err.message
                );
            }
        }
        assert!(from("missing").unwrap_err().is_permanent());
    }

    #[test]
    fn loader_variables_and_nul_bytes_are_refused() {
        let base = std::env::temp_dir();
        for bad in [
            json!({"argv": ["true"], "env": {"LD_PRELOAD": "/tmp/evil.so"}}),
            json!({"argv": ["true"], "env": {"LD_LIBRARY_PATH": "/tmp"}}),
            json!({"argv": ["true"], "env": {"FLOWFORGE_TASK_MARKER": "x"}}),
            json!({"argv": ["true"], "env": {"A": "x\0y"}}),
            json!({"argv": ["true"], "env": {"A\0B": "x"}}),
            json!({"argv": ["tr\0ue"]}),
            json!({"argv": ["true", "a\0"]}),
            json!({"argv": ["true"], "cwd": "a\0"}),
        ] {
            let err = CommandSpec::from_config(&cfg(bad.clone()), &base).unwrap_err();
            assert!(err.is_permanent(), "{bad}: {}", err.message);
        }
    }

    #[tokio::test]
    async fn a_nul_byte_reaching_spawn_is_a_permanent_failure() {
        let mut c = ctx("command");
        c.task_key = "t\0k".into();
        let err = run_command(&c, &spec(&["true"]), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.is_permanent(), "{}", err.message);
    }

    #[tokio::test]
    async fn the_child_sees_an_allow_list_of_the_environment_plus_its_own() {
        let mut s = spec(&["env"]);
        s.env.insert("GREETING".into(), "hi".into());
        let out = run_command(&ctx("command"), &s, Duration::from_secs(1)).await.unwrap();
        let text = out["stdout"].as_str().unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(n, _)| n)).collect();
        assert!(text.lines().any(|l| l == "GREETING=hi"), "{text}");
        assert!(names.contains(&"PATH"), "{text}");
        for name in names {
            assert!(
                INHERITED_ENV.contains(&name) || name.starts_with("FLOWFORGE_") || name == "GREETING",
                "the child inherited {name} from the worker"
            );
        }
    }
    #[tokio::test]
    async fn stdout_json_becomes_the_output_and_stdin_carries_inputs() {
        let mut c = ctx("command");
        c.inputs.insert("up".into(), json!({"n": 41}));
        let out = run_command(
            &c,
            &spec(&[
                "sh",
                "-c",
                r#"n=$(cat | sed 's/.*"n":\([0-9]*\).*/\1/'); echo "{\"n\": $((n+1))}""#,
            ]),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!(out, json!({"n": 42}));
        let plain = run_command(&c, &spec(&["echo", "hello"]), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(plain, json!({"exit_code": 0, "stdout": "hello\n"}));
    }

    #[tokio::test]
    async fn stdout_past_the_output_limit_is_a_permanent_failure_read_within_the_limit() {
        // 64 MiB on stdout against a 1 KiB limit: the reader keeps 1 KiB
        // and drains the rest, so this costs no memory to speak of.
        let mut s = spec(&["sh", "-c", "head -c 67108864 /dev/zero | tr '\\0' x"]);
        s.stdout_limit = 1024;
        let err = run_command(&ctx("command"), &s, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.kind, flowforge_ports::FailureKind::Permanent);
        assert_eq!(
            err.message,
            "command printed more than 1024 bytes on stdout; the limit (max_task_output_bytes) is 1024 bytes"
        );
    }

    #[tokio::test]
    async fn a_failing_command_reports_its_stderr_tail() {
        let err = run_command(
            &ctx("command"),
            &spec(&["sh", "-c", "echo boom >&2; exit 3"]),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
        assert_eq!(err.message, "command exited with status 3: boom");
        let missing = run_command(&ctx("command"), &spec(&["/no/such/program"]), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(missing.is_permanent());
    }

    fn alive(pid: i32) -> bool {
        nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
    }

    /// Whether `pid` is gone (or a zombie) within a patient bound: the
    /// kill is asserted, not its speed, so a loaded machine cannot fail it.
    fn dies(pid: i32) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if !alive(pid) || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z ")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[tokio::test]
    async fn cancel_kills_the_whole_group_including_grandchildren() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let c = ctx("command");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let cancel = c.cancel.clone();
        let task =
            tokio::spawn(async move { run_command(&c, &spec(&["sh", "-c", &script]), Duration::from_secs(1)).await });
        let grandchild = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(alive(grandchild));
        cancel.cancel();
        assert!(task.await.unwrap().is_err());
        // Killed and reaped by its parent shell, or reparented and killed.
        let gone = dies(grandchild);
        assert!(gone, "grandchild {grandchild} outlived its task");
    }

    #[tokio::test]
    async fn dropping_the_attempt_kills_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let c = ctx("command");
        let script = format!("echo $$ > {}; sleep 300", pidfile.display());
        let s = spec(&["sh", "-c", &script]);
        let mut attempt = Box::pin(run_command(&c, &s, Duration::from_secs(1)));
        let pid: i32 = loop {
            tokio::select! {
                r = &mut attempt => panic!("the command ended early: {r:?}"),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
        };
        drop(attempt);
        let gone = dies(pid);
        assert!(gone, "shell {pid} outlived its abandoned attempt");
    }
    #[test]
    fn stat_is_read_past_a_command_name_holding_parentheses_and_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags … starttime
        let line = |comm: &str, state: &str, flags: u64| {
            format!("42 ({comm}) {state} 1 42 42 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0")
        };
        let user = parse_stat(&line("a) (b c", "S", 0x0040_0100)).unwrap();
        assert_eq!((user.exited, user.kernel_thread, user.started), (false, false, 777));
        assert!(parse_stat(&line("sh", "Z", 0)).unwrap().exited);
        assert!(
            parse_stat(&line("kworker/0:1", "I", 0x0420_8060))
                .unwrap()
                .kernel_thread
        );
        assert!(parse_stat("42 (cut short) S 1").is_none());
        let me = stat(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert!(!me.exited && !me.kernel_thread && me.started > 0);
    }

    #[test]
    fn only_a_live_user_process_no_older_than_the_leader_is_looked_at_again() {
        let at = |started, exited, kernel_thread| Stat {
            exited,
            kernel_thread,
            started,
        };
        assert!(at(100, false, false).may_be_ours(100));
        assert!(at(150, false, false).may_be_ours(100));
        assert!(!at(99, false, false).may_be_ours(100), "older than the leader");
        assert!(!at(150, true, false).may_be_ours(100), "a zombie has no environment");
        assert!(!at(150, false, true).may_be_ours(100), "a kernel thread has none");
    }

    #[tokio::test]
    async fn a_setsid_descendant_is_killed_and_the_leaders_status_reported() {
        for (exit, expect_ok) in [("exit 0", true), ("exit 3", false)] {
            let dir = tempfile::tempdir().unwrap();
            let pidfile = dir.path().join("pid");
            // The escaped sleep holds stdout open, in a session of its own.
            let script = format!(
                "setsid sleep 300 & echo $! > {}; echo '{{\"ok\": true}}'; {exit}",
                pidfile.display()
            );
            let (c, s) = (ctx("command"), spec(&["sh", "-c", &script]));
            let result = tokio::time::timeout(Duration::from_secs(60), run_command(&c, &s, Duration::from_secs(1)))
                .await
                .expect("the attempt waited for a pipe held by an escaped descendant");
            if expect_ok {
                assert_eq!(result.unwrap(), json!({"ok": true}));
            } else {
                assert_eq!(result.unwrap_err().message, "command exited with status 3");
            }
            let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
            let gone = dies(pid);
            assert!(gone, "setsid descendant {pid} outlived its task");
        }
    }
}
