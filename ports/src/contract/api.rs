//! Contract cases: what an HTTP API server reads and writes — the per-run
//! event sequence, keyed starts, run pages and summaries, definition
//! listings, gauges, readiness, and API tokens.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::{RunState, RunTransition};
use serde_json::json;
use tokio::sync::Barrier;

use crate::clock::Clock;
use crate::ids::RunId;
use crate::store::{
    DefinitionStore, Gauges, IdempotencyKey, KeyedStart, NewToken, RunCursor, RunPass, RunQuery, RunStore, RunSummary,
    StartOptions, TokenError, TokenStatus, TokenStore,
};

use super::*;

fn key(key: &str, request_hash: &str) -> IdempotencyKey {
    IdempotencyKey {
        key: key.to_owned(),
        request_hash: request_hash.to_owned(),
    }
}

/// A token of `name` whose digest is `fill` repeated (lower-case hex).
fn token(name: &str, fill: char, expires_in: Option<Duration>) -> NewToken {
    NewToken {
        name: name.to_owned(),
        hash: fill.to_string().repeat(64),
        scopes: vec!["runs:read".to_owned(), "runs:write".to_owned()],
        expires_in,
    }
}

fn page(limit: u32) -> RunQuery {
    RunQuery {
        limit,
        ..RunQuery::default()
    }
}

fn ids(runs: &[RunSummary]) -> Vec<RunId> {
    runs.iter().map(|r| r.id).collect()
}

/// Every event of a run, task and run transitions and audits alike, is
/// numbered 1, 2, 3, … in the order get_run reports them; each run counts
/// on its own.
pub async fn event_seq_numbers_a_runs_history_without_gaps<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let other = start(&s, chain()).await;
    let a = claim(&s, run, "a", "w1", LONG).await;
    claim(&s, other, "a", "w1", LONG).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(RunTransition::Start).await.expect("start");
    p.commit().await.expect("commit");
    finish(&s, &a, "w1", succeeded(json!({}))).await;
    // A stale finish is an audit event: numbered like any other.
    assert_eq!(finish(&s, &a, "w2", succeeded(json!({}))).await, FinishResult::Stale);
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    p.commit().await.expect("commit");

    let history = events(&s, run).await;
    assert_eq!(
        transitions(&history),
        [
            "claim",
            "start",
            "succeed",
            "stale_write_rejected",
            "dependencies_satisfied"
        ]
    );
    let seqs: Vec<u64> = history.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=5).collect::<Vec<u64>>(), "1..n, in get_run's order");
    assert_eq!(s.run_events(run, 0, 100).await.expect("run_events"), history);
    let theirs: Vec<u64> = events(&s, other).await.iter().map(|e| e.seq).collect();
    assert_eq!(theirs, [1], "each run numbers its own events");
    assert!(
        s.run_events(RunId(uuid::Uuid::nil()), 0, 10)
            .await
            .expect("run_events")
            .is_empty()
    );
}

/// `run_events` pages by sequence number: strictly after `after`, at most
/// `limit`, so a reader resuming from the last number it saw misses
/// nothing and repeats nothing.
pub async fn run_events_pages_after_a_sequence_number<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let run = start(&s, chain()).await;
    let a = claim(&s, run, "a", "w", LONG).await;
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.transition_run(RunTransition::Start).await.expect("start");
    p.commit().await.expect("commit");
    finish(&s, &a, "w", succeeded(json!({}))).await;
    let all = events(&s, run).await;
    assert_eq!(all.len(), 3);

    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = s.run_events(run, after, 2).await.expect("run_events");
        assert!(page.len() <= 2, "the limit bounds a page");
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page);
    }
    assert_eq!(seen, all, "pages add up to the history, once each");

    // Events written after a reader's last page come on its next one.
    let mut p = pass(&s, run).await;
    p.take_flagged().await.expect("take_flagged");
    p.satisfy_dependencies(&[("b".into(), 1)]).await.expect("satisfy");
    p.commit().await.expect("commit");
    let next = s.run_events(run, after, 10).await.expect("run_events");
    assert_eq!(transitions(&next), ["dependencies_satisfied"]);
    assert_eq!(next[0].seq, after + 1);
    assert_eq!(s.run_events(run, 1, 1).await.expect("run_events"), all[1..2]);
}

/// A key starts one run: the same request again is `Replayed`, another
/// request under the key is `Reused`, both naming the first run and
/// starting nothing.
pub async fn keyed_starts_replay_the_first_run<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, chain()).await;
    let first = match s
        .start_run_keyed(p.id, json!({"n": 1}), &StartOptions::default(), &key("k1", "h1"))
        .await
        .expect("keyed start")
    {
        KeyedStart::Started(run) => run,
        other => panic!("a new key starts a run, got {other:?}"),
    };
    let summary = s.run_summary(first.id).await.expect("run_summary").expect("the run");
    assert_eq!(
        first.created_at, summary.created_at,
        "the start tells the stored creation time"
    );
    let first = first.id;
    assert_eq!(
        s.start_run_keyed(p.id, json!({"n": 1}), &StartOptions::default(), &key("k1", "h1"))
            .await
            .expect("keyed start"),
        KeyedStart::Replayed(first)
    );
    assert_eq!(
        s.start_run_keyed(p.id, json!({"n": 2}), &StartOptions::default(), &key("k1", "h2"))
            .await
            .expect("keyed start"),
        KeyedStart::Reused(first)
    );
    assert_eq!(
        ids(&s.list_runs(10).await.expect("list_runs")),
        [first],
        "no second run"
    );
    let detail = s.get_run(first).await.expect("get_run").expect("the run");
    assert_eq!(detail.input, json!({"n": 1}));
    assert_eq!(detail.tasks.len(), 3, "a keyed run is a run like any other");

    let second = s
        .start_run_keyed(p.id, json!({"n": 1}), &StartOptions::default(), &key("k2", "h1"))
        .await
        .expect("keyed start");
    assert!(matches!(second, KeyedStart::Started(run) if run.id != first));
    // A failed start records no key: the key stays free for a good request.
    let missing = crate::ids::WorkflowId(p.id.0 + 1_000);
    assert!(
        s.start_run_keyed(missing, json!({}), &StartOptions::default(), &key("k3", "h1"))
            .await
            .is_err()
    );
    assert!(matches!(
        s.start_run_keyed(p.id, json!({}), &StartOptions::default(), &key("k3", "h1"))
            .await
            .expect("keyed start"),
        KeyedStart::Started(_)
    ));
    assert_eq!(s.list_runs(10).await.expect("list_runs").len(), 3);
}

/// Concurrent starts under one key start exactly one run; every other
/// caller is told of that run.
pub async fn concurrent_keyed_starts_start_one_run<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, chain()).await;
    const CALLERS: usize = 4;
    let barrier = Arc::new(Barrier::new(CALLERS));
    let mut calls = Vec::new();
    for _ in 0..CALLERS {
        let (s, barrier) = (s.clone(), barrier.clone());
        calls.push(tokio::spawn(async move {
            barrier.wait().await;
            s.start_run_keyed(p.id, json!({}), &StartOptions::default(), &key("once", "h"))
                .await
        }));
    }
    let mut started = Vec::new();
    let mut replayed = Vec::new();
    for call in calls {
        match call.await.expect("the caller ran").expect("keyed start") {
            KeyedStart::Started(run) => started.push(run.id),
            KeyedStart::Replayed(run) => replayed.push(run),
            other => panic!("one request, one hash: {other:?}"),
        }
    }
    assert_eq!(started.len(), 1, "exactly one caller starts the run");
    assert!(replayed.iter().all(|r| *r == started[0]), "{replayed:?}");
    assert_eq!(ids(&s.list_runs(10).await.expect("list_runs")), started);
}

/// A page filters by state, workflow name and creation time (each a set
/// of alternatives, ANDed), newest first; `run_summary` reads one run.
pub async fn run_pages_filter_by_state_workflow_and_time<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let chain_def = publish(&s, chain()).await;
    let diamond_def = publish(&s, diamond()).await;
    let c1 = s.start_run(chain_def.id, json!({})).await.expect("start");
    let d1 = s.start_run(diamond_def.id, json!({})).await.expect("start");
    let c2 = s.start_run(chain_def.id, json!({})).await.expect("start");
    let mut p = pass(&s, c2).await;
    p.cancel_waiting().await.expect("cancel_waiting");
    assert!(
        p.transition_run(RunTransition::CancelBeforeStart)
            .await
            .expect("cancel")
    );
    p.commit().await.expect("commit");

    let all = s.list_runs_page(&page(10)).await.expect("page");
    assert_eq!(
        all,
        s.list_runs(10).await.expect("list_runs"),
        "newest first, as list_runs"
    );
    assert_eq!(BTreeSet::from_iter(ids(&all)), BTreeSet::from([c1, d1, c2]));
    assert!(
        all.windows(2)
            .all(|w| (w[0].created_at, w[0].id) > (w[1].created_at, w[1].id)),
        "by (created_at, id), descending"
    );
    let by_state = |states: Vec<RunState>| RunQuery { states, ..page(10) };
    assert_eq!(
        ids(&s
            .list_runs_page(&by_state(vec![RunState::Cancelled]))
            .await
            .expect("page")),
        [c2]
    );
    let pending = ids(&s
        .list_runs_page(&by_state(vec![RunState::Pending]))
        .await
        .expect("page"));
    assert_eq!(BTreeSet::from_iter(pending), BTreeSet::from([c1, d1]));
    let either = s
        .list_runs_page(&by_state(vec![RunState::Pending, RunState::Cancelled]))
        .await
        .expect("page");
    assert_eq!(either.len(), 3, "states are alternatives");

    let by_name = |names: &[&str]| RunQuery {
        workflows: names.iter().map(|n| (*n).to_owned()).collect(),
        ..page(10)
    };
    let chains = ids(&s.list_runs_page(&by_name(&["chain"])).await.expect("page"));
    assert_eq!(BTreeSet::from_iter(chains), BTreeSet::from([c1, c2]));
    assert_eq!(
        s.list_runs_page(&by_name(&["chain", "diamond"]))
            .await
            .expect("page")
            .len(),
        3
    );
    assert!(s.list_runs_page(&by_name(&["nope"])).await.expect("page").is_empty());
    let both = RunQuery {
        states: vec![RunState::Pending],
        ..by_name(&["chain"])
    };
    assert_eq!(ids(&s.list_runs_page(&both).await.expect("page")), [c1], "filters AND");

    let newest = &all[0];
    let from_newest = RunQuery {
        created_after: Some(newest.created_at),
        ..page(10)
    };
    let got = s.list_runs_page(&from_newest).await.expect("page");
    assert!(got.iter().any(|r| r.id == newest.id), "created_after is inclusive");
    assert!(got.iter().all(|r| r.created_at >= newest.created_at));
    let before_newest = RunQuery {
        created_before: Some(newest.created_at),
        ..page(10)
    };
    let got = s.list_runs_page(&before_newest).await.expect("page");
    assert!(
        got.iter().all(|r| r.created_at < newest.created_at),
        "created_before is exclusive"
    );
    assert!(s.list_runs_page(&page(0)).await.expect("page").is_empty());

    for run in &all {
        assert_eq!(s.run_summary(run.id).await.expect("run_summary").as_ref(), Some(run));
    }
    assert_eq!(
        s.run_summary(RunId(uuid::Uuid::nil())).await.expect("run_summary"),
        None
    );
}

/// Walking pages by the last row's cursor sees every run that existed
/// when the walk began exactly once, though runs start between pages.
pub async fn run_pages_walk_every_earlier_run_once<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let p = publish(&s, chain()).await;
    let mut before = Vec::new();
    for _ in 0..7 {
        before.push(s.start_run(p.id, json!({})).await.expect("start"));
    }
    let mut seen = Vec::new();
    let mut query = page(3);
    loop {
        let got = s.list_runs_page(&query).await.expect("page");
        assert!(got.len() <= 3);
        let Some(last) = got.last() else { break };
        query.after = Some(RunCursor {
            created_at: last.created_at,
            id: last.id,
        });
        seen.extend(ids(&got));
        // Newer than every cursor: never on a later page.
        s.start_run(p.id, json!({})).await.expect("start between pages");
    }
    let unique: BTreeSet<RunId> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no run twice: {seen:?}");
    assert_eq!(unique, BTreeSet::from_iter(before), "every earlier run, and only those");
}

/// Definitions are listed by name, then version highest first, with their
/// task counts (compensators included); a name narrows the list.
pub async fn list_definitions_by_name_then_newest_version<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    assert!(s.list_definitions(None).await.expect("list").is_empty());
    let chain1 = publish(&s, chain()).await;
    let mut newer = chain();
    newer["version"] = json!(2);
    newer["tasks"]
        .as_array_mut()
        .expect("tasks")
        .push(json!({"key": "e", "task_type": "noop", "depends_on": ["c"]}));
    let chain2 = publish(&s, newer).await;
    let diamond1 = publish(&s, diamond()).await;

    let all = s.list_definitions(None).await.expect("list");
    let got: Vec<(&str, u32, u32)> = all.iter().map(|d| (d.name.as_str(), d.version, d.tasks)).collect();
    assert_eq!(got, [("chain", 2, 5), ("chain", 1, 4), ("diamond", 1, 5)]);
    assert_eq!(all[0].id, chain2.id);
    assert_eq!(all[0].fingerprint, chain2.fingerprint);
    assert_eq!(all[1].id, chain1.id);
    assert_eq!(all[1].created_at, chain1.created_at);
    assert_eq!(all[2].id, diamond1.id);

    let chains = s.list_definitions(Some("chain")).await.expect("list");
    assert_eq!(chains, all[..2]);
    assert!(s.list_definitions(Some("nope")).await.expect("list").is_empty());
}

/// Tokens: created in store time, found by digest with their status as of
/// store now (expired by moving the clock, revoked by name), listed by
/// name; a name is never reused and a revocation happens once.
pub async fn tokens_are_created_found_expired_and_revoked<F: StoreFactory>(factory: &F) {
    let (s, clock) = fresh(factory).await;
    assert!(s.list_tokens().await.expect("list").is_empty());
    let short = s
        .create_token(&token("ci", 'a', Some(Duration::from_secs(60))))
        .await
        .expect("create");
    assert_eq!(short.status, TokenStatus::Active);
    assert_eq!(short.scopes, ["runs:read", "runs:write"]);
    assert_eq!(short.revoked_at, None);
    assert_store_time(short.created_at, clock.offset());
    let expires = short.expires_at.expect("an expiry");
    near(millis(expires, short.created_at), 60_000, "expires_at - created_at");
    let forever = s.create_token(&token("admin", 'b', None)).await.expect("create");
    assert_eq!(forever.expires_at, None);

    match s.create_token(&token("ci", 'c', None)).await {
        Err(TokenError::NameTaken(name)) => assert_eq!(name, "ci"),
        other => panic!("a taken name is NameTaken, got {other:?}"),
    }
    assert_eq!(
        s.token_by_hash(&"a".repeat(64)).await.expect("by hash"),
        Some(short.clone())
    );
    assert_eq!(
        s.token_by_hash(&"c".repeat(64)).await.expect("by hash"),
        None,
        "the refused one is not stored"
    );

    clock.advance(Duration::from_secs(61));
    let expired = s.token_by_hash(&"a".repeat(64)).await.expect("by hash").expect("found");
    assert_eq!(expired.status, TokenStatus::Expired, "judged at store now");
    let still = s.token_by_hash(&"b".repeat(64)).await.expect("by hash").expect("found");
    assert_eq!(still.status, TokenStatus::Active);

    assert!(s.revoke_token("admin").await.expect("revoke"));
    assert!(!s.revoke_token("admin").await.expect("revoke"), "already revoked");
    assert!(!s.revoke_token("nobody").await.expect("revoke"), "no such token");
    let revoked = s.token_by_hash(&"b".repeat(64)).await.expect("by hash").expect("found");
    assert_eq!(revoked.status, TokenStatus::Revoked);
    assert_store_time(revoked.revoked_at.expect("revoked_at"), clock.offset());
    assert!(
        matches!(
            s.create_token(&token("admin", 'd', None)).await,
            Err(TokenError::NameTaken(_))
        ),
        "a revoked token's name stays taken"
    );

    let listed: Vec<(String, TokenStatus)> = s
        .list_tokens()
        .await
        .expect("list")
        .into_iter()
        .map(|t| (t.name, t.status))
        .collect();
    assert_eq!(
        listed,
        [
            ("admin".to_owned(), TokenStatus::Revoked),
            ("ci".to_owned(), TokenStatus::Expired)
        ]
    );
}

/// Concurrent creates of one name make one token; the others are told the
/// name is taken.
pub async fn concurrent_token_creates_with_one_name_make_one<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    const CALLERS: usize = 4;
    let barrier = Arc::new(Barrier::new(CALLERS));
    let mut calls = Vec::new();
    for fill in ['1', '2', '3', '4'] {
        let (s, barrier) = (s.clone(), barrier.clone());
        calls.push(tokio::spawn(async move {
            barrier.wait().await;
            s.create_token(&token("race", fill, None)).await
        }));
    }
    let mut created = 0;
    for call in calls {
        match call.await.expect("the caller ran") {
            Ok(_) => created += 1,
            Err(TokenError::NameTaken(name)) => assert_eq!(name, "race"),
            Err(e) => panic!("a lost race is NameTaken, got {e:?}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(s.list_tokens().await.expect("list").len(), 1);
}

/// The gauges count ready and running task runs, unpublished outbox rows
/// and active runs; a migrated store is ready.
pub async fn gauges_count_active_work_and_the_store_is_ready<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    s.ready().await.expect("a fresh store is ready");
    assert_eq!(s.gauges().await.expect("gauges"), Gauges::default());
    let run = start(&s, diamond()).await;
    assert_eq!(
        s.gauges().await.expect("gauges"),
        Gauges {
            ready: 2,
            running: 0,
            outbox_unpublished: 2,
            active_runs: 1,
        }
    );
    claim(&s, run, "a", "w", LONG).await;
    sweep_published(&s, 1).await;
    assert_eq!(
        s.gauges().await.expect("gauges"),
        Gauges {
            ready: 1,
            running: 1,
            outbox_unpublished: 1,
            active_runs: 1,
        }
    );
    let other = start(&s, chain()).await;
    let mut p = pass(&s, other).await;
    p.cancel_waiting().await.expect("cancel_waiting");
    p.transition_run(RunTransition::CancelBeforeStart)
        .await
        .expect("cancel");
    p.commit().await.expect("commit");
    let after = s.gauges().await.expect("gauges");
    assert_eq!(after.active_runs, 1, "a finished run is not active");
    assert_eq!(after.ready, 1, "a cancelled task run is not ready");
    s.ready().await.expect("still ready");
}
