//! The use cases through their one front door: publishing against the task
//! types at hand, waiting, reporting, listing and closing an abandoned run.

use std::time::Duration;

use flowforge_app::{Closed, Error, Service, TaskTypes};
use flowforge_domain::{Priority, RunState};
use flowforge_ports::{RunId, WorkerId, WorkerRegistration, WorkerRegistry};
use serde_json::json;

use crate::{definition, store};

fn one_task(task_type: &str) -> flowforge_domain::WorkflowDefinition {
    definition(json!({"name": format!("w-{task_type}"), "version": 1, "tasks": [
        {"key": "a", "task_type": task_type}
    ]}))
}

fn types(names: &[&str]) -> TaskTypes {
    TaskTypes::Registered(names.iter().map(|n| (*n).to_owned()).collect())
}

#[tokio::test]
async fn publish_names_the_task_types_nothing_can_run() {
    let service = Service::new(store().await);
    let error = service
        .publish(&one_task("paint"), &types(&["noop"]))
        .await
        .unwrap_err();
    assert!(matches!(&error, Error::UnknownTaskTypes { types, .. } if types == &["paint"]));
    assert_eq!(error.to_string(), "unknown task type(s) paint: known types are noop");
    assert!(!error.is_infrastructure());
    let first = service.publish(&one_task("noop"), &types(&["noop"])).await.unwrap();
    let again = service.publish(&one_task("noop"), &types(&["noop"])).await.unwrap();
    assert_eq!(first.id, again.id, "publishing is idempotent by content");
}

#[tokio::test]
async fn live_workers_add_the_types_they_serve_to_the_built_in_ones() {
    let store = store().await;
    let service = Service::new(store.clone());
    assert!(matches!(
        service.publish(&one_task("paint"), &TaskTypes::LiveWorkers).await,
        Err(Error::UnknownTaskTypes { .. })
    ));
    service
        .publish(&one_task("noop"), &TaskTypes::LiveWorkers)
        .await
        .unwrap();
    store
        .register_worker(&WorkerRegistration {
            id: WorkerId("painter".into()),
            host: "here".into(),
            pid: 1,
            task_types: vec!["paint".to_owned()],
            concurrency: 1,
        })
        .await
        .unwrap();
    service
        .publish(&one_task("paint"), &TaskTypes::LiveWorkers)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unknown_run_is_not_found_by_every_use_case() {
    let service = Service::new(store().await);
    let run: RunId = "0190f5f2-0000-7000-8000-000000000000".parse().unwrap();
    assert!(matches!(service.report(run).await, Err(Error::RunNotFound(r)) if r == run));
    assert!(matches!(service.cancel(run).await, Err(Error::RunNotFound(_))));
    assert!(matches!(service.wait(run).await, Err(Error::RunNotFound(_))));
    assert!(matches!(
        service.close(run, Duration::ZERO).await,
        Err(Error::RunNotFound(_))
    ));
}

#[tokio::test]
async fn close_drives_an_abandoned_run_to_its_end_and_wait_sees_it() {
    let service = Service::new(store().await);
    let published = service.publish(&one_task("noop"), &types(&["noop"])).await.unwrap();
    let run = service
        .start(published.id, json!({}), Priority::DEFAULT)
        .await
        .unwrap()
        .id;
    // Nobody serves the run: close cancels its waiting task itself.
    assert_eq!(
        service.close(run, Duration::from_secs(30)).await.unwrap(),
        Closed::Ended(RunState::Cancelled)
    );
    assert_eq!(service.wait(run).await.unwrap(), RunState::Cancelled);
    assert_eq!(
        service.close(run, Duration::from_secs(30)).await.unwrap(),
        Closed::AlreadyEnded(RunState::Cancelled)
    );
    let report = service.report(run).await.unwrap();
    assert_eq!(report.tasks[0].state, "cancelled");
    let listed = service.list(10).await.unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [run]);
}
