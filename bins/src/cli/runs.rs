//! `flowforge runs list | get ID | cancel ID`: the runs in `--db`, past and
//! current, and closing one (an abandoned run whose process died).

use std::time::Duration;

use clap::ValueEnum;
use flowforge::{Closed, RunReport, Service};
use flowforge_ports::{RunId, Store};

use super::store::with_store;
use super::{Exit, Global, fail, print_report};

/// How a run report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// A table of tasks and compensations.
    Text,
    /// The JSON run report (docs/design/cli.md#reports) (schema:
    /// `bins/schemas/run-report.schema.json`).
    Json,
}

/// `flowforge runs …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// The most recent runs, newest first.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// One run's report.
    Get {
        /// The run id.
        id: RunId,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Cancel a run: waiting tasks are cancelled at once; running ones when
    /// their worker sees the request, or when their lease expires if their
    /// process is gone. Waits up to a lease for the run to end.
    Cancel {
        /// The run id.
        id: RunId,
    },
}

/// Runs a `runs` subcommand.
pub(crate) async fn run(global: &Global, command: Command) -> anyhow::Result<Exit> {
    with_store!(global, |store| {
        let service = Service::new(store);
        match command {
            Command::List { limit, output } => list(&service, limit, output).await,
            Command::Get { id, output } => get(&service, id, output).await,
            Command::Cancel { id } => cancel(&service, id, global.lease()).await,
        }
    })
}

async fn list<S: Store>(service: &Service<S>, limit: u32, output: Output) -> anyhow::Result<Exit> {
    let runs = match service.list(limit).await {
        Ok(runs) => runs,
        Err(e) => return Ok(fail(&e)),
    };
    let text = match output {
        Output::Json => {
            let rows: Vec<serde_json::Value> = runs
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "run_id": r.id.to_string(),
                        "workflow": r.workflow,
                        "version": r.version,
                        "state": r.state.as_str(),
                        "cancel_requested": r.cancel_requested,
                        "created_at": r.created_at.to_rfc3339(),
                        "finished_at": r.finished_at.map(|t| t.to_rfc3339()),
                    })
                })
                .collect();
            format!("{}\n", serde_json::to_string_pretty(&rows)?)
        }
        Output::Text => {
            let mut text = format!(
                "{:<36}  {:<24} {:>4}  {:<10} {}\n",
                "RUN", "WORKFLOW", "VER", "STATE", "CREATED"
            );
            for r in &runs {
                let state = if r.cancel_requested && !r.state.is_terminal() {
                    format!("{} (cancelling)", r.state)
                } else {
                    r.state.to_string()
                };
                text.push_str(&format!(
                    "{:<36}  {:<24} {:>4}  {:<10} {}\n",
                    r.id,
                    r.workflow,
                    r.version,
                    state,
                    r.created_at.format("%Y-%m-%d %H:%M:%S")
                ));
            }
            text
        }
    };
    print_report(&text)?;
    Ok(Exit::Ok)
}

async fn get<S: Store>(service: &Service<S>, id: RunId, output: Output) -> anyhow::Result<Exit> {
    match service.report(id).await {
        Ok(report) => {
            print_run_report(&report, output)?;
            Ok(Exit::Ok)
        }
        Err(e) => Ok(fail(&e)),
    }
}

async fn cancel<S: Store>(service: &Service<S>, id: RunId, lease: Duration) -> anyhow::Result<Exit> {
    // The process that ran it may be gone: drive it here, for up to a
    // lease (a running task stops when its worker sees the request or its
    // lease runs out).
    let patience = lease + Duration::from_secs(5);
    let closing = service.close(id, patience);
    tokio::pin!(closing);
    let closed = tokio::select! {
        closed = &mut closing => closed,
        () = tokio::time::sleep(Duration::from_millis(200)) => {
            eprintln!(
                "cancel requested; waiting for running tasks to stop (at most {}s)",
                patience.as_secs()
            );
            closing.await
        }
    };
    match closed {
        Ok(Closed::AlreadyEnded(state)) => println!("run {id} already ended: {state}"),
        Ok(Closed::Ended(state)) => println!("run {id} {state}"),
        Ok(Closed::StillStopping) => println!(
            "cancel requested for run {id}; a task is still running and will be cancelled when its worker stops it"
        ),
        Err(e) => return Ok(fail(&e)),
    }
    Ok(Exit::Ok)
}

/// Prints a run report as text or JSON on stdout.
pub(crate) fn print_run_report(report: &RunReport, output: Output) -> anyhow::Result<()> {
    let text = match output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(report)?),
        Output::Text => render(report),
    };
    print_report(&text)
}

fn mark(state: &str) -> &'static str {
    match state {
        "succeeded" => "✓",
        "failed" => "✗",
        "cancelled" => "⊘",
        "not_run" => "·",
        "running" => "▶",
        _ => "…",
    }
}

fn render(report: &RunReport) -> String {
    let elapsed = match (&report.started_at, &report.finished_at) {
        (Some(a), Some(b)) => match (
            chrono::DateTime::parse_from_rfc3339(a),
            chrono::DateTime::parse_from_rfc3339(b),
        ) {
            (Ok(a), Ok(b)) => format!(" in {:.2}s", (b - a).num_milliseconds() as f64 / 1000.0),
            _ => String::new(),
        },
        _ => String::new(),
    };
    let mut text = format!(
        "run {}: {} v{} {}{}\n",
        report.run_id, report.workflow.name, report.workflow.version, report.state, elapsed
    );
    let width = report
        .tasks
        .iter()
        .map(|t| t.key.len())
        .chain(report.compensations.iter().map(|c| c.key.len()))
        .max()
        .unwrap_or(0);
    for t in &report.tasks {
        let mut line = format!("  {} {:<width$}  {:<9}", mark(&t.state), t.key, t.state);
        if t.attempt > 1 {
            line.push_str(&format!("  {} attempts", t.attempt));
        }
        if let Some(reason) = &t.cancel_reason {
            line.push_str(&format!("  ({reason})"));
        }
        if let Some(error) = t.error.as_deref().filter(|_| t.state != "succeeded") {
            line.push_str(&format!("  {}", error.lines().next().unwrap_or("")));
        }
        if let Some(progress) = t.progress.as_ref().filter(|_| t.state == "running") {
            line.push_str(&format!("  progress {progress}"));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    if !report.compensations.is_empty() {
        text.push_str("compensations:\n");
        for c in &report.compensations {
            let mut line = format!(
                "  {} {:<width$}  {:<9}  undoes {}",
                mark(&c.state),
                c.key,
                c.state,
                c.compensate_for
            );
            if let Some(error) = &c.error {
                line.push_str(&format!("  {}", error.lines().next().unwrap_or("")));
            }
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}
