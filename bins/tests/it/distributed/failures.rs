//! Real `flowforge worker` processes meeting trouble
//! (docs/design/handlers.md#the-worker): one killed mid-task loses the task to
//! the reaper and the task completes exactly once; one stopped until its lease
//! is reaped cannot overwrite the newer attempt when it resumes (its finish is
//! rejected and audited with its token); SIGTERM lets the in-flight task finish
//! and be acked, then the process exits 0, as it does when idle; a worker cut
//! off from the broker (through the test's own proxy) reconnects by itself, and
//! SIGTERM interrupts its reconnect wait at once.
//!
//! Only the worker whose lease must expire runs with a short lease
//! (`--lease-seconds 5`: the reaper acts within seconds, yet a heartbeat
//! every 1.7 s survives a loaded machine's stalls); every other attempt
//! holds the default 30 s lease, so nothing else is reaped by accident.

use std::path::Path;
use std::time::{Duration, Instant};

use flowforge::RunState;
use flowforge_domain::TaskRunState;
use flowforge_ports::WorkerRegistry;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::cluster::{Cluster, worker_pid};
use super::{amqp_url_via, broker_address, detail, eventually, running_on, served, settled, task, transitions};
use flowforge_testkit::{Mode, Proxy};

/// A `command` task that waits for the file `gate` to exist, then prints
/// the pid of the worker running it and its attempt as its output.
fn gated_command(name: &str, gate: &Path) -> Value {
    json!({"name": name, "version": 1, "tasks": [{
        "key": "probe",
        "task_type": "command",
        "timeout_seconds": 600,
        "retry": {"max_attempts": 3, "delay_seconds": 0.1},
        "config": {
            "argv": ["sh", "-c",
                "while [ ! -e \"$GATE\" ]; do sleep 0.05; done; \
                 printf '{\"pid\": %s, \"attempt\": %s}' \"$PPID\" \"$FLOWFORGE_ATTEMPT\""],
            "env": {"GATE": gate.display().to_string()}
        }
    }]})
}

/// The pid in an event's or a lease's worker id.
fn pid_of(worker: Option<&str>) -> Option<u32> {
    worker.and_then(worker_pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_task_loses_it_to_the_reaper_and_it_completes_exactly_once() {
    let Some(mut cluster) = Cluster::migrated("sigkill").await else {
        return;
    };
    let store = cluster.db.store().await;
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    let a = cluster.spawn("worker-a", ["worker", "--concurrency", "1", "--lease-seconds", "5"]);
    let file = cluster.json(
        "nap.json",
        &json!({"name": "nap", "version": 1, "tasks": [{
            "key": "nap", "task_type": "sleep", "config": {"seconds": 6},
            "retry": {"max_attempts": 3, "delay_seconds": 0.1}
        }]}),
    );
    let run = cluster.submit(&file).await;
    running_on(&store, run, "nap", cluster.pid(a)).await;
    let b = cluster.spawn("worker-b", ["worker", "--concurrency", "1"]);
    cluster.signal(a, Signal::SIGKILL);
    assert_eq!(cluster.wait_exit(a).await, -1, "killed by the signal");

    let stored = settled(&store, run).await;
    assert_eq!(stored.summary.state, RunState::Succeeded, "{}", cluster.logs());
    let nap = task(&stored, "nap");
    assert_eq!((nap.state, nap.attempt), (TaskRunState::Succeeded, 2), "{nap:?}");
    assert_eq!(
        transitions(&stored, "nap"),
        ["claim", "reap_lease", "claim", "succeed"],
        "the killed attempt was reaped, the next one succeeded, once: {:#?}",
        stored.events
    );
    let events: Vec<_> = stored
        .events
        .iter()
        .filter(|e| e.task.as_deref() == Some("nap"))
        .collect();
    assert_eq!(
        pid_of(events[0].worker.as_deref()),
        Some(cluster.pid(a)),
        "A claimed first"
    );
    assert_eq!(
        (events[1].from.as_deref(), events[1].to.as_deref()),
        (Some("running"), Some("ready"))
    );
    assert_eq!(
        pid_of(events[2].worker.as_deref()),
        Some(cluster.pid(b)),
        "B claimed the reaped task"
    );
    assert_eq!(
        pid_of(events[3].worker.as_deref()),
        Some(cluster.pid(b)),
        "and finished it"
    );
    assert!(events[0].token < events[2].token, "the reap moved the token on");
    // The killed worker's unacked delivery was redelivered and acked
    // without running (its token is stale), and the reaper's dispatch was
    // acked: once B has stopped and the broker has dropped its consumer
    // (requeueing anything unacked), the queue is empty.
    cluster.signal(b, Signal::SIGTERM);
    assert_eq!(cluster.wait_exit(b).await, 0, "{}", cluster.stderr(b));
    let (ready, _) = eventually("the broker to drop B's consumer", || async {
        cluster.broker.counts().await.filter(|(_, consumers)| *consumers == 0)
    })
    .await;
    assert_eq!(ready, 0, "every delivery was acked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_whose_lease_was_reaped_cannot_overwrite_the_newer_attempt() {
    let Some(mut cluster) = Cluster::migrated("sigstop").await else {
        return;
    };
    let store = cluster.db.store().await;
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    // One slot: while A is stopped it holds its one delivery, so the broker
    // sends the re-dispatch to B, not to another slot of the stopped A.
    let a = cluster.spawn(
        "worker-a",
        [
            "worker",
            "--concurrency",
            "1",
            "--allow-command",
            "--lease-seconds",
            "5",
        ],
    );
    let gate = cluster.dir().join("gate");
    let file = cluster.json("probe.json", &gated_command("stale-write", &gate));
    served(&store, "command").await;
    let run = cluster.submit(&file).await;
    let on_a = running_on(&store, run, "probe", cluster.pid(a)).await;

    cluster.signal(a, Signal::SIGSTOP);
    let b = cluster.spawn("worker-b", ["worker", "--concurrency", "1", "--allow-command"]);
    // A sends no heartbeat: its lease expires, the reaper takes the task
    // back and B claims the new dispatch.
    let on_b = running_on(&store, run, "probe", cluster.pid(b)).await;
    assert_eq!(on_b.attempt, 2);
    assert!(on_b.token > on_a.token);

    cluster.signal(a, Signal::SIGCONT);
    // A resumes: its heartbeat finds the lease lost, it stops its handler
    // and presents its outcome with its old token.
    let stale = eventually("A's finish to be rejected", || async {
        detail(&store, run)
            .await
            .events
            .into_iter()
            .find(|e| e.transition == "stale_write_rejected")
    })
    .await;
    assert_eq!(stale.task.as_deref(), Some("probe"));
    assert_eq!(stale.token, Some(on_a.token), "the audit event carries A's token");
    assert_eq!(pid_of(stale.worker.as_deref()), Some(cluster.pid(a)));
    assert_eq!(
        (stale.from.as_deref(), stale.to.as_deref()),
        (None, None),
        "not a transition"
    );
    // Its finish wrote nothing: the row is B's attempt, untouched.
    let now = task(&detail(&store, run).await, "probe").clone();
    assert_eq!(
        (now.state, now.attempt, now.token, now.lease_owner.clone()),
        (TaskRunState::Running, 2, on_b.token, on_b.lease_owner.clone()),
        "{now:?}"
    );

    std::fs::write(&gate, b"open").expect("open the gate");
    let stored = settled(&store, run).await;
    assert_eq!(stored.summary.state, RunState::Succeeded, "{}", cluster.logs());
    let probe = task(&stored, "probe");
    assert_eq!(
        probe.output,
        Some(json!({"pid": cluster.pid(b), "attempt": 2})),
        "B's attempt's outcome stands"
    );
    assert_eq!(
        transitions(&stored, "probe"),
        ["claim", "reap_lease", "claim", "stale_write_rejected", "succeed"],
        "{:#?}",
        stored.events
    );
    // A survived its stall and still stops gracefully; with B stopped too
    // and their consumers gone, nothing is left on the queue: A acked its
    // delivery after its rejected finish, B acked the re-dispatch.
    assert!(cluster.running(a), "A is still up: {}", cluster.stderr(a));
    for worker in [a, b] {
        cluster.signal(worker, Signal::SIGTERM);
        assert_eq!(cluster.wait_exit(worker).await, 0, "{}", cluster.stderr(worker));
    }
    let (ready, _) = eventually("the broker to drop the workers' consumers", || async {
        cluster.broker.counts().await.filter(|(_, consumers)| *consumers == 0)
    })
    .await;
    assert_eq!(ready, 0, "every delivery was acked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_in_flight_task_finish_and_be_acked_then_the_worker_exits_0() {
    let Some(mut cluster) = Cluster::migrated("sigterm").await else {
        return;
    };
    let store = cluster.db.store().await;
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    let w = cluster.spawn("worker", ["worker", "--concurrency", "1", "--allow-command"]);
    let gate = cluster.dir().join("gate");
    let file = cluster.json("probe.json", &gated_command("graceful", &gate));
    served(&store, "command").await;
    let run = cluster.submit(&file).await;
    running_on(&store, run, "probe", cluster.pid(w)).await;

    cluster.signal(w, Signal::SIGTERM);
    eventually("the worker to begin its graceful stop", || async {
        cluster.stderr(w).contains("stopping gracefully").then_some(())
    })
    .await;
    assert!(
        cluster.running(w),
        "the worker waits for its task: {}",
        cluster.stderr(w)
    );
    assert_eq!(
        task(&detail(&store, run).await, "probe").state,
        TaskRunState::Running,
        "the in-flight task is not interrupted"
    );

    std::fs::write(&gate, b"open").expect("open the gate");
    assert_eq!(cluster.wait_exit(w).await, 0, "{}", cluster.stderr(w));
    let stored = settled(&store, run).await;
    assert_eq!(stored.summary.state, RunState::Succeeded, "{}", cluster.logs());
    let probe = task(&stored, "probe");
    assert_eq!(probe.output, Some(json!({"pid": cluster.pid(w), "attempt": 1})));
    assert_eq!(transitions(&stored, "probe"), ["claim", "succeed"]);
    // Acked: once the broker has dropped the worker's consumer (and
    // requeued whatever it had not acked), the queue is empty.
    let (ready, _) = eventually("the broker to drop the worker's consumer", || async {
        cluster.broker.counts().await.filter(|(_, consumers)| *consumers == 0)
    })
    .await;
    assert_eq!(ready, 0, "the delivery was acked before the exit");
    let workers = store.list_workers().await.expect("list workers");
    assert_eq!(workers.len(), 1);
    assert!(
        workers[0].stopped_at.is_some(),
        "deregistered on the way out: {workers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_exits_0_on_sigterm() {
    let Some(mut cluster) = Cluster::migrated("idle").await else {
        return;
    };
    let store = cluster.db.store().await;
    let w = cluster.spawn("worker", ["worker", "--concurrency", "2"]);
    let pid = cluster.pid(w);
    eventually("the worker to register and consume", || async {
        let registered = store
            .list_workers()
            .await
            .expect("list workers")
            .iter()
            .any(|info| info.pid == pid && info.stopped_at.is_none());
        let consuming = cluster
            .broker
            .counts()
            .await
            .is_some_and(|(_, consumers)| consumers == 2);
        (registered && consuming).then_some(())
    })
    .await;
    cluster.signal(w, Signal::SIGTERM);
    assert_eq!(cluster.wait_exit(w).await, 0, "{}", cluster.stderr(w));
    assert!(cluster.stderr(w).contains("stopping gracefully"));
    let workers = store.list_workers().await.expect("list workers");
    assert!(
        !workers.is_empty() && workers.iter().all(|info| info.stopped_at.is_some()),
        "registered, then deregistered: {workers:?}"
    );
}

/// The delay of the last "reconnecting" line of a worker's log that asks
/// for at least `min_ms`, if any.
fn reconnect_wait_at_least(stderr: &str, min_ms: u64) -> Option<u64> {
    stderr
        .lines()
        .filter(|line| line.contains("reconnecting"))
        .filter_map(|line| {
            let digits: String = line
                .split("retry_in_ms=")
                .nth(1)?
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .rfind(|ms| *ms >= min_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reconnects_after_a_broker_outage_and_sigterm_cuts_its_reconnect_wait_short() {
    let Some(mut cluster) = Cluster::migrated("reconnect").await else {
        return;
    };
    let store = cluster.db.store().await;
    let proxy = Proxy::start(broker_address(&cluster.broker.url).expect("the broker's address")).await;
    let via_proxy = amqp_url_via(&cluster.broker.url, proxy.port());
    cluster.spawn("scheduler", ["scheduler"]);
    cluster.spawn("publisher", ["publisher"]);
    // Only the worker goes through the proxy.
    let w = cluster.spawn("worker", ["worker", "--concurrency", "1", "--amqp", via_proxy.as_str()]);
    let consumers = |n: u32| {
        let broker = &cluster.broker;
        async move {
            eventually(&format!("{n} consumer(s) on the queue"), || async {
                broker.counts().await.filter(|(_, c)| *c == n).map(|_| ())
            })
            .await;
        }
    };
    consumers(1).await;
    proxy.set(Mode::Cut);
    consumers(0).await;
    proxy.set(Mode::Forward);
    // Back without a restart: reconnected, redeclared, consuming.
    consumers(1).await;
    let file = cluster.json(
        "echo.json",
        &json!({"name": "after-outage", "version": 1, "tasks": [{"key": "echo", "task_type": "echo"}]}),
    );
    let run = cluster.submit(&file).await;
    let stored = settled(&store, run).await;
    assert_eq!(stored.summary.state, RunState::Succeeded, "{}", cluster.logs());
    assert_eq!(
        pid_of(
            stored
                .events
                .iter()
                .find(|e| e.transition == "claim")
                .and_then(|e| e.worker.as_deref())
        ),
        Some(cluster.pid(w))
    );

    // A longer outage: the reconnect waits grow (jittered, capped) ...
    proxy.set(Mode::Cut);
    let wait_ms = eventually("a reconnect wait of at least 6 s", || async {
        reconnect_wait_at_least(&cluster.stderr(w), 6_000)
    })
    .await;
    assert!(wait_ms <= 30_000, "capped at 30 s: {wait_ms} ms");
    // ... and SIGTERM interrupts one at once: the worker exits 0 well
    // before the wait would have ended.
    let signalled = Instant::now();
    cluster.signal(w, Signal::SIGTERM);
    assert_eq!(cluster.wait_exit(w).await, 0, "{}", cluster.stderr(w));
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_millis(wait_ms) - Duration::from_secs(2),
        "exited {took:?} after SIGTERM, during a {wait_ms} ms reconnect wait"
    );
    let workers = store.list_workers().await.expect("list workers");
    assert!(
        !workers.is_empty() && workers.iter().all(|info| info.stopped_at.is_some()),
        "registered, then deregistered: {workers:?}"
    );
}
