//! Definitions, limits, health, metrics and the OpenAPI document.

use serde_json::{Value, json};

use super::{definition, json_of, on_both};

on_both!(definitions_publish_read_and_refuse, &[], |api| {
    let def = definition(
        "etl",
        1,
        &[("a", "noop", &[], json!({})), ("b", "echo", &["a"], json!({}))],
    );
    let first = api.post("/api/v1/definitions", &def).send().await.expect("answers");
    let first = json_of(first, 201).await;
    assert_eq!(first["levels"], json!([["a"], ["b"]]));
    let again = json_of(
        api.post("/api/v1/definitions", &def).send().await.expect("answers"),
        200,
    )
    .await;
    assert_eq!(again["fingerprint"], first["fingerprint"]);

    // Same name and version, other content: 409 with both fingerprints.
    let other = definition("etl", 1, &[("a", "noop", &[], json!({}))]);
    let conflict = json_of(
        api.post("/api/v1/definitions", &other).send().await.expect("answers"),
        409,
    )
    .await;
    assert_eq!(conflict["code"], "definition_conflict");
    assert_eq!(conflict["existing_fingerprint"], first["fingerprint"]);
    assert!(conflict["new_fingerprint"].is_string());

    // Every error with its kind and path.
    let bad = json!({"name": "bad", "version": 1, "tasks": [
        {"key": "a", "task_type": "noop", "depends_on": ["ghost"]},
        {"key": "b", "task_type": "noop", "timeout_seconds": -1}
    ]});
    let invalid = json_of(
        api.post("/api/v1/definitions", &bad).send().await.expect("answers"),
        422,
    )
    .await;
    assert_eq!(invalid["code"], "invalid_definition");
    let errors = invalid["errors"].as_array().expect("errors");
    assert!(
        errors
            .iter()
            .all(|e| e["kind"].is_string() && e["path"].as_str().is_some_and(|p| p.starts_with('$'))),
        "{invalid:#}"
    );

    // A task type nothing here runs: 422 naming it.
    let unknown = definition("resize", 1, &[("a", "resize-image", &[], json!({}))]);
    let refused = json_of(
        api.post("/api/v1/definitions", &unknown).send().await.expect("answers"),
        422,
    )
    .await;
    assert_eq!(refused["code"], "unknown_task_type");
    assert_eq!(refused["types"], json!(["resize-image"]));

    // Malformed JSON: 400 with the position; wrong type: 415.
    let malformed = api
        .http
        .post(api.url("/api/v1/definitions"))
        .bearer_auth(&api.admin)
        .header("content-type", "application/json")
        .body("{\"name\": ")
        .send()
        .await
        .expect("answers");
    let malformed = json_of(malformed, 400).await;
    assert_eq!(malformed["code"], "malformed_json");
    assert!(
        malformed["detail"].as_str().is_some_and(|d| d.contains("line 1")),
        "{malformed:#}"
    );
    let text = api
        .http
        .post(api.url("/api/v1/definitions"))
        .bearer_auth(&api.admin)
        .header("content-type", "text/plain")
        .body(def.to_string())
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(text, 415).await["code"], "unsupported_media_type");

    // Reads.
    api.publish(&definition("etl", 2, &[("a", "noop", &[], json!({}))]))
        .await;
    let all = api.get_json("/api/v1/definitions", 200).await;
    let names: Vec<(String, u64)> = all["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap_or_default().to_owned(),
                d["version"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(names, vec![("etl".to_owned(), 2), ("etl".to_owned(), 1)]);
    let versions = api.get_json("/api/v1/definitions/etl", 200).await;
    assert_eq!(versions["items"].as_array().map(Vec::len), Some(2));
    let one = api.get_json("/api/v1/definitions/etl/versions/1", 200).await;
    assert_eq!(one["fingerprint"], first["fingerprint"]);
    assert_eq!(one["definition"]["name"], "etl");
    assert_eq!(api.get_json("/api/v1/definitions/nope", 404).await["code"], "not_found");
    assert_eq!(
        api.get_json("/api/v1/definitions/etl/versions/9", 404).await["code"],
        "not_found"
    );
});

on_both!(limits_are_enforced_with_problems, &["--max-body", "100000"], |api| {
    // Over --max-body: 413. The server closes that connection without
    // reading the rest, so the request gets a client of its own.
    let big = definition("big", 1, &[("a", "noop", &[], json!({"output": "x".repeat(200_000)}))]);
    let response = crate::http_client()
        .post(api.url("/api/v1/definitions"))
        .bearer_auth(&api.admin)
        .json(&big)
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status().as_u16(), 413);

    // Nesting deeper than 128: 400.
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let response = api
        .http
        .post(api.url("/api/v1/runs"))
        .bearer_auth(&api.admin)
        .header("content-type", "application/json")
        .body(format!("{{\"workflow\": \"x\", \"input\": {deep}}}"))
        .send()
        .await
        .expect("answers");
    let problem = json_of(response, 400).await;
    assert!(
        problem["detail"].as_str().is_some_and(|d| d.contains("128")),
        "{problem:#}"
    );

    // Unknown route: a problem, not an empty 404.
    let missing = api.get("/api/v1/nothing").send().await.expect("answers");
    assert_eq!(json_of(missing, 404).await["code"], "not_found");
});

on_both!(too_many_tasks_is_invalid, &[], |api| {
    let tasks: Vec<Value> = (0..10_001)
        .map(|i| json!({"key": format!("t{i}"), "task_type": "noop"}))
        .collect();
    let huge = json!({"name": "huge", "version": 1, "tasks": tasks});
    let problem = json_of(
        api.post("/api/v1/definitions", &huge).send().await.expect("answers"),
        422,
    )
    .await;
    assert_eq!(problem["code"], "invalid_definition");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("10000") || d.contains("10 000")),
        "{problem:#}"
    );
});

on_both!(health_readiness_metrics_and_the_document, &[], |api| {
    let health = api.http.get(api.url("/healthz")).send().await.expect("answers");
    assert_eq!(health.status().as_u16(), 200);
    let ready = api.http.get(api.url("/readyz")).send().await.expect("answers");
    assert_eq!(ready.status().as_u16(), 200);

    // The counters move during a run.
    api.publish(&definition(
        "m",
        1,
        &[("a", "noop", &[], json!({})), ("b", "fail", &["a"], json!({}))],
    ))
    .await;
    let id = api.start_run("m", json!({})).await;
    assert_eq!(api.wait_run(&id).await["state"], "failed");
    let closed = api.http.get(api.url("/metrics")).send().await.expect("answers");
    assert_eq!(closed.status().as_u16(), 401);
    let metrics = api.metrics().await;
    assert!(
        metrics.contains("flowforge_runs_started_total{workflow=\"m\"} 1"),
        "{metrics}"
    );
    // Wherever the loops run (in the server on SQLite, in their own
    // processes on PostgreSQL), their histograms are exposed.
    for series in [
        "flowforge_runs_finished_total{workflow=\"m\",state=\"failed\"} 1",
        "flowforge_run_duration_seconds_count{workflow=\"m\"} 1",
        "flowforge_task_schedule_to_start_seconds_count{task_type=\"noop\"} 1",
        "flowforge_task_attempts_total{task_type=\"fail\",outcome=\"failed\"}",
    ] {
        assert!(metrics.contains(series), "no {series} in:\n{metrics}");
    }
    assert!(
        metrics.contains("flowforge_http_requests_total{route=\"/api/v1/runs\",status=\"201\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("flowforge_queue_depth"), "{metrics}");
    assert!(!metrics.contains(&id), "a run id in a label: {metrics}");

    let workers = api.get_json("/api/v1/workers", 200).await;
    assert!(workers["items"].is_array());
    let doc = api.http.get(api.url("/openapi.json")).send().await.expect("answers");
    let doc: Value = doc.json().await.expect("JSON");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{doc:#}");
});
