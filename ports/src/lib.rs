//! The traits FlowForge's application needs from the world — stores,
//! dispatch queue, clock, handlers, observers — and their typed errors.
//!
//! Ports name no driver type: an adapter translates its driver's errors and
//! rows into the types here. Methods return `impl Future + Send`;
//! implementations write `async fn`. Every method documents its contract.

pub mod clock;
#[cfg(feature = "test-util")]
pub mod contract;
pub mod handler;
pub mod ids;
pub mod observer;
pub mod queue;
pub mod store;

pub use clock::{Clock, SystemClock};
pub use handler::{FailureKind, Handler, HandlerError, MapItem, TaskContext};
pub use ids::{DispatchId, RunId, TaskRunId, WorkerId, WorkflowId};
pub use observer::{Observer, RunEvent, TaskEvent};
pub use queue::{Delivery, Dispatch, DispatchConsumer, DispatchPublisher, DispatchQueue};
pub use store::{
    Activity, CancelOutcome, Claim, DefinitionStore, EventView, FinishCall, FinishResult, Handover, LeaseStatus,
    LoadError, LockedRun, NextClaim, Notifier, OutboxStore, OutboxSweep, PassTask, PublishError, Published, Reaped,
    RunDetail, RunPass, RunSet, RunStore, RunSummary, ScheduleStore, Scope, Store, TaskInputs, TaskOutcome,
    TaskRunView, TokenStore, Topic, TransitionError, WorkerInfo, WorkerRegistration, WorkerRegistry,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The contract's sections, read as text: a case is a `pub async fn`.
    const SECTIONS: [&str; 21] = [
        include_str!("contract/api.rs"),
        include_str!("contract/claims.rs"),
        include_str!("contract/concurrency.rs"),
        include_str!("contract/conditions.rs"),
        include_str!("contract/definitions.rs"),
        include_str!("contract/finishing.rs"),
        include_str!("contract/generic.rs"),
        include_str!("contract/handoff.rs"),
        include_str!("contract/history.rs"),
        include_str!("contract/limits.rs"),
        include_str!("contract/map.rs"),
        include_str!("contract/model.rs"),
        include_str!("contract/outbox.rs"),
        include_str!("contract/pass.rs"),
        include_str!("contract/polling.rs"),
        include_str!("contract/priority.rs"),
        include_str!("contract/queries.rs"),
        include_str!("contract/reads.rs"),
        include_str!("contract/reaper.rs"),
        include_str!("contract/retry.rs"),
        include_str!("contract/schedules.rs"),
    ];

    /// A case written but left off `store_contract_tests!`'s list would
    /// never run, silently; one listed but not written would not compile.
    #[test]
    fn every_contract_case_is_listed_in_the_macro_and_every_section_is_read() {
        let written: BTreeSet<&str> = SECTIONS
            .iter()
            .flat_map(|s| s.lines())
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .filter_map(|l| l.split(['<', '(']).next())
            .collect();
        let macro_text = include_str!("contract/mod.rs");
        let list = macro_text
            .split_once("@cases $factory;")
            .and_then(|(_, rest)| rest.split_once(");"))
            .map(|(list, _)| list)
            .expect("store_contract_tests! lists its cases after `@cases $factory;`");
        let listed: BTreeSet<&str> = list.split(',').map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(
            written, listed,
            "store_contract_tests! must list exactly the written cases"
        );
        let modules = macro_text.lines().filter(|l| l.starts_with("mod ")).count();
        assert_eq!(modules, SECTIONS.len(), "a contract section is missing from SECTIONS");
    }
}
