//! The built-in task types (docs/design/handlers.md#built-in-task-types):
//! `noop`, `echo`, `sleep`, `fail` and `command`.

use std::path::PathBuf;
use std::time::Duration;

use flowforge_domain::limits::DEFAULT_TASK_OUTPUT_BYTES;
use flowforge_ports::{HandlerError, TaskContext};
use serde_json::{Map, Value, json};

use crate::command::{CommandSpec, run_command};
use crate::registry::HandlerRegistry;

/// The names of the built-in task types.
pub const BUILTIN_TYPES: [&str; 5] = ["command", "echo", "fail", "noop", "sleep"];

/// How the built-ins behave in this process.
#[derive(Debug, Clone)]
pub struct BuiltinOptions {
    /// Whether `command` is registered. The embedded runner allows it (the
    /// user runs their own file); a distributed worker only with
    /// `--allow-command`.
    pub allow_command: bool,
    /// The folder a relative `cwd` (and a command's default working
    /// directory) is resolved against, and which a `cwd` must not leave:
    /// the definition's folder in embedded mode, the worker's working
    /// directory otherwise.
    pub base_dir: PathBuf,
    /// How long a command's process group gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// The most stdout a command may print: the task output limit
    /// (docs/design/data-flow.md#limits).
    pub output_limit: usize,
}

impl Default for BuiltinOptions {
    fn default() -> Self {
        Self {
            allow_command: false,
            base_dir: PathBuf::from("."),
            kill_grace: Duration::from_secs(3),
            output_limit: DEFAULT_TASK_OUTPUT_BYTES,
        }
    }
}

/// Adds the built-ins to `registry`.
pub fn register_builtins(registry: &mut HandlerRegistry, options: BuiltinOptions) {
    registry
        .register_fn("noop", |ctx| async move { Ok(noop(&ctx.config)) })
        .register_fn("echo", |ctx| async move {
            let mut echoed = json!({ "inputs": ctx.inputs, "run_input": ctx.run_input });
            // A child of a mapped task shows what it ran for.
            if let Some(item) = ctx.item {
                echoed["index"] = json!(item.index);
                echoed["item"] = item.item;
            }
            Ok(echoed)
        })
        .register_fn("sleep", sleep)
        .register_fn("fail", |ctx| async move { fail(&ctx) });
    // Not registered at all unless allowed: a worker advertises and takes
    // only the types it serves, so a `command` dispatch on a shared queue
    // goes back to a worker that runs it instead of failing here.
    if options.allow_command {
        registry.register_fn("command", move |ctx| {
            let options = options.clone();
            async move {
                let mut spec = CommandSpec::from_config(&ctx.config, &options.base_dir)?;
                spec.stdout_limit = options.output_limit;
                run_command(&ctx, &spec, options.kill_grace).await
            }
        });
    }
}

fn noop(config: &Map<String, Value>) -> Value {
    config.get("output").cloned().unwrap_or_else(|| json!({}))
}

async fn sleep(ctx: TaskContext) -> Result<Value, HandlerError> {
    let seconds = match ctx.config.get("seconds") {
        Some(v) => v.as_f64().filter(|s| (0.0..=31_536_000.0).contains(s)).ok_or_else(|| {
            HandlerError::permanent(format!("sleep: config.seconds must be a number of seconds, not {v}"))
        })?,
        None => return Err(HandlerError::permanent("sleep: config.seconds is required")),
    };
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => Ok(json!({ "slept_seconds": seconds })),
        () = ctx.cancel.cancelled() => Err(HandlerError::retryable("sleep was interrupted")),
    }
}

fn fail(ctx: &TaskContext) -> Result<Value, HandlerError> {
    let message = ctx
        .config
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("failed on purpose");
    match ctx.config.get("fail_times") {
        None => Err(HandlerError::retryable(format!("{message} (attempt {})", ctx.attempt))),
        Some(v) => {
            let times = v.as_u64().ok_or_else(|| {
                HandlerError::permanent(format!("fail: config.fail_times must be a whole number, not {v}"))
            })?;
            if u64::from(ctx.attempt) <= times {
                Err(HandlerError::retryable(format!(
                    "{message} (attempt {} of {times} failing)",
                    ctx.attempt
                )))
            } else {
                Ok(json!({ "attempts": ctx.attempt }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tests::ctx;

    fn registry(allow_command: bool) -> HandlerRegistry {
        let mut r = HandlerRegistry::new();
        register_builtins(
            &mut r,
            BuiltinOptions {
                allow_command,
                ..BuiltinOptions::default()
            },
        );
        r
    }

    fn with_config(task_type: &str, config: Value) -> TaskContext {
        let mut c = ctx(task_type);
        c.config = config.as_object().cloned().unwrap_or_default();
        c
    }

    #[tokio::test]
    async fn noop_and_echo() {
        let r = registry(false);
        assert_eq!(r.invoke(with_config("noop", json!({}))).unwrap().await, Ok(json!({})));
        assert_eq!(
            r.invoke(with_config("noop", json!({"output": {"n": 1}})))
                .unwrap()
                .await,
            Ok(json!({"n": 1}))
        );
        let mut c = ctx("echo");
        c.inputs.insert("a".into(), json!(1));
        c.run_input = json!({"x": 2});
        assert_eq!(
            r.invoke(c).unwrap().await,
            Ok(json!({"inputs": {"a": 1}, "run_input": {"x": 2}}))
        );
        assert_eq!(BUILTIN_TYPES.to_vec(), registry(true).task_types().collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn fail_fails_the_first_attempts_then_succeeds() {
        let r = registry(false);
        let mut c = with_config("fail", json!({"fail_times": 2}));
        c.attempt = 2;
        assert!(r.invoke(c.clone()).unwrap().await.is_err());
        c.attempt = 3;
        assert_eq!(r.invoke(c).unwrap().await, Ok(json!({"attempts": 3})));
        let always = r.invoke(with_config("fail", json!({}))).unwrap().await.unwrap_err();
        assert!(!always.is_permanent());
        let bad = r
            .invoke(with_config("fail", json!({"fail_times": "x"})))
            .unwrap()
            .await
            .unwrap_err();
        assert!(bad.is_permanent());
    }

    #[tokio::test]
    async fn sleep_needs_seconds_and_stops_on_cancel() {
        let r = registry(false);
        assert!(r.invoke(ctx("sleep")).unwrap().await.unwrap_err().is_permanent());
        assert_eq!(
            r.invoke(with_config("sleep", json!({"seconds": 0}))).unwrap().await,
            Ok(json!({"slept_seconds": 0.0}))
        );
        let c = with_config("sleep", json!({"seconds": 600}));
        c.cancel.cancel();
        assert!(r.invoke(c).unwrap().await.is_err());
    }

    #[tokio::test]
    async fn command_is_not_served_without_the_allow_flag() {
        assert!(!registry(false).contains("command"));
        assert!(registry(false).invoke(ctx("command")).is_none());
        assert!(registry(true).contains("command"));
    }
}
