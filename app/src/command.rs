//! The `command` built-in: a child process in its own process group, fed
//! `{"inputs", "run_input"}` on stdin, whose stdout becomes the output.
//! On cancel or timeout the whole group gets SIGTERM, a grace period, then
//! SIGKILL, so no grandchild outlives its task.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use flowforge_ports::{HandlerError, TaskContext};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// The most stdout a command may print (its output is size-limited anyway).
const STDOUT_LIMIT: usize = 4 * 1024 * 1024;
/// How much of stderr's tail a failure reports.
const STDERR_TAIL: usize = 4 * 1024;

/// A validated `command` config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute, resolved against the base folder).
    pub cwd: PathBuf,
}

impl CommandSpec {
    /// Reads `argv`, `env` and `cwd` from a task config. A bad config is a
    /// permanent failure: no retry can fix it.
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
        let env = match config.get("env") {
            None => BTreeMap::new(),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("config.env values must be strings"))?,
            Some(_) => return Err(bad("config.env must be an object of strings")),
        };
        let cwd = match config.get("cwd") {
            None => base_dir.to_path_buf(),
            Some(Value::String(dir)) => base_dir.join(dir),
            Some(_) => return Err(bad("config.cwd must be a string")),
        };
        Ok(Self { argv, env, cwd })
    }
}

/// Kills the process group when dropped while armed: a handler future the
/// worker abandons (timeout) must not leave its processes behind.
struct GroupGuard {
    pgid: Option<Pid>,
}

impl GroupGuard {
    fn new(pid: u32) -> Option<Self> {
        // A new group's id is its leader's pid. Never 0 or 1: killpg(0)
        // would signal our own group and 1 is init.
        let pid = i32::try_from(pid).ok().filter(|&p| p > 1)?;
        Some(Self {
            pgid: Some(Pid::from_raw(pid)),
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

    fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

async fn read_limited(mut pipe: impl AsyncRead + Unpin, limit: usize) -> std::io::Result<(Vec<u8>, bool)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut overflow = false;
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok((buf, overflow));
        }
        if buf.len() + n > limit {
            overflow = true;
            // Keep draining so the child never blocks on a full pipe.
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn read_tail(mut pipe: impl AsyncRead + Unpin, keep: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 2 * keep {
            buf.drain(..buf.len() - keep);
        }
    }
}

fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&bytes[start..]).trim().to_owned()
}

/// Runs one attempt of a command task.
pub async fn run_command(ctx: &TaskContext, spec: &CommandSpec, grace: Duration) -> Result<Value, HandlerError> {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .envs(&spec.env)
        .env("FLOWFORGE_RUN_ID", ctx.run_id.to_string())
        .env("FLOWFORGE_TASK_KEY", &ctx.task_key)
        .env("FLOWFORGE_ATTEMPT", ctx.attempt.to_string())
        .env("FLOWFORGE_IDEMPOTENCY_KEY", &ctx.idempotency_key)
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
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => HandlerError::permanent(msg),
            _ => HandlerError::retryable(msg),
        }
    })?;
    let mut guard = child
        .id()
        .and_then(GroupGuard::new)
        .ok_or_else(|| HandlerError::retryable("command: the child exited before its process group was known"))?;

    let stdin_json = serde_json::to_vec(&json!({ "inputs": ctx.inputs, "run_input": ctx.run_input }))
        .map_err(|e| HandlerError::permanent(format!("command: cannot encode stdin: {e}")))?;
    let stdin = child.stdin.take();
    let writer = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A child that does not read stdin closes it: not an error.
            let _ = stdin.write_all(&stdin_json).await;
        }
    });
    let stdout = child.stdout.take().map(|p| tokio::spawn(read_limited(p, STDOUT_LIMIT)));
    let stderr = child.stderr.take().map(|p| tokio::spawn(read_tail(p, STDERR_TAIL)));

    let status = tokio::select! {
        status = child.wait() => status,
        () = ctx.cancel.cancelled() => {
            guard.signal(Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                guard.signal(Signal::SIGKILL);
                let _ = child.wait().await;
            }
            // Leftover members of the group (a backgrounded grandchild).
            guard.signal(Signal::SIGKILL);
            guard.disarm();
            return Err(HandlerError::retryable("command was terminated (timeout or cancellation)"));
        }
    };
    // The leader is gone; anything it left running in its group would hold
    // the pipes open and outlive the task.
    guard.signal(Signal::SIGKILL);
    guard.disarm();
    let status = status.map_err(|e| HandlerError::retryable(format!("command: waiting for the child failed: {e}")))?;
    let _ = writer.await;
    let (out, overflow) = match stdout {
        Some(h) => h
            .await
            .map_err(|e| HandlerError::retryable(format!("command: stdout reader failed: {e}")))?
            .map_err(|e| HandlerError::retryable(format!("command: reading stdout failed: {e}")))?,
        None => (Vec::new(), false),
    };
    let err = match stderr {
        Some(h) => h.await.ok().and_then(Result::ok).unwrap_or_default(),
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
            "command printed more than {STDOUT_LIMIT} bytes on stdout"
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
        }
    }

    #[test]
    fn config_is_validated() {
        let base = Path::new("/defs");
        let cfg = |v: Value| v.as_object().cloned().unwrap();
        let s = CommandSpec::from_config(
            &cfg(json!({"argv": ["ls", "-l"], "cwd": "data", "env": {"A": "1"}})),
            base,
        )
        .unwrap();
        assert_eq!(s.cwd, Path::new("/defs/data"));
        assert_eq!(s.env["A"], "1");
        for bad in [
            json!({}),
            json!({"argv": []}),
            json!({"argv": [1]}),
            json!({"argv": ["x"], "env": {"A": 1}}),
        ] {
            assert!(CommandSpec::from_config(&cfg(bad), base).unwrap_err().is_permanent());
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
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !alive(grandchild)
                || std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| s.contains(") Z "))
        });
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
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !alive(pid) || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
        });
        assert!(gone, "shell {pid} outlived its abandoned attempt");
    }
}
