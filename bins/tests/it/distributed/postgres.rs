//! PostgreSQL with the in-process queue (issue 4): the same engine code as
//! the embedded mode over another store reaches the same report as on
//! SQLite — driven by the engine in process, and by `flowforge migrate`
//! then `flowforge run --db postgres://…` as a user would.

use std::time::Duration;

use flowforge::{BuiltinOptions, Embedded, Engine, EngineConfig, HandlerRegistry, InprocQueue, RunReport};
use flowforge_ports::WorkerId;
use serde_json::{Value, json};

use super::{LONG_LEASE, TestDb, assert_same_report, comparable, definition, postgres_url};
use crate::{assert_schema_valid, root};

/// The diamond example, parsed.
fn diamond() -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("examples/diamond.json")).expect("read the example"))
        .expect("the example is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamond_driven_by_the_engine_on_postgres_reports_what_sqlite_does() {
    let Some(postgres) = postgres_url() else {
        return;
    };
    let db = TestDb::migrated(&postgres).await;
    let def = definition(&diamond());
    let input = json!({"batch": "it"});

    let mut registry = HandlerRegistry::new();
    flowforge_app::register_builtins(&mut registry, BuiltinOptions::default());
    let config = EngineConfig {
        concurrency: 2,
        lease: LONG_LEASE,
        worker_id: WorkerId("it-postgres".to_owned()),
        ..EngineConfig::default()
    };
    let on_postgres = Engine::new(db.store().await, InprocQueue::new(), registry, Vec::new(), config);
    let pg: RunReport = tokio::time::timeout(Duration::from_secs(90), on_postgres.run(&def, input.clone()))
        .await
        .expect("the run ends")
        .expect("the run on PostgreSQL");

    let dir = tempfile::tempdir().expect("a temp folder");
    let on_sqlite = Embedded::builder()
        .database(format!("sqlite://{}", dir.path().join("flowforge.db").display()))
        .concurrency(2)
        .lease(LONG_LEASE)
        .build()
        .await
        .expect("the SQLite engine");
    let sqlite = tokio::time::timeout(Duration::from_secs(90), on_sqlite.run(&def, input))
        .await
        .expect("the run ends")
        .expect("the run on SQLite");

    assert_eq!(pg.state, "succeeded", "{pg:#?}");
    assert_eq!(pg.comparable(), sqlite.comparable(), "PostgreSQL vs SQLite");
    assert_ne!(pg.run_id, sqlite.run_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flowforge_migrate_then_run_on_postgres_prints_the_sqlite_report() {
    let Some(postgres) = postgres_url() else {
        return;
    };
    let db = TestDb::empty(&postgres).await;
    let dir = tempfile::tempdir().expect("a temp folder");
    let file = root().join("examples/diamond.json");
    let flowforge = |args: Vec<String>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flowforge"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FLOWFORGE_") {
                cmd.env_remove(key);
            }
        }
        cmd.current_dir(dir.path()).args(args).env_remove("RUST_LOG");
        async move {
            tokio::task::spawn_blocking(move || {
                assert_cmd::Command::from_std(cmd)
                    .timeout(super::PATIENCE)
                    .output()
                    .expect("flowforge runs")
            })
            .await
            .expect("join")
        }
    };
    let args = |db: &str| -> Vec<String> {
        vec![
            "run".into(),
            file.display().to_string(),
            "--db".into(),
            db.to_owned(),
            "--output".into(),
            "json".into(),
        ]
    };

    // Before `migrate`, the store refuses: exit 4 (migration missing).
    let refused = flowforge(args(&db.url)).await;
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("migration"),
        "{refused:?}"
    );

    let migrated = flowforge(vec!["migrate".into(), "--db".into(), db.url.clone()]).await;
    assert_eq!(migrated.status.code(), Some(0), "{migrated:?}");
    assert!(String::from_utf8_lossy(&migrated.stdout).contains("is migrated"));

    let pg = flowforge(args(&db.url)).await;
    assert_eq!(pg.status.code(), Some(0), "{pg:?}");
    let sqlite_url = format!("sqlite://{}", dir.path().join("embedded.db").display());
    let sqlite = flowforge(args(&sqlite_url)).await;
    assert_eq!(sqlite.status.code(), Some(0), "{sqlite:?}");

    let pg = assert_schema_valid("run-report.schema.json", &String::from_utf8_lossy(&pg.stdout));
    let sqlite = assert_schema_valid("run-report.schema.json", &String::from_utf8_lossy(&sqlite.stdout));
    assert_eq!(pg["state"], "succeeded");
    assert_same_report(&comparable(&pg), &comparable(&sqlite), "diamond.json");
}
