//! `cargo xtask ci`: what CI runs, in order, stopping at the first failure.
//!
//! 1. `cargo fmt --all -- --check`
//! 2. `cargo clippy --workspace --all-targets --all-features -- -D warnings`
//! 3. check-deps (in process, see [`crate::check_deps`])
//! 4. `cargo deny check bans licenses sources` with `deny.toml` — never
//!    `advisories`: the advisory database cannot be fetched here
//! 5. `cargo deny --manifest-path domain/Cargo.toml --exclude-dev --config
//!    xtask/deny-domain.toml check bans` — no I/O crate in `domain`'s graph
//! 6. the tests: `cargo nextest run --workspace --all-features` when
//!    cargo-nextest is installed (then the doc tests, which nextest does
//!    not run), else `cargo test --workspace --all-features`; both with
//!    `--no-fail-fast`, so one run shows every failing test
//! 7. the test containers: names the PostgreSQL and RabbitMQ containers
//!    the tests started through flowforge-testkit (when `DATABASE_URL` /
//!    `AMQP_URL` are unset), which nextest's captured output would hide,
//!    and removes them
//! 8. the fault matrix, quick (`cargo xtask chaos --quick --dev --check`,
//!    see [`crate::chaos`]) on the machine's PostgreSQL and RabbitMQ; not
//!    with `--allow-skips`, which promises no services
//!
//! Each step prints its duration; the first failing step stops the run,
//! and the error names it.
//!
//! Every step runs with `REQUIRE_POSTGRES=1 REQUIRE_RABBITMQ=1
//! REQUIRE_BROWSER=1`, so an integration test whose service (or, for the
//! web UI's tests, chromium and chromedriver) is missing fails instead of
//! skipping, exactly as under `.ci/run`; `--allow-skips` leaves them unset
//! (a quick local run without the services).

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::{cargo, project_root};

/// `cargo deny` rooted at `domain`, its dev-dependencies excluded, with
/// the bans of xtask/deny-domain.toml (also run by `deny-selftest`).
pub(crate) const DENY_DOMAIN: &[&str] = &[
    "deny",
    "--manifest-path",
    "domain/Cargo.toml",
    "--exclude-dev",
    "--config",
    "xtask/deny-domain.toml",
    "check",
    "bans",
];

/// One CI step.
#[derive(Debug)]
enum Action {
    /// `cargo <args>` in the workspace root.
    Cargo(Vec<&'static str>),
    /// A function of this crate.
    InProcess(fn() -> Result<()>),
}

#[derive(Debug)]
struct Step {
    name: &'static str,
    action: Action,
}

/// The steps, in order. Tests with nextest when it is installed; the fault
/// matrix only when the services are required (it needs them).
fn steps(nextest: bool, services: bool) -> Vec<Step> {
    let cargo_step = |name, args: &[&'static str]| Step {
        name,
        action: Action::Cargo(args.to_vec()),
    };
    let mut steps = vec![
        cargo_step("fmt", &["fmt", "--all", "--", "--check"]),
        cargo_step(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ],
        ),
        Step {
            name: "check-deps",
            action: Action::InProcess(|| crate::check_deps::check(&project_root())),
        },
        cargo_step("deny (workspace)", &["deny", "check", "bans", "licenses", "sources"]),
        cargo_step("deny (domain)", DENY_DOMAIN),
    ];
    if nextest {
        steps.push(cargo_step(
            "tests (nextest)",
            &["nextest", "run", "--workspace", "--all-features", "--no-fail-fast"],
        ));
        steps.push(cargo_step(
            "doc tests",
            &["test", "--workspace", "--all-features", "--doc"],
        ));
    } else {
        steps.push(cargo_step(
            "tests",
            &["test", "--workspace", "--all-features", "--no-fail-fast"],
        ));
    }
    steps.push(Step {
        name: "test containers",
        action: Action::InProcess(test_containers),
    });
    if services {
        steps.push(Step {
            name: "fault matrix (quick)",
            action: Action::InProcess(|| crate::chaos::run(&["--quick", "--dev", "--check"].map(String::from))),
        });
    }
    steps
}

/// Lists and removes the containers of test runs that have ended (their
/// `flowforge.testkit.pid` process is gone): the ones the tests just used.
fn test_containers() -> Result<()> {
    let listed = Command::new("docker")
        .args([
            "ps",
            "--all",
            "--filter",
            "label=flowforge.testkit",
            "--format",
            "{{.ID}} {{.Image}} {{.Label \"flowforge.testkit.pid\"}}",
        ])
        .output();
    let Ok(listed) = listed.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()) else {
        println!("no Docker: the tests used the services at DATABASE_URL / AMQP_URL");
        return Ok(());
    };
    let ended: Vec<(&str, &str)> = listed
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (id, image, pid) = (fields.next()?, fields.next()?, fields.next()?);
            let alive = std::path::Path::new("/proc").join(pid).exists();
            (!alive).then_some((id, image))
        })
        .collect();
    if ended.is_empty() {
        println!("the tests started no containers: they used the services at DATABASE_URL / AMQP_URL");
        return Ok(());
    }
    for (id, image) in &ended {
        println!("testkit: the tests ran {image} in container {id}; removing it");
    }
    let removed = Command::new("docker")
        .args(["rm", "--force", "--volumes"])
        .args(ended.iter().map(|(id, _)| id))
        .output()?;
    if !removed.status.success() {
        bail!(
            "could not remove the test containers: {}",
            String::from_utf8_lossy(&removed.stderr).trim()
        );
    }
    Ok(())
}

/// `cargo xtask ci`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let skips = allow_skips(args)?;
    let env = service_env(skips);
    if !cargo_has("deny") {
        bail!("cargo-deny is not installed: run `cargo install cargo-deny --locked` (or use .ci/run, which does)");
    }
    let steps = steps(cargo_has("nextest"), !skips);
    let total = steps.len();
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    let started = Instant::now();
    for (n, step) in steps.iter().enumerate() {
        println!("\n==> [{}/{total}] {}", n + 1, step.name);
        let t0 = Instant::now();
        let outcome = execute(&step.action, env);
        let took = t0.elapsed();
        if let Err(error) = outcome {
            print_timings(&timings);
            bail!(
                "CI step {}/{total} `{}` failed after {}: {error:#}",
                n + 1,
                step.name,
                secs(took)
            );
        }
        println!("<== {} ok in {}", step.name, secs(took));
        timings.push((step.name, took));
    }
    print_timings(&timings);
    println!("ci: all {total} steps passed in {}", secs(started.elapsed()));
    Ok(())
}

/// The variables every step runs with: a green CI must mean the
/// integration tests ran against their services, not that they skipped.
fn service_env(allow_skips: bool) -> &'static [(&'static str, &'static str)] {
    if allow_skips {
        &[]
    } else {
        &[
            ("REQUIRE_POSTGRES", "1"),
            ("REQUIRE_RABBITMQ", "1"),
            ("REQUIRE_BROWSER", "1"),
        ]
    }
}

/// Reads `ci`'s arguments: whether `--allow-skips` was given.
fn allow_skips(args: &[String]) -> Result<bool> {
    match args {
        [] => Ok(false),
        [flag] if flag == "--allow-skips" => Ok(true),
        [arg, ..] => bail!("ci takes only `--allow-skips`, got `{arg}`"),
    }
}

fn execute(action: &Action, env: &[(&str, &str)]) -> Result<()> {
    match action {
        Action::InProcess(f) => f(),
        Action::Cargo(args) => {
            println!("$ cargo {}", args.join(" "));
            let status = Command::new(cargo())
                .args(args)
                .envs(env.iter().copied())
                .current_dir(project_root())
                .status()?;
            if !status.success() {
                bail!("`cargo {}` exited with {status}", args.join(" "));
            }
            Ok(())
        }
    }
}

/// Whether `cargo <sub> --version` works (the subcommand is installed).
pub(crate) fn cargo_has(sub: &str) -> bool {
    Command::new(cargo())
        .args([OsString::from(sub), OsString::from("--version")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn print_timings(timings: &[(&str, Duration)]) {
    if timings.is_empty() {
        return;
    }
    println!("\nstep durations:");
    for (name, took) in timings {
        println!("  {name:<18} {:>8}", secs(*took));
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(nextest: bool, services: bool) -> Vec<&'static str> {
        steps(nextest, services).iter().map(|s| s.name).collect()
    }

    #[test]
    fn the_steps_run_in_the_documented_order() {
        assert_eq!(
            names(false, false),
            [
                "fmt",
                "clippy",
                "check-deps",
                "deny (workspace)",
                "deny (domain)",
                "tests",
                "test containers"
            ]
        );
        assert_eq!(
            names(true, true),
            [
                "fmt",
                "clippy",
                "check-deps",
                "deny (workspace)",
                "deny (domain)",
                "tests (nextest)",
                "doc tests",
                "test containers",
                "fault matrix (quick)"
            ]
        );
    }

    #[test]
    fn missing_services_fail_the_tests_unless_skips_are_allowed() {
        let required = service_env(allow_skips(&[]).unwrap());
        assert_eq!(
            required,
            [
                ("REQUIRE_POSTGRES", "1"),
                ("REQUIRE_RABBITMQ", "1"),
                ("REQUIRE_BROWSER", "1")
            ]
        );
        assert!(service_env(allow_skips(&["--allow-skips".to_owned()]).unwrap()).is_empty());
        assert!(allow_skips(&["--fast".to_owned()]).is_err());
    }

    #[test]
    fn advisories_are_never_checked() {
        for step in steps(true, true) {
            if let Action::Cargo(args) = &step.action {
                assert!(!args.contains(&"advisories") && !args.contains(&"all"), "{args:?}");
            }
        }
    }
}
