//! What `images` and `compose-smoke` need from the machine: the Docker
//! client, a daemon that answers, debootstrap and a compose tool. Missing
//! packages are installed with apt-get; a daemon that does not answer is
//! started in the background and left running for the next command (its
//! pid and log are under `target/containers/`).

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::project_root;

/// A program this crate runs, and the Debian package that provides it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tool {
    pub(crate) program: &'static str,
    pub(crate) package: &'static str,
}

pub(crate) const DOCKER: Tool = Tool {
    program: "docker",
    package: "docker.io",
};
const DOCKERD: Tool = Tool {
    program: "dockerd",
    package: "docker.io",
};
pub(crate) const DEBOOTSTRAP: Tool = Tool {
    program: "debootstrap",
    package: "debootstrap",
};
const DOCKER_COMPOSE: Tool = Tool {
    program: "docker-compose",
    package: "docker-compose",
};

/// Whether `program` is on the PATH.
fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs the packages of the tools that are missing. A fresh machine's
/// package lists may be stale or empty: a failed install is retried once
/// after `apt-get update`.
pub(crate) fn ensure_tools(tools: &[Tool]) -> Result<()> {
    let mut packages: Vec<&str> = tools
        .iter()
        .filter(|t| !installed(t.program))
        .map(|t| t.package)
        .collect();
    packages.dedup();
    if packages.is_empty() {
        return Ok(());
    }
    println!("installing {}", packages.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() {
        return Ok(());
    }
    run(Command::new("apt-get").args(["update", "-q"]))?;
    if !install() {
        bail!("`apt-get install {}` failed", packages.join(" "));
    }
    Ok(())
}

/// Whether a Docker daemon answers the client.
fn daemon_answers() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Makes sure the client is installed and a daemon answers, starting
/// `dockerd` when none does.
pub(crate) fn ensure_daemon() -> Result<()> {
    ensure_tools(&[DOCKER])?;
    if daemon_answers() {
        return Ok(());
    }
    ensure_tools(&[DOCKERD])?;
    let dir = project_root().join("target/containers");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log_path = dir.join("dockerd.log");
    let log = File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new("dockerd")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C meant for this command must not
        // take the daemon (and every container) down with it.
        .process_group(0)
        .spawn()
        .context("starting dockerd")?;
    let pid = child.id();
    std::fs::write(dir.join("dockerd.pid"), format!("{pid}\n"))?;
    println!(
        "started dockerd (pid {pid}, log {}); it keeps running for the next command: `kill {pid}` stops it",
        log_path.display()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !daemon_answers() {
        if Instant::now() > deadline {
            bail!(
                "dockerd (pid {pid}) did not answer within 60 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// The compose command: `docker compose` (v2) when the plugin is there,
/// else `docker-compose` (1.29, Debian's), installed when neither is.
pub(crate) fn compose_command() -> Result<Vec<&'static str>> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works("docker", &["compose", "version"]) {
        return Ok(vec!["docker", "compose"]);
    }
    ensure_tools(&[DOCKER_COMPOSE])?;
    if works("docker-compose", &["version"]) {
        return Ok(vec!["docker-compose"]);
    }
    bail!("neither `docker compose` nor `docker-compose` works")
}

/// Runs `command`, its output shown; fails unless it exits 0.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    let shown = show(command);
    let status = command.status().with_context(|| format!("running `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` exited with {status}");
    }
    Ok(())
}

/// Runs `command` and returns its stdout (stderr shown); fails unless it
/// exits 0.
pub(crate) fn output(command: &mut Command) -> Result<String> {
    let shown = show(command);
    let out = command
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running `{shown}`"))?;
    if !out.status.success() {
        bail!("`{shown}` exited with {}", out.status);
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{shown}` printed something that is not UTF-8"))
}

/// Whether `command` exits 0 (its output discarded).
pub(crate) fn succeeds(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `command` as a shell would show it, long arguments (certificates
/// passed as build arguments) cut short.
fn show(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| {
            let a = a.to_string_lossy();
            match a.char_indices().nth(60) {
                Some((cut, _)) => format!("{}…", &a[..cut]),
                None => a.into_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
