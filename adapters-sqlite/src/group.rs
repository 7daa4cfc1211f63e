//! Group commit (docs/design/leases-and-fencing.md#group-commit): the
//! claims and finishes that wait for SQLite's one writer while it is busy
//! commit together, in one transaction, each still its own conditional
//! statements with its own answer.
//!
//! No committer task and no timer: whoever gets the writer takes every
//! write waiting at that moment and runs them. A caller that finds its
//! write already answered when the writer comes to it only hands the
//! writer on. So a lone write runs at once, alone, as before, and a
//! burst shares the transaction's fixed cost: the write lock, and the WAL
//! frames of the pages its writes share. It still takes one call to
//! SQLite's thread per write.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use flowforge_ports::store;
use sqlx::sqlite::SqliteRow;
use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::store::{Conn, Inner, Query, lock, padded, sql};

/// What a write's caller gets: the rows of its statements, in order.
type Answer = Result<Vec<SqliteRow>, store::Error>;

/// One claim's or finish's call: its SQL as it runs alone (from `BEGIN
/// IMMEDIATE` to `COMMIT`) and its values.
pub(crate) struct Write {
    alone: &'static str,
    /// Binds the values to either form of the SQL. A group that fails
    /// runs its writes again alone, which binds them a second time.
    bind: Box<dyn Fn(Query) -> Query + Send + Sync>,
}

impl Write {
    pub(crate) fn new(alone: &'static str, bind: impl Fn(Query) -> Query + Send + Sync + 'static) -> Self {
        Self {
            alone,
            bind: Box::new(bind),
        }
    }

    fn alone(&self) -> Query {
        padded((self.bind)(sql(self.alone)))
    }

    /// The same statements as one of several calls in a transaction: the
    /// first call opens it and the last commits it, so a group of writes
    /// takes no more calls than its writes alone would.
    fn part(&self, first: bool, last: bool) -> Option<Query> {
        let mut text = self.alone;
        if !first {
            text = text.strip_prefix(BEGIN)?;
        }
        if !last {
            text = text.strip_suffix(COMMIT)?;
        }
        Some(padded((self.bind)(sql(text))))
    }
}

const BEGIN: &str = "BEGIN IMMEDIATE; ";
const COMMIT: &str = "; COMMIT";

struct Waiting {
    id: u64,
    write: Write,
    answer: oneshot::Sender<Answer>,
}

/// The writes waiting for the writer.
#[derive(Default)]
pub(crate) struct Group {
    waiting: Mutex<Vec<Waiting>>,
    next_id: AtomicU64,
    /// Transactions that carried several writes, for the tests to tell a
    /// group from writes that happened to run one by one.
    #[cfg(test)]
    together: AtomicU64,
}

/// Takes a caller's write back out of the waiting list if the caller goes
/// (its future dropped, the writer not had in time) before anybody took
/// it: a claim nobody waits for would hold its task until the reaper.
struct Withdraw<'a> {
    group: &'a Group,
    id: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        lock(&self.group.waiting).retain(|w| w.id != self.id);
    }
}

fn abandoned() -> store::Error {
    store::Error::Unavailable(
        "the call carrying this write with others was abandoned before it answered; the write may have committed"
            .into(),
    )
}

impl Inner {
    /// Runs `write` on the writer, in one transaction with whichever other
    /// writes are waiting when the writer is free.
    pub(crate) async fn grouped(&self, write: Write) -> Answer {
        let (answer, mut answered) = oneshot::channel();
        let id = self.group.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.group.waiting).push(Waiting { id, write, answer });
        let withdraw = Withdraw { group: &self.group, id };
        let conn = self.hold_writer().await;
        match answered.try_recv() {
            // Taken and answered by whoever had the writer before.
            Ok(answer) => return answer,
            // Taken by a caller that went before answering.
            Err(TryRecvError::Closed) => return Err(abandoned()),
            Err(TryRecvError::Empty) => {}
        }
        let mut conn = conn?;
        // Nobody else holds the writer, and whoever held it answered all it
        // took: this write is still waiting, and goes in this group.
        let group = std::mem::take(&mut *lock(&self.group.waiting));
        drop(withdraw);
        self.wrote(group.len());
        run(&self.group, &mut conn, group).await;
        drop(conn);
        answered.await.unwrap_or_else(|_| Err(abandoned()))
    }
}

/// Runs a group and answers each of its writes: together when there are
/// several, and each alone when they are one or together failed (a
/// write's own error must not fail the others).
async fn run(#[cfg_attr(not(test), expect(unused))] counts: &Group, conn: &mut Conn, group: Vec<Waiting>) {
    if group.len() > 1 {
        match together(conn, &group).await {
            Ok(answers) => {
                #[cfg(test)]
                counts.together.fetch_add(1, Ordering::Relaxed);
                for (waiting, rows) in group.into_iter().zip(answers) {
                    // A caller that went no longer wants its answer.
                    let _ = waiting.answer.send(Ok(rows));
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, writes = group.len(), "a group commit failed; its writes run alone");
                // A failed call has rolled back already; a write that could
                // not join leaves the group's transaction open.
                if let Err(e) = conn.rollback().await {
                    for waiting in group {
                        let _ = waiting.answer.send(Err(e.clone()));
                    }
                    return;
                }
            }
        }
    }
    for waiting in group {
        let answer = conn.call(waiting.write.alone()).await;
        let _ = waiting.answer.send(answer);
    }
}

/// One transaction for every write of `group`, each write's statements
/// one call inside it; nothing of it stays when any call fails.
async fn together(conn: &mut Conn, group: &[Waiting]) -> Result<Vec<Vec<SqliteRow>>, store::Error> {
    let last = group.len() - 1;
    let mut answers = Vec::with_capacity(group.len());
    for (at, waiting) in group.iter().enumerate() {
        let q = waiting.write.part(at == 0, at == last).ok_or_else(|| {
            store::Error::Other(format!(
                "a write that cannot share a transaction: {}",
                waiting.write.alone
            ))
        })?;
        answers.push(if at == last {
            conn.call(q).await?
        } else {
            conn.open_call(q).await?
        });
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use flowforge_domain::{TaskRunState, WorkflowDefinition, WorkflowDocument};
    use flowforge_ports::{DefinitionStore, RunId, RunStore, SystemClock, TaskRunView, WorkerId};
    use serde_json::json;

    use crate::store::lock;
    use crate::{SqliteStore, queries};

    const LEASE: Duration = Duration::from_secs(300);

    /// A store whose one run has three independent tasks, all ready.
    async fn three_ready() -> (SqliteStore, RunId, Vec<TaskRunView>) {
        let store = SqliteStore::connect("sqlite::memory:", Arc::new(SystemClock))
            .await
            .expect("connect");
        let doc: WorkflowDocument = serde_json::from_value(json!({"name": "three", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop"},
            {"key": "c", "task_type": "noop"}
        ]}))
        .expect("a document");
        let definition = WorkflowDefinition::from_document(doc).expect("a definition");
        let published = store.publish_definition(&definition).await.expect("publish");
        let run = store.start_run(published.id, json!({})).await.expect("start");
        let mut tasks = store.get_run(run).await.expect("get_run").expect("the run").tasks;
        tasks.sort_by(|x, y| x.key.cmp(&y.key));
        (store, run, tasks)
    }

    /// Waits, without sleeping on a guess, until `n` writes wait for the writer.
    async fn until_waiting(store: &SqliteStore, n: usize) {
        while lock(&store.inner.group.waiting).len() < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_with_one_stale_token_commits_the_others_and_answers_that_one_stale() {
        let (store, run, tasks) = three_ready().await;
        // Held, the writer makes the claims wait for it together.
        let held = store.inner.write().await.expect("the writer");
        let claims: Vec<_> = tasks
            .iter()
            .map(|t| {
                let store = store.clone();
                // b's dispatch is stale: a token ahead of the row's.
                let token = if t.key == "b" { t.token + 1 } else { t.token };
                let id = t.id;
                tokio::spawn(async move { store.claim_task_run(id, token, &WorkerId("w".into()), LEASE).await })
            })
            .collect();
        until_waiting(&store, 3).await;
        drop(held);
        let mut claimed = Vec::new();
        for claim in claims {
            claimed.push(claim.await.expect("joined").expect("claimed or stale").is_some());
        }
        assert_eq!(claimed, [true, false, true], "a and c claimed, b stale");
        assert_eq!(
            store.inner.group.together.load(Ordering::Relaxed),
            1,
            "one transaction carried them"
        );
        let detail = store.get_run(run).await.expect("get_run").expect("the run");
        for t in &detail.tasks {
            let want = if t.key == "b" {
                TaskRunState::Ready
            } else {
                TaskRunState::Running
            };
            assert_eq!(t.state, want, "{}", t.key);
            let claims = detail
                .events
                .iter()
                .filter(|e| e.task.as_deref() == Some(t.key.as_str()) && e.transition == "claim")
                .count();
            assert_eq!(
                claims,
                usize::from(t.key != "b"),
                "{}: the claim's event with its UPDATE",
                t.key
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_whose_caller_goes_before_its_group_runs_is_withdrawn() {
        let (store, run, tasks) = three_ready().await;
        let held = store.inner.write().await.expect("the writer");
        let (id, token) = (tasks[0].id, tasks[0].token);
        let gone = {
            let store = store.clone();
            tokio::spawn(async move { store.claim_task_run(id, token, &WorkerId("w".into()), LEASE).await })
        };
        until_waiting(&store, 1).await;
        gone.abort();
        assert!(gone.await.expect_err("aborted").is_cancelled());
        assert!(lock(&store.inner.group.waiting).is_empty(), "withdrawn");
        drop(held);
        let stays = store.get_run(run).await.expect("get_run").expect("the run").tasks;
        assert!(
            stays.iter().all(|t| t.state == TaskRunState::Ready),
            "nothing claimed it"
        );
        // The writer and the group still serve the next write.
        assert!(
            store
                .claim_task_run(id, token, &WorkerId("w".into()), LEASE)
                .await
                .expect("claim")
                .is_some()
        );
    }

    #[test]
    fn every_grouped_write_can_open_join_or_commit_a_group() {
        for (name, alone) in queries::grouped_writes() {
            let inside = alone
                .strip_prefix(super::BEGIN)
                .and_then(|rest| rest.strip_suffix(super::COMMIT))
                .unwrap_or_else(|| panic!("{name} is not BEGIN IMMEDIATE; …; COMMIT"));
            assert!(
                !inside.contains("BEGIN") && !inside.contains("COMMIT"),
                "{name} opens or ends a transaction of its own"
            );
        }
    }
}
