//! The `flowforge` processes a benchmark or the fault matrix starts, and
//! the broker objects it declared: each stopped or deleted when its guard
//! drops, whatever way the run ends.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::amqp;

/// The release binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_flowforge");

/// The queues and exchanges a run declared, deleted on drop.
pub(crate) struct Broker {
    pub(crate) url: String,
    pub(crate) queues: Vec<String>,
    pub(crate) exchanges: Vec<String>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        for q in &self.queues {
            match amqp::delete_queue(&self.url, q) {
                Ok(n) => eprintln!("deleted queue {q} ({n} messages left in it)"),
                Err(e) => eprintln!("could not delete queue {q}: {e}"),
            }
        }
        for x in &self.exchanges {
            match amqp::delete_exchange(&self.url, x) {
                Ok(()) => eprintln!("deleted exchange {x}"),
                Err(e) => eprintln!("could not delete exchange {x}: {e}"),
            }
        }
    }
}

/// One started process and how to start it again.
struct Proc {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Child,
}

/// The `flowforge` processes started here. Dropping stops each by its own
/// pid: SIGTERM, up to 10 s to exit, then SIGKILL.
pub(crate) struct Processes {
    /// Worker slots started (consumers with prefetch 1).
    pub(crate) slots: usize,
    global: Vec<String>,
    /// The environment every process gets, under its own.
    env: Vec<(String, String)>,
    logs: tempfile::TempDir,
    children: Vec<Proc>,
    /// Processes found dead when about to be signalled.
    died: Vec<(String, ExitStatus)>,
}

impl Processes {
    pub(crate) fn new(global: Vec<String>) -> Self {
        Self {
            slots: 0,
            global,
            env: Vec::new(),
            logs: tempfile::tempdir().expect("a folder for the process logs"),
            children: Vec::new(),
            died: Vec::new(),
        }
    }

    /// Gives every process these environment variables.
    pub(crate) fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.logs.path().join(format!("{name}.log"))
    }

    /// The command for `name`; its output is appended to `name`'s log, which
    /// a restarted process shares with the ones before it.
    fn command(&self, name: &str, args: &[String], env: &[(String, String)]) -> Command {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(name))
            .expect("a log file");
        let mut cmd = Command::new(BIN);
        cmd.args(&self.global)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .envs(self.env.iter().chain(env).map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs a one-shot command to completion.
    pub(crate) fn run(&self, name: &str, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let status = self.command(name, &args, &[]).status().expect("running flowforge");
        assert!(
            status.success(),
            "flowforge {name} failed ({status}):\n{}",
            self.tail(name)
        );
    }

    /// Runs a one-shot `flowforge <args>` and returns what it printed.
    pub(crate) fn output(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(&self.global)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("running flowforge")
    }

    /// Starts `flowforge <args>` as `name`; returns its pid.
    pub(crate) fn spawn(&mut self, name: &str, args: &[&str]) -> u32 {
        self.spawn_with(name, args, Vec::new())
    }

    /// [`Processes::spawn`] with extra environment variables, kept for
    /// every restart.
    pub(crate) fn spawn_with(&mut self, name: &str, args: &[&str], env: Vec<(String, String)>) -> u32 {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let child = self.command(name, &args, &env).spawn().expect("starting flowforge");
        let pid = child.id();
        eprintln!("started flowforge {name} (pid {pid})");
        self.children.push(Proc {
            name: name.to_owned(),
            args,
            env,
            child,
        });
        pid
    }

    /// The pid of `name`.
    pub(crate) fn pid(&mut self, name: &str) -> u32 {
        self.find(name).child.id()
    }

    /// The pids of the processes whose name starts with `prefix`.
    pub(crate) fn pids(&self, prefix: &str) -> Vec<u32> {
        self.children
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .map(|p| p.child.id())
            .collect()
    }

    /// The names of the processes whose name starts with `prefix`.
    pub(crate) fn names(&self, prefix: &str) -> Vec<String> {
        self.children
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .map(|p| p.name.clone())
            .collect()
    }

    fn find(&mut self, name: &str) -> &mut Proc {
        self.children
            .iter_mut()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no process named {name}"))
    }

    /// Sends `signal` to the process `name` if it is still running: only
    /// our own child, by its pid, never 0 and never a group.
    /// One found already dead is recorded as having died on its own.
    pub(crate) fn signal(&mut self, name: &str, signal: Signal) {
        let proc = self.find(name);
        match proc.child.try_wait() {
            Ok(None) => {
                if let Ok(pid) = i32::try_from(proc.child.id())
                    && pid > 0
                {
                    let _ = kill(Pid::from_raw(pid), signal);
                }
            }
            Ok(Some(status)) => {
                let died = (name.to_owned(), status);
                if !self.died.contains(&died) {
                    self.died.push(died);
                }
            }
            Err(_) => {}
        }
    }

    /// Waits up to `timeout` for `name` to exit; `None` if it still runs.
    pub(crate) fn wait_exit(&mut self, name: &str, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let proc = self.find(name);
        loop {
            match proc.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => return None,
            }
        }
    }

    /// Starts `name` again with its arguments, once the old process has
    /// exited (killed here if it has not); returns the new pid.
    pub(crate) fn respawn(&mut self, name: &str) -> u32 {
        if self.wait_exit(name, Duration::ZERO).is_none() {
            let proc = self.find(name);
            let _ = proc.child.kill();
            let _ = proc.child.wait();
        }
        let (args, env) = {
            let proc = self.find(name);
            (proc.args.clone(), proc.env.clone())
        };
        let child = self
            .command(name, &args, &env)
            .spawn()
            .expect("starting flowforge again");
        let pid = child.id();
        self.find(name).child = child;
        pid
    }

    pub(crate) fn tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.log_path(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The whole log of `name` (every process started under that name).
    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// Sets the environment `name` is started again with.
    pub(crate) fn set_env(&mut self, name: &str, env: Vec<(String, String)>) {
        self.find(name).env = env;
    }

    /// The processes that have exited, with how, and those found dead
    /// when about to be signalled.
    pub(crate) fn exited(&mut self) -> Vec<(String, ExitStatus)> {
        let mut dead = self.died.clone();
        dead.extend(self.children.iter_mut().filter_map(|p| match p.child.try_wait() {
            Ok(Some(status)) => Some((p.name.clone(), status)),
            _ => None,
        }));
        dead
    }

    /// Panics (with its log) if a process has exited.
    pub(crate) fn check_alive(&mut self) {
        if let Some((name, status)) = self.exited().first() {
            panic!("flowforge {name} exited ({status}):\n{}", self.tail(name));
        }
    }

    /// The last lines of every process's log.
    pub(crate) fn all_tails(&self) -> String {
        self.children
            .iter()
            .map(|p| format!("--- {}\n{}", p.name, self.tail(&p.name)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(crate) fn stop(&mut self) {
        for p in &mut self.children {
            let Ok(pid) = i32::try_from(p.child.id()) else { continue };
            // Only our own child, by its pid: never 0, never a group. A
            // stopped one is continued first, or it could not exit.
            if pid > 0 && matches!(p.child.try_wait(), Ok(None)) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                eprintln!("sent SIGTERM to flowforge {} (pid {pid})", p.name);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &mut self.children {
            loop {
                match p.child.try_wait() {
                    Ok(Some(status)) => {
                        eprintln!("flowforge {} exited ({status})", p.name);
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                    _ => {
                        eprintln!("flowforge {} did not stop in time: SIGKILL", p.name);
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        break;
                    }
                }
            }
        }
        self.children.clear();
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop();
    }
}
