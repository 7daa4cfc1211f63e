//! The handler registry: task type → trusted Rust handler. A dispatch only
//! names a type; nothing it carries is executed
//! (docs/design/handlers.md#trusted-handlers).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use flowforge_ports::{Handler, HandlerError, TaskContext};
use futures_util::FutureExt;
use serde::Serialize;
use serde_json::Value;

/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, HandlerError>> + Send>>;

/// A handler with its type erased, so the registry can hold any kind.
pub trait ErasedHandler: Send + Sync + 'static {
    /// Starts one attempt.
    fn call(&self, ctx: TaskContext) -> HandlerFuture;
}

struct AsyncHandler<H>(Arc<H>);

impl<H: Handler> ErasedHandler for AsyncHandler<H> {
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        let handler = Arc::clone(&self.0);
        Box::pin(async move { handler.run(ctx).await })
    }
}

struct FnHandler<F>(F);

impl<F, Fut> ErasedHandler for FnHandler<F>
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
{
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        Box::pin((self.0)(ctx))
    }
}

struct BlockingHandler<F>(Arc<F>);

impl<F> ErasedHandler for BlockingHandler<F>
where
    F: Fn(TaskContext) -> Result<Value, HandlerError> + Send + Sync + 'static,
{
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        let f = Arc::clone(&self.0);
        Box::pin(async move {
            // Off the async runtime: a blocking handler must not stall the
            // scheduler or other tasks. On timeout the thread is abandoned
            // (Rust cannot kill a thread); its late result is discarded.
            match tokio::task::spawn_blocking(move || f(ctx)).await {
                Ok(result) => result,
                Err(e) if e.is_panic() => Err(HandlerError::retryable(format!(
                    "handler panicked: {}",
                    panic_message(e.into_panic().as_ref())
                ))),
                Err(e) => Err(HandlerError::retryable(format!("handler thread was cancelled: {e}"))),
            }
        })
    }
}

/// The text of a panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

/// Converts a handler's typed output to JSON, or a permanent failure
/// naming why it is not JSON (e.g. a map with non-string keys).
pub fn to_output<T: Serialize>(value: &T) -> Result<Value, HandlerError> {
    serde_json::to_value(value).map_err(|e| HandlerError::permanent(format!("output is not JSON-serialisable: {e}")))
}

/// Task type → handler.
#[derive(Clone, Default)]
pub struct HandlerRegistry {
    handlers: BTreeMap<String, Arc<dyn ErasedHandler>>,
}

impl fmt::Debug for HandlerRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerRegistry")
            .field("types", &self.handlers.keys())
            .finish()
    }
}

impl HandlerRegistry {
    /// An empty registry (see [`crate::builtins`] for the built-ins).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a [`Handler`] for `task_type`, replacing any previous one.
    pub fn register<H: Handler>(&mut self, task_type: impl Into<String>, handler: H) -> &mut Self {
        self.handlers
            .insert(task_type.into(), Arc::new(AsyncHandler(Arc::new(handler))));
        self
    }

    /// Registers an async function or closure for `task_type`.
    pub fn register_fn<F, Fut>(&mut self, task_type: impl Into<String>, f: F) -> &mut Self
    where
        F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
    {
        self.handlers.insert(task_type.into(), Arc::new(FnHandler(f)));
        self
    }

    /// Registers a blocking function for `task_type`; it runs on a thread
    /// of the blocking pool, never on the async runtime.
    pub fn register_blocking<F>(&mut self, task_type: impl Into<String>, f: F) -> &mut Self
    where
        F: Fn(TaskContext) -> Result<Value, HandlerError> + Send + Sync + 'static,
    {
        self.handlers
            .insert(task_type.into(), Arc::new(BlockingHandler(Arc::new(f))));
        self
    }

    /// Adds every handler of `other`, replacing same-named ones here.
    pub fn extend(&mut self, other: HandlerRegistry) -> &mut Self {
        self.handlers.extend(other.handlers);
        self
    }

    /// The handler of `task_type`.
    pub fn get(&self, task_type: &str) -> Option<&Arc<dyn ErasedHandler>> {
        self.handlers.get(task_type)
    }

    /// Whether `task_type` has a handler.
    pub fn contains(&self, task_type: &str) -> bool {
        self.handlers.contains_key(task_type)
    }

    /// Every registered type, ascending.
    pub fn task_types(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }

    /// Runs one attempt of `task_type`'s handler, turning a panic into a
    /// failed (retryable) attempt. `None` if the type is unknown.
    pub fn invoke(&self, ctx: TaskContext) -> Option<HandlerFuture> {
        let handler = Arc::clone(self.handlers.get(&ctx.task_type)?);
        Some(Box::pin(async move {
            match AssertUnwindSafe(handler.call(ctx)).catch_unwind().await {
                Ok(result) => result,
                Err(payload) => Err(HandlerError::retryable(format!(
                    "handler panicked: {}",
                    panic_message(payload.as_ref())
                ))),
            }
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flowforge_ports::RunId;
    use serde_json::json;
    use std::collections::HashMap;
    use tokio_util::sync::CancellationToken;

    pub(crate) fn ctx(task_type: &str) -> TaskContext {
        TaskContext {
            run_id: RunId(Default::default()),
            task_key: "t".into(),
            task_type: task_type.into(),
            attempt: 1,
            token: 1,
            idempotency_key: "r:t".into(),
            run_input: json!({}),
            inputs: Default::default(),
            config: Default::default(),
            item: None,
            cancel: CancellationToken::new(),
            pulse: Default::default(),
        }
    }

    struct Doubler;
    impl Handler for Doubler {
        async fn run(&self, ctx: TaskContext) -> Result<Value, HandlerError> {
            Ok(json!(ctx.attempt * 2))
        }
    }

    #[tokio::test]
    async fn every_kind_of_handler_runs_and_panics_become_failures() {
        let mut r = HandlerRegistry::new();
        r.register("double", Doubler)
            .register_fn("async", |_ctx| async { Ok(json!("a")) })
            .register_blocking("blocking", |_ctx| Ok(json!("b")))
            .register_fn("boom", |_ctx| async { panic!("kaboom") })
            .register_blocking("boom_blocking", |_ctx| panic!("thread kaboom"));
        assert_eq!(r.invoke(ctx("double")).unwrap().await, Ok(json!(2)));
        assert_eq!(r.invoke(ctx("async")).unwrap().await, Ok(json!("a")));
        assert_eq!(r.invoke(ctx("blocking")).unwrap().await, Ok(json!("b")));
        let err = r.invoke(ctx("boom")).unwrap().await.unwrap_err();
        assert_eq!(err.message, "handler panicked: kaboom");
        assert!(!err.is_permanent());
        let err = r.invoke(ctx("boom_blocking")).unwrap().await.unwrap_err();
        assert_eq!(err.message, "handler panicked: thread kaboom");
        assert!(r.invoke(ctx("ghost")).is_none());
        assert_eq!(
            r.task_types().collect::<Vec<_>>(),
            ["async", "blocking", "boom", "boom_blocking", "double"]
        );
    }

    #[test]
    fn non_json_outputs_are_permanent_failures() {
        let mut bad = HashMap::new();
        bad.insert(vec![1u8], 1);
        let err = to_output(&bad).unwrap_err();
        assert!(err.is_permanent());
        assert!(err.message.contains("not JSON-serialisable"), "{}", err.message);
    }
}
