//! The command line of `flowforge` (clap derive): the top-level [`Cli`],
//! one [`Command`] variant per subcommand, one module per command, and the
//! exit codes of DESIGN §7.
//!
//! Adding a command: a module with an `Args` struct (clap `Args`) and a
//! `run(&Args) -> anyhow::Result<Exit>`, a variant in [`Command`], an arm in
//! [`run`]. DESIGN §7's global options (`--db`, `--amqp`, `--queue`,
//! `--lease-seconds`, `--log-format`, each with its environment variable)
//! belong on [`Cli`] as `#[arg(long, global = true, env = "FLOWFORGE_…")]`
//! fields, added with the first command that reads them.
//!
//! Conventions: reports go to stdout, diagnostics about the tool itself to
//! stderr; an error that escapes a command is an infrastructure error
//! (exit 4); invalid input is a report plus exit 2, not an `Err`.

pub(crate) mod graph;
pub(crate) mod validate;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// FlowForge: a DAG workflow engine. Reports go to stdout; exit codes: 0 ok,
/// 2 invalid input or usage, 4 infrastructure error.
#[derive(Debug, Parser)]
#[command(name = "flowforge", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check definition files: shape, then graph; print the fingerprint of
    /// each valid one. Exits 2 if any file is invalid.
    Validate(validate::Args),
    /// Draw a definition: its DAG (dependency -> dependent), levels,
    /// topological order and compensators.
    Graph(graph::Args),
}

/// Runs the parsed command line.
pub(crate) fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Graph(args) => graph::run(&args),
    }
}

/// The exit codes of DESIGN §7. Not every command uses every code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // the run-related codes arrive with `run` and `submit`
pub(crate) enum Exit {
    /// 0: ok / the run succeeded.
    Ok = 0,
    /// 1: the run failed.
    RunFailed = 1,
    /// 2: invalid input or usage (bad definition, conflict, unknown task
    /// type, bad flags).
    Invalid = 2,
    /// 3: the run was cancelled.
    Cancelled = 3,
    /// 4: infrastructure error (database or broker unreachable, migration
    /// missing, an unexpected I/O failure).
    Infrastructure = 4,
    /// 130: interrupted (`run` and `submit --wait` only).
    Interrupted = 130,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// Writes a report to stdout. A closed pipe (`flowforge graph x | head`)
/// is not an error: the reader has what it wanted.
pub(crate) fn print_report(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(anyhow::Error::new(e).context("writing to stdout")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
