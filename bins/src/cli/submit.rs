//! `flowforge submit FILE [--input …] [--wait]`: publish a definition and
//! start a run directly through `--db`, for operators of the distributed
//! mode (until the HTTP API exists). Task types must be built in or served
//! by a live worker. With `--wait`, waits for the run and prints its
//! report; Ctrl-C then cancels the run and exits 130.

use std::path::PathBuf;

use flowforge::{Service, TaskTypes};
use flowforge_adapters_rabbit::RabbitConfig;
use flowforge_ports::Store;

use super::common::{exit_for, interrupted, load_definition, parse_input};
use super::runs::{Output, print_run_report};
use super::store::with_store;
use super::{Exit, Global, fail};

/// Arguments of `flowforge submit`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The definition file (JSON).
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// The run input: inline JSON, or `@path` to read it from a file.
    #[arg(long, value_name = "JSON|@FILE")]
    pub(crate) input: Option<String>,
    /// Its dispatch priority, 0 (lowest) to 9 (highest); a task whose
    /// definition names a priority keeps its own.
    #[arg(long, value_name = "0-9", default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub(crate) priority: u8,
    /// Wait for the run to end and print its report.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Report format (with --wait).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
}

/// `flowforge submit`.
pub(crate) async fn run(global: &Global, args: &Args) -> anyhow::Result<Exit> {
    let def = match load_definition(&args.file) {
        Ok(def) => def,
        Err(exit) => return Ok(exit),
    };
    let input = match parse_input(args.input.as_deref()) {
        Ok(v) => v,
        Err(exit) => return Ok(exit),
    };
    // RabbitMQ closes a channel whose delivery stays unacked past its
    // consumer timeout, heartbeats or not: a longer task could never finish.
    let limit = RabbitConfig::new(global.amqp.clone()).max_task_timeout();
    if let Some(task) = def.tasks().iter().find(|t| def.timeout(t) > limit) {
        eprintln!(
            "error: task '{}' has a timeout of {}s, above the {}s a distributed worker can hold a task \
             (RabbitMQ's consumer_timeout, 30 min by default, minus a margin); shorten it or split the task",
            task.key(),
            def.timeout(task).as_secs_f64(),
            limit.as_secs()
        );
        return Ok(Exit::Invalid);
    }
    with_store!(global, |store| submit(store, global.limits(), args, &def, input).await)
}

async fn submit<S: Store>(
    store: S,
    limits: flowforge::Limits,
    args: &Args,
    def: &flowforge_domain::WorkflowDefinition,
    input: serde_json::Value,
) -> anyhow::Result<Exit> {
    let service = Service::new(store).with_limits(limits);
    let published = match service.publish(def, &TaskTypes::LiveWorkers).await {
        Ok(p) => p,
        Err(e) => return Ok(fail(&e)),
    };
    let priority = flowforge_domain::Priority::new(i64::from(args.priority))?;
    let run = match service.start(published.id, input, priority).await {
        Ok(run) => run.id,
        Err(e) => return Ok(fail(&e)),
    };
    if !args.wait {
        println!("{run}");
        return Ok(Exit::Ok);
    }
    eprintln!("run {run} started; waiting for it to end");
    let mut interrupted_once = false;
    loop {
        tokio::select! {
            state = service.wait(run) => {
                if let Err(e) = state {
                    return Ok(fail(&e));
                }
                break;
            }
            () = interrupted(), if !interrupted_once => {
                interrupted_once = true;
                eprintln!("cancelling run {run}");
                if let Err(e) = service.cancel(run).await {
                    return Ok(fail(&e));
                }
            }
        }
    }
    let report = match service.report(run).await {
        Ok(report) => report,
        Err(e) => return Ok(fail(&e)),
    };
    print_run_report(&report, args.output)?;
    Ok(if interrupted_once {
        Exit::Interrupted
    } else {
        exit_for(report.run_state())
    })
}
