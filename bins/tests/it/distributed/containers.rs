//! Faults that need a container (issue 11 item 5): real `flowforge`
//! processes over a PostgreSQL or RabbitMQ container of the test's own
//! (flowforge-testkit's `Dedicated`), which the test restarts or pauses.
//! The database restarted mid-run: every process reconnects, the run
//! finishes, and each task ran once — by the handlers' own log, not only
//! the store's. The broker paused (its sockets open, silent) for longer
//! than the heartbeat: the worker and the publisher notice, reconnect once
//! it is back, and the run finishes with each task run once.

use std::path::Path;

use flowforge::RunState;
use flowforge_adapters_postgres::PgStore;
use flowforge_domain::TaskRunState;
use flowforge_ports::RunId;
use flowforge_testkit::{Dedicated, Service};
use serde_json::{Value, json};

use super::cluster::{Cluster, ProcId};
use super::{amqp_url, eventually, postgres_url, served, settled, task, transitions};

/// What the AMQP client logs when a connection missed its heartbeats.
const MISSED_HEARTBEATS: &str = "no heartbeat received from server";

/// A chain of `keys.len()` `command` tasks, each writing its key to
/// `ran.log` in the worker's folder, then sleeping `seconds`.
fn logged_chain(name: &str, keys: &[&str], seconds: u32) -> Value {
    let tasks: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let mut t = json!({
                "key": key, "task_type": "command",
                "config": {"argv": ["sh", "-c", format!("echo {key} >> ran.log; sleep {seconds}")]}
            });
            if i > 0 {
                t["depends_on"] = json!([keys[i - 1]]);
            }
            t
        })
        .collect();
    json!({"name": name, "version": 1, "tasks": tasks})
}

/// The keys the handlers logged, in the order they started.
fn ran(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ran.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The run succeeded with each task claimed once, at its first attempt
/// (none lost to the outage and reaped), each handler ran once and in
/// order by its own log, and every process is still running: none gave
/// up on the outage.
async fn each_ran_once(cluster: &mut Cluster, store: &PgStore, run: RunId, keys: &[&str], procs: &[ProcId]) {
    let stored = settled(store, run).await;
    assert_eq!(stored.summary.state, RunState::Succeeded, "{}", cluster.logs());
    for key in keys {
        let t = task(&stored, key);
        assert_eq!((t.state, t.attempt), (TaskRunState::Succeeded, 1), "{key}: {t:?}");
        let seen = transitions(&stored, key);
        let claims = seen.iter().filter(|t| *t == "claim").count();
        assert!(
            claims == 1 && seen.last().map(String::as_str) == Some("succeed"),
            "{key}: {seen:?}"
        );
    }
    assert_eq!(ran(cluster.dir()), keys, "each handler ran once, in order");
    for &p in procs {
        assert!(
            cluster.running(p),
            "a process exited on the outage:\n{}",
            cluster.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_run_every_process_reconnects_and_each_task_runs_once() {
    let Some(amqp) = amqp_url() else {
        return;
    };
    let Some(postgres) = Dedicated::start(Service::Postgres).await else {
        return;
    };
    let mut cluster = Cluster::on(&postgres.url(), &amqp, "pg-restart").await;
    cluster.migrate().await;
    let store = cluster.db.store().await;
    let procs = [
        cluster.spawn("scheduler", ["scheduler"]),
        cluster.spawn("publisher", ["publisher"]),
        cluster.spawn("worker", ["worker", "--concurrency", "2", "--allow-command"]),
    ];
    served(&store, "command").await;
    let keys = ["one", "two", "three", "four"];
    let file = cluster.json("chain.json", &logged_chain("pg-restart", &keys, 2));
    let run = cluster.submit(&file).await;
    eventually("the second task to start", || async {
        (ran(cluster.dir()).len() >= 2).then_some(())
    })
    .await;

    // A clean stop and start: connections close, committed work stays.
    postgres.restart().await;

    each_ran_once(&mut cluster, &store, run, &keys, &procs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_paused_past_the_heartbeat_is_noticed_and_the_run_finishes_once_it_is_back() {
    let Some(postgres) = postgres_url() else {
        return;
    };
    let Some(broker) = Dedicated::start(Service::Rabbitmq).await else {
        return;
    };
    // A 2 s heartbeat: a silent broker is found dead after a few seconds.
    let amqp = format!("{}?heartbeat=2", broker.url());
    let mut cluster = Cluster::on(&postgres, &amqp, "rabbit-pause").await;
    cluster.migrate().await;
    let store = cluster.db.store().await;
    let procs = [
        cluster.spawn("scheduler", ["scheduler"]),
        cluster.spawn("publisher", ["publisher"]),
        cluster.spawn("worker", ["worker", "--concurrency", "1", "--allow-command"]),
    ];
    served(&store, "command").await;
    let keys = ["first", "second", "third"];
    let file = cluster.json("chain.json", &logged_chain("rabbit-pause", &keys, 1));
    let run = cluster.submit(&file).await;
    eventually("the first task to start", || async {
        (!ran(cluster.dir()).is_empty()).then_some(())
    })
    .await;

    broker.pause().await;
    // Held until the worker and the publisher have found their silent
    // connections dead (by the heartbeat: nothing closes a socket) — while
    // the first task ends and the second waits in the outbox.
    let [_, publisher, worker] = procs;
    eventually("the worker and the publisher to notice the paused broker", || async {
        [worker, publisher]
            .iter()
            .all(|&p| cluster.stderr(p).contains(MISSED_HEARTBEATS))
            .then_some(())
    })
    .await;
    broker.unpause().await;

    each_ran_once(&mut cluster, &store, run, &keys, &procs).await;
}
