//! What the repository cites, checked as text: it explains itself.
//!
//! * **No document outside the repository.** The decisions the code relies
//!   on are recorded in `docs/design/`; a comment that cites a section or a
//!   numbered decision of some other document (the blueprint and the
//!   specification the project started from) points at text nobody reading
//!   the repository has. The released migrations are exempt: sqlx checksums
//!   each migration file, comments included, so their text can never change
//!   (docs/design/data-model.md#released-migrations).
//! * **No dangling design reference.** Every `docs/design/<file>.md` and
//!   `docs/design/<file>.md#<anchor>` mentioned anywhere, and every relative
//!   link between the files of `docs/design/`, names an existing file and a
//!   heading of it. Anchors are GitHub's: the heading in lower case, spaces
//!   turned into `-`, punctuation other than `-` and `_` dropped, a repeated
//!   heading suffixed `-1`, `-2`, ….
//!
//! Both rules read every UTF-8 text file of the repository outside
//! `target/` and `.git/`. The cited patterns are spelled with `concat!` so
//! this file does not trip its own checks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The design record, relative to the repository root.
const DESIGN_DIR: &str = concat!("docs/", "design");

/// How a reference to the design record starts.
const DESIGN_PREFIX: &str = concat!("docs/", "design/");

/// Folders never read: build output, git's own files, local databases.
const SKIP_DIRS: &[&str] = &["target", ".git", ".flowforge"];

/// Migrations already released: sqlx refuses a database whose applied
/// migration's checksum changed, so their comments stay as released.
const RELEASED_MIGRATIONS: &[&str] = &[
    "adapters-postgres/migrations/20261129000001_create_schema.sql",
    "adapters-sqlite/migrations/20261129000001_create_schema.sql",
];

/// The blueprint's name, as it was cited.
const BLUEPRINT: &str = concat!("DESI", "GN");

/// Every citation and dangling reference in the repository at `root`, each
/// as `path:line: message`.
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    text_files(root, root, &mut files)?;

    let mut design: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in &files {
        if let Some(name) = path.strip_prefix(DESIGN_PREFIX)
            && !name.contains('/')
            && name.ends_with(".md")
        {
            design.insert(name.to_owned(), anchors(text));
        }
    }

    let mut problems = Vec::new();
    for (path, text) in &files {
        if !RELEASED_MIGRATIONS.contains(&path.as_str()) {
            problems.extend(citations(text).into_iter().map(|p| format!("{path}:{p}")));
        }
        let in_design = path.strip_prefix(DESIGN_PREFIX);
        problems.extend(
            dangling(text, in_design, &design)
                .into_iter()
                .map(|p| format!("{path}:{p}")),
        );
    }
    Ok(problems)
}

/// Every UTF-8 text file under `dir` as (path relative to `root` with `/`
/// separators, text), sorted; binary and non-UTF-8 files are skipped.
fn text_files(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !SKIP_DIRS.contains(&name) {
                text_files(root, &path, out)?;
            }
            continue;
        }
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let Ok(text) = String::from_utf8(bytes) else { continue };
        if text.contains('\0') {
            continue;
        }
        let shown = path.strip_prefix(root).unwrap_or(&path);
        let shown: Vec<&str> = shown.components().filter_map(|c| c.as_os_str().to_str()).collect();
        out.push((shown.join("/"), text));
    }
    Ok(())
}

/// The citations of documents outside the repository in `text`, each as
/// `line: message`.
fn citations(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for cited in cited_outside(line) {
            problems.push(format!(
                "{}: cites `{cited}`, a document outside the repository; cite the decision's \
                 heading in docs/design/ instead (docs/design/README.md lists them)",
                n + 1
            ));
        }
    }
    problems
}

/// The citations of outside documents in one line: the blueprint by name
/// or section (`… §4`, `….md`), a numbered decision, a numbered spec.
fn cited_outside(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in line.match_indices(BLUEPRINT) {
        let rest = &line[i + BLUEPRINT.len()..];
        for suffix in ["§", " §", ".md"] {
            if rest.starts_with(suffix) {
                found.push(format!("{BLUEPRINT}{suffix}"));
                break;
            }
        }
    }
    for word in [
        concat!("decision", " "),
        concat!("Decision", " "),
        concat!("spec", " 00"),
    ] {
        for (i, _) in line.match_indices(word) {
            let digits: String = line[i + word.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if !digits.is_empty() {
                found.push(format!("{word}{digits}"));
            }
        }
    }
    found
}

/// The GitHub anchors of the headings of a Markdown file (fenced code
/// excluded), a repeated one suffixed `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let base = anchor(title);
        let count = seen.entry(base.clone()).or_insert(0);
        out.insert(if *count == 0 { base } else { format!("{base}-{count}") });
        *count += 1;
    }
    out
}

/// GitHub's anchor of a heading: lower case, each space a `-`, every other
/// character that is not alphanumeric, `-` or `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The references in `text` to a design file or heading that does not
/// exist, each as `line: message`. `design` maps each file of the record to
/// its anchors; `in_design` names the file when `text` is itself a file of
/// the record, whose relative links are checked too.
fn dangling(text: &str, in_design: Option<&str>, design: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut targets: Vec<(String, Option<String>)> = Vec::new();
        for (i, _) in line.match_indices(DESIGN_PREFIX) {
            let rest = &line[i + DESIGN_PREFIX.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            let name = name.trim_end_matches('.');
            // `docs/design/` alone, or a placeholder such as `<file>`.
            if !name.ends_with(".md") {
                continue;
            }
            let anchor = rest[name.len()..].strip_prefix('#').map(|a| {
                a.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                    .collect::<String>()
            });
            targets.push((name.to_owned(), anchor));
        }
        if let Some(own) = in_design {
            for (i, _) in line.match_indices("](") {
                let link = line[i + 2..].split(')').next().unwrap_or_default();
                if link.contains("://") || link.contains('/') {
                    continue;
                }
                let (file, anchor) = match link.split_once('#') {
                    Some((file, anchor)) => (file, Some(anchor.to_owned())),
                    None => (link, None),
                };
                if file.is_empty() {
                    targets.push((own.to_owned(), anchor));
                } else if file.ends_with(".md") {
                    targets.push((file.to_owned(), anchor));
                }
            }
        }
        for (file, anchor) in targets {
            let shown = match &anchor {
                Some(a) => format!("{DESIGN_PREFIX}{file}#{a}"),
                None => format!("{DESIGN_PREFIX}{file}"),
            };
            match (design.get(&file), anchor) {
                (None, _) => problems.push(format!("{}: `{shown}`: no such file in {DESIGN_DIR}/", n + 1)),
                (Some(anchors), Some(a)) if !anchors.contains(&a) => problems.push(format!(
                    "{}: `{shown}`: {DESIGN_PREFIX}{file} has no heading with anchor `#{a}`",
                    n + 1
                )),
                _ => {}
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spelled in pieces so this file is not itself a dangling reference.
    fn reference(rest: &str) -> String {
        format!("{DESIGN_PREFIX}{rest}")
    }

    fn record() -> BTreeMap<String, BTreeSet<String>> {
        let leases = "# Leases\n\n## Fencing tokens\n\n```\n## not a heading\n```\n## Store time\n## Store time\n";
        BTreeMap::from([("leases.md".to_owned(), anchors(leases))])
    }

    #[test]
    fn a_citation_of_an_outside_document_is_caught() {
        let cases = [
            (format!("// See {BLUEPRINT} §5."), format!("{BLUEPRINT} §")),
            (format!("-- schema ({BLUEPRINT}§4)"), format!("{BLUEPRINT}§")),
            (format!("kept in `{BLUEPRINT}.md`"), format!("{BLUEPRINT}.md")),
            (
                format!("/// fails for good ({}1).", concat!("decision", " ")),
                concat!("decision", " 1").to_owned(),
            ),
            (
                format!("/// {}10: started.", concat!("Decision", " ")),
                concat!("Decision", " 10").to_owned(),
            ),
            (
                format!("//! Readiness ({}2).", concat!("spec", " 00")),
                concat!("spec", " 002").to_owned(),
            ),
        ];
        for (line, cited) in cases {
            let text = format!("//! m\n{line}\n");
            let problems = citations(&text);
            assert_eq!(problems.len(), 1, "{line}: {problems:?}");
            assert!(
                problems[0].starts_with(&format!("2: cites `{cited}`")),
                "{}",
                problems[0]
            );
            assert!(problems[0].contains("docs/design/"), "{}", problems[0]);
        }
    }

    #[test]
    fn prose_that_only_looks_like_a_citation_passes() {
        let text = format!(
            "// The decisions the code relies on; a decision is named, not numbered.\n\
             // The {BLUEPRINT}ER of the spec 1.0 format.\n// See {}.\n",
            reference("leases.md#fencing-tokens")
        );
        assert_eq!(citations(&text), Vec::<String>::new());
    }

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(anchor("Two modes, one code base"), "two-modes-one-code-base");
        assert_eq!(anchor("`cancel_retrying`"), "cancel_retrying");
        assert_eq!(anchor("Barriers, not sleeps"), "barriers-not-sleeps");
        assert_eq!(anchor("Two-stage validation"), "two-stage-validation");
        assert_eq!(anchor("LISTEN/NOTIFY"), "listennotify");
        let got: Vec<String> = record()["leases.md"].iter().cloned().collect();
        assert_eq!(got, ["fencing-tokens", "leases", "store-time", "store-time-1"]);
    }

    #[test]
    fn a_good_reference_passes() {
        let text = format!(
            "// See {}.\n// The record: {DESIGN_PREFIX} and {}.\n// Cite `{DESIGN_PREFIX}<file>.md#<anchor>`.\n",
            reference("leases.md#fencing-tokens"),
            reference("leases.md")
        );
        assert_eq!(dangling(&text, None, &record()), Vec::<String>::new());
    }

    #[test]
    fn a_dangling_reference_is_caught() {
        let text = format!(
            "//! m\n// See {}.\n// And {} and {}.\n",
            reference("leases.md#fencing-token"),
            reference("gone.md#fencing-tokens"),
            reference("gone.md"),
        );
        let problems = dangling(&text, None, &record());
        assert_eq!(
            problems,
            [
                format!(
                    "2: `{}`: {} has no heading with anchor `#fencing-token`",
                    reference("leases.md#fencing-token"),
                    reference("leases.md")
                ),
                format!(
                    "3: `{}`: no such file in {DESIGN_DIR}/",
                    reference("gone.md#fencing-tokens")
                ),
                format!("3: `{}`: no such file in {DESIGN_DIR}/", reference("gone.md")),
            ]
        );
    }

    #[test]
    fn links_between_design_files_are_checked() {
        let text = "See [tokens](leases.md#fencing-tokens), [time](#store-time-1), [x](leases.md#nope), \
                    [y](#nope), [z](other.md) and [web](https://example.com/a.md#b), [up](../../README.md).\n";
        let problems = dangling(text, Some("leases.md"), &record());
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("#nope"), "{}", problems[0]);
        assert!(problems[1].contains("#nope"), "{}", problems[1]);
        assert!(problems[2].contains("other.md`: no such file"), "{}", problems[2]);
        // Outside the record, the same links are not design references.
        assert!(dangling(text, None, &record()).is_empty());
    }
}
