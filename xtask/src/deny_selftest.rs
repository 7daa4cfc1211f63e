//! `cargo xtask deny-selftest`: proves that the two guards of `domain`'s
//! purity actually bite.
//!
//! It adds `tokio = { workspace = true }` to `[dependencies]` of
//! `domain/Cargo.toml`, then runs `check-deps` and the domain-rooted
//! `cargo deny … check bans` (the same command as CI) and asserts that
//! **both fail**. The manifest is restored afterwards by a drop guard, so
//! it is restored on error and on panic too; cargo is then run once more
//! so `Cargo.lock` drops the temporary edge again.
//!
//! Not part of `cargo xtask ci`, because it edits the work tree; run it
//! after changing check-deps, deny.toml or xtask/deny-domain.toml. Do not
//! run it while another cargo command is building `domain`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::{cargo, project_root};

/// The line the self-test plants in `domain`'s `[dependencies]`.
const PLANTED: &str = "tokio = { workspace = true }";

/// `cargo xtask deny-selftest`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("deny-selftest takes no arguments, got `{arg}`");
    }
    let root = project_root();
    let lock_before = std::fs::read(root.join("Cargo.lock")).ok();

    let outcome = {
        let _guard = Planted::plant(&root.join("domain/Cargo.toml"))?;
        println!("planted `{PLANTED}` in domain/Cargo.toml");
        probe(&root)
    };
    println!("restored domain/Cargo.toml");
    resync_lock(&root)?;
    if std::fs::read(root.join("Cargo.lock")).ok() == lock_before {
        println!("Cargo.lock is byte-identical to before the self-test");
    } else {
        println!("note: Cargo.lock differs from before the self-test (another cargo command may have changed it)");
    }
    let (check_deps_failed, deny_failed) = outcome?;
    ensure!(
        check_deps_failed,
        "check-deps PASSED with tokio in domain: the allow-list guard is broken"
    );
    ensure!(
        deny_failed,
        "cargo deny PASSED with tokio in domain: xtask/deny-domain.toml is broken"
    );
    println!("deny-selftest: ok — both check-deps and cargo deny reject tokio in domain");
    Ok(())
}

/// Runs both guards against the planted manifest: whether each failed.
fn probe(root: &Path) -> Result<(bool, bool)> {
    println!("\n--- check-deps (expected to fail)");
    let check_deps = crate::check_deps::check(root);
    if let Err(e) = &check_deps {
        println!("check-deps failed as expected: {e:#}");
    }

    println!("\n--- cargo deny, domain-rooted (expected to fail)");
    let args = crate::ci::DENY_DOMAIN;
    println!("$ cargo {}", args.join(" "));
    let status = Command::new(cargo())
        .args(args)
        .current_dir(root)
        .status()
        .context("running cargo deny")?;
    println!("cargo deny exited with {status}");
    Ok((check_deps.is_err(), !status.success()))
}

/// Lets cargo rewrite `Cargo.lock` for the restored manifest.
fn resync_lock(root: &Path) -> Result<()> {
    let status = Command::new(cargo())
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running cargo metadata")?;
    ensure!(
        status.success(),
        "cargo metadata failed after restoring domain/Cargo.toml"
    );
    Ok(())
}

/// The planted manifest; dropping it writes the original back.
#[derive(Debug)]
struct Planted {
    path: PathBuf,
    original: String,
}

impl Planted {
    fn plant(path: &Path) -> Result<Self> {
        let original = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let planted = plant(&original)?;
        let guard = Self {
            path: path.to_path_buf(),
            original,
        };
        std::fs::write(path, planted).with_context(|| format!("writing {}", path.display()))?;
        Ok(guard)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.path, &self.original) {
            eprintln!(
                "error: could not restore {}: {e}; remove the line `{PLANTED}` by hand",
                self.path.display()
            );
        }
    }
}

/// `manifest` with [`PLANTED`] as the first entry of `[dependencies]`.
fn plant(manifest: &str) -> Result<String> {
    let mut out = String::with_capacity(manifest.len() + PLANTED.len() + 1);
    let mut done = false;
    for line in manifest.split_inclusive('\n') {
        out.push_str(line);
        if !done && line.trim() == "[dependencies]" {
            out.push_str(PLANTED);
            out.push('\n');
            done = true;
        }
    }
    ensure!(done, "domain/Cargo.toml has no [dependencies] section");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokio_is_planted_under_dependencies_only() {
        let manifest = "[package]\nname = \"x\"\n\n[dependencies]\nserde.workspace = true\n\n[dev-dependencies]\n";
        assert_eq!(
            plant(manifest).unwrap(),
            "[package]\nname = \"x\"\n\n[dependencies]\ntokio = { workspace = true }\nserde.workspace = true\n\n[dev-dependencies]\n"
        );
        assert!(plant("[package]\n").is_err());
    }

    #[test]
    fn the_guard_restores_the_file_even_on_panic() {
        let dir = std::env::temp_dir().join(format!("xtask-selftest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("Cargo.toml");
        let original = "[dependencies]\nserde = \"1\"\n";
        std::fs::write(&file, original).unwrap();
        let result = std::panic::catch_unwind(|| {
            let _guard = Planted::plant(&file).unwrap();
            assert!(std::fs::read_to_string(&file).unwrap().contains(PLANTED));
            panic!("a failing probe");
        });
        assert!(result.is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), original);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
