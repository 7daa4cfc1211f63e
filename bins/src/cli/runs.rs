//! `flowforge runs list | get ID | cancel ID | retry ID`: the runs in
//! `--db`, past and current, closing one (an abandoned run whose process
//! died), and retrying a failed or cancelled one in place.

use std::time::Duration;

use clap::ValueEnum;
use flowforge::{Closed, Embedded, RunReport, Service};
use flowforge_ports::{RunId, Scope, Store, WorkerId};

use super::common::{exit_for, host};
use super::store::{Kind, kind, with_store};
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
    /// Retry a failed or cancelled run in place (docs/design/retry.md): it
    /// keeps its id and opens its next generation; only the retry set runs
    /// again, every other task keeps its state and output. On SQLite the
    /// run is driven to its end here and its report printed, as `flowforge
    /// run` does (command tasks run from the current directory); on
    /// PostgreSQL the workers take it up.
    Retry {
        /// The run id.
        id: RunId,
        /// Redo this task and all its descendants, succeeded ones too
        /// (repeatable; default: every failed or cancelled task).
        #[arg(long = "from", value_name = "KEY")]
        from: Vec<String>,
        /// Print the retry set and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only reset the run; do not drive it here.
        #[arg(long)]
        detach: bool,
        /// Report format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
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
            Command::Retry {
                id,
                from,
                dry_run,
                detach,
                output,
            } => {
                let drive = !dry_run && !detach && kind(&global.db) == Ok(Kind::Sqlite);
                let retried = retry(&service, id, &from, dry_run, output).await?;
                match retried {
                    Some(()) if drive => drive_to_end(service.store().clone(), global, id, output).await,
                    Some(()) => Ok(Exit::Ok),
                    None => Ok(Exit::Invalid),
                }
            }
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

/// Applies (or, for a dry run, decides) a retry and prints its set: on
/// stdout for a dry run or a detached retry, as the JSON object the API
/// answers with `--output json`; on stderr before a driven run's report.
/// `None` when it was refused (the error printed).
async fn retry<S: Store>(
    service: &Service<S>,
    id: RunId,
    from: &[String],
    dry_run: bool,
    output: Output,
) -> anyhow::Result<Option<()>> {
    let retry = match service.retry(id, from, dry_run).await {
        Ok(retry) => retry,
        Err(e) => {
            fail(&e);
            return Ok(None);
        }
    };
    let text = match output {
        Output::Json => {
            let tasks: Vec<serde_json::Value> = retry
                .resets
                .iter()
                .map(|r| serde_json::json!({"key": r.key, "from": r.from.as_str(), "to": r.to.as_str()}))
                .collect();
            let body = serde_json::json!({
                "id": id.to_string(), "generation": retry.generation, "applied": retry.applied, "tasks": tasks,
            });
            format!("{}\n", serde_json::to_string_pretty(&body)?)
        }
        Output::Text => {
            let verb = if retry.applied { "retrying" } else { "would retry" };
            let mut text = format!("run {id} generation {}: {verb}\n", retry.generation);
            for r in &retry.resets {
                text.push_str(&format!("  {} ({} → {})\n", r.key, r.from, r.to));
            }
            text
        }
    };
    if retry.applied && output == Output::Json {
        // The driven run's report follows on stdout; the set goes beside it.
        eprint!("{text}");
    } else {
        print_report(&text)?;
    }
    Ok(Some(()))
}

/// Drives a retried run to its end in this process (the embedded mode)
/// and prints its report, exiting as `flowforge run` does.
async fn drive_to_end<S: Store>(store: S, global: &Global, id: RunId, output: Output) -> anyhow::Result<Exit> {
    let engine = Embedded::builder()
        .lease(global.lease())
        .limits(global.limits())
        .priority_aging(global.priority_aging())
        .worker_id(WorkerId(format!("{}:{}", host(), std::process::id())))
        .build_on(store);
    let mut serving = engine.serve(Scope::Run(id));
    let outcome = loop {
        tokio::select! {
            settled = engine.wait(id) => break settled.map(|_| ()),
            failed = serving.failed() => {
                if let Err(e) = failed {
                    break Err(e);
                }
            }
        }
    };
    let stopped = serving.stop().await;
    if let Err(e) = outcome.and(stopped) {
        return Ok(fail(&e));
    }
    match engine.report(id).await {
        Ok(report) => {
            print_run_report(&report, output)?;
            Ok(exit_for(report.run_state()))
        }
        Err(e) => Ok(fail(&e)),
    }
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
        "skipped" => "↷",
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
        if let Some(reason) = t.cancel_reason.as_ref().or(t.skip_reason.as_ref()) {
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
