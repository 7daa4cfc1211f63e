//! `cargo xtask screenshots`: regenerates the web UI's committed
//! screenshots. Runs the bins integration tests whose names contain
//! `screenshot` under nextest, with `FLOWFORGE_SCREENSHOTS` pointing at
//! `docs/screenshots` (where the browser harness's `save_screenshot`
//! writes `<name>.png`) and `REQUIRE_BROWSER=1`, so a missing browser fails
//! the command instead of leaving the old pictures silently in place.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{cargo, project_root};

/// The folder the PNGs go to, relative to the workspace root.
const FOLDER: &str = "docs/screenshots";

/// `cargo nextest` arguments: the tests that write screenshots.
const NEXTEST_ARGS: &[&str] = &[
    "nextest",
    "run",
    "--package",
    "flowforge-bins",
    "--test",
    "it",
    "-E",
    "test(screenshot)",
];

/// `cargo xtask screenshots`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("screenshots takes no arguments, got `{arg}`");
    }
    if !crate::ci::cargo_has("nextest") {
        bail!("cargo-nextest is not installed: run `cargo install cargo-nextest --locked`");
    }
    let root = project_root();
    let folder = root.join(FOLDER);
    println!("$ cargo {}", NEXTEST_ARGS.join(" "));
    let status = Command::new(cargo())
        .args(NEXTEST_ARGS)
        .env("FLOWFORGE_SCREENSHOTS", &folder)
        .env("REQUIRE_BROWSER", "1")
        .current_dir(&root)
        .status()?;
    if !status.success() {
        bail!("`cargo {}` exited with {status}", NEXTEST_ARGS.join(" "));
    }
    println!("screenshots: written to {FOLDER} (`git status {FOLDER}` shows what changed)");
    Ok(())
}
