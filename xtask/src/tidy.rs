//! `cargo xtask tidy`: the house rules, checked as text (rust-analyzer's
//! `xtask/src/tidy.rs` model). The same checks run as the `#[test]`
//! [`tests::tidy`], so a plain `cargo test` enforces them.
//!
//! For the whole repository ([`references`]): no citation of a document
//! outside it, and no reference to a `docs/design` file or heading that
//! does not exist.
//!
//! For every workspace member:
//! * every `.rs` file under `src/`, `tests/`, `benches/` and `examples/`
//!   starts with a `//!` doc comment (`main.rs`, `lib.rs` and test files
//!   included) saying what the module is for;
//! * no ignored tests (a test that does not run is not a test);
//! * no to-do, unimplemented or debug-print macros (clippy warns on them
//!   too; this catches them before a build);
//! * `Cargo.toml` uses `[lints] workspace = true`, `publish.workspace =
//!   true` (or `publish = false`), and every internal (`flowforge-*`)
//!   dependency is declared with `workspace = true`, never by `path`.
//!
//! The patterns below are spelled with `concat!` so this file does not
//! trip its own checks.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, project_root, rust_files};

mod references;

/// Macros that must not be committed.
const FORBIDDEN_MACROS: &[&str] = &[
    concat!("todo", "!("),
    concat!("unimplemented", "!("),
    concat!("dbg", "!("),
];

/// An attribute that silences a test.
const IGNORE_ATTRIBUTE: &str = concat!("#[", "ignore");

/// `cargo xtask tidy`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("tidy takes no arguments, got `{arg}`");
    }
    let problems = check(&project_root())?;
    if problems.is_empty() {
        println!("tidy: ok");
        return Ok(());
    }
    for problem in &problems {
        eprintln!("error: {problem}");
    }
    bail!("tidy found {} problem(s)", problems.len())
}

/// Every house-rule violation in the workspace at `root`.
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for dir in member_dirs(root)? {
        let manifest = dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
        let shown = relative(&manifest, root);
        problems.extend(check_manifest(&text).into_iter().map(|p| format!("{shown}: {p}")));

        let mut files = Vec::new();
        for sub in ["src", "tests", "benches", "examples"] {
            rust_files(&dir.join(sub), &mut files)?;
        }
        for file in files {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let shown = relative(&file, root);
            problems.extend(check_source(&text).into_iter().map(|p| format!("{shown}:{p}")));
        }
    }
    problems.extend(references::check(root)?);
    Ok(problems)
}

fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

/// The folders of the workspace members, from `cargo metadata --no-deps`.
fn member_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new(cargo())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    let json: Value = serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    let mut dirs: Vec<PathBuf> = json["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| p["manifest_path"].as_str())
        .filter_map(|m| Path::new(m).parent().map(Path::to_path_buf))
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// The problems of one source file, each as `line: message`.
fn check_source(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !text.starts_with("//!") {
        problems.push("1: a module starts with a `//!` doc comment saying what it is for".to_owned());
    }
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if code.contains(IGNORE_ATTRIBUTE) {
            problems.push(format!("{}: no ignored tests: make it pass or delete it", n + 1));
        }
        for pattern in FORBIDDEN_MACROS {
            if code.contains(pattern) {
                problems.push(format!("{}: `{pattern}…)` must not be committed", n + 1));
            }
        }
    }
    problems
}

/// The problems of one member manifest.
fn check_manifest(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut section = String::new();
    let mut lints_workspace = false;
    let mut publish_ok = false;
    // `[dependencies.flowforge-x]` tables: (name, saw `workspace = true`).
    let mut dep_table: Option<(String, bool)> = None;

    let close_table = |table: &mut Option<(String, bool)>, problems: &mut Vec<String>| {
        if let Some((name, false)) = table.take() {
            problems.push(format!("internal dependency `{name}` must use `workspace = true`"));
        }
    };

    for raw in text.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            close_table(&mut dep_table, &mut problems);
            section = line.trim_matches(|c| c == '[' || c == ']').trim().to_owned();
            if let Some((kind, name)) = section.rsplit_once('.')
                && kind.ends_with("dependencies")
                && name.trim_matches('"').starts_with("flowforge-")
            {
                dep_table = Some((name.trim_matches('"').to_owned(), false));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let workspace_true = |key: &str, value: &str| key == "workspace" && value == "true";

        if let Some((_, seen)) = &mut dep_table {
            *seen |= workspace_true(key, value);
            continue;
        }
        match section.as_str() {
            "package" => {
                publish_ok |= (key == "publish.workspace" && value == "true") || (key == "publish" && value == "false");
                lints_workspace |= key == "lints.workspace" && value == "true";
            }
            "lints" => lints_workspace |= workspace_true(key, value),
            s if s.ends_with("dependencies") => {
                let name = key.split('.').next().unwrap_or(key).trim_matches('"');
                if name.starts_with("flowforge-") {
                    let ok = key.ends_with(".workspace") && value == "true"
                        || value.replace(' ', "").contains("workspace=true");
                    if !ok {
                        problems.push(format!(
                            "internal dependency `{name}` must use `workspace = true` (declared once in the root manifest), not `{line}`"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    close_table(&mut dep_table, &mut problems);
    if !lints_workspace {
        problems.push("missing `[lints] workspace = true`".to_owned());
    }
    if !publish_ok {
        problems.push("missing `publish.workspace = true` (or `publish = false`) in [package]".to_owned());
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The house rules hold for the whole workspace.
    #[test]
    fn tidy() {
        let problems = check(&project_root()).unwrap();
        assert!(problems.is_empty(), "tidy found problems:\n{}", problems.join("\n"));
    }

    #[test]
    fn a_module_without_a_doc_comment_is_refused() {
        assert!(check_source("//! Does a thing.\nfn main() {}\n").is_empty());
        assert_eq!(check_source("fn main() {}\n").len(), 1);
        assert_eq!(check_source("/// item doc, not module doc\nfn f() {}\n").len(), 1);
        assert_eq!(check_source("\n//! late\n").len(), 1);
    }

    #[test]
    fn ignored_tests_and_leftover_macros_are_refused() {
        let bad = format!(
            "//! m\n{}]\n#[test]\nfn t() {{ {}\"x\"); }}\nfn u() {{ {}); {}1); }}\n",
            IGNORE_ATTRIBUTE, FORBIDDEN_MACROS[0], FORBIDDEN_MACROS[1], FORBIDDEN_MACROS[2]
        );
        let problems = check_source(&bad);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("2: no ignored tests"));
        assert!(problems[1].starts_with("4: "));
        assert!(problems[2].starts_with("5: ") && problems[3].starts_with("5: "));
        // Mentioned in a comment is fine.
        let commented = format!("//! m\n// {}] is banned\n", IGNORE_ATTRIBUTE);
        assert!(check_source(&commented).is_empty());
    }

    const GOOD: &str = r#"[package]
name = "flowforge-x"
version.workspace = true
publish.workspace = true

[lints]
workspace = true

[dependencies]
flowforge-domain.workspace = true
flowforge-ports = { workspace = true, features = ["test-util"] }
serde = { version = "1", path = "../serde" } # external: not our business

[dev-dependencies.flowforge-app]
workspace = true
features = ["x"]
"#;

    #[test]
    fn a_good_manifest_passes() {
        assert_eq!(check_manifest(GOOD), Vec::<String>::new());
        let unpublished = GOOD.replace("publish.workspace = true", "publish = false");
        assert_eq!(check_manifest(&unpublished), Vec::<String>::new());
    }

    #[test]
    fn manifest_problems_are_named() {
        let path_dep = GOOD.replace(
            "flowforge-domain.workspace = true",
            "flowforge-domain = { path = \"../domain\" }",
        );
        let p = check_manifest(&path_dep);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("`flowforge-domain` must use `workspace = true`"),
            "{}",
            p[0]
        );

        let table = GOOD.replace(
            "[dev-dependencies.flowforge-app]\nworkspace = true",
            "[dev-dependencies.flowforge-app]\npath = \"../app\"",
        );
        let p = check_manifest(&table);
        assert_eq!(p, ["internal dependency `flowforge-app` must use `workspace = true`"]);

        let no_lints = GOOD.replace("[lints]\nworkspace = true\n", "");
        assert_eq!(check_manifest(&no_lints), ["missing `[lints] workspace = true`"]);

        let published = GOOD.replace("publish.workspace = true\n", "");
        assert_eq!(
            check_manifest(&published),
            ["missing `publish.workspace = true` (or `publish = false`) in [package]"]
        );
    }
}
