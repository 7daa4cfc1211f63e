//! `flowforge run FILE [--input JSON|@file] [--concurrency N] [--output
//! text|json]`: the embedded mode. Publishes the definition to `--db`,
//! starts a run and drives only that run in this process — scheduler,
//! outbox publisher and worker over the in-process queue — with live
//! progress, then prints the report. Ctrl-C cancels the run (handlers are
//! stopped, command children get SIGTERM then SIGKILL), records the outcome
//! and exits 130.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowforge::{Embedded, RunReport};
use flowforge_domain::WorkflowDefinition;
use flowforge_ports::{Scope, Store, WorkerId};
use serde_json::Value;

use super::common::{exit_for, host, interrupted, load_definition, parse_input};
use super::progress::Progress;
use super::runs::{Output, print_run_report};
use super::store::with_store;
use super::{Exit, Global, fail};

/// Arguments of `flowforge run`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The definition file (JSON).
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// The run input: inline JSON, or `@path` to read it from a file.
    #[arg(long, value_name = "JSON|@FILE")]
    pub(crate) input: Option<String>,
    /// Tasks run at once (default: the number of CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: Option<u32>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
}

/// `flowforge run`.
pub(crate) async fn run(global: &Global, args: &Args) -> anyhow::Result<Exit> {
    let def = match load_definition(&args.file) {
        Ok(def) => def,
        Err(exit) => return Ok(exit),
    };
    let input = match parse_input(args.input.as_deref()) {
        Ok(v) => v,
        Err(exit) => return Ok(exit),
    };
    let base_dir = args
        .file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    with_store!(global, |store| drive(store, global, args, &def, input, base_dir).await)
}

async fn drive<S: Store>(
    store: S,
    global: &Global,
    args: &Args,
    def: &WorkflowDefinition,
    input: Value,
    base_dir: PathBuf,
) -> anyhow::Result<Exit> {
    let progress = Arc::new(Progress::new(
        def.forward_tasks().count() as u64,
        args.output == Output::Json,
    ));
    let mut builder = Embedded::builder()
        .base_dir(base_dir)
        .lease(global.lease())
        .limits(global.limits())
        .priority_aging(global.priority_aging())
        .worker_id(WorkerId(format!("{}:{}", host(), std::process::id())))
        .observer(progress.clone());
    if let Some(n) = args.concurrency {
        builder = builder.concurrency(n as usize);
    }
    let engine = builder.build_on(store);
    let published = match engine.publish(def).await {
        Ok(p) => p,
        Err(e) => return Ok(fail(&e)),
    };
    let run = match engine.start(published.id, input).await {
        Ok(run) => run,
        Err(e) => return Ok(fail(&e)),
    };
    let mut serving = engine.serve(Scope::Run(run));
    let mut interrupted_once = false;
    let outcome = loop {
        tokio::select! {
            settled = engine.wait(run) => break settled,
            failed = serving.failed() => {
                progress.finish();
                if let Err(e) = failed {
                    return Ok(fail(&e));
                }
            }
            () = interrupted() => {
                if interrupted_once {
                    progress.finish();
                    eprintln!("interrupted again: exiting without waiting; run {run} is left to `flowforge runs cancel {run}`");
                    return Ok(Exit::Interrupted);
                }
                interrupted_once = true;
                progress.finish();
                eprintln!("cancelling run {run} (Ctrl-C again to exit at once)");
                if let Err(e) = engine.cancel(run).await {
                    eprintln!("error: could not cancel: {e}");
                }
            }
        }
    };
    progress.finish();
    let stopped = serving.stop().await;
    if let Err(e) = outcome.as_ref().map(|_| ()).or(stopped) {
        return Ok(fail(&e));
    }
    let report: RunReport = match engine.report(run).await {
        Ok(r) => r,
        Err(e) => return Ok(fail(&e)),
    };
    print_run_report(&report, args.output)?;
    Ok(if interrupted_once {
        Exit::Interrupted
    } else {
        exit_for(report.run_state())
    })
}
