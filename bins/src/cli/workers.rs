//! `flowforge workers list`: the registered workers, their task types and
//! when they were last seen.

use flowforge_ports::Store;

use super::runs::Output;
use super::store::with_store;
use super::{Exit, Global, print_report};

/// `flowforge workers …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Every registered worker, most recently seen first.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// Runs a `workers` subcommand.
pub(crate) async fn run(global: &Global, command: Command) -> anyhow::Result<Exit> {
    let Command::List { output } = command;
    with_store!(global, |store| list(&store, output).await)
}

async fn list<S: Store>(store: &S, output: Output) -> anyhow::Result<Exit> {
    let workers = store.list_workers().await?;
    let text = match output {
        Output::Json => {
            let rows: Vec<serde_json::Value> = workers
                .iter()
                .map(|w| {
                    serde_json::json!({
                        "id": w.id.to_string(), "host": w.host, "pid": w.pid, "task_types": w.task_types,
                        "concurrency": w.concurrency, "started_at": w.started_at.to_rfc3339(),
                        "last_seen_at": w.last_seen_at.to_rfc3339(),
                        "stopped_at": w.stopped_at.map(|t| t.to_rfc3339()),
                    })
                })
                .collect();
            format!("{}\n", serde_json::to_string_pretty(&rows)?)
        }
        Output::Text => {
            let mut text = format!(
                "{:<40} {:>5}  {:<8} {:<20} {}\n",
                "WORKER", "SLOTS", "STATUS", "LAST SEEN", "TASK TYPES"
            );
            for w in &workers {
                text.push_str(&format!(
                    "{:<40} {:>5}  {:<8} {:<20} {}\n",
                    w.id,
                    w.concurrency,
                    if w.stopped_at.is_some() { "stopped" } else { "running" },
                    w.last_seen_at.format("%Y-%m-%d %H:%M:%S"),
                    w.task_types.join(",")
                ));
            }
            text
        }
    };
    print_report(&text)?;
    Ok(Exit::Ok)
}
