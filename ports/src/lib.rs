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
pub use handler::{FailureKind, Handler, HandlerError, TaskContext};
pub use ids::{DispatchId, RunId, TaskRunId, WorkerId, WorkflowId};
pub use observer::{Observer, RunEvent, TaskEvent};
pub use queue::{Delivery, Dispatch, DispatchConsumer, DispatchPublisher, DispatchQueue, QueueError};
pub use store::{
    Activity, CancelOutcome, Claim, DefinitionStore, EventView, FinishResult, LeaseStatus, LoadError, Notifier,
    OutboxStore, OutboxSweep, PassRun, PassTask, PublishError, Published, Reaped, RunDetail, RunPass, RunSet, RunStore,
    RunSummary, Scope, Store, StoreError, TaskInputs, TaskOutcome, TaskRunView, Topic, TransitionError, WorkerInfo,
    WorkerRegistration, WorkerRegistry,
};
