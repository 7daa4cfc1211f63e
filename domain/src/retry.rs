//! An operator's retry of a finished run (docs/design/retry.md): which
//! forward tasks start again, in which state, and why a retry is refused.
//! The store applies the answer in one transaction; nothing here reads it.

use std::collections::{BTreeMap, BTreeSet};

use crate::concurrency::Gate;
use crate::condition::Trigger;
use crate::graph::DependencyGraph;
use crate::state::TaskRunState;

/// One task of the retry set: the `reset` edge it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    /// The forward task.
    pub key: String,
    /// The state it rests in now (the edge is conditional on it).
    pub from: TaskRunState,
    /// `ready` when every dependency is kept succeeded, else `pending`.
    pub to: TaskRunState,
    /// Its dependencies inside the retry set: the counter the scheduler
    /// lowers as they succeed again.
    pub pending_deps: u32,
}

/// Why a run cannot be retried as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetryRefusal {
    /// `--from` named a task the definition does not have.
    #[error("task '{0}' is not a forward task of this run's definition")]
    UnknownTask(String),
    /// The rollback ran: what the run kept has been undone, so only a retry
    /// from named tasks says what to do again.
    #[error("the run's compensators have run; retry it from named tasks (--from) to redo what they undid")]
    Compensated,
    /// A task of the set waits on one outside it that will never succeed.
    #[error("task '{task}' depends on '{dependency}', which is {state} and not retried; add '{dependency}' to --from")]
    Stranded {
        /// The task that could never start.
        task: String,
        /// The dependency kept in its unsucceeded state.
        dependency: String,
        /// That dependency's state.
        state: TaskRunState,
    },
    /// A forward task is still active, so the run has not finished.
    #[error("task '{task}' is still {state}; only a finished run can be retried")]
    Active {
        /// The active task.
        task: String,
        /// Its state.
        state: TaskRunState,
    },
    /// The set holds a mapped task or one of its children: their rows
    /// cannot be reset yet (docs/design/map.md#retrying-a-run).
    #[error("task '{0}' is mapped or a mapped task's child; a run cannot be retried through a mapped task yet")]
    Mapped(String),
    /// Nothing failed or was cancelled, and nothing was named.
    #[error("no task failed or was cancelled; name the tasks to redo with --from")]
    NothingToRetry,
}

/// Decides the retry set of a finished run from its forward tasks' states.
///
/// Without `from`, the set is every failed or cancelled forward task (a
/// cancel's reason does not matter: user or upstream failure, the task did
/// not run to its end). With `from`, it is the named tasks, the tasks whose
/// compensators ran (`compensated`: what they did was undone), and all
/// their descendants, succeeded ones included. A task outside the set keeps
/// its state and output; one inside is `ready` when all its dependencies
/// are kept succeeded, else `pending` on the ones inside. A kept dependency
/// must have ended as the task's trigger runs after (for the default
/// trigger: succeeded; docs/design/conditions.md#retries). Tasks come back
/// in the graph's topological order.
pub fn reset_set(
    graph: &DependencyGraph,
    trigger: impl Fn(&str) -> Trigger,
    states: &BTreeMap<&str, TaskRunState>,
    compensated: &BTreeSet<&str>,
    from: &[String],
) -> Result<Vec<Reset>, RetryRefusal> {
    if let Some((task, state)) = states.iter().find(|(_, s)| s.is_active()) {
        return Err(RetryRefusal::Active {
            task: (*task).to_owned(),
            state: *state,
        });
    }
    let mut roots: BTreeSet<&str> = BTreeSet::new();
    if from.is_empty() {
        if !compensated.is_empty() {
            return Err(RetryRefusal::Compensated);
        }
        roots.extend(
            states
                .iter()
                .filter(|(_, s)| matches!(s, TaskRunState::Failed | TaskRunState::Cancelled))
                .map(|(k, _)| *k),
        );
    } else {
        for key in from {
            match graph.keys().find(|k| k == key) {
                Some(k) => roots.insert(k),
                None => return Err(RetryRefusal::UnknownTask(key.clone())),
            };
        }
        roots.extend(compensated.iter().copied().filter(|k| graph.contains(k)));
    }
    let mut set: BTreeSet<&str> = BTreeSet::new();
    for root in &roots {
        set.insert(root);
        set.extend(graph.transitive_dependents_of(root));
    }
    if set.is_empty() {
        return Err(RetryRefusal::NothingToRetry);
    }
    let state_of = |key: &str| states.get(key).copied().unwrap_or(TaskRunState::Pending);
    let mut resets = Vec::with_capacity(set.len());
    for key in graph.topological_order().into_iter().filter(|k| set.contains(k)) {
        let mut pending_deps = 0u32;
        for dependency in graph.dependencies_of(key) {
            if set.contains(dependency) {
                pending_deps += 1;
            } else if !trigger(key).accepts(state_of(dependency)) {
                return Err(RetryRefusal::Stranded {
                    task: key.to_owned(),
                    dependency: dependency.to_owned(),
                    state: state_of(dependency),
                });
            }
        }
        resets.push(Reset {
            key: key.to_owned(),
            from: state_of(key),
            to: if pending_deps == 0 {
                TaskRunState::Ready
            } else {
                TaskRunState::Pending
            },
            pending_deps,
        });
    }
    Ok(resets)
}

/// Holds each conditional task of a retry set on its condition, as a start
/// does (docs/design/conditions.md#retries): one more on its counter, and
/// pending, so the resumed run's first pass decides it again once its
/// dependencies have finished.
pub fn hold_conditions(resets: &mut [Reset], conditional: impl Fn(&str) -> bool) {
    for reset in resets.iter_mut().filter(|r| conditional(&r.key)) {
        reset.pending_deps += 1;
        reset.to = TaskRunState::Pending;
    }
}

/// Holds a retry set back at the run's concurrency gates, as a start does
/// (docs/design/concurrency.md#retries): a run gate counts as one more
/// dependency of every task of the set it would make ready at once, a
/// task gate as one more of its task. Returns the gates the resumed run
/// passes again: its run gates, and the task gates of tasks in the set (a
/// kept task does not run again, so its gate has nothing to hold).
pub fn hold_at_gates(resets: &mut [Reset], gates: Vec<Gate>) -> Vec<Gate> {
    let run_gated = gates.iter().any(|g| g.task.is_none());
    let kept: Vec<Gate> = gates
        .into_iter()
        .filter(|g| g.task.as_ref().is_none_or(|t| resets.iter().any(|r| &r.key == t)))
        .collect();
    for reset in resets.iter_mut() {
        let first = u32::from(run_gated && reset.pending_deps == 0);
        let own = u32::from(kept.iter().any(|g| g.task.as_ref() == Some(&reset.key)));
        reset.pending_deps += first + own;
        if reset.pending_deps > 0 {
            reset.to = TaskRunState::Pending;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::TaskTransition;
    use crate::state::task_machine;
    use proptest::prelude::*;

    fn graph(tasks: &[(&str, &[&str])]) -> DependencyGraph {
        DependencyGraph::new(tasks.iter().map(|(k, d)| (*k, d.iter().copied()))).unwrap()
    }

    fn states<'a>(pairs: &[(&'a str, TaskRunState)]) -> BTreeMap<&'a str, TaskRunState> {
        pairs.iter().copied().collect()
    }

    use TaskRunState::{Cancelled, Failed, Pending, Ready, Running, Succeeded};

    fn gate(task: Option<&str>) -> Gate {
        Gate {
            task: task.map(str::to_owned),
            scope: format!("{task:?}"),
            label: "acme".into(),
            max: 1,
            strategy: crate::concurrency::Strategy::CancelNewest,
        }
    }

    #[test]
    fn a_retry_set_waits_at_the_run_gate_and_at_its_own_tasks_gates() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &[])]);
        let s = states(&[("a", Succeeded), ("b", Failed), ("c", Cancelled), ("d", Succeeded)]);
        let mut r = reset_set(&g, |_| Trigger::AllSucceeded, &s, &BTreeSet::new(), &[]).unwrap();
        let kept = hold_at_gates(&mut r, vec![gate(None), gate(Some("c")), gate(Some("d"))]);
        assert_eq!(
            kept.iter().map(|g| g.task.as_deref()).collect::<Vec<_>>(),
            [None, Some("c")],
            "a kept task's gate has nothing to hold"
        );
        let held: Vec<_> = r.iter().map(|r| (r.key.as_str(), r.to, r.pending_deps)).collect();
        assert_eq!(held, [("b", Pending, 1), ("c", Pending, 2)]);

        let mut ungated = reset_set(&g, |_| Trigger::AllSucceeded, &s, &BTreeSet::new(), &[]).unwrap();
        let before = ungated.clone();
        assert!(hold_at_gates(&mut ungated, Vec::new()).is_empty());
        assert_eq!(ungated, before, "without gates a retry set is as planned");
    }

    #[test]
    fn without_from_the_failed_and_cancelled_start_again_and_the_rest_is_kept() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &["a"])]);
        let s = states(&[("a", Succeeded), ("b", Failed), ("c", Cancelled), ("d", Succeeded)]);
        let r = reset_set(&g, |_| Trigger::AllSucceeded, &s, &BTreeSet::new(), &[]).unwrap();
        assert_eq!(
            r,
            [
                Reset {
                    key: "b".into(),
                    from: Failed,
                    to: Ready,
                    pending_deps: 0
                },
                Reset {
                    key: "c".into(),
                    from: Cancelled,
                    to: Pending,
                    pending_deps: 1
                },
            ]
        );
    }

    #[test]
    fn from_a_succeeded_task_redoes_it_and_its_descendants() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &["a"])]);
        let s = states(&[("a", Succeeded), ("b", Succeeded), ("c", Failed), ("d", Succeeded)]);
        let r = reset_set(&g, |_| Trigger::AllSucceeded, &s, &BTreeSet::new(), &["b".into()]).unwrap();
        let keys: Vec<_> = r.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["b", "c"]);
        assert_eq!((r[0].from, r[0].to), (Succeeded, Ready));
    }

    #[test]
    fn refusals_say_what_and_where() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &[])]);
        let none = BTreeSet::new();
        let s = states(&[("a", Failed), ("b", Cancelled), ("c", Succeeded)]);
        assert_eq!(
            reset_set(&g, |_| Trigger::AllSucceeded, &s, &none, &["zz".into()]),
            Err(RetryRefusal::UnknownTask("zz".into()))
        );
        assert_eq!(
            reset_set(&g, |_| Trigger::AllSucceeded, &s, &none, &["b".into()]),
            Err(RetryRefusal::Stranded {
                task: "b".into(),
                dependency: "a".into(),
                state: Failed
            })
        );
        let compensated = BTreeSet::from(["c"]);
        assert_eq!(
            reset_set(&g, |_| Trigger::AllSucceeded, &s, &compensated, &[]),
            Err(RetryRefusal::Compensated)
        );
        let ok = reset_set(&g, |_| Trigger::AllSucceeded, &s, &compensated, &["a".into()]).unwrap();
        let keys: BTreeSet<_> = ok.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["a", "b", "c"]),
            "a compensated task is redone by rule"
        );
        let all_good = states(&[("a", Succeeded), ("b", Succeeded), ("c", Succeeded)]);
        assert_eq!(
            reset_set(&g, |_| Trigger::AllSucceeded, &all_good, &none, &[]),
            Err(RetryRefusal::NothingToRetry)
        );
        let busy = states(&[("a", Running), ("b", Pending), ("c", Succeeded)]);
        assert!(matches!(
            reset_set(&g, |_| Trigger::AllSucceeded, &busy, &none, &[]),
            Err(RetryRefusal::Active { .. })
        ));
    }

    /// Tasks as `(key, dependencies)`, a finished state per task, and
    /// whether each is named in `from`.
    type FinishedRun = (Vec<(String, Vec<String>)>, Vec<TaskRunState>, Vec<bool>);

    /// A random DAG of `n` tasks `t0…` (each depends on some earlier ones)
    /// with a finished state per task.
    fn arb_run() -> impl Strategy<Value = FinishedRun> {
        (1usize..10).prop_flat_map(|n| {
            (
                prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..3), n),
                prop::collection::vec(prop::sample::select(vec![Succeeded, Failed, Cancelled]), n),
                prop::collection::vec(any::<bool>(), n),
            )
                .prop_map(move |(picks, states, named)| {
                    let tasks = picks
                        .into_iter()
                        .enumerate()
                        .map(|(i, p)| {
                            let deps: BTreeSet<String> = if i == 0 {
                                BTreeSet::new()
                            } else {
                                p.iter().map(|x| format!("t{}", x.index(i))).collect()
                            };
                            (format!("t{i}"), deps.into_iter().collect())
                        })
                        .collect();
                    (tasks, states, named)
                })
        })
    }

    proptest! {
        /// Whatever the run looked like, an accepted retry set is closed
        /// under descendants, takes only legal `reset` edges, makes ready
        /// exactly the tasks with nothing to wait for, counts exactly the
        /// dependencies inside the set, and strands nothing: every
        /// dependency outside the set is succeeded.
        #[test]
        fn an_accepted_retry_set_can_run_to_its_end((tasks, finished, named) in arb_run()) {
            let g = DependencyGraph::new(tasks.iter().map(|(k, d)| (k.as_str(), d.iter().map(String::as_str)))).unwrap();
            let s: BTreeMap<&str, TaskRunState> = tasks.iter().map(|(k, _)| k.as_str()).zip(finished.iter().copied()).collect();
            let from: Vec<String> = tasks.iter().zip(&named).filter(|(_, n)| **n).map(|((k, _), _)| k.clone()).collect();
            let Ok(resets) = reset_set(&g, |_| Trigger::AllSucceeded, &s, &BTreeSet::new(), &from) else { return Ok(()) };
            let set: BTreeSet<&str> = resets.iter().map(|r| r.key.as_str()).collect();
            for r in &resets {
                prop_assert!(task_machine().is_legal_retry(TaskTransition::Reset, r.from, r.to));
                for d in g.transitive_dependents_of(&r.key) {
                    prop_assert!(set.contains(d), "{} is reset but its descendant {} is not", r.key, d);
                }
                let inside = g.dependencies_of(&r.key).filter(|d| set.contains(d)).count() as u32;
                prop_assert_eq!(r.pending_deps, inside);
                prop_assert_eq!(r.to == Ready, inside == 0);
                for d in g.dependencies_of(&r.key).filter(|d| !set.contains(d)) {
                    prop_assert_eq!(s[d], Succeeded);
                }
            }
            if from.is_empty() {
                for (k, st) in s.iter().filter(|(_, st)| **st != Succeeded) {
                    prop_assert!(set.contains(k), "{} is {:?} but not retried", k, st);
                }
            }
            let order: Vec<&str> = g.topological_order().into_iter().filter(|k| set.contains(k)).collect();
            prop_assert_eq!(order, resets.iter().map(|r| r.key.as_str()).collect::<Vec<_>>());
        }

        /// Held at a run gate and at task gates, nothing of an accepted
        /// retry set is ready. The run gate holds back exactly the tasks
        /// whose dependencies are all kept (the ones the scheduler lowers
        /// once the run is past its gate), a task gate only its own task,
        /// and the gates of tasks outside the set are dropped.
        #[test]
        fn gates_hold_back_what_the_pass_lowers((tasks, finished, named) in arb_run()) {
            let g = DependencyGraph::new(tasks.iter().map(|(k, d)| (k.as_str(), d.iter().map(String::as_str)))).unwrap();
            let s: BTreeMap<&str, TaskRunState> = tasks.iter().map(|(k, _)| k.as_str()).zip(finished.iter().copied()).collect();
            let Ok(plan) = reset_set(&g, |_| Trigger::AllSucceeded, &s, &BTreeSet::new(), &[]) else { return Ok(()) };
            let set: BTreeSet<&str> = plan.iter().map(|r| r.key.as_str()).collect();
            let gated: BTreeSet<&str> = tasks.iter().zip(&named).filter(|(_, n)| **n).map(|((k, _), _)| k.as_str()).collect();
            let mut gates = vec![gate(None)];
            gates.extend(gated.iter().map(|k| gate(Some(k))));
            let mut held = plan.clone();
            let kept = hold_at_gates(&mut held, gates);
            let kept: Vec<Option<&str>> = kept.iter().map(|g| g.task.as_deref()).collect();
            let expected: Vec<Option<&str>> =
                std::iter::once(None).chain(gated.iter().filter(|k| set.contains(*k)).map(|k| Some(*k))).collect();
            prop_assert_eq!(kept, expected);
            for (h, p) in held.iter().zip(&plan) {
                prop_assert_eq!(h.to, Pending);
                let first = g.dependencies_of(&h.key).all(|d| !set.contains(d));
                let own = gated.contains(h.key.as_str());
                prop_assert_eq!(h.pending_deps, p.pending_deps + u32::from(first) + u32::from(own), "{}", h.key);
            }
        }
    }

    #[test]
    fn a_kept_dependency_must_have_ended_as_the_trigger_runs_after() {
        use TaskRunState::{Failed, Skipped};
        // a (skipped, kept) and b (failed) → j.
        let g = graph(&[("a", &[]), ("b", &[]), ("j", &["a", "b"])]);
        let s = states(&[("a", Skipped), ("b", Failed), ("j", TaskRunState::Cancelled)]);
        let none = BTreeSet::new();
        let strict = reset_set(&g, |_| Trigger::AllSucceeded, &s, &none, &[]);
        assert!(matches!(strict, Err(RetryRefusal::Stranded { ref dependency, .. }) if dependency == "a"));
        let join = |k: &str| {
            if k == "j" {
                Trigger::NoneFailed
            } else {
                Trigger::AllSucceeded
            }
        };
        let mut resets =
            reset_set(&g, join, &s, &none, &[]).expect("a skipped dependency is what none_failed runs after");
        assert_eq!(
            resets
                .iter()
                .map(|r| (r.key.as_str(), r.pending_deps))
                .collect::<Vec<_>>(),
            [("b", 0), ("j", 1)]
        );
        hold_conditions(&mut resets, |k| k == "j");
        let j = &resets[1];
        assert_eq!(
            (j.pending_deps, j.to),
            (2, TaskRunState::Pending),
            "one hold more, decided again"
        );
        assert_eq!(resets[0].to, TaskRunState::Ready);
    }
}
