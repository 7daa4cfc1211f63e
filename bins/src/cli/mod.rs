//! The command line of `flowforge` (clap derive): the top-level [`Cli`],
//! one [`Command`] variant per subcommand, one module per command, and the
//! exit codes (docs/design/cli.md#exit-codes).
//!
//! Adding a command: a module with an `Args` struct (clap `Args`) and a
//! `run(&Args) -> anyhow::Result<Exit>`, a variant in [`Command`], an arm in
//! [`run`]. The global options (docs/design/cli.md#global-options: `--db`,
//! `--amqp`, `--queue`, `--lease-seconds`, `--log-format`, each with its
//! environment variable) belong on [`Cli`] as
//! `#[arg(long, global = true, env = "FLOWFORGE_…")]` fields, added with the
//! first command that reads them.
//!
//! Conventions: reports go to stdout, diagnostics about the tool itself to
//! stderr; an error that escapes a command is an infrastructure error
//! (exit 4); invalid input is a report plus exit 2, not an `Err`.

pub(crate) mod common;
pub(crate) mod graph;
pub(crate) mod migrate;
pub(crate) mod processes;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod submit;
pub(crate) mod telemetry;
pub(crate) mod tokens;
pub(crate) mod validate;
pub(crate) mod workers;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// FlowForge: a DAG workflow engine.
///
/// Exit codes: 0 ok / run succeeded, 1 run failed, 2 invalid input or
/// usage, 3 run cancelled, 4 infrastructure error (database or broker
/// unreachable, migration missing), 130 interrupted.
#[derive(Debug, Parser)]
#[command(name = "flowforge", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The global options, each with its environment variable
/// (docs/design/cli.md#global-options).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Global {
    /// The store: `sqlite://path.db` (created on first use),
    /// `sqlite::memory:`, or `postgres://user@host/db`.
    // Hidden values: clap would print the environment's URL, password
    // included, in `--help`.
    #[arg(long, global = true, env = "FLOWFORGE_DB", hide_env_values = true,
          default_value = flowforge::DEFAULT_DATABASE, value_name = "URL")]
    pub(crate) db: String,
    /// The RabbitMQ broker of the distributed processes.
    #[arg(
        long,
        global = true,
        env = "FLOWFORGE_AMQP",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        value_name = "URL"
    )]
    pub(crate) amqp: String,
    /// The dispatch queue (a quorum queue) of the distributed processes.
    #[arg(
        long,
        global = true,
        env = "FLOWFORGE_QUEUE",
        default_value = "flowforge.tasks",
        value_name = "NAME"
    )]
    pub(crate) queue: String,
    /// How long a running task's lease lasts; workers renew it every third.
    #[arg(long, global = true, env = "FLOWFORGE_LEASE_SECONDS", default_value_t = 30, value_name = "N",
          value_parser = clap::value_parser!(u64).range(3..=86_400))]
    pub(crate) lease_seconds: u64,
    /// PostgreSQL: a statement running longer is cancelled (its call
    /// fails as "unavailable" and is retried by the loops).
    #[arg(long, global = true, env = "FLOWFORGE_PG_STATEMENT_TIMEOUT_SECONDS", default_value_t = 30,
          value_name = "N", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) pg_statement_timeout_seconds: u64,
    /// PostgreSQL: a session idle inside a transaction this long (a process
    /// stalled mid-pass or mid-sweep) is ended by the server, releasing its
    /// locks for the other processes.
    #[arg(long, global = true, env = "FLOWFORGE_PG_IDLE_IN_TRANSACTION_SECONDS", default_value_t = 20,
          value_name = "N", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) pg_idle_in_transaction_seconds: u64,
    /// PostgreSQL: the most connections this process's pool opens (the
    /// notifier of a long-running process holds one more of its own).
    #[arg(long, global = true, env = "FLOWFORGE_PG_POOL_SIZE", default_value_t = 10,
          value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) pg_pool_size: u32,
    /// PostgreSQL: connections the pool keeps open even when idle, up to
    /// `--pg-pool-size`; equal to it, the pool has a fixed size
    /// (docs/design/cli.md#connection-pool).
    #[arg(long, global = true, env = "FLOWFORGE_PG_POOL_MIN", default_value_t = 0,
          value_name = "N", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub(crate) pg_pool_min: u32,
    /// The largest run input accepted, in bytes of compact JSON.
    #[arg(long, global = true, env = "FLOWFORGE_MAX_RUN_INPUT_BYTES", value_name = "BYTES",
          default_value_t = flowforge::limits::DEFAULT_RUN_INPUT_BYTES)]
    pub(crate) max_run_input_bytes: usize,
    /// The largest output one task may store, in bytes of compact JSON (a
    /// `command` task's stdout is held to it while it is read).
    #[arg(long, global = true, env = "FLOWFORGE_MAX_TASK_OUTPUT_BYTES", value_name = "BYTES",
          default_value_t = flowforge::limits::DEFAULT_TASK_OUTPUT_BYTES)]
    pub(crate) max_task_output_bytes: usize,
    /// The largest sum of its dependencies' outputs one task may be given.
    #[arg(long, global = true, env = "FLOWFORGE_MAX_TASK_INPUTS_BYTES", value_name = "BYTES",
          default_value_t = flowforge::limits::DEFAULT_TASK_INPUTS_BYTES)]
    pub(crate) max_task_inputs_bytes: usize,
    /// How long ready work waits to gain one priority level: a priority-0
    /// task goes before priority-9 work that became ready more than nine
    /// times this after it (docs/design/priorities.md#aging).
    #[arg(long, global = true, env = "FLOWFORGE_PRIORITY_AGING_SECONDS", default_value_t = 300.0,
          value_name = "SECONDS", value_parser = positive_seconds)]
    pub(crate) priority_aging_seconds: f64,
    /// Log line format (logs go to stderr; `RUST_LOG` sets the level).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Export traces over OTLP/HTTP to this collector (`/v1/traces` is
    /// added to a bare `http://host:4318`).
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
}

/// A number of seconds above zero, up to a year.
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 31_536_000.0 => Ok(v),
        _ => Err(format!(
            "expected a number of seconds above 0 and at most a year, not '{s}'"
        )),
    }
}

impl Cli {
    /// The checks across options that clap cannot state one option at a
    /// time; a failure is a usage error (exit 2).
    pub(crate) fn check(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory as _;
        let global = &self.global;
        if global.pg_pool_min > global.pg_pool_size {
            return Err(Self::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--pg-pool-min {} is more than --pg-pool-size {}: a pool cannot keep open more connections than it may hold",
                    global.pg_pool_min, global.pg_pool_size
                ),
            ));
        }
        Ok(())
    }
}

impl Global {
    /// The priority aging step as a duration.
    pub(crate) fn priority_aging(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.priority_aging_seconds)
    }

    /// The lease as a duration.
    pub(crate) fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.lease_seconds)
    }

    /// The size limits (docs/design/data-flow.md#limits).
    pub(crate) fn limits(&self) -> flowforge::Limits {
        flowforge::Limits {
            run_input_bytes: self.max_run_input_bytes,
            task_output_bytes: self.max_task_output_bytes,
            task_inputs_bytes: self.max_task_inputs_bytes,
        }
    }

    /// The PostgreSQL pool's tuning
    /// (docs/design/outbox-and-queues.md#bounded-transactions).
    pub(crate) fn pg_options(&self) -> flowforge_adapters_postgres::PgOptions {
        flowforge_adapters_postgres::PgOptions {
            statement_timeout: std::time::Duration::from_secs(self.pg_statement_timeout_seconds),
            idle_in_transaction_timeout: Some(std::time::Duration::from_secs(self.pg_idle_in_transaction_seconds)),
            max_connections: self.pg_pool_size,
            min_connections: self.pg_pool_min,
            ..flowforge_adapters_postgres::PgOptions::default()
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
    /// Run a definition in this process (embedded: SQLite by default, the
    /// in-process queue), with live progress and a report at the end.
    Run(run::Args),
    /// Runs in the store: list, show, cancel.
    #[command(subcommand)]
    Runs(runs::Command),
    /// Apply the store's migrations to --db.
    Migrate(migrate::Args),
    /// Distributed: the scheduler process (promotes, cancels, compensates,
    /// reaps expired leases). Stops gracefully on SIGTERM/SIGINT.
    Scheduler(processes::SchedulerArgs),
    /// Distributed: the outbox publisher process (outbox -> RabbitMQ).
    Publisher(processes::PublisherArgs),
    /// Distributed: a worker process (RabbitMQ -> handlers).
    Worker(processes::WorkerArgs),
    /// Publish a definition and start a run through --db (distributed).
    Submit(submit::Args),
    /// Registered workers.
    #[command(subcommand)]
    Workers(workers::Command),
    /// The HTTP API (on SQLite with the engine in process: a whole
    /// deployment). Stops gracefully on SIGTERM/SIGINT.
    Server(server::Args),
    /// The API's bearer tokens: create, list, revoke.
    #[command(subcommand)]
    Tokens(tokens::Command),
    /// Runs on a clock: create, list, pause, resume, delete, backfill.
    /// `flowforge server` (SQLite) and `flowforge scheduler` fire them.
    #[command(subcommand)]
    Schedules(schedules::Command),
}

impl Command {
    /// The log level when `RUST_LOG` is unset: the long-running processes
    /// narrate, the one-shot commands stay quiet (their output is the point).
    fn default_log_level(&self) -> &'static str {
        match self {
            Self::Scheduler(_) | Self::Publisher(_) | Self::Worker(_) | Self::Server(_) => "info",
            _ => "error",
        }
    }
}

/// Runs the parsed command line.
pub(crate) fn run(cli: Cli) -> anyhow::Result<Exit> {
    // Dropped last: flushes the spans once the command is done.
    let _telemetry = telemetry::init(
        cli.global.log_format,
        cli.command.default_log_level(),
        cli.global.otlp_endpoint.as_deref(),
    )?;
    match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Graph(args) => graph::run(&args),
        command => runtime()?.block_on(run_async(cli.global, command)),
    }
}

async fn run_async(global: Global, command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Run(args) => run::run(&global, &args).await,
        Command::Runs(cmd) => runs::run(&global, cmd).await,
        Command::Migrate(args) => migrate::run(&global, &args).await,
        Command::Scheduler(args) => processes::scheduler(&global, &args).await,
        Command::Publisher(args) => processes::publisher(&global, &args).await,
        Command::Worker(args) => processes::worker(&global, &args).await,
        Command::Submit(args) => submit::run(&global, &args).await,
        Command::Workers(cmd) => workers::run(&global, cmd).await,
        Command::Server(args) => server::run(&global, &args).await,
        Command::Tokens(cmd) => tokens::run(&global, cmd).await,
        Command::Schedules(cmd) => schedules::run(&global, cmd).await,
        Command::Validate(_) | Command::Graph(_) => unreachable!("handled without a runtime"),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Reports an application error on stderr and picks its exit code:
/// infrastructure (4) or invalid input (2).
pub(crate) fn fail(error: &flowforge::Error) -> Exit {
    eprintln!("error: {error}");
    if error.is_infrastructure() {
        Exit::Infrastructure
    } else {
        Exit::Invalid
    }
}

/// The exit codes (docs/design/cli.md#exit-codes). Not every command uses every
/// code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    #[test]
    fn the_pool_options_size_the_postgres_pool_and_a_minimum_above_the_size_is_refused() {
        let cli = Cli::try_parse_from(["flowforge", "--pg-pool-size", "4", "--pg-pool-min", "4", "scheduler"]).unwrap();
        cli.check().unwrap();
        let options = cli.global.pg_options();
        assert_eq!((options.max_connections, options.min_connections), (4, 4));

        let default = Cli::try_parse_from(["flowforge", "scheduler"]).unwrap();
        let options = default.global.pg_options();
        assert_eq!((options.max_connections, options.min_connections), (10, 0));

        let over = Cli::try_parse_from(["flowforge", "--pg-pool-min", "5", "--pg-pool-size", "4", "worker"]).unwrap();
        let error = over.check().unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert_eq!(error.exit_code(), 2);
        assert!(
            error
                .to_string()
                .contains("--pg-pool-min 5 is more than --pg-pool-size 4"),
            "{error}"
        );

        let zero = Cli::try_parse_from(["flowforge", "--pg-pool-size", "0", "worker"]).unwrap_err();
        assert_eq!(zero.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn a_panicking_loop_exits_as_the_engine_failing_not_as_bad_input() {
        let panicked = flowforge::Error::LoopPanicked {
            what: "scheduler",
            message: "boom".into(),
        };
        assert_eq!(panicked.to_string(), "the engine's scheduler panicked: boom");
        assert_eq!(fail(&panicked), Exit::Infrastructure);
        assert_eq!(fail(&flowforge::Error::LoopStopped), Exit::Infrastructure);
    }
}
