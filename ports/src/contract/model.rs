//! Contract case: random sequences of store operations (start, claim,
//! heartbeat, finish with the live or a stale token, reap, cancel, a
//! scheduler pass) run against the store and against a tiny in-memory
//! model of one run, comparing every outcome and checking the invariants
//! after every step (docs/design/testing.md#property-tests).
//!
//! The model covers forward tasks only (one to three, random edges, one or
//! two attempts each), so a failed run settles without a rollback. Times
//! are whole steps of [`STEP`] against leases and retry delays of
//! [`LEASE`]: no sum of steps lands within 30 s of a deadline, so the wall
//! time a case takes never changes what has expired.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use flowforge_domain::derive::{CompensationProgress, TaskTally, Verdict, derive_run_state};
use flowforge_domain::plan;
use flowforge_domain::{CancelReason, RunState, TaskRunState, TaskTransition};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::json;

use crate::ids::RunId;
use crate::store::{
    CancelOutcome, DefinitionStore, FinishResult, LeaseStatus, RunPass, RunStore, Scope, TaskOutcome, TaskRunView,
};

use super::*;

/// Leases and retry delays.
const LEASE: Duration = Duration::from_secs(100);
/// One move of the clock: 70 k never comes within 30 s of 100 or 300.
const STEP: Duration = Duration::from_secs(70);
/// Cases per store (each one creates a database), unless
/// `PROPTEST_CASES` asks for more or fewer.
const CASES: u32 = 24;
/// The longest sequence of operations in a case.
const MAX_OPS: usize = 25;
/// Shrunk failures, replayed first on every later run. Absolute, because
/// the adapters' test binaries run in their own crate folders.
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/contract/model.txt");

/// Which token an operation presents.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// The task run's current token.
    Current,
    /// A token from before the current one (older by 1 + n bumps, or below
    /// every token the row ever had).
    Older(u8),
}

/// How a finishing worker says its attempt ended.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Succeed,
    /// With `retry`, a retry is asked for when attempts are left.
    Fail {
        retry: bool,
    },
    Cancel,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Claim { task: usize, pick: Pick },
    Heartbeat { task: usize, pick: Pick },
    Finish { task: usize, pick: Pick, ending: Ending },
    Advance,
    Reap,
    Cancel,
    Pass,
}

/// One case: the workflow's shape and the operations to apply.
#[derive(Debug, Clone)]
struct Plan {
    /// For each task, the earlier tasks it depends on.
    deps: Vec<Vec<usize>>,
    max_attempts: Vec<u32>,
    ops: Vec<Op>,
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![3 => Just(Pick::Current), 1 => (0..3u8).prop_map(Pick::Older)]
}

fn op() -> impl Strategy<Value = Op> {
    let ending = prop_oneof![
        Just(Ending::Succeed),
        any::<bool>().prop_map(|retry| Ending::Fail { retry }),
        Just(Ending::Cancel)
    ];
    prop_oneof![
        4 => (0..3usize, pick()).prop_map(|(task, pick)| Op::Claim { task, pick }),
        1 => (0..3usize, pick()).prop_map(|(task, pick)| Op::Heartbeat { task, pick }),
        4 => (0..3usize, pick(), ending).prop_map(|(task, pick, ending)| Op::Finish { task, pick, ending }),
        2 => Just(Op::Advance),
        2 => Just(Op::Reap),
        1 => Just(Op::Cancel),
        3 => Just(Op::Pass),
    ]
}

fn plans() -> impl Strategy<Value = Plan> {
    (
        1..=3usize,
        any::<[bool; 3]>(),
        proptest::collection::vec(1..=2u32, 3),
        proptest::collection::vec(op(), 1..=MAX_OPS),
    )
        .prop_map(|(n, edges, max_attempts, ops)| {
            let all = [vec![], vec![(edges[0], 0)], vec![(edges[1], 0), (edges[2], 1)]];
            let deps = all[..n]
                .iter()
                .map(|d| d.iter().filter(|(on, _)| *on).map(|(_, i)| *i).collect())
                .collect();
            let ops = ops
                .into_iter()
                .map(|op| match op {
                    Op::Claim { task, pick } => Op::Claim { task: task % n, pick },
                    Op::Heartbeat { task, pick } => Op::Heartbeat { task: task % n, pick },
                    Op::Finish { task, pick, ending } => Op::Finish {
                        task: task % n,
                        pick,
                        ending,
                    },
                    other => other,
                })
                .collect();
            Plan {
                deps,
                max_attempts: max_attempts[..n].to_vec(),
                ops,
            }
        })
}

/// Random operation sequences give the same outcomes on the store as on
/// the model, and after every operation the store's task runs match the
/// model's and keep the invariants: a lease iff running, a token that only
/// grows (bumped exactly when the model says), at most one live attempt,
/// and a terminal task run or run never changes again; at the end, the
/// run's history is numbered 1..n.
pub async fn random_operation_sequences_match_the_model<F: StoreFactory>(factory: &F) {
    let config = Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(CASES),
        // Each shrinking step creates a database too.
        max_shrink_iters: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let handle = tokio::runtime::Handle::current();
    // The runner is synchronous: each case blocks this worker thread on its
    // own store (the contract's runtime is multi-threaded).
    let result = tokio::task::block_in_place(|| runner.run(&plans(), |plan| handle.block_on(check(factory, &plan))));
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

async fn check<F: StoreFactory>(factory: &F, plan: &Plan) -> Result<(), TestCaseError> {
    let (s, clock) = fresh(factory).await;
    let tasks: Vec<Value> = plan
        .deps
        .iter()
        .zip(&plan.max_attempts)
        .enumerate()
        .map(|(i, (deps, max))| {
            let deps: Vec<String> = deps.iter().map(|d| key(*d)).collect();
            json!({"key": key(i), "task_type": "work", "depends_on": deps,
                   "retry": {"max_attempts": max, "delay_seconds": LEASE.as_secs()}})
        })
        .collect();
    let def = definition(json!({"name": "model", "version": 1, "tasks": tasks}));
    let published = s.publish_definition(&def).await.expect("publish");
    let run = s.start_run(published.id, json!({})).await.expect("start_run");

    let mut model = Model::new(plan);
    let mut h = Harness {
        tokens: Vec::new(),
        claimed: vec![Vec::new(); plan.deps.len()],
        before: None,
    };
    let views = tasks_by_key(&s, run).await;
    for (i, view) in views.iter().enumerate() {
        prop_assert_eq!(&view.key, &key(i));
        h.tokens.push(vec![view.token]);
    }
    h.observe(&s, run, &model).await?;

    for (step, op) in plan.ops.iter().enumerate() {
        apply(&s, &clock, run, &def, &mut model, &mut h, *op)
            .await
            .map_err(|e| TestCaseError::fail(format!("step {step} ({op:?}): {e}")))?;
        h.observe(&s, run, &model)
            .await
            .map_err(|e| TestCaseError::fail(format!("after step {step} ({op:?}): {e}")))?;
    }
    // Whatever wrote them (claims, finishes, stale audits, reaps, passes),
    // the run's events are numbered 1..n in history order, without a gap.
    let seqs: Vec<u64> = events(&s, run).await.iter().map(|e| e.seq).collect();
    let numbered: Vec<u64> = (1..).take(seqs.len()).collect();
    prop_assert_eq!(seqs, numbered);
    Ok(())
}

fn key(i: usize) -> String {
    format!("t{i}")
}

async fn tasks_by_key<S: Store>(s: &S, run: RunId) -> Vec<TaskRunView> {
    let mut views = tasks(s, run).await;
    views.sort_by(|a, b| a.key.cmp(&b.key));
    views
}

/// What the test knows about the store beyond the model: the real tokens.
struct Harness {
    /// Per task, every token the row has had, oldest first: index g is the
    /// token after g bumps.
    tokens: Vec<Vec<i64>>,
    /// Per task, the tokens of the claims that won.
    claimed: Vec<Vec<i64>>,
    /// The last snapshot: run state and task runs.
    before: Option<(RunState, Vec<TaskRunView>)>,
}

impl Harness {
    fn token(&self, task: usize, pick: Pick) -> i64 {
        let seen = &self.tokens[task];
        let current = seen.len() - 1;
        match pick {
            Pick::Current => seen[current],
            Pick::Older(n) if current == 0 => seen[0] - 1 - i64::from(n),
            Pick::Older(n) => seen[current - 1 - usize::from(n).min(current - 1)],
        }
    }

    /// Reads the run back, compares it with the model and checks the
    /// invariants; records a token bump the model expects.
    async fn observe<S: Store>(&mut self, s: &S, run: RunId, model: &Model) -> Result<(), TestCaseError> {
        let detail = s.get_run(run).await.expect("get_run").expect("the run exists");
        let mut views = detail.tasks.clone();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        prop_assert_eq!(detail.summary.state, model.run, "run state");
        prop_assert_eq!(
            detail.summary.cancel_requested,
            model.cancel_requested,
            "cancel request"
        );
        prop_assert_eq!(views.len(), model.tasks.len(), "one task run per task");
        for (i, (v, m)) in views.iter().zip(&model.tasks).enumerate() {
            let running = v.state == TaskRunState::Running;
            prop_assert_eq!(
                (v.state, v.cancel_reason, v.attempt),
                (m.state, m.reason, m.attempt),
                "task run {} (state, cancel reason, attempt)",
                v.key
            );
            prop_assert_eq!(v.started_at.is_some(), m.started, "{} started_at", v.key);
            prop_assert_eq!(v.lease_owner.is_some(), running, "{}: a lease iff running", v.key);
            prop_assert_eq!(v.finished_at.is_some(), at_rest(v.state), "{} finished_at", v.key);
            prop_assert_eq!(
                v.retry_at.is_some(),
                v.state == TaskRunState::Retrying,
                "{} retry_at",
                v.key
            );
            let seen = &mut self.tokens[i];
            if m.bumps == seen.len() {
                let last = *seen.last().expect("the first token");
                prop_assert!(v.token > last, "{}: token {} after {} must grow", v.key, v.token, last);
                seen.push(v.token);
            }
            prop_assert_eq!(seen.len(), m.bumps + 1, "{}: one bump at a time", v.key);
            prop_assert_eq!(v.token, seen[m.bumps], "{}: the token moves only when it must", v.key);
            let live = self.claimed[i].iter().filter(|t| running && **t == v.token).count();
            prop_assert_eq!(live, usize::from(running), "{}: one live attempt iff running", v.key);
        }
        if let Some((state, old)) = &self.before {
            if state.is_terminal() {
                prop_assert_eq!(detail.summary.state, *state, "a terminal run is final");
            }
            for (was, now) in old.iter().zip(&views) {
                if at_rest(was.state) {
                    prop_assert_eq!(
                        (now.state, now.cancel_reason, now.attempt, now.token),
                        (was.state, was.cancel_reason, was.attempt, was.token),
                        "{}: a terminal task run is final",
                        now.key
                    );
                }
            }
        }
        self.before = Some((detail.summary.state, views));
        Ok(())
    }
}

async fn apply<S: Store>(
    s: &S,
    clock: &ManualClock,
    run: RunId,
    def: &WorkflowDefinition,
    model: &mut Model,
    h: &mut Harness,
    op: Op,
) -> Result<(), TestCaseError> {
    let views = tasks_by_key(s, run).await;
    match op {
        Op::Claim { task, pick } => {
            let token = h.token(task, pick);
            let got = s
                .claim_task_run(views[task].id, token, &worker("w"), LEASE)
                .await
                .expect("claim_task_run");
            let expected = model.claim(task, matches!(pick, Pick::Current));
            prop_assert_eq!(got.is_some(), expected, "claim won");
            if let Some(c) = got {
                prop_assert_eq!((c.task_key, c.attempt), (key(task), model.tasks[task].attempt));
                prop_assert!(c.token > token, "a claim bumps the token");
                h.claimed[task].push(c.token);
            }
        }
        Op::Heartbeat { task, pick } => {
            let got = s
                .renew_lease(views[task].id, h.token(task, pick), LEASE)
                .await
                .expect("renew_lease");
            let expected = match model.heartbeat(task, matches!(pick, Pick::Current)) {
                Some(cancel_requested) => LeaseStatus::Held { cancel_requested },
                None => LeaseStatus::Lost,
            };
            prop_assert_eq!(got, expected);
        }
        Op::Finish { task, pick, ending } => {
            let m = &model.tasks[task];
            let outcome = match ending {
                Ending::Succeed => TaskOutcome::Succeeded {
                    output: json!({"by": key(task)}),
                },
                Ending::Fail { retry } => TaskOutcome::Failed {
                    error: "planned".to_owned(),
                    retry_in: (retry && m.attempt < m.max_attempts).then_some(LEASE),
                },
                Ending::Cancel => TaskOutcome::Cancelled,
            };
            let got = s
                .finish_task_run(views[task].id, h.token(task, pick), &worker("w"), outcome.clone())
                .await
                .expect("finish_task_run");
            prop_assert_eq!(got, model.finish(task, matches!(pick, Pick::Current), &outcome));
        }
        Op::Advance => {
            clock.advance(STEP);
            model.now += secs(STEP);
        }
        Op::Reap => {
            let mut got: Vec<_> = s
                .reap_expired_leases(Scope::All, 10)
                .await
                .expect("reap")
                .into_iter()
                .map(|r| {
                    prop_assert_eq!(r.run_id, run);
                    Ok((r.task_key, r.transition, r.cancelled, r.attempt, r.token))
                })
                .collect::<Result<_, TestCaseError>>()?;
            got.sort();
            let expected: Vec<_> = model
                .reap()
                .into_iter()
                .map(|(i, transition, cancelled, attempt, bumps)| {
                    (key(i), transition, cancelled, attempt, h.tokens[i][bumps])
                })
                .collect();
            prop_assert_eq!(got, expected, "reaped (key, transition, cancelled, attempt, token)");
        }
        Op::Cancel => {
            let got = s.request_cancel(run).await.expect("request_cancel");
            prop_assert_eq!(got, Some(model.cancel()));
        }
        Op::Pass => pass_both(s, run, def, model).await?,
    }
    Ok(())
}

/// The scheduler's pass (docs/design/scheduler.md#the-pass) without a
/// rollback, over the store (reacting to what `take_flagged` reports) and
/// over the model (reacting to what it flagged itself), step by step.
async fn pass_both<S: Store>(
    s: &S,
    run: RunId,
    def: &WorkflowDefinition,
    model: &mut Model,
) -> Result<(), TestCaseError> {
    let Some(mut p) = s.begin_pass(run).await.expect("begin_pass") else {
        prop_assert!(model.run.is_terminal(), "only a terminal run has no pass here");
        return Ok(());
    };
    prop_assert!(!model.run.is_terminal(), "a terminal run has no pass");
    let header = p.run().clone();
    prop_assert_eq!(
        (header.state, header.cancel_requested),
        (model.run, model.cancel_requested)
    );

    let flagged = p.take_flagged().await.expect("take_flagged");
    let reaction = plan::react(
        def.graph(),
        |k| def.task(k).map(|t| t.trigger()).unwrap_or_default(),
        flagged.iter().map(|t| (t.key.as_str(), t.state)),
    );
    let reacted = model.take_flagged();
    // The model's definitions have no triggers: a failure's cancellation
    // reaches everything below it at once, as the scheduler applies it.
    let upstream_failed: std::collections::BTreeSet<&str> = reaction
        .upstream_failed
        .iter()
        .flat_map(|k| std::iter::once(*k).chain(def.graph().transitive_dependents_of(k)))
        .collect();
    for (keys, (expected, reason)) in [&upstream_failed, &reaction.upstream_cancelled].into_iter().zip([
        (&reacted.upstream_failed, CancelReason::UpstreamFailed),
        (&reacted.upstream_cancelled, CancelReason::User),
    ]) {
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        let got = if keys.is_empty() {
            Vec::new()
        } else {
            p.cancel_pending(&keys, reason).await.expect("cancel_pending")
        };
        prop_assert_eq!(
            sorted(got),
            model.cancel_pending(expected, reason),
            "cancel_pending {:?}",
            reason
        );
    }
    if header.cancel_requested {
        let got = p.cancel_waiting().await.expect("cancel_waiting");
        prop_assert_eq!(sorted(got), model.cancel_waiting(), "cancel_waiting");
    } else {
        let done: Vec<(String, u32)> = reaction.satisfied.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        let got = if done.is_empty() {
            Vec::new()
        } else {
            p.satisfy_dependencies(&done).await.expect("satisfy_dependencies")
        };
        prop_assert_eq!(sorted(got), model.satisfy(&reacted.satisfied), "satisfy_dependencies");
        let got = p.promote_due_retries().await.expect("promote_due_retries");
        prop_assert_eq!(sorted(got), model.promote_due(), "promote_due_retries");
    }

    let activity = p.activity().await.expect("activity");
    let tally = p.tally().await.expect("tally");
    let expected = model.tally();
    prop_assert_eq!(tally, expected, "tally");
    prop_assert_eq!(
        (activity.any_active, activity.any_started),
        (expected.active() > 0, expected.any_started),
        "activity"
    );
    // No compensators: a rollback is finished as soon as it is due.
    let verdict = match derive_run_state(&tally, CompensationProgress::NotStarted) {
        Verdict::Compensating => derive_run_state(&tally, CompensationProgress::Finished),
        other => other,
    };
    let edges = plan::run_edges(header.state, verdict, tally.any_started);
    for edge in edges {
        prop_assert!(p.transition_run(*edge).await.expect("transition_run"), "{edge} applies");
    }
    p.commit().await.expect("commit");
    if !edges.is_empty() {
        model.run = verdict.run_state();
    }
    Ok(())
}

/// Succeeded, failed or cancelled: a task run no edge leaves (a resting
/// `failed` is failed for good, docs/design/state-machines.md#failed-for-good).
fn at_rest(state: TaskRunState) -> bool {
    matches!(
        state,
        TaskRunState::Succeeded | TaskRunState::Failed | TaskRunState::Cancelled
    )
}

fn sorted(mut keys: Vec<String>) -> Vec<String> {
    keys.sort();
    keys
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// One task run as the model sees it.
#[derive(Debug, Clone)]
struct Task {
    deps: Vec<usize>,
    max_attempts: u32,
    state: TaskRunState,
    reason: Option<CancelReason>,
    attempt: u32,
    /// How many times the token was bumped.
    bumps: usize,
    /// Dependencies not yet seen succeed by a pass.
    waiting_on: u32,
    started: bool,
    /// In model seconds.
    lease_until: Option<i64>,
    retry_at: Option<i64>,
    /// Changed since the last pass.
    flagged: bool,
}

/// The model of one run.
#[derive(Debug)]
struct Model {
    tasks: Vec<Task>,
    /// Seconds the clock moved.
    now: i64,
    run: RunState,
    cancel_requested: bool,
}

/// What a pass reacts to: keys by what happened upstream of them.
#[derive(Debug, Default)]
struct Reaction {
    satisfied: BTreeMap<usize, u32>,
    upstream_failed: BTreeSet<usize>,
    upstream_cancelled: BTreeSet<usize>,
}

impl Model {
    fn new(plan: &Plan) -> Self {
        let tasks = plan
            .deps
            .iter()
            .zip(&plan.max_attempts)
            .map(|(deps, max)| Task {
                deps: deps.clone(),
                max_attempts: *max,
                state: if deps.is_empty() {
                    TaskRunState::Ready
                } else {
                    TaskRunState::Pending
                },
                reason: None,
                attempt: 1,
                bumps: 0,
                waiting_on: u32::try_from(deps.len()).unwrap_or(u32::MAX),
                started: false,
                lease_until: None,
                retry_at: None,
                flagged: false,
            })
            .collect();
        Self {
            tasks,
            now: 0,
            run: RunState::Pending,
            cancel_requested: false,
        }
    }

    fn claim(&mut self, i: usize, current: bool) -> bool {
        let now = self.now;
        let cancel_requested = self.cancel_requested;
        let t = &mut self.tasks[i];
        if !(t.state == TaskRunState::Ready && current && !cancel_requested) {
            return false;
        }
        t.state = TaskRunState::Running;
        t.bumps += 1;
        t.started = true;
        t.lease_until = Some(now + secs(LEASE));
        true
    }

    /// `Some(cancel_requested)` when the lease is held.
    fn heartbeat(&mut self, i: usize, current: bool) -> Option<bool> {
        let now = self.now;
        let t = &mut self.tasks[i];
        (t.state == TaskRunState::Running && current).then(|| {
            t.lease_until = Some(now + secs(LEASE));
            self.cancel_requested
        })
    }

    fn finish(&mut self, i: usize, current: bool, outcome: &TaskOutcome) -> FinishResult {
        let now = self.now;
        let t = &mut self.tasks[i];
        if !(t.state == TaskRunState::Running && current) {
            return FinishResult::Stale;
        }
        t.lease_until = None;
        t.flagged = true;
        match outcome {
            TaskOutcome::Succeeded { .. } => t.state = TaskRunState::Succeeded,
            TaskOutcome::Failed { retry_in: None, .. } => t.state = TaskRunState::Failed,
            TaskOutcome::Failed {
                retry_in: Some(wait), ..
            } => {
                t.state = TaskRunState::Retrying;
                t.attempt += 1;
                t.retry_at = Some(now + secs(*wait));
            }
            TaskOutcome::Cancelled => {
                t.state = TaskRunState::Cancelled;
                t.reason = Some(CancelReason::User);
            }
        }
        FinishResult::Recorded(t.state)
    }

    /// The leases taken back: (task, transition, cancelled, attempt, the
    /// token generation it held), by key.
    fn reap(&mut self) -> Vec<(usize, TaskTransition, bool, u32, usize)> {
        let (now, cancel_requested) = (self.now, self.cancel_requested);
        let mut reaped = Vec::new();
        for (i, t) in self.tasks.iter_mut().enumerate() {
            if !(t.state == TaskRunState::Running && t.lease_until.is_some_and(|until| until < now)) {
                continue;
            }
            let final_attempt = t.attempt >= t.max_attempts;
            let transition = if final_attempt && !cancel_requested {
                TaskTransition::ReapLeaseFinal
            } else {
                TaskTransition::ReapLease
            };
            reaped.push((i, transition, cancel_requested, t.attempt, t.bumps));
            t.bumps += 1;
            t.lease_until = None;
            if cancel_requested {
                t.attempt += 1;
                t.state = TaskRunState::Cancelled;
                t.reason = Some(CancelReason::User);
                t.flagged = true;
            } else if final_attempt {
                t.state = TaskRunState::Failed;
                t.flagged = true;
            } else {
                t.attempt += 1;
                t.state = TaskRunState::Ready;
            }
        }
        reaped
    }

    fn cancel(&mut self) -> CancelOutcome {
        if self.run.is_terminal() {
            CancelOutcome::AlreadyFinished(self.run)
        } else if self.cancel_requested {
            CancelOutcome::AlreadyRequested
        } else {
            self.cancel_requested = true;
            CancelOutcome::Requested
        }
    }

    fn dependents(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.tasks.len()).filter(move |j| self.tasks[*j].deps.contains(&i))
    }

    fn transitive_dependents(&self, i: usize) -> BTreeSet<usize> {
        let mut found = BTreeSet::new();
        let mut todo = vec![i];
        while let Some(k) = todo.pop() {
            for d in self.dependents(k) {
                if found.insert(d) {
                    todo.push(d);
                }
            }
        }
        found
    }

    fn take_flagged(&mut self) -> Reaction {
        let mut r = Reaction::default();
        for i in 0..self.tasks.len() {
            if !std::mem::take(&mut self.tasks[i].flagged) {
                continue;
            }
            match self.tasks[i].state {
                TaskRunState::Succeeded => {
                    for d in self.dependents(i).collect::<Vec<_>>() {
                        *r.satisfied.entry(d).or_default() += 1;
                    }
                }
                TaskRunState::Failed => r.upstream_failed.extend(self.transitive_dependents(i)),
                TaskRunState::Cancelled => r.upstream_cancelled.extend(self.transitive_dependents(i)),
                _ => {}
            }
        }
        r
    }

    fn cancel_where(&mut self, reason: CancelReason, which: impl Fn(usize, &Task) -> bool) -> Vec<String> {
        let mut keys = Vec::new();
        for (i, t) in self.tasks.iter_mut().enumerate() {
            if which(i, t) {
                t.state = TaskRunState::Cancelled;
                t.reason = Some(reason);
                t.retry_at = None;
                keys.push(key(i));
            }
        }
        keys
    }

    fn cancel_pending(&mut self, which: &BTreeSet<usize>, reason: CancelReason) -> Vec<String> {
        self.cancel_where(reason, |i, t| which.contains(&i) && t.state == TaskRunState::Pending)
    }

    fn cancel_waiting(&mut self) -> Vec<String> {
        self.cancel_where(CancelReason::User, |_, t| {
            matches!(
                t.state,
                TaskRunState::Pending | TaskRunState::Ready | TaskRunState::Retrying
            )
        })
    }

    fn satisfy(&mut self, done: &BTreeMap<usize, u32>) -> Vec<String> {
        let mut keys = Vec::new();
        for (i, t) in self.tasks.iter_mut().enumerate() {
            if t.state != TaskRunState::Pending {
                continue;
            }
            t.waiting_on = t.waiting_on.saturating_sub(done.get(&i).copied().unwrap_or(0));
            if t.waiting_on == 0 {
                t.state = TaskRunState::Ready;
                keys.push(key(i));
            }
        }
        keys
    }

    fn promote_due(&mut self) -> Vec<String> {
        let now = self.now;
        let mut keys = Vec::new();
        for (i, t) in self.tasks.iter_mut().enumerate() {
            if t.state == TaskRunState::Retrying && t.retry_at.is_some_and(|at| at <= now) {
                t.state = TaskRunState::Ready;
                t.retry_at = None;
                keys.push(key(i));
            }
        }
        keys
    }

    fn tally(&self) -> TaskTally {
        let mut tally = TaskTally::default();
        for t in &self.tasks {
            tally.add(t.state, t.reason, t.started);
        }
        tally
    }
}
