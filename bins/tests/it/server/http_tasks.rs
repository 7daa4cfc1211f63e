//! `http` tasks end to end (docs/design/handlers.md#the-http-task-type): a
//! server on SQLite with `--allow-http` calls a local endpoint, retries a
//! 503 with the same idempotency key, takes a secret header from its own
//! environment — and the secret is found nowhere in the store, the API or
//! the logs; a metadata address is refused.

use serde_json::{Value, json};

use super::{Api, On};
use crate::hook::Hook;

const SECRET: &str = "s3cr3t-0f-the-http-task-test";

fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the server's folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            found.push((path, bytes));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tasks_call_out_retry_and_keep_their_secrets() {
    let api = Api::start_with(
        On::Sqlite,
        "http_tasks",
        &["--allow-http"],
        &[("FF_TEST_HTTP_SECRET", SECRET), ("RUST_LOG", "debug")],
    )
    .await
    .expect("SQLite needs no service");
    let hook = Hook::start(vec![(503, r#"{"busy": true}"#), (200, r#"{"accepted": 7}"#)]).await;
    api.publish(&json!({"name": "calls", "version": 1, "tasks": [
        {"key": "seed", "task_type": "noop", "config": {"output": {"order": 42}}},
        {"key": "post", "task_type": "http", "depends_on": ["seed"],
         "retry": {"max_attempts": 3, "delay_seconds": 0.1},
         "config": {"method": "POST", "url": format!("{}/orders", hook.base), "body_from": "inputs",
                    "headers": {"Authorization": {"env": "FF_TEST_HTTP_SECRET"}, "X-Source": "flowforge"}}}
    ]}))
    .await;
    let run = api.start_run("calls", json!({})).await;
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "succeeded", "{report:#}\n{}", api.logs());
    let post = report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["key"] == "post")
        .expect("post");
    assert_eq!(post["output"], json!({"accepted": 7}));
    assert_eq!(post["attempt"], 2, "the 503 was retried");

    let received = hook.received();
    assert_eq!(received.len(), 2, "{received:?}");
    let key = format!("idempotency-key: {run}:post");
    for r in &received {
        let head = r.head.to_ascii_lowercase();
        assert!(
            head.contains(&format!("authorization: {SECRET}")),
            "the secret is sent: {}",
            r.head
        );
        assert!(head.contains(&key), "the same key on every attempt: {}", r.head);
        let body: Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(body, json!({"seed": {"order": 42}}));
    }

    // The secret is the worker's: not in the definition, the run, the
    // store's files or the logs.
    let attempts = api
        .get_json(&format!("/api/v1/runs/{run}/tasks/post/attempts"), 200)
        .await;
    let definition = api.get_json("/api/v1/definitions/calls/versions/1", 200).await;
    for (what, text) in [
        ("the report", report.to_string()),
        ("the attempts", attempts.to_string()),
        ("the definition", definition.to_string()),
        ("the logs", api.logs()),
    ] {
        assert!(!text.contains(SECRET), "the secret leaked into {what}");
    }
    assert!(api.logs().contains("DEBUG"), "the logs were verbose");
    for (path, bytes) in files_under(&api.dir) {
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "the secret leaked into {}",
            path.display()
        );
    }

    // A cloud metadata address is refused without a request.
    api.publish(&json!({"name": "metadata", "version": 1, "tasks": [
        {"key": "steal", "task_type": "http", "config": {"url": "http://169.254.169.254/latest/meta-data"}}
    ]}))
    .await;
    let run = api.start_run("metadata", json!({})).await;
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "failed");
    let error = report["tasks"][0]["error"].as_str().expect("an error");
    assert!(error.contains("refused"), "{error}");
    assert_eq!(report["tasks"][0]["attempt"], 1, "refused for good, not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tasks_need_allow_http() {
    let api = Api::start(On::Sqlite, "http_off", &[])
        .await
        .expect("SQLite needs no service");
    let response = api
        .post(
            "/api/v1/definitions",
            &json!({"name": "off", "version": 1, "tasks": [
                {"key": "call", "task_type": "http", "config": {"url": "http://127.0.0.1:9/"}}
            ]}),
        )
        .send()
        .await
        .expect("answers");
    let problem = super::json_of(response, 422).await;
    assert_eq!(problem["code"], "unknown_task_type", "{problem:#}");
}
