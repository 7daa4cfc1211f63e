//! The remote-worker API (docs/design/handlers.md#remote-workers): claims
//! by long poll with inputs, heartbeats with progress and cancellation,
//! outcomes fenced by their tokens, and the `worker` scope.

use std::time::Instant;

use serde_json::{Value, json};

use crate::run::task;

use super::{Api, PATIENCE, definition, json_of, on_both};

/// Claims once as `worker` for `types`, waiting up to `wait` seconds.
async fn claim(api: &Api, worker: &str, types: &[&str], max: u32, wait: f64) -> Vec<Value> {
    let response = api
        .post(
            "/api/v1/worker/claims",
            &json!({"worker": worker, "task_types": types, "max": max, "wait_seconds": wait}),
        )
        .send()
        .await
        .expect("answers");
    json_of(response, 200).await["claims"]
        .as_array()
        .expect("claims")
        .clone()
}

/// Claims until `n` task runs are held (each poll waits for work).
async fn claim_n(api: &Api, worker: &str, types: &[&str], n: usize) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    let mut held = Vec::new();
    while held.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} claimed:\n{}",
            held.len(),
            api.logs()
        );
        let want = u32::try_from(n - held.len()).expect("small");
        held.extend(claim(api, worker, types, want, 2.0).await);
    }
    held
}

async fn results(api: &Api, worker: &str, items: Value) -> reqwest::Response {
    api.post("/api/v1/worker/results", &json!({"worker": worker, "results": items}))
        .send()
        .await
        .expect("answers")
}

async fn heartbeat(api: &Api, worker: &str, leases: Value) -> Vec<String> {
    let response = api
        .post(
            "/api/v1/worker/heartbeats",
            &json!({"worker": worker, "leases": leases}),
        )
        .send()
        .await
        .expect("answers");
    json_of(response, 200).await["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| l["status"].as_str().expect("a status").to_owned())
        .collect()
}

fn result_of(c: &Value, outcome: Value) -> Value {
    let mut item = json!({"task_run_id": c["task_run_id"], "run_id": c["run_id"], "token": c["token"]});
    item.as_object_mut()
        .expect("an object")
        .extend(outcome.as_object().expect("an object").clone());
    item
}

on_both!(a_remote_worker_claims_heartbeats_and_finishes, &[], |api| {
    // Nothing ready: an empty answer once the wait is over.
    assert!(claim(&api, "remote-1", &["ext.resize"], 5, 0.0).await.is_empty());
    // The claim registered the worker and its type, so a definition using
    // it publishes (422 unknown_task_type otherwise).
    let workers = api.get_json("/api/v1/workers", 200).await;
    assert!(
        workers["items"]
            .as_array()
            .expect("items")
            .iter()
            .any(|w| w["id"] == "remote-1"
                && w["task_types"]
                    .as_array()
                    .is_some_and(|t| t.contains(&json!("ext.resize")))),
        "{workers:#}"
    );
    api.publish(&definition(
        "remote",
        1,
        &[
            ("seed", "noop", &[], json!({"output": {"px": 64}})),
            ("resize", "ext.resize", &["seed"], json!({"format": "webp"})),
            ("after", "echo", &["resize"], json!({})),
        ],
    ))
    .await;
    let run = api.start_run("remote", json!({"image": "cat.png"})).await;
    let claims = claim_n(&api, "remote-1", &["ext.resize"], 1).await;
    let c = &claims[0];
    assert_eq!(c["task_key"], "resize");
    assert_eq!(c["task_type"], "ext.resize");
    assert_eq!(c["attempt"], 1);
    assert_eq!(c["run_id"], run.as_str());
    assert_eq!(c["idempotency_key"], format!("{run}:resize"));
    assert_eq!(c["run_input"], json!({"image": "cat.png"}));
    assert_eq!(c["inputs"], json!({"seed": {"px": 64}}), "the dependency's output");
    assert_eq!(c["config"], json!({"format": "webp"}));
    assert!(c["deadline"].is_string() && c["lease_expires_at"].is_string(), "{c:#}");

    // A heartbeat with progress renews the lease; the progress shows.
    let beat = json!([{"task_run_id": c["task_run_id"], "token": c["token"], "progress": {"done": 1, "of": 2}}]);
    assert_eq!(heartbeat(&api, "remote-1", beat).await, ["held"]);
    let report = api.get_json(&format!("/api/v1/runs/{run}"), 200).await;
    assert_eq!(task(&report, "resize")["state"], "running");
    assert_eq!(task(&report, "resize")["progress"], json!({"done": 1, "of": 2}));
    // A token from another attempt holds nothing.
    let wrong = json!([{"task_run_id": c["task_run_id"], "token": c["token"].as_i64().expect("token") - 1}]);
    assert_eq!(heartbeat(&api, "remote-1", wrong).await, ["lost"]);

    let response = results(
        &api,
        "remote-1",
        json!([result_of(
            c,
            json!({"outcome": "succeeded", "output": {"url": "s3://x"}})
        )]),
    )
    .await;
    let body = json_of(response, 200).await;
    assert_eq!(body["results"][0]["status"], "recorded");
    assert_eq!(body["results"][0]["state"], "succeeded");
    // Again, with the same (now spent) token: discarded, 409.
    let response = results(
        &api,
        "remote-1",
        json!([result_of(c, json!({"outcome": "succeeded", "output": {}}))]),
    )
    .await;
    let problem = json_of(response, 409).await;
    assert_eq!(problem["code"], "stale_token");
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "succeeded", "{report:#}");
    assert_eq!(task(&report, "resize")["output"], json!({"url": "s3://x"}));
    assert_eq!(
        task(&report, "after")["output"]["inputs"],
        json!({"resize": {"url": "s3://x"}})
    );
    let attempts = api
        .get_json(&format!("/api/v1/runs/{run}/tasks/resize/attempts"), 200)
        .await;
    assert_eq!(attempts["items"][0]["worker"], "remote-1", "{attempts:#}");
    let events = report["events"].as_array().expect("events");
    assert!(
        events
            .iter()
            .any(|e| e["transition"] == "stale_write_rejected" && e["task"] == "resize"),
        "the stale outcome is audited"
    );
});

on_both!(remote_failures_retry_fail_and_cancel, &[], |api| {
    assert!(
        claim(&api, "remote-2", &["ext.flaky", "ext.slow"], 1, 0.0)
            .await
            .is_empty()
    );
    api.publish(&json!({"name": "flaky", "version": 1, "tasks": [
        {"key": "f", "task_type": "ext.flaky", "retry": {"max_attempts": 3, "delay_seconds": 0.1}}
    ]}))
    .await;
    api.publish(&json!({"name": "slow", "version": 1, "tasks": [
        {"key": "s", "task_type": "ext.slow"}
    ]}))
    .await;

    // Retryable with a Retry-After: the retry waits at least that long.
    let run = api.start_run("flaky", json!({})).await;
    let c = claim_n(&api, "remote-2", &["ext.flaky"], 1).await.remove(0);
    let failed = json!({"outcome": "failed", "error": "busy", "retryable": true, "retry_after_seconds": 1.0});
    let body = json_of(results(&api, "remote-2", json!([result_of(&c, failed)])).await, 200).await;
    assert_eq!(body["results"][0]["state"], "retrying");
    let report = api.get_json(&format!("/api/v1/runs/{run}"), 200).await;
    assert_eq!(task(&report, "f")["state"], "retrying");
    // Then a permanent failure: no more attempts.
    let c = claim_n(&api, "remote-2", &["ext.flaky"], 1).await.remove(0);
    assert_eq!(c["attempt"], 2);
    let failed = json!({"outcome": "failed", "error": "bad input", "retryable": false});
    let body = json_of(results(&api, "remote-2", json!([result_of(&c, failed)])).await, 200).await;
    assert_eq!(body["results"][0]["state"], "failed");
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "failed");
    assert_eq!(task(&report, "f")["error"], "bad input");
    let events = report["events"].as_array().expect("events");
    let fail_at = |attempt: u64| {
        events
            .iter()
            .find(|e| e["task"] == "f" && e["transition"] == "fail" && e["attempt"] == attempt)
            .and_then(|e| e["at"].as_str())
            .map(str::to_owned)
    };
    let retried = events
        .iter()
        .find(|e| e["task"] == "f" && e["transition"] == "retry_ready")
        .and_then(|e| e["at"].as_str())
        .expect("a retry_ready event");
    let first = fail_at(1).expect("the first failure");
    let gap = chrono::DateTime::parse_from_rfc3339(retried).expect("time")
        - chrono::DateTime::parse_from_rfc3339(&first).expect("time");
    assert!(
        gap >= chrono::TimeDelta::milliseconds(990),
        "Retry-After honoured: {gap}"
    );

    // A cancel reaches the remote worker through its heartbeat.
    let run = api.start_run("slow", json!({})).await;
    let c = claim_n(&api, "remote-2", &["ext.slow"], 1).await.remove(0);
    let response = api
        .post(&format!("/api/v1/runs/{run}/cancel"), &json!({}))
        .send()
        .await
        .expect("answers");
    assert!(response.status().is_success(), "{}", response.status());
    let lease = json!([{"task_run_id": c["task_run_id"], "token": c["token"]}]);
    assert_eq!(heartbeat(&api, "remote-2", lease).await, ["cancel_requested"]);
    let body = json_of(
        results(
            &api,
            "remote-2",
            json!([result_of(&c, json!({"outcome": "cancelled"}))]),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(body["results"][0]["state"], "cancelled");
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "cancelled", "{report:#}");
});

on_both!(the_worker_api_needs_the_worker_scope_and_valid_requests, &[], |api| {
    let reader = api.token("reader", &["runs:read"]);
    let worker = api.token("worker", &["worker"]);
    let body = json!({"worker": "w", "task_types": ["x"]});
    for path in [
        "/api/v1/worker/claims",
        "/api/v1/worker/heartbeats",
        "/api/v1/worker/results",
    ] {
        let response = api
            .http
            .post(api.url(path))
            .bearer_auth(&reader)
            .json(&body)
            .send()
            .await
            .expect("answers");
        assert_eq!(json_of(response, 403).await["code"], "forbidden", "{path}");
    }
    let send = |body: Value| {
        api.http
            .post(api.url("/api/v1/worker/claims"))
            .bearer_auth(&worker)
            .json(&body)
            .send()
    };
    let ok = send(json!({"worker": "w", "task_types": ["x"], "wait_seconds": 0}))
        .await
        .expect("answers");
    assert_eq!(json_of(ok, 200).await, json!({"claims": []}));
    for (bad, needle) in [
        (json!({"worker": "", "task_types": ["x"]}), "$.worker"),
        (json!({"worker": "w", "task_types": []}), "$.task_types"),
        (json!({"worker": "w", "task_types": ["x"], "max": 0}), "$.max"),
        (
            json!({"worker": "w", "task_types": ["x"], "wait_seconds": 99}),
            "$.wait_seconds",
        ),
        (
            json!({"worker": "w", "task_types": ["x"], "lease_seconds": 0}),
            "$.lease_seconds",
        ),
    ] {
        let problem = json_of(send(bad.clone()).await.expect("answers"), 422).await;
        assert!(
            problem["detail"].as_str().is_some_and(|d| d.contains(needle)),
            "{bad}: {problem:#}"
        );
    }
    let unknown = send(json!({"worker": "w", "task_types": ["x"], "maximum": 3}))
        .await
        .expect("answers");
    assert_eq!(unknown.status().as_u16(), 422, "unknown fields are refused");
});

on_both!(a_remote_attempt_past_its_deadline_times_out, &[], |api| {
    assert!(claim(&api, "remote-3", &["ext.late"], 1, 0.0).await.is_empty());
    api.publish(&json!({"name": "late", "version": 1, "tasks": [
        {"key": "l", "task_type": "ext.late", "timeout_seconds": 0.3}
    ]}))
    .await;
    let run = api.start_run("late", json!({})).await;
    let c = claim_n(&api, "remote-3", &["ext.late"], 1).await.remove(0);
    // Waiting past a deadline is safe on any machine: it is only ever later.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let lease = json!([{"task_run_id": c["task_run_id"], "token": c["token"]}]);
    assert_eq!(heartbeat(&api, "remote-3", lease).await, ["timed_out"]);
    let response = results(
        &api,
        "remote-3",
        json!([result_of(&c, json!({"outcome": "succeeded"}))]),
    )
    .await;
    assert_eq!(
        json_of(response, 409).await["code"],
        "stale_token",
        "the timed-out attempt's outcome is refused"
    );
    let report = api.wait_run(&run).await;
    assert_eq!(report["state"], "failed");
    let error = task(&report, "l")["error"].as_str().expect("an error");
    assert!(error.starts_with("timed out after 0.3s"), "{error}");
});
