//! `cargo xtask chaos`: the fault matrix (the `chaos` bench of
//! `flowforge-bins`, separate processes on this machine's PostgreSQL and
//! RabbitMQ with one fault per scenario), its table written into
//! RELIABILITY.md between the `chaos` markers; the soak (`soak`, only when
//! named: random faults for `--seconds`, 600 by default) is written
//! between the `soak` markers with every process's memory and sockets.
//!
//! `cargo xtask chaos [--quick] [--seconds N] [--dev] [--check] [scenario…]`:
//! `--quick` shortens every phase, `--seconds` sets how long the fault
//! lasts, `--dev` builds the processes with the dev profile (what CI's test
//! build already compiled) instead of release, and `--check` only prints
//! the table and fails on a failed scenario, leaving RELIABILITY.md alone
//! (what CI runs).

use std::fmt::Write as _;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, project_root};

/// The RELIABILITY.md sections the matrix and the soak write.
const MATRIX: &str = "chaos";
const SOAK: &str = "soak";

/// `cargo xtask chaos`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let dev = args.iter().any(|a| a == "--dev");
    let check = args.iter().any(|a| a == "--check");
    let quick = args.iter().any(|a| a == "--quick");
    let passed: Vec<&String> = args.iter().filter(|a| *a != "--dev" && *a != "--check").collect();
    let mut cargo_args = vec!["bench", "--package", "flowforge-bins", "--bench", "chaos"];
    if dev {
        // The test build's profile and features: everything but the bench
        // itself is already compiled.
        cargo_args.extend(["--profile", "dev", "--all-features"]);
    }
    cargo_args.push("--");
    let output = Command::new(cargo())
        .current_dir(project_root())
        .args(&cargo_args)
        .args(&passed)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the fault matrix")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let results = crate::bench::json_lines(&stdout).context("the fault matrix printed a line that is not JSON")?;
    if results.is_empty() {
        bail!("the fault matrix reported no scenario ({}):\n{stdout}", output.status);
    }
    let (soak, matrix): (Vec<Value>, Vec<Value>) = results.iter().cloned().partition(|r| r["scenario"] == SOAK);
    let mut sections = Vec::new();
    if !matrix.is_empty() {
        sections.push((MATRIX, render(&matrix, quick, dev)));
    }
    if !soak.is_empty() {
        sections.push((SOAK, render_soak(&soak, dev)));
    }
    for (_, body) in &sections {
        println!("{body}");
    }
    if !check {
        let path = project_root().join("RELIABILITY.md");
        let mut text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for (name, body) in &sections {
            text = replace_section(&text, name, body).with_context(|| {
                format!(
                    "{} has no `<!-- {name} -->` … `<!-- /{name} -->` section",
                    path.display()
                )
            })?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r["passed"] != Value::Bool(true))
        .filter_map(|r| r["scenario"].as_str())
        .collect();
    if !failed.is_empty() || !output.status.success() {
        bail!("the fault matrix failed ({}): {}", output.status, failed.join(", "));
    }
    Ok(())
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "—".to_owned(),
        Value::Number(n) => n.to_string(),
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "**no**".to_owned(),
        other => other.to_string(),
    }
}

/// The figures of a scenario, in table order: (key, heading).
const FIGURES: [(&str, &str); 13] = [
    ("faults", "faults"),
    ("submitted", "runs submitted"),
    ("finished", "runs finished"),
    ("lost", "lost"),
    ("duplicate_effects", "duplicate effects"),
    ("duplicate_attempts", "duplicate attempts"),
    ("stuck", "stuck"),
    ("wrong", "wrong outcome"),
    ("down", "processes down"),
    ("stale_writes_rejected", "stale writes rejected"),
    ("attempts", "attempts"),
    ("effects", "effects"),
    ("recovery_s", "recovery (s)"),
];

/// The table of one run, with the machine and how it ran.
fn render(results: &[Value], quick: bool, dev: bool) -> String {
    let mut out = format!(
        "Run {}with the {} build; each fault lasted {} s.\n\nMachine:\n\n{}\n",
        if quick { "with `--quick` " } else { "" },
        if dev { "dev" } else { "release" },
        results.first().map_or_else(|| "?".to_owned(), |r| cell(&r["seconds"])),
        crate::bench::machine()
    );
    let headings: Vec<&str> = FIGURES.iter().map(|(_, h)| *h).collect();
    let _ = writeln!(out, "| scenario | {} | passed |", headings.join(" | "));
    let _ = writeln!(out, "|{}", " --- |".repeat(FIGURES.len() + 2));
    for r in results {
        let cells: Vec<String> = FIGURES.iter().map(|(k, _)| cell(&r[*k])).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            r["scenario"].as_str().unwrap_or("?"),
            cells.join(" | "),
            cell(&r["passed"])
        );
    }
    out
}

/// The soak's figures: the faults it drew and every process's footprint,
/// at both ends of the measured time and over it.
fn render_soak(results: &[Value], dev: bool) -> String {
    let mut out = String::new();
    for r in results {
        let footprint = &r["footprint"];
        // The run's figures but the per-fault ones, which the fault list gives.
        let figures: Vec<String> = FIGURES[1..9]
            .iter()
            .map(|(k, heading)| format!("{heading} {}", cell(&r[*k])))
            .collect();
        let _ = write!(
            out,
            "Run with the {} build: a warm-up of 30 s calm and then every fault once, then {} s of random faults, \
             one every 30 s for 15 s ({} in all), two runs started a second; \
             {}; passed: {}.\n\nMachine:\n\n{}\n\
             Memory and sockets of the {} processes that ran throughout: memory, the median of the calm 15 s that \
             end the warm-up against that of the last 30 s; sockets, the most held during the warm-up against the \
             median of the last 30 s, which the table splits by peer as PostgreSQL + RabbitMQ + other (worst growth: \
             memory {} %, sockets {} %):\n\n\
             | process | RSS after warm-up (KiB) | RSS at the end (KiB) | most sockets in the warm-up | sockets at the end |\n\
             | --- | --- | --- | --- | --- |\n",
            if dev { "dev" } else { "release" },
            cell(&r["seconds"]),
            r["faults_by_kind"]
                .as_object()
                .map(|m| m
                    .iter()
                    .map(|(k, v)| format!("{k} ×{v}"))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
            figures.join(", "),
            cell(&r["passed"]),
            crate::bench::machine(),
            cell(&footprint["processes_measured"]),
            cell(&footprint["rss_growth_pct"]),
            cell(&footprint["socket_growth_pct"]),
        );
        let processes = footprint["per_process"].as_object();
        for (name, p) in processes.into_iter().flatten() {
            let by = &p["sockets_by_peer"];
            let peers = if by.is_object() {
                format!(
                    " ({} + {} + {})",
                    cell(&by["postgres"]),
                    cell(&by["rabbitmq"]),
                    cell(&by["other"])
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {}{peers} |",
                cell(&p["rss_kib"][0]),
                cell(&p["rss_kib"][1]),
                cell(&p["sockets"][0]),
                cell(&p["sockets"][1]),
            );
        }
        // Over time: a leak keeps growing, a level reached once stays.
        let steps: Vec<String> = processes
            .and_then(|m| m.values().next())
            .and_then(|p| p["over_time"].as_array())
            .map(|a| a.iter().map(|s| cell(&s[0])).collect())
            .unwrap_or_default();
        if steps.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "\nRSS (KiB) and sockets over the measured time, seconds from the end of the warm-up:\n\n\
             | process | {} |\n|{}\n",
            steps.join(" | "),
            " --- |".repeat(steps.len() + 1)
        );
        for (name, p) in processes.into_iter().flatten() {
            let cells: Vec<String> = p["over_time"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| format!("{} / {}", cell(&s[1]), cell(&s[2])))
                .collect();
            let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
        }
    }
    out
}

/// `text` with the body of its section `name` replaced by `body`.
fn replace_section(text: &str, name: &str, body: &str) -> Option<String> {
    let start = format!("<!-- {name} -->\n");
    let end = format!("<!-- /{name} -->");
    let from = text.find(&start)? + start.len();
    let to = text[from..].find(&end)? + from;
    Some(format!("{}{body}\n{}", &text[..from], &text[to..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_and_the_rest_kept() {
        let text = "# R\n\nbefore\n<!-- chaos -->\nold\n<!-- /chaos -->\nafter\n";
        assert_eq!(
            replace_section(text, "chaos", "new").as_deref(),
            Some("# R\n\nbefore\n<!-- chaos -->\nnew\n<!-- /chaos -->\nafter\n")
        );
        assert_eq!(replace_section(text, "soak", "new"), None);
    }

    #[test]
    fn a_failed_scenario_shows_in_the_table() {
        let rows = [
            serde_json::json!({"scenario": "worker-kill", "seconds": 10, "lost": 1, "passed": false, "recovery_s": null}),
        ];
        let table = render(&rows, true, true);
        assert!(table.contains("| worker-kill | — | — | — | 1 |"), "{table}");
        assert!(table.ends_with("| **no** |\n"), "{table}");
        assert!(
            table.contains(
                "| scenario | faults | runs submitted | runs finished | lost | duplicate effects | duplicate attempts \
                 | stuck | wrong outcome | processes down | stale writes rejected | attempts | effects | recovery (s) \
                 | passed |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
            ),
            "{table}"
        );
    }

    #[test]
    fn the_soak_says_its_figures_and_every_process() {
        let rows = [serde_json::json!({
            "scenario": "soak", "seconds": 600, "faults_by_kind": {"worker-stop": 3},
            "submitted": 10, "finished": 10, "lost": 0, "duplicate_effects": 0, "duplicate_attempts": 0,
            "stuck": 0, "wrong": 0, "down": 0, "passed": false,
            "footprint": {"processes_measured": 1, "rss_growth_pct": 12.5, "socket_growth_pct": 0.0,
                "per_process": {"worker-1": {"rss_kib": [100.0, 112.5], "sockets": [7.0, 7.0],
                    "sockets_by_peer": {"postgres": 3.0, "rabbitmq": 1.0, "other": 3.0},
                    "over_time": [[0, 100, 7], [120, 112, 7]]}}}
        })];
        let text = render_soak(&rows, false);
        assert!(text.contains("(worker-stop ×3 in all)"), "{text}");
        assert!(
            text.contains(
                "runs submitted 10, runs finished 10, lost 0, duplicate effects 0, duplicate attempts 0, \
                 stuck 0, wrong outcome 0, processes down 0; passed: **no**."
            ),
            "{text}"
        );
        assert!(
            text.contains("| worker-1 | 100.0 | 112.5 | 7.0 | 7.0 (3.0 + 1.0 + 3.0) |"),
            "{text}"
        );
        assert!(
            text.contains("| process | 0 | 120 |\n| --- | --- | --- |\n| worker-1 | 100 / 7 | 112 / 7 |"),
            "{text}"
        );
    }
}
