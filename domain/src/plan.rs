//! The scheduler pass's decisions (docs/design/scheduler.md#the-pass) as pure
//! functions: what the forward tasks that finished since the last pass ask
//! of their dependents, what a conditional task does once they have all
//! finished, and which run edges store a verdict. The pass
//! gathers their inputs from the store and applies their answers; it
//! decides nothing itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Map, Value};

use crate::condition::{self, Trigger};
use crate::definition::{TaskDefinition, WorkflowDefinition};
use crate::derive::{CompensationProgress, CompensationStep, Verdict, compensation_order, next_compensation_step};
use crate::graph::DependencyGraph;
use crate::state::{RunState, RunTransition, SkipReason, TaskRunState};

/// What newly finished forward tasks ask of the tasks below them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reaction<'g> {
    /// Per dependent, how many of its dependencies just released it: the
    /// amount its pending-dependency counter goes down by. A task is
    /// promoted when its counter reaches zero. A plain task counts
    /// successes only; a conditional one also counts the outcomes its
    /// trigger runs after, and the pass decides it once only its hold is
    /// left (docs/design/conditions.md#deciding).
    pub satisfied: BTreeMap<&'g str, u32>,
    /// The first wave below a task that failed for good
    /// (docs/design/state-machines.md#failed-for-good): its direct
    /// dependents other than those that run after anything (`all_done`).
    /// They can never run and are cancelled `upstream_failed`; the pass
    /// carries the cancellation further with [`failure_wave`].
    pub upstream_failed: BTreeSet<&'g str>,
    /// Everything downstream of a cancelled task: it inherits the user's
    /// reason, not `upstream_failed`.
    pub upstream_cancelled: BTreeSet<&'g str>,
    /// The dependents of a skipped task whose trigger needs every
    /// dependency to succeed: skipped `upstream_skipped`. Each is flagged
    /// by its skip, so the pass reacts to it in turn.
    pub upstream_skipped: BTreeSet<&'g str>,
}

/// Reacts to the forward tasks that finished since the last pass, given as
/// `(key, state)`; `trigger` gives each task's trigger rule. States other
/// than succeeded, failed, cancelled and skipped (a flagged row that moved
/// on since, or a first claim) ask nothing. Keys the graph does not know
/// ask nothing either: the definition is the authority on who depends on
/// whom.
pub fn react<'g, 'k>(
    graph: &'g DependencyGraph,
    trigger: impl Fn(&str) -> Trigger,
    finished: impl IntoIterator<Item = (&'k str, TaskRunState)>,
) -> Reaction<'g> {
    let mut reaction = Reaction::default();
    for (key, state) in finished {
        match state {
            TaskRunState::Succeeded => {
                for dependent in graph.dependents_of(key) {
                    *reaction.satisfied.entry(dependent).or_default() += 1;
                }
            }
            TaskRunState::Skipped => {
                for dependent in graph.dependents_of(key) {
                    if trigger(dependent) == Trigger::AllSucceeded {
                        reaction.upstream_skipped.insert(dependent);
                    } else {
                        *reaction.satisfied.entry(dependent).or_default() += 1;
                    }
                }
            }
            TaskRunState::Failed => {
                let (blocked, released) = failure_wave(graph, &trigger, [key]);
                reaction.upstream_failed.extend(blocked);
                for (dependent, n) in released {
                    *reaction.satisfied.entry(dependent).or_default() += n;
                }
            }
            TaskRunState::Cancelled => reaction.upstream_cancelled.extend(graph.transitive_dependents_of(key)),
            TaskRunState::Pending | TaskRunState::Ready | TaskRunState::Running | TaskRunState::Retrying => {}
        }
    }
    reaction
}

/// One wave of a failure's cancellation: the direct dependents of `moved`
/// (tasks that just failed for good, or that the store just cancelled
/// `upstream_failed`) that it cancels, and the `all_done` dependents it
/// releases instead, one count per task moved. The pass applies a wave,
/// then the next one from the rows the store actually moved, so a task
/// skipped or cancelled earlier stops the spread below it and is never
/// counted twice (docs/design/conditions.md#deciding). A definition without
/// triggers may apply [`DependencyGraph::transitive_dependents_of`] at
/// once: every task below a failure is then still pending.
pub fn failure_wave<'g, 'k>(
    graph: &'g DependencyGraph,
    trigger: impl Fn(&str) -> Trigger,
    moved: impl IntoIterator<Item = &'k str>,
) -> (BTreeSet<&'g str>, BTreeMap<&'g str, u32>) {
    let mut blocked = BTreeSet::new();
    let mut released = BTreeMap::new();
    for key in moved {
        for dependent in graph.dependents_of(key) {
            if trigger(dependent) == Trigger::AllDone {
                *released.entry(dependent).or_default() += 1;
            } else {
                blocked.insert(dependent);
            }
        }
    }
    (blocked, released)
}

/// What the pass does with a conditional task once all its dependencies
/// have finished (docs/design/conditions.md#deciding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Lower its hold: it runs (or waits at its gate).
    Run,
    /// It is skipped, for this reason.
    Skip(SkipReason),
    /// Its `when` could not be evaluated: it fails for good with this error.
    Fail(String),
}

/// Decides a conditional task whose dependencies have all finished, given
/// their `(state, output)` and the run's input.
pub fn decide(
    task: &TaskDefinition,
    dependencies: &BTreeMap<String, (TaskRunState, Option<Value>)>,
    run_input: &Value,
) -> Decision {
    let trigger = task.trigger();
    let any_succeeded = dependencies.values().any(|(s, _)| *s == TaskRunState::Succeeded);
    let any_skipped = dependencies.values().any(|(s, _)| *s == TaskRunState::Skipped);
    match trigger {
        // A skipped dependency skipped it already; what is left succeeded.
        Trigger::AllSucceeded if any_skipped => return Decision::Skip(SkipReason::UpstreamSkipped),
        Trigger::NoneFailed if !dependencies.is_empty() && !any_succeeded => {
            return Decision::Skip(SkipReason::UpstreamSkipped);
        }
        _ => {}
    }
    let Some(when) = task.when() else {
        return Decision::Run;
    };
    let inputs = condition_inputs(trigger, dependencies);
    match condition::evaluate(when, &inputs, run_input) {
        Ok(true) => Decision::Run,
        Ok(false) => Decision::Skip(SkipReason::ConditionFalse),
        Err(e) => Decision::Fail(format!("`when` could not be evaluated: {e}")),
    }
}

/// The `inputs` a task sees, in its `when` and in its handler: each
/// dependency's output by key (null when it did not succeed), or, with the
/// `all_done` trigger, its state beside its output
/// (docs/design/conditions.md#inputs).
pub fn condition_inputs(
    trigger: Trigger,
    dependencies: &BTreeMap<String, (TaskRunState, Option<Value>)>,
) -> Map<String, Value> {
    dependencies
        .iter()
        .map(|(key, (state, output))| {
            let value = match trigger {
                Trigger::AllDone => condition::dependency_view(*state, output.clone()),
                Trigger::AllSucceeded | Trigger::NoneFailed => output.clone().unwrap_or(Value::Null),
            };
            (key.clone(), value)
        })
        .collect()
}

/// The rollback's next move (docs/design/compensation.md#one-at-a-time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compensation<'d> {
    /// The compensator to create now, as `(forward key, compensator key)`.
    pub start: Option<(&'d str, &'d str)>,
    /// Where the rollback stands once `start` is applied.
    pub progress: CompensationProgress,
}

/// Decides the rollback of a run whose forward tasks settled as failed:
/// the compensators of the `succeeded` forward tasks run one at a time in
/// reverse dependency order, each once every earlier one succeeded; a
/// compensator that failed for good halts the rest. `compensators` maps the
/// compensator rows created so far to their states.
pub fn compensate<'d>(
    def: &'d WorkflowDefinition,
    succeeded: &BTreeSet<&str>,
    compensators: &HashMap<&str, TaskRunState>,
) -> Compensation<'d> {
    let order = compensation_order(def, succeeded);
    let keys: Vec<&str> = order.iter().map(|(_, c)| *c).collect();
    match next_compensation_step(&keys, compensators) {
        CompensationStep::Start(key) => Compensation {
            start: order.iter().find(|(_, c)| **c == key).copied(),
            progress: CompensationProgress::Outstanding,
        },
        step => Compensation {
            start: None,
            progress: step.progress(!compensators.is_empty()),
        },
    }
}

/// The run edges, in order, that carry `verdict` to a run stored in
/// `current` along legal edges only
/// (docs/design/state-machines.md#deriving-the-run-state). None when the
/// stored state already says it, and none backwards: a running run whose
/// tasks look unstarted stays running. A pending run that settles takes
/// `start` first, except a cancel before anything started, which has its
/// own edge.
pub fn run_edges(current: RunState, verdict: Verdict, any_started: bool) -> &'static [RunTransition] {
    use RunTransition::{Cancel, CancelBeforeStart, Fail, Start, Succeed};
    match (current, verdict) {
        (RunState::Pending, Verdict::Running | Verdict::Compensating) => &[Start],
        (RunState::Pending, Verdict::Settled(RunState::Cancelled)) if !any_started => &[CancelBeforeStart],
        (RunState::Pending, Verdict::Settled(RunState::Cancelled)) => &[Start, Cancel],
        (RunState::Pending, Verdict::Settled(RunState::Failed)) => &[Start, Fail],
        (RunState::Pending, Verdict::Settled(RunState::Succeeded)) => &[Start, Succeed],
        (RunState::Running, Verdict::Settled(RunState::Cancelled)) => &[Cancel],
        (RunState::Running, Verdict::Settled(RunState::Failed)) => &[Fail],
        (RunState::Running, Verdict::Settled(RunState::Succeeded)) => &[Succeed],
        _ => &[],
    }
}

/// What a forward task's success hands on in its own transaction
/// (docs/design/scheduler.md#handoff): the dependents it alone holds back,
/// which the store makes ready beside the success if their counter is
/// still at one, so the common hop does not wait for a pass; and the
/// joins it holds back with other tasks, whose counters a store may lower
/// beside the success (docs/design/scheduler.md#joins).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// Dependents whose only dependency is the task and that nothing else
    /// holds back (no condition, no map, no concurrency limit in the
    /// workflow), ascending.
    pub dependents: Vec<String>,
    /// Dependents that wait on other tasks too and that nothing else holds
    /// back, ascending. A store that lowers a shared counter cheaply (one
    /// writer, no row versions) lowers each by one beside the success and
    /// makes ready one that reaches zero; a store that does not leaves
    /// them to the pass and flags the success.
    pub joins: Vec<String>,
    /// Whether handing on `dependents` and lowering `joins` is all a pass
    /// would do for this success: then, once they have moved, the success
    /// does not flag its run for a pass. Never true for a task without
    /// dependents (its success may settle the run).
    pub whole: bool,
}

impl Handoff {
    /// Whether it names nothing: the success is flagged for the pass.
    pub fn is_empty(&self) -> bool {
        self.dependents.is_empty() && self.joins.is_empty()
    }
}

/// The [`Handoff`] of a success of task `key` of `def`. Nothing for a
/// task the forward graph does not know (a compensator, a mapped task's
/// child), and nothing in a workflow with concurrency limits, whose gates
/// and slots only the pass moves (docs/design/concurrency.md#gates).
pub fn handoff(def: &WorkflowDefinition, key: &str) -> Handoff {
    if def.has_limits() || def.task(key).is_none_or(TaskDefinition::is_compensator) {
        return Handoff::default();
    }
    let mut whole = true;
    let (mut dependents, mut joins) = (Vec::new(), Vec::new());
    for task in def.graph().dependents_of(key).filter_map(|d| def.task(d)) {
        if task.holds() {
            whole = false;
        } else if task.depends_on().len() == 1 {
            dependents.push(task.key().to_owned());
        } else {
            joins.push(task.key().to_owned());
        }
    }
    Handoff {
        whole: whole && !(dependents.is_empty() && joins.is_empty()),
        dependents,
        joins,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::run_machine;
    use proptest::prelude::*;

    const RUN_STATES: [RunState; 5] = [
        RunState::Pending,
        RunState::Running,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Cancelled,
    ];

    /// A random DAG of `n` tasks `t0…`: each depends on some earlier ones.
    fn arb_graph() -> impl Strategy<Value = (Vec<String>, Vec<Vec<String>>)> {
        (1usize..12).prop_flat_map(|n| {
            prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..4), n).prop_map(move |picks| {
                let keys: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
                let deps = picks
                    .iter()
                    .enumerate()
                    .map(|(i, picks)| {
                        let set: BTreeSet<usize> = if i == 0 {
                            BTreeSet::new()
                        } else {
                            picks.iter().map(|p| p.index(i)).collect()
                        };
                        set.into_iter().map(|d| keys[d].clone()).collect()
                    })
                    .collect();
                (keys, deps)
            })
        })
    }

    fn build(keys: &[String], deps: &[Vec<String>]) -> DependencyGraph {
        DependencyGraph::new(
            keys.iter()
                .zip(deps)
                .map(|(k, d)| (k.as_str(), d.iter().map(String::as_str))),
        )
        .expect("an acyclic graph by construction")
    }

    fn arb_verdict() -> impl Strategy<Value = Verdict> {
        prop_oneof![
            Just(Verdict::Pending),
            Just(Verdict::Running),
            Just(Verdict::Compensating),
            prop::sample::select(RUN_STATES.to_vec()).prop_map(Verdict::Settled),
        ]
    }

    proptest! {
        /// Successes reported in any batches bring each task's counter to
        /// the number of its dependencies that have not succeeded: a task
        /// reaches zero, and is promoted, only when every dependency has.
        #[test]
        fn never_promotes_a_task_with_an_unsucceeded_dependency(
            (keys, deps) in arb_graph(),
            succeeded_mask in prop::collection::vec(any::<bool>(), 12),
            batch_of in prop::collection::vec(0usize..3, 12),
        ) {
            let graph = build(&keys, &deps);
            let mut counters: BTreeMap<&str, i64> =
                keys.iter().zip(&deps).map(|(k, d)| (k.as_str(), d.len() as i64)).collect();
            let succeeded: BTreeSet<&str> =
                keys.iter().zip(&succeeded_mask).filter(|(_, s)| **s).map(|(k, _)| k.as_str()).collect();
            for batch in 0..3 {
                let finished = keys
                    .iter()
                    .enumerate()
                    .filter(|(i, k)| batch_of[*i] == batch && succeeded.contains(k.as_str()))
                    .map(|(_, k)| (k.as_str(), TaskRunState::Succeeded));
                for (key, n) in react(&graph, |_| Trigger::AllSucceeded, finished).satisfied {
                    *counters.get_mut(key).expect("a known key") -= i64::from(n);
                }
            }
            for (key, d) in keys.iter().zip(&deps) {
                let missing = d.iter().filter(|dep| !succeeded.contains(dep.as_str())).count() as i64;
                prop_assert_eq!(counters[key.as_str()], missing, "counter of {}", key);
            }
        }

        /// A failure blocks exactly the tasks downstream of it, wave by wave
        /// from the rows moved (a task already finished stops the spread),
        /// and a cancel blocks everything below it at once; each with its
        /// own reason, and neither satisfies anything.
        #[test]
        fn a_failure_or_cancel_blocks_exactly_its_descendants(
            (keys, deps) in arb_graph(),
            states in prop::collection::vec(0usize..3, 12),
        ) {
            let graph = build(&keys, &deps);
            let finished: Vec<(&str, TaskRunState)> = keys
                .iter()
                .zip(&states)
                .filter_map(|(k, s)| match s {
                    1 => Some((k.as_str(), TaskRunState::Failed)),
                    2 => Some((k.as_str(), TaskRunState::Cancelled)),
                    _ => None,
                })
                .collect();
            let all = |_: &str| Trigger::AllSucceeded;
            let reaction = react(&graph, all, finished.iter().copied());
            prop_assert!(reaction.satisfied.is_empty());
            let done: BTreeSet<&str> = finished.iter().map(|(k, _)| *k).collect();
            // The store moves only rows still pending: every row not finished.
            let mut cancelled: BTreeSet<&str> = BTreeSet::new();
            let mut wave: BTreeSet<&str> = reaction.upstream_failed.clone();
            while !wave.is_empty() {
                let moved: Vec<&str> = wave.into_iter().filter(|k| !done.contains(k) && cancelled.insert(k)).collect();
                let (next, released) = failure_wave(&graph, all, moved.iter().copied());
                prop_assert!(released.is_empty());
                wave = next;
            }
            // Expected: what a walk from each failure reaches through rows
            // that are not finished.
            let mut expected: BTreeSet<&str> = BTreeSet::new();
            let mut stack: Vec<&str> = finished.iter().filter(|(_, s)| *s == TaskRunState::Failed).map(|(k, _)| *k).collect();
            while let Some(key) = stack.pop() {
                for d in graph.dependents_of(key) {
                    if !done.contains(d) && expected.insert(d) {
                        stack.push(d);
                    }
                }
            }
            prop_assert_eq!(cancelled, expected);
            let below: BTreeSet<&str> = finished
                .iter()
                .filter(|(_, s)| *s == TaskRunState::Cancelled)
                .flat_map(|(k, _)| graph.transitive_dependents_of(k))
                .collect();
            prop_assert_eq!(&reaction.upstream_cancelled, &below);
        }

        /// The edges are legal one after another from the stored state, end
        /// in the verdict's state, and leave the run terminal iff the
        /// verdict is settled (nothing forward active, no rollback left).
        #[test]
        fn run_edges_are_legal_and_terminal_iff_settled(
            current in prop::sample::select(RUN_STATES.to_vec()),
            verdict in arb_verdict(),
            any_started in any::<bool>(),
        ) {
            // A verdict never says pending or running as settled.
            prop_assume!(!matches!(verdict, Verdict::Settled(RunState::Pending | RunState::Running)));
            let machine = run_machine();
            let edges = run_edges(current, verdict, any_started);
            let mut state = current;
            for edge in edges {
                prop_assert!(machine.is_legal(*edge, state), "{} from {:?}", edge, state);
                state = machine.get(*edge).expect("a run edge").target;
            }
            if current.is_terminal() {
                prop_assert!(edges.is_empty(), "a finished run never moves");
            } else if !(current == RunState::Running && verdict == Verdict::Pending) {
                prop_assert_eq!(state, verdict.run_state());
                prop_assert_eq!(state.is_terminal(), matches!(verdict, Verdict::Settled(_)));
            }
        }
    }

    /// A definition over the random DAG where the tasks in `undoable` have
    /// a compensator `undo_<key>`.
    fn saga(keys: &[String], deps: &[Vec<String>], undoable: &[bool]) -> WorkflowDefinition {
        let mut tasks: Vec<serde_json::Value> = keys
            .iter()
            .zip(deps)
            .map(|(k, d)| serde_json::json!({"key": k, "task_type": "noop", "depends_on": d}))
            .collect();
        tasks.extend(
            keys.iter().zip(undoable).filter(|(_, u)| **u).map(
                |(k, _)| serde_json::json!({"key": format!("undo_{k}"), "task_type": "noop", "compensate_for": k}),
            ),
        );
        crate::schema::parse_value(serde_json::json!({"name": "saga", "version": 1, "tasks": tasks}))
            .expect("a valid saga by construction")
    }

    /// A definition over the random DAG where the tasks in `held` run
    /// after anything (`all_done`, so the pass decides them) and, when
    /// `limited`, the first task has a concurrency limit instead.
    fn shaped(keys: &[String], deps: &[Vec<String>], held: &[bool], limited: bool) -> WorkflowDefinition {
        let tasks: Vec<serde_json::Value> = keys
            .iter()
            .zip(deps)
            .zip(held.iter().chain(std::iter::repeat(&false)))
            .enumerate()
            .map(|(i, ((k, d), held))| {
                let mut task = serde_json::json!({"key": k, "task_type": "noop", "depends_on": d});
                if limited && i == 0 {
                    // A limited task cannot also be conditional.
                    task["concurrency"] = serde_json::json!({"key": "$.site", "max": 1});
                } else if *held {
                    task["trigger"] = "all_done".into();
                }
                task
            })
            .collect();
        crate::schema::parse_value(serde_json::json!({"name": "shaped", "version": 1, "tasks": tasks}))
            .expect("a valid definition by construction")
    }

    proptest! {
        /// A success hands on only dependents it alone holds back and that
        /// the pass would promote at once: their only dependency is the
        /// task, nothing holds them, and the workflow has no limits. It
        /// names as joins the dependents nothing holds that wait on other
        /// tasks too, which the pass would lower by one for it. It skips
        /// the pass only when those two are every dependent, and never for
        /// a task without dependents (its success may settle the run).
        #[test]
        fn a_handoff_never_promotes_what_the_pass_would_hold(
            (keys, deps) in arb_graph(),
            held in prop::collection::vec(any::<bool>(), 12),
            limited in any::<bool>(),
        ) {
            let def = shaped(&keys, &deps, &held, limited);
            for key in &keys {
                let handoff = handoff(&def, key);
                let below: Vec<&str> = def.graph().dependents_of(key).collect();
                if limited {
                    prop_assert_eq!(&handoff, &Handoff::default());
                    continue;
                }
                for d in &handoff.dependents {
                    let task = def.task(d).expect("a task of the definition");
                    prop_assert_eq!(task.depends_on(), std::slice::from_ref(key));
                    prop_assert!(!task.holds());
                }
                for j in &handoff.joins {
                    let task = def.task(j).expect("a task of the definition");
                    prop_assert!(task.depends_on().len() > 1 && task.depends_on().contains(key));
                    prop_assert!(!task.holds());
                }
                let named = |d: &&str| handoff.dependents.iter().chain(&handoff.joins).any(|h| h == d);
                prop_assert_eq!(handoff.whole, below.iter().all(named) && !below.is_empty());
                // Counting this success as the pass does lowers each named
                // task by exactly one: the handed-on dependents to zero.
                let reaction = react(def.graph(), |k| def.task(k).map(TaskDefinition::trigger).unwrap_or_default(),
                    [(key.as_str(), TaskRunState::Succeeded)]);
                for d in handoff.dependents.iter().chain(&handoff.joins) {
                    prop_assert_eq!(reaction.satisfied.get(d.as_str()), Some(&1));
                }
            }
            prop_assert_eq!(handoff(&def, "nope"), Handoff::default());
        }
    }

    proptest! {
        /// Driven to its end, the rollback starts one compensator at a time,
        /// exactly one per succeeded task that has one, each task undone
        /// before every task it depends on; a compensator that fails for
        /// good halts the rest.
        #[test]
        fn compensators_run_one_at_a_time_in_reverse_dependency_order(
            (keys, deps) in arb_graph(),
            undoable in prop::collection::vec(any::<bool>(), 12),
            succeeded_mask in prop::collection::vec(any::<bool>(), 12),
            fail_at in prop::option::of(0usize..12),
        ) {
            let def = saga(&keys, &deps, &undoable);
            let succeeded: BTreeSet<&str> =
                keys.iter().zip(&succeeded_mask).filter(|(_, s)| **s).map(|(k, _)| k.as_str()).collect();
            let mut rows: HashMap<&str, TaskRunState> = HashMap::new();
            let mut undone: Vec<&str> = Vec::new();
            let end = loop {
                let next = compensate(&def, &succeeded, &rows);
                let Some((forward, compensator)) = next.start else { break next.progress };
                prop_assert_eq!(next.progress, CompensationProgress::Outstanding);
                prop_assert_eq!(compensator, format!("undo_{forward}"));
                // While it runs, nothing else starts.
                rows.insert(compensator, TaskRunState::Running);
                prop_assert_eq!(compensate(&def, &succeeded, &rows).start, None);
                let fails = fail_at == Some(undone.len());
                rows.insert(compensator, if fails { TaskRunState::Failed } else { TaskRunState::Succeeded });
                undone.push(forward);
            };
            for (i, first) in undone.iter().enumerate() {
                let below = def.graph().transitive_dependents_of(first);
                for later in &undone[i + 1..] {
                    prop_assert!(!below.contains(later), "{} undone after {}, which it depends on", later, first);
                }
            }
            let expected: BTreeSet<&str> = keys
                .iter()
                .zip(&undoable)
                .filter(|(k, u)| **u && succeeded.contains(k.as_str()))
                .map(|(k, _)| k.as_str())
                .collect();
            match fail_at {
                Some(n) if n < expected.len() => {
                    prop_assert_eq!(end, CompensationProgress::Halted);
                    prop_assert_eq!(undone.len(), n + 1);
                }
                _ => {
                    prop_assert_eq!(undone.iter().copied().collect::<BTreeSet<_>>(), expected.clone());
                    prop_assert_eq!(undone.len(), expected.len());
                    prop_assert_eq!(end, CompensationProgress::Finished);
                }
            }
        }
    }

    #[test]
    fn a_cancel_before_anything_started_takes_its_own_edge() {
        let verdict = Verdict::Settled(RunState::Cancelled);
        assert_eq!(
            run_edges(RunState::Pending, verdict, false),
            &[RunTransition::CancelBeforeStart]
        );
        assert_eq!(
            run_edges(RunState::Pending, verdict, true),
            &[RunTransition::Start, RunTransition::Cancel]
        );
    }

    /// A model of the store's counters and the pass, driving a random DAG
    /// with random triggers, conditions and outcomes to its end
    /// (docs/design/conditions.md#deciding).
    mod conditions {
        use super::*;
        use serde_json::json;

        /// What a task does when it runs, and whether its `when` says no.
        #[derive(Debug, Clone, Copy)]
        struct Plan {
            trigger: Trigger,
            when_false: Option<bool>,
            fails: bool,
        }

        fn arb_plan() -> impl Strategy<Value = Plan> {
            (
                prop::sample::select(vec![Trigger::AllSucceeded, Trigger::NoneFailed, Trigger::AllDone]),
                prop::option::of(any::<bool>()),
                prop::bool::weighted(0.3),
            )
                .prop_map(|(trigger, when_false, fails)| Plan {
                    trigger,
                    when_false,
                    fails,
                })
        }

        fn definition(keys: &[String], deps: &[Vec<String>], plans: &[Plan]) -> WorkflowDefinition {
            let tasks: Vec<Value> = keys
                .iter()
                .zip(deps)
                .zip(plans)
                .map(|((k, d), p)| {
                    let mut task = json!({"key": k, "task_type": "noop", "depends_on": d, "trigger": p.trigger});
                    if p.when_false.is_some() {
                        task["when"] = json!(format!("run_input.{k} == false"));
                    }
                    task
                })
                .collect();
            crate::schema::parse_value(json!({"name": "c", "version": 1, "tasks": tasks}))
                .expect("a valid definition by construction")
        }

        /// Drives `def` to its end as the stores and the pass do: each
        /// round runs every ready task (failing those `fails` names), then
        /// one pass reacts, cancels wave by wave, skips, lowers and decides
        /// until nothing new is flagged. The final state of each task, or
        /// what went wrong.
        fn simulate(
            def: &WorkflowDefinition,
            fails: impl Fn(&str) -> bool,
            run_input: &Value,
        ) -> Result<BTreeMap<String, TaskRunState>, String> {
            let graph = def.graph();
            let trigger = |key: &str| def.task(key).expect("a task").trigger();
            let mut state: BTreeMap<String, TaskRunState> = BTreeMap::new();
            let mut counter: BTreeMap<String, u32> = BTreeMap::new();
            let mut ready: Vec<String> = Vec::new();
            let mut flagged: Vec<String> = Vec::new();
            for task in def.forward_tasks() {
                let k = task.key().to_owned();
                let n = task.depends_on().len() as u32 + u32::from(task.is_conditional());
                counter.insert(k.clone(), n);
                state.insert(
                    k.clone(),
                    if n == 0 {
                        TaskRunState::Ready
                    } else {
                        TaskRunState::Pending
                    },
                );
                if n == 0 {
                    ready.push(k.clone());
                }
                if task.is_conditional() && task.depends_on().is_empty() {
                    flagged.push(k);
                }
            }
            for _ in 0..1000 {
                for k in std::mem::take(&mut ready) {
                    let s = if fails(&k) {
                        TaskRunState::Failed
                    } else {
                        TaskRunState::Succeeded
                    };
                    state.insert(k.clone(), s);
                    flagged.push(k);
                }
                if flagged.is_empty() {
                    return Ok(state);
                }
                while !flagged.is_empty() {
                    let taken = std::mem::take(&mut flagged);
                    let finished: Vec<(&str, TaskRunState)> = taken.iter().map(|k| (k.as_str(), state[k])).collect();
                    let reaction = react(graph, trigger, finished);
                    let mut lower = reaction.satisfied.clone();
                    let mut wave: BTreeSet<&str> = reaction.upstream_failed.clone();
                    while !wave.is_empty() {
                        let moved: Vec<&str> = wave
                            .into_iter()
                            .filter(|k| state[*k] == TaskRunState::Pending)
                            .collect();
                        for k in &moved {
                            state.insert((*k).to_owned(), TaskRunState::Cancelled);
                        }
                        let (next, released) = failure_wave(graph, trigger, moved.iter().copied());
                        for (k, n) in released {
                            *lower.entry(k).or_default() += n;
                        }
                        wave = next;
                    }
                    for k in &reaction.upstream_cancelled {
                        if state[*k] == TaskRunState::Pending {
                            state.insert((*k).to_owned(), TaskRunState::Cancelled);
                        }
                    }
                    for k in &reaction.upstream_skipped {
                        if state[*k] == TaskRunState::Pending {
                            state.insert((*k).to_owned(), TaskRunState::Skipped);
                            flagged.push((*k).to_owned());
                        }
                    }
                    for (k, n) in lower {
                        if state[k] != TaskRunState::Pending {
                            continue;
                        }
                        let c = counter.get_mut(k).expect("a counter");
                        if *c < n {
                            return Err(format!("{k} lowered below zero"));
                        }
                        *c -= n;
                        if *c == 0 {
                            state.insert(k.to_owned(), TaskRunState::Ready);
                            ready.push(k.to_owned());
                        }
                    }
                    for task in def.forward_tasks().filter(|t| t.is_conditional()) {
                        let k = task.key().to_owned();
                        if state[&k] != TaskRunState::Pending || counter[&k] != 1 {
                            continue;
                        }
                        let view: BTreeMap<String, (TaskRunState, Option<Value>)> = task
                            .depends_on()
                            .iter()
                            .map(|d| {
                                (
                                    d.clone(),
                                    (state[d], (state[d] == TaskRunState::Succeeded).then(|| json!({}))),
                                )
                            })
                            .collect();
                        if view.values().any(|(s, _)| s.is_active()) {
                            return Err(format!("{k} decided before its dependencies finished"));
                        }
                        match decide(task, &view, run_input) {
                            Decision::Run => {
                                counter.insert(k.clone(), 0);
                                state.insert(k.clone(), TaskRunState::Ready);
                                ready.push(k);
                            }
                            Decision::Skip(_) => {
                                state.insert(k.clone(), TaskRunState::Skipped);
                                flagged.push(k);
                            }
                            Decision::Fail(e) => return Err(format!("{k} failed to evaluate: {e}")),
                        }
                    }
                }
            }
            Err("the run did not settle in 1000 rounds".to_owned())
        }

        /// Whether a task may run after dependencies that ended in `states`.
        fn allowed(trigger: Trigger, states: &[TaskRunState]) -> bool {
            match trigger {
                Trigger::AllSucceeded => states.iter().all(|s| *s == TaskRunState::Succeeded),
                Trigger::NoneFailed => {
                    states
                        .iter()
                        .all(|s| matches!(s, TaskRunState::Succeeded | TaskRunState::Skipped))
                        && (states.is_empty() || states.contains(&TaskRunState::Succeeded))
                }
                Trigger::AllDone => true,
            }
        }

        proptest! {
            /// Every task ends terminal; a task runs only as its trigger
            /// allows; a skipped or failed dependency never lets an
            /// `all_succeeded` task run; `all_done` tasks always run.
            #[test]
            fn every_task_settles_and_runs_only_as_its_trigger_allows(
                (keys, deps) in arb_graph(),
                plans in prop::collection::vec(arb_plan(), 12),
            ) {
                let def = definition(&keys, &deps, &plans);
                let plan_of = |key: &str| plans[keys.iter().position(|k| k == key).expect("a key")];
                let run_input: Value = keys
                    .iter()
                    .zip(&plans)
                    .map(|(k, p)| (k.clone(), json!(p.when_false == Some(true))))
                    .collect::<Map<_, _>>()
                    .into();
                let state = simulate(&def, |k| plan_of(k).fails, &run_input).map_err(TestCaseError::fail)?;
                for (k, d) in keys.iter().zip(&deps) {
                    let s = state[k];
                    prop_assert!(!s.is_active(), "{} was left {}", k, s);
                    let ran = matches!(s, TaskRunState::Succeeded | TaskRunState::Failed);
                    let dep_states: Vec<TaskRunState> = d.iter().map(|d| state[d]).collect();
                    let p = plan_of(k);
                    let expected = allowed(p.trigger, &dep_states) && p.when_false != Some(true);
                    prop_assert_eq!(ran, expected, "{} is {} after {:?}", k, s, dep_states);
                }
            }
        }

        /// A failure below a branch already skipped does not cancel a
        /// `none_failed` join whose own dependencies did not fail: the
        /// cancellation spreads only from the rows it moved.
        #[test]
        fn a_failure_does_not_spread_through_a_skipped_task() {
            let def = crate::schema::parse_value(json!({"name": "c", "version": 1, "tasks": [
                {"key": "gate", "task_type": "noop", "when": "false"},
                {"key": "s0", "task_type": "noop"},
                {"key": "slow", "task_type": "noop", "depends_on": ["s0"]},
                {"key": "y", "task_type": "noop", "depends_on": ["gate", "slow"]},
                {"key": "r0", "task_type": "noop"},
                {"key": "r", "task_type": "noop", "depends_on": ["r0"]},
                {"key": "j", "task_type": "noop", "depends_on": ["y", "r"], "trigger": "none_failed"}
            ]}))
            .expect("valid");
            let state = simulate(&def, |k| k == "slow", &Value::Null).expect("it settles");
            assert_eq!(state["y"], TaskRunState::Skipped);
            assert_eq!(state["slow"], TaskRunState::Failed);
            assert_eq!(state["j"], TaskRunState::Succeeded, "{state:?}");
        }
    }
}
