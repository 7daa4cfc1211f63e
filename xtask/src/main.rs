//! `cargo xtask …`: FlowForge's project automation, written in Rust so it
//! runs wherever cargo does (the `xtask` alias is in `.cargo/config.toml`).
//!
//! One module per command:
//!
//! * `cargo xtask ci` ([`ci`]) — everything CI runs, in order, stopping at
//!   the first failure: fmt check, clippy `-D warnings`, check-deps,
//!   cargo deny (workspace and domain-rooted), the tests.
//! * `cargo xtask check-deps` ([`check_deps`]) — crate layering, the
//!   allow-lists of `domain`'s and `ports`' dependencies, and the scan of
//!   `domain`'s source for I/O.
//! * `cargo xtask tidy` ([`tidy`]) — house rules (`//!` docs, no
//!   ignored tests, manifests use the workspace, no citation of a document
//!   outside the repository, no dangling `docs/design` reference). Also a
//!   `#[test]`, so `cargo test` enforces them.
//! * `cargo xtask deny-selftest` ([`deny_selftest`]) — proves the guards
//!   bite: adds `tokio` to `domain`, asserts check-deps and the
//!   domain-rooted cargo deny both fail, restores the manifest. Not part of
//!   `ci` (it edits the tree); run it after touching the guards.
//! * `cargo xtask bench` ([`bench`]) — the benchmark suites, written down
//!   beside their targets in `BENCHMARKS.md`.
//! * `cargo xtask chaos` ([`chaos`]) — the fault matrix, its table
//!   written into `RELIABILITY.md`; `--quick --dev --check` is a CI step.
//! * `cargo xtask images` ([`images`]) — the `flowforge` image and the
//!   compose stack's service images, from local bases (no registry).
//! * `cargo xtask compose-smoke` ([`compose_smoke`]) — the compose stack
//!   end to end: a submitted run, and a worker killed mid-run.
//! * `cargo xtask screenshots` ([`screenshots`]) — the web UI's
//!   screenshots in `docs/screenshots`, taken by the browser tests.
//!
//! [`docker`] is what the last two need from the machine.

// Printing is what a task runner is for: the workspace-wide print lints do
// not apply to this crate.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod chaos;
mod check_deps;
mod ci;
mod compose_smoke;
mod deny_selftest;
mod docker;
mod images;
mod screenshots;
mod tidy;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

const HELP: &str = "\
usage: cargo xtask <command>

commands:
  ci [--allow-skips]
                  fmt, clippy, check-deps, cargo deny, tests: what CI runs
                  (tests without PostgreSQL/RabbitMQ/chromium fail unless --allow-skips)
  check-deps      crate layering, dependency allow-lists, domain source scan
  tidy            house rules: //! docs, no ignored tests, workspace manifests, design references
  deny-selftest   prove check-deps and cargo deny reject tokio in domain
  bench [SUITE…]  run the benchmarks (embedded, postgres, distributed) and
                  write their figures beside the targets in BENCHMARKS.md
  chaos [--quick] [--seconds N] [--dev] [--check] [SCENARIO…]
                  the fault matrix: separate processes, one fault per scenario,
                  the history checked; its table written into RELIABILITY.md
  images [--services]
                  build the flowforge image and the compose stack's service
                  images from local bases (installs and starts Docker if needed);
                  --services: only the PostgreSQL and RabbitMQ images the
                  integration tests start
  compose-smoke   bring compose.yaml up, submit a run, kill a worker mid-run,
                  check both runs, bring it down
  screenshots     rerun the web UI's screenshot tests in a headless chromium,
                  writing docs/screenshots/*.png
  help            this text";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => ("help", &[][..]),
    };
    let result = match command {
        "ci" => ci::run(rest),
        "check-deps" => check_deps::run(rest),
        "tidy" => tidy::run(rest),
        "deny-selftest" => deny_selftest::run(rest),
        "bench" => bench::run(rest),
        "chaos" => chaos::run(rest),
        "images" => images::run(rest),
        "compose-smoke" => compose_smoke::run(rest),
        "screenshots" => screenshots::run(rest),
        "help" | "-h" | "--help" => {
            println!("{HELP}");
            Ok(())
        }
        other => {
            eprintln!("error: unknown command `{other}`\n\n{HELP}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the folder above this crate).
fn project_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

/// The cargo that runs us (so the pinned toolchain is used throughout).
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Every `.rs` file under `dir`, recursively, sorted; a missing `dir` has
/// none.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    let mut entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}
