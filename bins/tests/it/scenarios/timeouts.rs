//! Timeouts (docs/design/handlers.md#timeouts): an async handler that
//! overruns its `timeout_seconds` is abandoned (its future dropped), a
//! `command` task's whole process group is terminated — no child or
//! grandchild left behind — and either way the attempt counts as a failed
//! attempt that the retry policy may retry.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_app::worker::Handled;
use flowforge_domain::TaskRunState;
use flowforge_ports::FinishResult;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::json;

use super::{Counter, PATIENCE, event, scenario, task_of, transitions};

/// Sets its flag when dropped: proves a handler's future was abandoned.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn an_async_handler_that_overruns_its_timeout_is_abandoned_and_the_attempt_fails() {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let calls = Counter::default();
    let counter = calls.clone();
    let s = scenario(move |b| {
        b.handler_fn("stubborn", move |ctx: TaskContext| {
            counter.hit();
            let flag = Arc::clone(&flag);
            async move {
                if ctx.attempt == 1 {
                    // Ignores its cancellation signal: only dropping the
                    // future stops it.
                    let _guard = DropFlag(flag);
                    std::future::pending::<()>().await;
                }
                Ok::<_, HandlerError>(json!({ "attempt": ctx.attempt }))
            }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "async-timeout", "version": 1,
                "tasks": [{"key": "slow", "task_type": "stubborn", "timeout_seconds": 0.2,
                           "retry": {"max_attempts": 2, "delay_seconds": 1}}]
            }),
            json!({}),
        )
        .await;
    s.publish(run).await;
    let started = Instant::now();
    assert_eq!(
        s.work_one().await,
        Some(Handled::Finished(FinishResult::Recorded(TaskRunState::Retrying)))
    );
    assert!(started.elapsed() < PATIENCE);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the overrunning handler was not dropped"
    );
    let d = s.detail(run).await;
    let fail = event(&d, "slow", "fail", 0);
    assert_eq!(fail.attempt, Some(1));
    assert_eq!(fail.error.as_deref(), Some("timed out after 0.2s"));
    assert_eq!(task_of(&d, "slow").state, TaskRunState::Retrying);

    // The timeout was an ordinary failed attempt: the retry runs.
    s.clock.advance(Duration::from_secs(2));
    s.settle(run).await;
    let d = s.detail(run).await;
    let slow = task_of(&d, "slow");
    assert_eq!((slow.state, slow.attempt), (TaskRunState::Succeeded, 2));
    assert_eq!(
        transitions(&d, "slow"),
        ["claim", "fail", "schedule_retry", "retry_ready", "claim", "succeed"]
    );
    assert_eq!(calls.get(), 2);
    assert_eq!(d.summary.state, RunState::Succeeded);
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `pid` is gone: no such process, or a zombie nobody reaped yet
/// (a reparented grandchild that init has not collected).
fn gone(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_err()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
        })
}

async fn eventually_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !gone(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) outlived its timed-out task"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_command_that_times_out_loses_its_whole_process_group_and_the_attempt_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    let shell_pid = dir.path().join("shell.pid");
    let child_pid = dir.path().join("grandchild.pid");
    let marker = dir.path().join("attempted");
    // Attempt 1 backgrounds a long sleep (a grandchild in the same process
    // group) and waits; attempt 2 finds the marker and succeeds at once.
    let script = format!(
        "if [ -e '{marker}' ]; then echo '{{\"second\": true}}'; exit 0; fi\n\
         touch '{marker}'\n\
         echo $$ > '{shell}'\n\
         sleep 300 &\n\
         echo $! > '{child}'\n\
         wait\n",
        marker = marker.display(),
        shell = shell_pid.display(),
        child = child_pid.display(),
    );
    let s = scenario(|b| b).await;
    let run = s
        .start(
            json!({
                "name": "command-timeout", "version": 1,
                "tasks": [{"key": "cmd", "task_type": "command", "timeout_seconds": 3,
                           "retry": {"max_attempts": 2, "delay_seconds": 1},
                           "config": {"argv": ["sh", "-c", script]}}]
            }),
            json!({}),
        )
        .await;
    s.publish(run).await;
    assert_eq!(
        s.work_one().await,
        Some(Handled::Finished(FinishResult::Recorded(TaskRunState::Retrying)))
    );
    let shell = read_pid(&shell_pid).expect("the shell wrote its pid before the timeout");
    let grandchild = read_pid(&child_pid).expect("the shell wrote its child's pid before the timeout");
    eventually_gone(shell, "the command's shell").await;
    eventually_gone(grandchild, "the backgrounded grandchild").await;

    let d = s.detail(run).await;
    let fail = event(&d, "cmd", "fail", 0);
    assert_eq!(fail.attempt, Some(1));
    assert_eq!(fail.error.as_deref(), Some("timed out after 3s"));

    s.clock.advance(Duration::from_secs(2));
    s.settle(run).await;
    let d = s.detail(run).await;
    let cmd = task_of(&d, "cmd");
    assert_eq!((cmd.state, cmd.attempt), (TaskRunState::Succeeded, 2));
    assert_eq!(cmd.output, Some(json!({"second": true})));
    assert_eq!(d.summary.state, RunState::Succeeded);
}
