//! `cargo xtask bench [embedded] [postgres] [distributed] [api]`: runs the
//! benchmark suites (release builds of `bins/benches/<suite>.rs`, each
//! printing one JSON object per scenario), then writes their figures beside
//! the targets, with the machine they ran on, into `BENCHMARKS.md`.
//!
//! Suites not run this time keep their previous section, so one suite can
//! be re-measured without losing the others. Speed targets live here, in
//! benchmarks, never in tests.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, project_root};

/// The suites, in the order they are written down.
const SUITES: [&str; 4] = ["embedded", "postgres", "distributed", "api"];

/// A target: scenario, metric (a path into the scenario's object,
/// `cpu_ms_per_task/total` for a nested figure), comparison, threshold, what
/// the issue says.
struct Target {
    scenario: &'static str,
    metric: &'static str,
    at_least: bool,
    threshold: f64,
    what: &'static str,
}

const fn at_least(scenario: &'static str, metric: &'static str, threshold: f64, what: &'static str) -> Target {
    Target {
        scenario,
        metric,
        at_least: true,
        threshold,
        what,
    }
}

const fn at_most(scenario: &'static str, metric: &'static str, threshold: f64, what: &'static str) -> Target {
    Target {
        scenario,
        metric,
        at_least: false,
        threshold,
        what,
    }
}

const TARGETS: &[Target] = &[
    at_least(
        "fanout",
        "tasks_per_s",
        5_000.0,
        "embedded 9 998-wide fan-out/fan-in: ≥ 5 000 tasks/s",
    ),
    at_most("chain", "hop_ms_p50", 1.0, "embedded 1 000-deep chain: p50 hop ≤ 1 ms"),
    at_most("chain40", "wall_s", 0.1, "embedded 40-task chain: ≤ 0.1 s"),
    at_most(
        "memory",
        "growth_pct",
        10.0,
        "embedded 10 000 runs: peak RSS within 10 % of the peak after 1 000",
    ),
    at_least(
        "claim_finish_1",
        "ratio_pct",
        50.0,
        "PostgreSQL claim+finish, 1 client: ≥ 50 % of pgbench/2",
    ),
    at_least(
        "claim_finish_4",
        "ratio_pct",
        50.0,
        "PostgreSQL claim+finish, 4 clients: ≥ 50 % of pgbench/2",
    ),
    at_least(
        "claim_finish_16",
        "ratio_pct",
        50.0,
        "PostgreSQL claim+finish, 16 clients: ≥ 50 % of pgbench/2",
    ),
    at_most(
        "pass_history",
        "ratio",
        1.2,
        "PostgreSQL pass over 1 000 runs with 1 M history: ≤ 1.2× without",
    ),
    at_least(
        "dist_fanout",
        "tasks_per_s",
        1_000.0,
        "distributed fan-out: ≥ 1 000 tasks/s",
    ),
    at_most(
        "dist_chain",
        "hop_ms_p50",
        5.0,
        "distributed 1 000-deep chain: p50 hop ≤ 5 ms",
    ),
    at_most(
        "dist_chain",
        "hop_ms_p99",
        20.0,
        "distributed 1 000-deep chain: p99 hop ≤ 20 ms",
    ),
    at_most("dist_chain40", "wall_s", 0.4, "distributed 40-task chain: ≤ 0.4 s"),
    at_least(
        "start_sqlite",
        "achieved_per_s",
        2_000.0,
        "POST /runs on SQLite at 2 000/s: sustained",
    ),
    at_most(
        "start_sqlite",
        "p99_ms",
        20.0,
        "POST /runs on SQLite at 2 000/s: p99 ≤ 20 ms",
    ),
    at_most(
        "start_sqlite",
        "errors",
        0.0,
        "POST /runs on SQLite at 2 000/s: every request answered 201",
    ),
    at_least(
        "start_pg",
        "achieved_per_s",
        1_000.0,
        "POST /runs on PostgreSQL at 1 000/s: sustained",
    ),
    at_most(
        "start_pg",
        "p99_ms",
        20.0,
        "POST /runs on PostgreSQL at 1 000/s: p99 ≤ 20 ms",
    ),
    at_most(
        "start_pg",
        "errors",
        0.0,
        "POST /runs on PostgreSQL at 1 000/s: every request answered 201",
    ),
    at_most(
        "get_run_1000",
        "p99_ms",
        20.0,
        "GET /runs/{id} of a 1 000-task run: p99 ≤ 20 ms",
    ),
    at_most(
        "sse_10000",
        "rss_growth_mib",
        50.0,
        "SSE of a 10 000-task fan-out: server RSS growth ≤ 50 MiB",
    ),
    at_least(
        "remote_sqlite",
        "tasks_per_s",
        1_000.0,
        "remote workers over the API on SQLite (max 50): ≥ 1 000 tasks/s",
    ),
    at_least(
        "remote_pg",
        "tasks_per_s",
        1_000.0,
        "remote workers over the API on PostgreSQL (max 50): ≥ 1 000 tasks/s",
    ),
    // Hot path v2 (issue 15): the same workloads, ten times the best peer.
    at_least(
        "fanout",
        "tasks_per_s",
        6_000.0,
        "hot path v2: embedded 9 998-wide fan-out/fan-in ≥ 6 000 tasks/s",
    ),
    at_most(
        "chain40",
        "engine_s",
        0.025,
        "hot path v2: embedded 40-task chain, engine time ≤ 0.025 s",
    ),
    at_least(
        "dist_fanout1000",
        "tasks_per_s",
        2_000.0,
        "hot path v2: distributed 1 → 1 000 → 1, 2 workers × 4 slots ≥ 2 000 tasks/s",
    ),
    at_most(
        "dist_chain40",
        "store_s",
        0.10,
        "hot path v2: distributed 40-task chain, engine time ≤ 0.10 s",
    ),
    at_most(
        "dist_chain",
        "hop_ms_p50",
        2.0,
        "hot path v2: distributed hop p50 ≤ 2.0 ms",
    ),
    at_most(
        "dist_chain",
        "hop_ms_p99",
        8.0,
        "hot path v2: distributed hop p99 ≤ 8 ms",
    ),
    at_most(
        "dist_fanout1000",
        "cpu_ms_per_task/total",
        1.0,
        "hot path v2: CPU per task, all processes and PostgreSQL backends ≤ 1.0 ms",
    ),
];

/// `cargo xtask bench`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let wanted: Vec<&str> = if args.is_empty() {
        SUITES.to_vec()
    } else {
        for a in args {
            if !SUITES.contains(&a.as_str()) {
                bail!("unknown suite `{a}`; the suites are {}", SUITES.join(", "));
            }
        }
        SUITES.iter().copied().filter(|s| args.iter().any(|a| a == s)).collect()
    };
    let path = project_root().join("BENCHMARKS.md");
    let previous = std::fs::read_to_string(&path).unwrap_or_default();
    let mut sections: BTreeMap<&str, String> = BTreeMap::new();
    for suite in SUITES {
        if let Some(old) = section(&previous, suite) {
            sections.insert(suite, old);
        }
    }
    for suite in wanted {
        eprintln!("==> bench {suite}");
        let results = run_suite(suite)?;
        sections.insert(suite, render_suite(suite, &results));
    }
    let mut out = String::from(
        "# Benchmarks\n\nWritten by `cargo xtask bench`; each section records the machine and the date it ran on.\n\
         Re-run one suite with `cargo xtask bench <suite>`; the others keep their figures.\n",
    );
    for suite in SUITES {
        if let Some(body) = sections.get(suite) {
            let _ = write!(out, "\n<!-- suite:{suite} -->\n{body}<!-- /suite:{suite} -->\n");
        }
    }
    // Sections written by hand (measured by tests, not by a suite) follow
    // the suites and are kept as they are.
    out.push_str(hand_written(&previous));
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// What follows the last suite's end marker.
fn hand_written(text: &str) -> &str {
    text.rfind("<!-- /suite:")
        .and_then(|i| text[i..].find('\n').map(|j| &text[i + j + 1..]))
        .unwrap_or("")
}

fn section(text: &str, suite: &str) -> Option<String> {
    let start = format!("<!-- suite:{suite} -->\n");
    let end = format!("<!-- /suite:{suite} -->");
    let from = text.find(&start)? + start.len();
    let to = text[from..].find(&end)? + from;
    Some(text[from..to].to_owned())
}

fn run_suite(suite: &str) -> Result<Vec<Value>> {
    let output = Command::new(cargo())
        .current_dir(project_root())
        .args(["bench", "--package", "flowforge-bins", "--bench", suite])
        .output()
        .with_context(|| format!("running the {suite} benchmarks"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "the {suite} benchmarks failed ({}):\n{}\n{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let results = json_lines(&stdout).context("a benchmark printed a line that is not JSON")?;
    for r in &results {
        eprintln!("    {r}");
    }
    Ok(results)
}

/// The JSON objects a harness printed, one per line, among its other output.
pub(crate) fn json_lines(stdout: &str) -> serde_json::Result<Vec<Value>> {
    stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(serde_json::from_str)
        .collect()
}

pub(crate) fn machine() -> String {
    let sh = |cmd: &str| {
        Command::new("sh")
            .args(["-c", cmd])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    };
    format!(
        "- date: {}\n- cpu: {} ({} cores)\n- memory: {}\n- kernel: {}\n- rustc: {}\n- PostgreSQL: {}\n- RabbitMQ: {}\n",
        sh("date -u +%Y-%m-%dT%H:%MZ"),
        sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        sh("nproc"),
        sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo"),
        sh("uname -sr"),
        sh("rustc --version"),
        sh("psql --version"),
        sh("rabbitmqctl version 2>/dev/null || echo unknown"),
    )
}

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() != 0.0 => format!("{f:.3}"),
        Some(f) => format!("{f:.0}"),
        None => v.to_string(),
    }
}

fn render_suite(suite: &str, results: &[Value]) -> String {
    let mut out = format!("## {suite}\n\nMachine:\n\n{}\n", machine());
    let targeted: Vec<(&Target, Option<f64>)> = TARGETS
        .iter()
        .filter_map(|t| {
            let r = results.iter().find(|r| r["scenario"] == t.scenario)?;
            Some((t, r.pointer(&format!("/{}", t.metric)).and_then(Value::as_f64)))
        })
        .collect();
    if !targeted.is_empty() {
        out.push_str("| target | measured | met |\n| --- | --- | --- |\n");
        for (t, value) in targeted {
            let (shown, met) = match value {
                Some(v) => (
                    format!("{} = {v:.3}", t.metric),
                    if (t.at_least && v >= t.threshold) || (!t.at_least && v <= t.threshold) {
                        "yes"
                    } else {
                        "**no**"
                    },
                ),
                None => (format!("{} missing", t.metric), "**no**"),
            };
            let _ = writeln!(out, "| {} | {shown} | {met} |", t.what);
        }
        out.push('\n');
    }
    out.push_str("All figures:\n\n");
    for r in results {
        let Some(map) = r.as_object() else { continue };
        let scenario = map.get("scenario").and_then(Value::as_str).unwrap_or("?");
        let fields: Vec<String> = map
            .iter()
            .filter(|(k, _)| k.as_str() != "scenario" && k.as_str() != "notes")
            .map(|(k, v)| format!("{k} = {}", number(v)))
            .collect();
        let _ = writeln!(out, "- **{scenario}**: {}", fields.join(", "));
        if let Some(notes) = map.get("notes").and_then(Value::as_str) {
            let _ = writeln!(out, "\n```text\n{notes}\n```\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sections_round_trip_and_targets_are_judged() {
        let text = "x\n<!-- suite:embedded -->\nbody\n<!-- /suite:embedded -->\n";
        assert_eq!(hand_written(text), "");
        assert_eq!(hand_written(&format!("{text}\n## ui\n\nkept\n")), "\n## ui\n\nkept\n");
        assert_eq!(section(text, "embedded").as_deref(), Some("body\n"));
        assert_eq!(section(text, "postgres"), None);
        let rendered = render_suite(
            "embedded",
            &[
                json!({"scenario": "fanout", "tasks_per_s": 6000.0}),
                json!({"scenario": "chain40", "wall_s": 0.5, "engine_s": 0.02}),
            ],
        );
        assert!(rendered.contains("tasks_per_s = 6000.000 | yes"), "{rendered}");
        assert!(rendered.contains("wall_s = 0.500 | **no**"), "{rendered}");
        assert!(
            rendered.contains("engine time ≤ 0.025 s | engine_s = 0.020 | yes"),
            "{rendered}"
        );
        let nested = render_suite(
            "distributed",
            &[json!({"scenario": "dist_fanout1000", "tasks_per_s": 400.0, "cpu_ms_per_task": {"total": 5.5}})],
        );
        assert!(
            nested.contains("≤ 1.0 ms | cpu_ms_per_task/total = 5.500 | **no**"),
            "{nested}"
        );
        assert!(
            nested.contains("≥ 2 000 tasks/s | tasks_per_s = 400.000 | **no**"),
            "{nested}"
        );
    }
}
