//! FlowForge's use cases and loops, generic over the ports: publishing,
//! starting and cancelling runs, schedules, the scheduler pass, the outbox publisher,
//! the worker, the handler registry and the built-in task types.
//!
//! Nothing here names a concrete adapter: the `flowforge` binary (and any
//! embedding program) picks the store and the queue.

pub mod after_commit;
pub mod attempts;
pub mod builtins;
pub mod cache;
pub mod command;
pub mod engine;
pub mod error;
mod inputs;
mod metrics;
pub mod observers;
pub mod process;
pub mod publisher;
pub mod registry;
pub mod remote;
pub mod report;
pub mod scheduler;
pub mod schedules;
pub mod service;
pub mod telemetry;
pub mod tokens;
pub mod worker;

use std::time::Duration;

pub use builtins::{BUILTIN_TYPES, BuiltinOptions, register_builtins};
pub use engine::{Engine, EngineConfig, Serving};
pub use error::Error;
pub use registry::{HandlerRegistry, to_output};
pub use report::RunReport;
pub use service::{Closed, Retry, Service, TaskTypes, check_task_types};

/// The wait before retry number `failures` of a loop talking to a store
/// or a broker: exponential from 100 ms, full jitter, capped at 30 s.
pub fn backoff(failures: u32) -> Duration {
    let cap_ms = 100u64.saturating_mul(1 << failures.min(9)).min(30_000);
    Duration::from_millis(fastrand::u64(cap_ms / 2..=cap_ms))
}

/// Resolves when `nudge` is poked; never without one. A loop over a
/// [`flowforge_ports::Scope::Runs`] set selects on it beside the store's
/// notifications: the set's owner pokes it after adding a run whose
/// notification the loop may have seen before the run was in its scope.
pub(crate) async fn nudged(nudge: Option<&tokio::sync::Notify>) {
    match nudge {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(super::backoff(1).as_millis() <= 200);
        for n in [9, 20, u32::MAX] {
            assert!(super::backoff(n).as_millis() <= 30_000);
        }
        assert!(super::backoff(12).as_millis() >= 15_000);
    }
}
