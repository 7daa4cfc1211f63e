//! The WorkflowRun and TaskRun machines
//! (docs/design/state-machines.md#taskrun), with the two added TaskRun edges
//! `cancel_retrying` and `reap_lease_final`
//! (docs/design/state-machines.md#added-edges).

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use crate::machine::{RetryEdge, State, StateMachine, Transition, TransitionName};

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const VALUES: &'static [Self] = &[$(Self::$variant,)+];

            /// The stable lower-case name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(UnknownName { kind: stringify!($name), name: other.to_owned() }),
                }
            }
        }
    };
}

macro_rules! impl_state {
    ($($name:ident),+) => {$(
        impl State for $name {
            const ALL: &'static [Self] = $name::VALUES;
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }
    )+};
}

macro_rules! impl_transition_name {
    ($($name:ident),+) => {$(
        impl TransitionName for $name {
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }
    )+};
}

/// A stored name that is not one of the enum's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{name}' is not a known {kind}")]
pub struct UnknownName {
    /// Which enum was being parsed.
    pub kind: &'static str,
    /// The text that did not match.
    pub name: String,
}

named_enum! {
    /// The state of a workflow run.
    RunState {
        /// Created; no task has started.
        Pending => "pending",
        /// At least one task has started and the run is not settled.
        Running => "running",
        /// Every forward task succeeded.
        Succeeded => "succeeded",
        /// A task failed for good (after any rollback settled).
        Failed => "failed",
        /// A user cancelled it.
        Cancelled => "cancelled",
    }
}

named_enum! {
    /// The edges of the WorkflowRun machine.
    RunTransition {
        /// pending → running.
        Start => "start",
        /// pending → cancelled, when nothing had started.
        CancelBeforeStart => "cancel_before_start",
        /// running → succeeded.
        Succeed => "succeed",
        /// running → failed.
        Fail => "fail",
        /// running → cancelled.
        Cancel => "cancel",
        /// failed | cancelled → running: an operator's retry opens the next
        /// generation (a retry edge, docs/design/retry.md).
        Resume => "resume",
    }
}

named_enum! {
    /// The state of one task run.
    TaskRunState {
        /// Waiting for its dependencies.
        Pending => "pending",
        /// Eligible for dispatch; has an outbox row for its current token.
        Ready => "ready",
        /// Claimed by a worker holding a lease.
        Running => "running",
        /// Finished with an output. Terminal.
        Succeeded => "succeeded",
        /// An attempt failed. Resting here means failed for good
        /// (docs/design/state-machines.md#failed-for-good).
        Failed => "failed",
        /// Waiting for `retry_at` before the next attempt.
        Retrying => "retrying",
        /// Will not run: see its cancel reason. Terminal.
        Cancelled => "cancelled",
        /// Did not run, by the definition's own rule (`when`, `trigger`):
        /// see its skip reason. Terminal, never compensated, and counts
        /// towards a run's success (docs/design/conditions.md).
        Skipped => "skipped",
    }
}

impl TaskRunState {
    /// Whether a forward task in this state keeps its run from settling.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Pending | Self::Ready | Self::Running | Self::Retrying)
    }
}

named_enum! {
    /// The edges of the TaskRun machine.
    TaskTransition {
        /// pending → ready: every dependency succeeded.
        DependenciesSatisfied => "dependencies_satisfied",
        /// pending → cancelled.
        CancelPending => "cancel_pending",
        /// ready → running: acquires the lease, token + 1.
        Claim => "claim",
        /// ready → cancelled.
        CancelReady => "cancel_ready",
        /// running → succeeded (lease).
        Succeed => "succeed",
        /// running → failed (lease).
        Fail => "fail",
        /// running → cancelled (lease).
        CancelRunning => "cancel_running",
        /// running → ready: the lease expired and attempts remain (reaper only).
        ReapLease => "reap_lease",
        /// running → failed: the lease expired on the final attempt (reaper only).
        ReapLeaseFinal => "reap_lease_final",
        /// failed → retrying: attempt + 1, `retry_at` set.
        ScheduleRetry => "schedule_retry",
        /// retrying → ready: `retry_at` has passed.
        RetryReady => "retry_ready",
        /// retrying → cancelled.
        CancelRetrying => "cancel_retrying",
        /// succeeded | failed | cancelled → pending | ready: the task is in an
        /// operator's retry set (a retry edge, docs/design/retry.md).
        Reset => "reset",
        /// pending → skipped: its condition is false, or the rule of its
        /// trigger says a skipped dependency skips it
        /// (docs/design/conditions.md#skipping).
        Skip => "skip",
        /// pending → failed: its `when` could not be evaluated. Failed at
        /// rest, so failed for good (docs/design/conditions.md#when).
        FailCondition => "fail_condition",
        /// pending → succeeded: every child of a mapped task succeeded; its
        /// output is theirs in index order (docs/design/map.md#collecting).
        Collect => "collect",
        /// pending → failed: a mapped task's source is not an array or is
        /// too long, or one of its children failed for good. Failed at rest,
        /// so failed for good (docs/design/map.md#collecting).
        FailMap => "fail_map",
    }
}

named_enum! {
    /// Why a task run was cancelled (set iff its state is cancelled).
    CancelReason {
        /// A user (or operator) cancelled the run.
        User => "user",
        /// A dependency failed for good, transitively.
        UpstreamFailed => "upstream_failed",
    }
}

named_enum! {
    /// Why a task run was skipped (set iff its state is skipped;
    /// docs/design/conditions.md#skipping).
    SkipReason {
        /// Its `when` evaluated to false.
        ConditionFalse => "condition_false",
        /// Its trigger rule does not run it after a skipped dependency.
        UpstreamSkipped => "upstream_skipped",
        /// It is mapped over an empty array (docs/design/map.md#expanding).
        EmptyMap => "empty_map",
    }
}

impl_state!(RunState, TaskRunState);
impl_transition_name!(RunTransition, TaskTransition);

/// The WorkflowRun machine.
pub type RunMachine = StateMachine<RunState, RunTransition>;
/// The TaskRun machine.
pub type TaskMachine = StateMachine<TaskRunState, TaskTransition>;

fn run_table() -> Vec<Transition<RunState, RunTransition>> {
    use RunState::*;
    use RunTransition as T;
    let edge = |name, source, target| Transition {
        name,
        source,
        target,
        requires_lease: false,
    };
    vec![
        edge(T::Start, Pending, Running),
        edge(T::CancelBeforeStart, Pending, Cancelled),
        edge(T::Succeed, Running, Succeeded),
        edge(T::Fail, Running, Failed),
        edge(T::Cancel, Running, Cancelled),
    ]
}

fn task_table() -> Vec<Transition<TaskRunState, TaskTransition>> {
    use TaskRunState::*;
    use TaskTransition as T;
    let edge = |name, source, target, requires_lease| Transition {
        name,
        source,
        target,
        requires_lease,
    };
    vec![
        edge(T::DependenciesSatisfied, Pending, Ready, false),
        edge(T::CancelPending, Pending, Cancelled, false),
        edge(T::Claim, Ready, Running, false),
        edge(T::CancelReady, Ready, Cancelled, false),
        edge(T::Succeed, Running, Succeeded, true),
        edge(T::Fail, Running, Failed, true),
        edge(T::CancelRunning, Running, Cancelled, true),
        edge(T::ReapLease, Running, Ready, false),
        edge(T::ReapLeaseFinal, Running, Failed, false),
        edge(T::ScheduleRetry, Failed, Retrying, false),
        edge(T::RetryReady, Retrying, Ready, false),
        edge(T::CancelRetrying, Retrying, Cancelled, false),
        edge(T::Skip, Pending, Skipped, false),
        edge(T::FailCondition, Pending, Failed, false),
        edge(T::Collect, Pending, Succeeded, false),
        edge(T::FailMap, Pending, Failed, false),
    ]
}

/// Builds the WorkflowRun machine, validating its table.
pub fn build_run_machine() -> Result<RunMachine, crate::machine::MachineError> {
    StateMachine::new(
        RunState::Pending,
        &[RunState::Succeeded, RunState::Failed, RunState::Cancelled],
        run_table(),
    )?
    .with_retry_edges(vec![RetryEdge {
        name: RunTransition::Resume,
        sources: vec![RunState::Failed, RunState::Cancelled],
        targets: vec![RunState::Running],
    }])
}

/// Builds the TaskRun machine, validating its table.
pub fn build_task_machine() -> Result<TaskMachine, crate::machine::MachineError> {
    use TaskRunState::{Cancelled, Failed, Pending, Ready, Skipped, Succeeded};
    StateMachine::new(Pending, &[Succeeded, Cancelled, Skipped], task_table())?.with_retry_edges(vec![RetryEdge {
        name: TaskTransition::Reset,
        sources: vec![Succeeded, Failed, Cancelled, Skipped],
        targets: vec![Pending, Ready],
    }])
}

static RUN_MACHINE: LazyLock<RunMachine> =
    LazyLock::new(|| build_run_machine().expect("the WorkflowRun table is valid (checked by a unit test)"));
static TASK_MACHINE: LazyLock<TaskMachine> =
    LazyLock::new(|| build_task_machine().expect("the TaskRun table is valid (checked by a unit test)"));

/// The WorkflowRun machine.
pub fn run_machine() -> &'static RunMachine {
    &RUN_MACHINE
}

impl RunState {
    /// Whether the run has ended: no edge of the WorkflowRun machine leaves
    /// this state.
    pub fn is_terminal(self) -> bool {
        run_machine().is_terminal(self)
    }
}

/// The TaskRun machine.
pub fn task_machine() -> &'static TaskMachine {
    &TASK_MACHINE
}

/// The state a task run starts in: ready with no dependencies, else pending.
pub fn initial_task_run_state(dependency_count: usize) -> TaskRunState {
    if dependency_count == 0 {
        TaskRunState::Ready
    } else {
        TaskRunState::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn both_real_tables_are_valid() {
        let run = build_run_machine().unwrap();
        let task = build_task_machine().unwrap();
        assert_eq!(run.transitions().len(), 5);
        assert_eq!(task.transitions().len(), 16);
        assert_eq!(run.retry_edges().len(), 1);
        assert_eq!(task.retry_edges().len(), 1);
    }

    #[test]
    fn only_the_three_finishing_edges_require_a_lease() {
        let leased: Vec<_> = task_machine()
            .transitions()
            .iter()
            .filter(|t| t.requires_lease)
            .map(|t| t.name)
            .collect();
        assert_eq!(
            leased,
            [
                TaskTransition::Succeed,
                TaskTransition::Fail,
                TaskTransition::CancelRunning
            ]
        );
        assert!(!task_machine().requires_lease(TaskTransition::Claim));
    }

    #[test]
    fn failed_is_not_terminal_but_succeeded_cancelled_and_skipped_are() {
        let m = task_machine();
        assert!(!m.is_terminal(TaskRunState::Failed));
        assert!(m.is_terminal(TaskRunState::Succeeded));
        assert!(m.is_terminal(TaskRunState::Cancelled));
        assert!(m.is_terminal(TaskRunState::Skipped));
        assert!(!TaskRunState::Skipped.is_active());
    }

    #[test]
    fn names_round_trip_through_strings() {
        for &t in TaskTransition::VALUES {
            assert_eq!(t.as_str().parse::<TaskTransition>().unwrap(), t);
            let known = task_machine().get_by_str(t.as_str()).is_some()
                || task_machine().retry_edges().iter().any(|r| r.name == t);
            assert!(known, "{t} is in neither table");
        }
        for &s in RunState::VALUES {
            assert_eq!(s.as_str().parse::<RunState>().unwrap(), s);
        }
        assert!("done".parse::<TaskRunState>().is_err());
    }

    #[test]
    fn initial_state_follows_the_dependency_count() {
        assert_eq!(initial_task_run_state(0), TaskRunState::Ready);
        assert_eq!(initial_task_run_state(3), TaskRunState::Pending);
    }

    fn rank(s: RunState) -> u8 {
        match s {
            RunState::Pending => 0,
            RunState::Running => 1,
            _ => 2,
        }
    }

    proptest! {
        #[test]
        fn random_legal_task_walks_never_leave_a_terminal_state(choices in prop::collection::vec(0usize..14, 0..64)) {
            let m = task_machine();
            let mut state = m.initial();
            for c in choices {
                let legal: Vec<_> = m.transitions().iter().filter(|t| t.source == state).collect();
                if legal.is_empty() {
                    prop_assert!(m.is_terminal(state));
                    break;
                }
                prop_assert!(!m.is_terminal(state));
                state = legal[c % legal.len()].target;
            }
        }

        #[test]
        fn random_legal_run_walks_never_go_backwards(choices in prop::collection::vec(0usize..5, 0..16)) {
            let m = run_machine();
            let mut state = m.initial();
            for c in choices {
                let legal: Vec<_> = m.transitions().iter().filter(|t| t.source == state).collect();
                if legal.is_empty() {
                    prop_assert!(m.is_terminal(state));
                    break;
                }
                let next = legal[c % legal.len()].target;
                prop_assert!(rank(next) > rank(state));
                state = next;
            }
        }

        #[test]
        fn any_name_is_legal_exactly_from_its_source(t in 0usize..15, s in 0usize..8) {
            let name = TaskTransition::VALUES[t];
            // The retry edge is not in the table (names_round_trip_through_strings).
            prop_assume!(name != TaskTransition::Reset);
            let from = TaskRunState::VALUES[s];
            let edge = task_machine().get(name).unwrap();
            prop_assert_eq!(task_machine().is_legal(name, from), edge.source == from);
        }
    }
}
