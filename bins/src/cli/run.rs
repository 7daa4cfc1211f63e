//! `flowforge run FILE [--input JSON|@file] [--concurrency N] [--output
//! text|json]`: the embedded mode. Publishes the definition to `--db`,
//! starts a run and drives only that run in this process — scheduler,
//! outbox publisher and worker over the in-process queue — with live
//! progress, then prints the report. Ctrl-C cancels the run (handlers are
//! stopped, command children get SIGTERM then SIGKILL), records the outcome
//! and exits 130.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowforge::{BuiltinOptions, Engine, EngineConfig, HandlerRegistry, InprocQueue, RunReport};
use flowforge_domain::{RunState, WorkflowDefinition};
use flowforge_ports::{Observer, Scope, Store, WorkerId};
use serde_json::Value;

use super::progress::Progress;
use super::runs::{Output, print_run_report};
use super::store::with_store;
use super::validate::{check_file, render_text};
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

/// Reads a definition file, printing its problems (exit 2) if invalid.
pub(crate) fn load_definition(file: &Path) -> Result<WorkflowDefinition, Exit> {
    let report = check_file(file);
    match report.definition {
        Some(def) => Ok(def),
        None => {
            eprint!("{}", render_text(&report));
            Err(Exit::Invalid)
        }
    }
}

/// Parses `--input`: inline JSON or `@file`.
pub(crate) fn parse_input(input: Option<&str>) -> Result<Value, Exit> {
    let Some(input) = input else {
        return Ok(Value::Object(Default::default()));
    };
    let (text, source) = match input.strip_prefix('@') {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (text, path.to_owned()),
            Err(e) => {
                eprintln!("error: cannot read --input file {path}: {e}");
                return Err(Exit::Invalid);
            }
        },
        None => (input.to_owned(), "--input".to_owned()),
    };
    serde_json::from_str(&text).map_err(|e| {
        eprintln!("error: {source} is not valid JSON: {e}");
        Exit::Invalid
    })
}

/// Resolves when the user asks to stop: Ctrl-C or SIGTERM.
pub(crate) async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The exit code of a run that ended in `state`.
pub(crate) fn exit_for(state: Option<RunState>) -> Exit {
    match state {
        Some(RunState::Succeeded) => Exit::Ok,
        Some(RunState::Cancelled) => Exit::Cancelled,
        _ => Exit::RunFailed,
    }
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
    with_store!(&global.db, |store| drive(store, global, args, &def, input, base_dir)
        .await)
}

async fn drive<S: Store>(
    store: S,
    global: &Global,
    args: &Args,
    def: &WorkflowDefinition,
    input: Value,
    base_dir: PathBuf,
) -> anyhow::Result<Exit> {
    let mut registry = HandlerRegistry::new();
    flowforge_app::register_builtins(
        &mut registry,
        BuiltinOptions {
            allow_command: true,
            base_dir,
            ..BuiltinOptions::default()
        },
    );
    let progress = Arc::new(Progress::new(
        def.forward_tasks().count() as u64,
        args.output == Output::Json,
    ));
    let mut config = EngineConfig {
        lease: global.lease(),
        worker_id: WorkerId(format!("{}:{}", host(), std::process::id())),
        ..EngineConfig::default()
    };
    if let Some(n) = args.concurrency {
        config.concurrency = n as usize;
    }
    let observers: Vec<Arc<dyn Observer>> = vec![progress.clone()];
    let engine = Engine::new(store, InprocQueue::new(), registry, observers, config);
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

/// This host's name, for worker ids.
pub(crate) fn host() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}
