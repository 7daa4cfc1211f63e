//! Run-state derivation (docs/design/state-machines.md#deriving-the-run-state)
//! and compensation order
//! (docs/design/compensation.md#reverse-dependency-order): pure functions of
//! task states, so they are property-tested without a database.

use std::collections::{BTreeSet, HashMap};

use crate::definition::WorkflowDefinition;
use crate::state::{CancelReason, RunState, TaskRunState};

/// A run's forward task runs counted by state (cancellations by reason).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskTally {
    /// Waiting for dependencies.
    pub pending: u64,
    /// Dispatched, not yet claimed.
    pub ready: u64,
    /// Claimed by a worker.
    pub running: u64,
    /// Waiting for `retry_at`.
    pub retrying: u64,
    /// Finished with an output.
    pub succeeded: u64,
    /// Failed for good (a resting `failed` row;
    /// docs/design/state-machines.md#failed-for-good).
    pub failed: u64,
    /// Cancelled by a user.
    pub cancelled_by_user: u64,
    /// Cancelled because a dependency failed for good.
    pub cancelled_upstream: u64,
    /// Skipped by its condition or trigger: a success for the run's sake
    /// (docs/design/conditions.md#skipping).
    pub skipped: u64,
    /// Whether any task run has `started_at`
    /// (docs/design/state-machines.md#started).
    pub any_started: bool,
}

impl TaskTally {
    /// Counts one task run.
    pub fn add(&mut self, state: TaskRunState, reason: Option<CancelReason>, started: bool) {
        self.add_count(state, reason, 1, started);
    }

    /// Counts `n` task runs alike (a store's `GROUP BY` row); `started`
    /// when any of them started.
    pub fn add_count(&mut self, state: TaskRunState, reason: Option<CancelReason>, n: u64, started: bool) {
        let counter = match state {
            TaskRunState::Pending => &mut self.pending,
            TaskRunState::Ready => &mut self.ready,
            TaskRunState::Running => &mut self.running,
            TaskRunState::Retrying => &mut self.retrying,
            TaskRunState::Succeeded => &mut self.succeeded,
            TaskRunState::Failed => &mut self.failed,
            TaskRunState::Skipped => &mut self.skipped,
            TaskRunState::Cancelled => match reason {
                Some(CancelReason::UpstreamFailed) => &mut self.cancelled_upstream,
                Some(CancelReason::User) | None => &mut self.cancelled_by_user,
            },
        };
        *counter += n;
        self.any_started |= started;
    }

    /// Task runs that keep the run from settling.
    pub fn active(&self) -> u64 {
        self.pending + self.ready + self.running + self.retrying
    }

    /// Every counted task run.
    pub fn total(&self) -> u64 {
        self.active() + self.succeeded + self.failed + self.cancelled_by_user + self.cancelled_upstream + self.skipped
    }
}

/// Where a rollback stands (docs/design/compensation.md#one-at-a-time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompensationProgress {
    /// No compensator has been created (or none is due).
    NotStarted,
    /// A compensator is active, or the next one is due.
    Outstanding,
    /// Every compensator in the order succeeded (or there were none).
    Finished,
    /// A compensator failed for good; the rest never run.
    Halted,
}

/// What a run's task states say about the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not settled, nothing started.
    Pending,
    /// Not settled, something started.
    Running,
    /// Forward tasks settled as failed; the rollback must start or go on.
    /// The run stays `running` meanwhile.
    Compensating,
    /// Settled: terminal state to store.
    Settled(RunState),
}

impl Verdict {
    /// The verdict on a run that is not settled: `running` once anything
    /// has started, else `pending`.
    pub fn unsettled(any_started: bool) -> Self {
        if any_started { Self::Running } else { Self::Pending }
    }

    /// The run state to store for this verdict.
    pub fn run_state(self) -> RunState {
        match self {
            Self::Pending => RunState::Pending,
            Self::Running | Self::Compensating => RunState::Running,
            Self::Settled(state) => state,
        }
    }
}

/// Derives a run's state from its forward tasks and its rollback.
///
/// Settled means no forward task is pending, ready, running or retrying and
/// no compensation is outstanding. Until then: `running` once any task has
/// started, else `pending`. A settled run is cancelled if any task was
/// cancelled by a user; else failed if any failed for good (after its
/// rollback); else succeeded: every task succeeded or was skipped. An
/// empty tally is not a success: it stays pending.
///
/// A cancel *request* is not an input: the scheduler turns it into
/// user-cancelled tasks, so a request that found nothing left to cancel
/// leaves the outcome to the tasks (a run whose last task succeeded before
/// it saw the cancel succeeds).
pub fn derive_run_state(tally: &TaskTally, compensation: CompensationProgress) -> Verdict {
    if tally.active() > 0 || tally.total() == 0 {
        return Verdict::unsettled(tally.any_started);
    }
    if tally.cancelled_by_user > 0 {
        return Verdict::Settled(RunState::Cancelled);
    }
    if tally.failed > 0 || tally.cancelled_upstream > 0 {
        return match compensation {
            CompensationProgress::NotStarted | CompensationProgress::Outstanding => Verdict::Compensating,
            CompensationProgress::Finished | CompensationProgress::Halted => Verdict::Settled(RunState::Failed),
        };
    }
    Verdict::Settled(RunState::Succeeded)
}

/// The compensators to run, in order: the reverse of the topological order
/// restricted to the succeeded forward tasks that have a compensator.
/// Returns `(forward key, compensator key)` pairs.
pub fn compensation_order<'d>(def: &'d WorkflowDefinition, succeeded: &BTreeSet<&str>) -> Vec<(&'d str, &'d str)> {
    let mut order: Vec<(&str, &str)> = def
        .graph()
        .topological_order()
        .into_iter()
        .filter(|key| succeeded.contains(key))
        .filter_map(|key| def.compensator_of(key).map(|c| (key, c.key())))
        .collect();
    order.reverse();
    order
}

/// What the rollback should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompensationStep {
    /// Create (and dispatch) this compensator now.
    Start(String),
    /// The current compensator is still active.
    Wait,
    /// Every compensator succeeded.
    Done,
    /// A compensator failed for good; the rest are never created.
    Halted,
}

impl CompensationStep {
    /// The progress this step means, for [`derive_run_state`].
    pub fn progress(&self, any_created: bool) -> CompensationProgress {
        match self {
            Self::Start(_) if !any_created => CompensationProgress::NotStarted,
            Self::Start(_) | Self::Wait => CompensationProgress::Outstanding,
            Self::Done => CompensationProgress::Finished,
            Self::Halted => CompensationProgress::Halted,
        }
    }
}

/// The next step of a rollback, one compensator at a time: the first
/// compensator in `order` without a row starts once every earlier one
/// succeeded. `rows` maps compensator keys to their current states.
pub fn next_compensation_step(order: &[&str], rows: &HashMap<&str, TaskRunState>) -> CompensationStep {
    for &key in order {
        match rows.get(key) {
            None => return CompensationStep::Start(key.to_owned()),
            Some(TaskRunState::Succeeded) => {}
            Some(TaskRunState::Failed | TaskRunState::Cancelled) => return CompensationStep::Halted,
            Some(_) => return CompensationStep::Wait,
        }
    }
    CompensationStep::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::parse_value;
    use proptest::prelude::*;
    use serde_json::json;

    const STATES: [TaskRunState; 7] = [
        TaskRunState::Pending,
        TaskRunState::Ready,
        TaskRunState::Running,
        TaskRunState::Succeeded,
        TaskRunState::Failed,
        TaskRunState::Retrying,
        TaskRunState::Cancelled,
    ];

    proptest! {
        /// A store's grouped count is the same tally as adding the rows one by one.
        #[test]
        fn add_count_is_repeated_add(
            rows in proptest::collection::vec((0..7usize, any::<bool>(), 0..5u64, any::<bool>()), 0..10)
        ) {
            let (mut grouped, mut single) = (TaskTally::default(), TaskTally::default());
            for (state, upstream, n, started) in rows {
                let reason = (STATES[state] == TaskRunState::Cancelled)
                    .then_some(if upstream { CancelReason::UpstreamFailed } else { CancelReason::User });
                grouped.add_count(STATES[state], reason, n, started && n > 0);
                for _ in 0..n {
                    single.add(STATES[state], reason, started);
                }
            }
            prop_assert_eq!(grouped, single);
        }
    }

    fn tally(states: &[(TaskRunState, Option<CancelReason>)], started: bool) -> TaskTally {
        let mut t = TaskTally::default();
        for &(s, r) in states {
            t.add(s, r, started);
        }
        t
    }

    #[test]
    fn precedence_user_cancel_then_failure_then_success() {
        use TaskRunState::*;
        let user = Some(CancelReason::User);
        let up = Some(CancelReason::UpstreamFailed);
        let done = CompensationProgress::Finished;
        assert_eq!(
            derive_run_state(&tally(&[(Cancelled, user), (Failed, None)], true), done),
            Verdict::Settled(RunState::Cancelled)
        );
        assert_eq!(
            derive_run_state(
                &tally(&[(Failed, None), (Cancelled, up), (Succeeded, None)], true),
                done
            ),
            Verdict::Settled(RunState::Failed)
        );
        assert_eq!(
            derive_run_state(&tally(&[(Succeeded, None), (Succeeded, None)], true), done),
            Verdict::Settled(RunState::Succeeded)
        );
        assert_eq!(derive_run_state(&TaskTally::default(), done), Verdict::Pending);
    }

    #[test]
    fn a_failed_run_is_held_running_until_its_rollback_settles() {
        let t = tally(&[(TaskRunState::Succeeded, None), (TaskRunState::Failed, None)], true);
        assert_eq!(
            derive_run_state(&t, CompensationProgress::NotStarted),
            Verdict::Compensating
        );
        assert_eq!(
            derive_run_state(&t, CompensationProgress::Outstanding),
            Verdict::Compensating
        );
        assert_eq!(
            derive_run_state(&t, CompensationProgress::Halted),
            Verdict::Settled(RunState::Failed)
        );
        assert_eq!(Verdict::Compensating.run_state(), RunState::Running);
    }

    #[test]
    fn unsettled_runs_are_pending_until_something_starts() {
        let ready = [(TaskRunState::Ready, None)];
        assert_eq!(
            derive_run_state(&tally(&ready, false), CompensationProgress::NotStarted),
            Verdict::Pending
        );
        assert_eq!(
            derive_run_state(&tally(&ready, true), CompensationProgress::NotStarted),
            Verdict::Running
        );
    }

    fn saga() -> WorkflowDefinition {
        parse_value(json!({"name": "saga", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]},
            {"key": "c", "task_type": "noop", "depends_on": ["a"]},
            {"key": "d", "task_type": "fail", "depends_on": ["b", "c"]},
            {"key": "undo_a", "task_type": "noop", "compensate_for": "a"},
            {"key": "undo_c", "task_type": "noop", "compensate_for": "c"},
            {"key": "undo_b", "task_type": "noop", "compensate_for": "b"}
        ]}))
        .unwrap()
    }

    #[test]
    fn compensation_runs_in_reverse_dependency_order_one_at_a_time() {
        let def = saga();
        let order = compensation_order(&def, &BTreeSet::from(["a", "b", "c"]));
        assert_eq!(order, [("c", "undo_c"), ("b", "undo_b"), ("a", "undo_a")]);
        let keys: Vec<&str> = order.iter().map(|(_, c)| *c).collect();
        let mut rows = HashMap::new();
        assert_eq!(
            next_compensation_step(&keys, &rows),
            CompensationStep::Start("undo_c".into())
        );
        rows.insert("undo_c", TaskRunState::Running);
        assert_eq!(next_compensation_step(&keys, &rows), CompensationStep::Wait);
        rows.insert("undo_c", TaskRunState::Succeeded);
        assert_eq!(
            next_compensation_step(&keys, &rows),
            CompensationStep::Start("undo_b".into())
        );
        rows.insert("undo_b", TaskRunState::Failed);
        assert_eq!(next_compensation_step(&keys, &rows), CompensationStep::Halted);
        assert_eq!(next_compensation_step(&[], &rows), CompensationStep::Done);
        assert_eq!(compensation_order(&def, &BTreeSet::from(["a"])), [("a", "undo_a")]);
    }

    fn arb_state() -> impl Strategy<Value = (TaskRunState, Option<CancelReason>)> {
        (0usize..8).prop_map(|i| match i {
            7 => (TaskRunState::Cancelled, Some(CancelReason::UpstreamFailed)),
            6 => (TaskRunState::Cancelled, Some(CancelReason::User)),
            i => (STATES[i], None),
        })
    }

    fn arb_progress() -> impl Strategy<Value = CompensationProgress> {
        prop_oneof![
            Just(CompensationProgress::NotStarted),
            Just(CompensationProgress::Outstanding),
            Just(CompensationProgress::Finished),
            Just(CompensationProgress::Halted),
        ]
    }

    proptest! {
        #[test]
        fn never_terminal_while_a_forward_task_is_active_or_a_rollback_outstanding(
            states in prop::collection::vec(arb_state(), 0..20),
            started in any::<bool>(),
            progress in arb_progress(),
        ) {
            let t = tally(&states, started);
            let v = derive_run_state(&t, progress);
            if t.active() > 0 {
                prop_assert!(matches!(v, Verdict::Pending | Verdict::Running));
            }
            if matches!(v, Verdict::Settled(RunState::Failed)) {
                prop_assert!(matches!(progress, CompensationProgress::Finished | CompensationProgress::Halted));
            }
            if let Verdict::Settled(state) = v {
                prop_assert_eq!(t.active(), 0);
                let cancelled = states.iter().any(|s| s.1 == Some(CancelReason::User));
                let failed = states.iter().any(|s| s.0 == TaskRunState::Failed || s.1 == Some(CancelReason::UpstreamFailed));
                match state {
                    RunState::Cancelled => prop_assert!(cancelled),
                    RunState::Failed => prop_assert!(!cancelled && failed),
                    RunState::Succeeded => prop_assert!(states.iter().all(|s| s.0 == TaskRunState::Succeeded) && !states.is_empty()),
                    _ => prop_assert!(false, "settled into {:?}", state),
                }
            }
        }

        #[test]
        fn compensation_order_reverses_a_dependency_order_over_exactly_the_succeeded_compensable_tasks(
            mask in prop::collection::vec(any::<bool>(), 4),
        ) {
            let def = saga();
            let keys = ["a", "b", "c", "d"];
            let succeeded: BTreeSet<&str> = keys.iter().zip(&mask).filter(|(_, m)| **m).map(|(k, _)| *k).collect();
            let order = compensation_order(&def, &succeeded);
            let expected: BTreeSet<&str> = succeeded.iter().copied().filter(|k| def.compensator_of(k).is_some()).collect();
            let got: BTreeSet<&str> = order.iter().map(|(k, _)| *k).collect();
            prop_assert_eq!(got, expected);
            // Reversed, the order must respect every dependency.
            for (i, (later, _)) in order.iter().enumerate() {
                for (earlier, _) in &order[i + 1..] {
                    prop_assert!(!def.graph().transitive_dependencies_of(earlier).contains(later),
                        "{} depends on {} but is undone after it", earlier, later);
                }
            }
        }
    }
}
