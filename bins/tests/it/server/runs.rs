//! Starting, reading, listing and cancelling runs; idempotency keys.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::distributed::eventually;
use crate::run::task;

use super::{definition, json_of, on_both};

on_both!(a_run_is_started_watched_and_read, &[], |api| {
    api.publish(&definition(
        "flow",
        1,
        &[
            ("a", "noop", &[], json!({"output": {"n": 1}})),
            ("b", "echo", &["a"], json!({})),
        ],
    ))
    .await;
    api.publish(&definition("flow", 2, &[("only", "noop", &[], json!({}))]))
        .await;
    // No version: the latest.
    let response = api
        .post("/api/v1/runs", &json!({"workflow": "flow"}))
        .send()
        .await
        .expect("answers");
    let started = json_of(response, 201).await;
    assert_eq!(started["version"], 2);
    let report = api.wait_run(started["id"].as_str().expect("id")).await;
    assert_eq!(report["state"], "succeeded");

    let response = api
        .post(
            "/api/v1/runs",
            &json!({"workflow": "flow", "version": 1, "input": {"x": 1}}),
        )
        .send()
        .await
        .expect("answers");
    let id = json_of(response, 201).await["id"].as_str().expect("id").to_owned();
    let report = api.wait_run(&id).await;
    assert_eq!(report["state"], "succeeded", "{report:#}");
    assert_eq!(report["input"], json!({"x": 1}));
    // The same JSON as `flowforge runs get --output json`.
    let cli = api.cli(["runs", "get", &id, "--output", "json"]);
    assert_eq!(cli.code, 0, "{cli:?}");
    let cli: Value = serde_json::from_str(&cli.stdout).expect("JSON");
    assert_eq!(cli, report);

    let attempts = api.get_json(&format!("/api/v1/runs/{id}/tasks/b/attempts"), 200).await;
    let items = attempts["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{attempts:#}");
    assert_eq!(items[0]["state"], "succeeded");
    assert_eq!(items[0]["attempt"], 1);
    assert!(
        items[0]["token"].is_i64() && items[0]["worker"].is_string(),
        "{attempts:#}"
    );
    assert_eq!(items[0]["output"], report["tasks"][1]["output"]);
    assert_eq!(
        api.get_json(&format!("/api/v1/runs/{id}/tasks/zz/attempts"), 404).await["code"],
        "not_found"
    );

    // Cancelling a finished run: 409; unknown runs and workflows: 404.
    let response = api
        .post(&format!("/api/v1/runs/{id}/cancel"), &json!({}))
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 409).await["code"], "run_finished");
    let nil = "00000000-0000-0000-0000-000000000000";
    assert_eq!(
        api.get_json(&format!("/api/v1/runs/{nil}"), 404).await["code"],
        "not_found"
    );
    assert_eq!(api.get_json("/api/v1/runs/not-a-uuid", 404).await["code"], "not_found");
    let response = api
        .post("/api/v1/runs", &json!({"workflow": "ghost"}))
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 404).await["code"], "not_found");
    let response = api
        .post("/api/v1/runs", &json!({"workflow": "flow", "colour": 1}))
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 422).await["code"], "invalid_request");
});

on_both!(a_running_run_is_cancelled, &[], |api| {
    api.publish(&definition(
        "slow",
        1,
        &[
            ("nap", "sleep", &[], json!({"seconds": 60})),
            ("after", "noop", &["nap"], json!({})),
        ],
    ))
    .await;
    let id = api.start_run("slow", json!({})).await;
    let response = api
        .post(&format!("/api/v1/runs/{id}/cancel"), &json!({}))
        .send()
        .await
        .expect("answers");
    let body = json_of(response, 202).await;
    assert_eq!(body["cancel"], "requested");
    let report = api.wait_run(&id).await;
    assert_eq!(report["state"], "cancelled", "{report:#}");
});

on_both!(idempotency_keys_start_one_run, &[], |api| {
    api.publish(&definition("once", 1, &[("a", "noop", &[], json!({}))]))
        .await;
    let body = json!({"workflow": "once", "input": {"order": 7}});
    let send = |key: &'static str, body: Value| {
        api.http
            .post(api.url("/api/v1/runs"))
            .bearer_auth(&api.admin)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let first = send("order-7", body.clone()).await.expect("answers");
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first = json_of(first, 201).await;
    // The same key and body, written in another key order: a replay.
    let again = send("order-7", json!({"input": {"order": 7}, "workflow": "once"}))
        .await
        .expect("answers");
    assert_eq!(
        again.headers().get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(json_of(again, 200).await, first);
    let reused = send("order-7", json!({"workflow": "once", "input": {"order": 8}}))
        .await
        .expect("answers");
    let reused = json_of(reused, 422).await;
    assert_eq!(reused["code"], "idempotency_key_reused");
    assert_eq!(reused["run_id"], first["id"]);

    // Two at once with a new key: one run, both answers name it.
    let (a, b) = tokio::join!(send("race", body.clone()), send("race", body.clone()));
    let (a, b) = (a.expect("answers"), b.expect("answers"));
    let mut statuses = vec![a.status().as_u16(), b.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, vec![200, 201]);
    let (a, b): (Value, Value) = (a.json().await.expect("JSON"), b.json().await.expect("JSON"));
    assert_eq!(a["id"], b["id"]);
    let page = api.get_json("/api/v1/runs?workflow=once&limit=500", 200).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(2), "{page:#}");
});

on_both!(pages_walk_every_run_once, &[], |api| {
    api.publish(&definition("p", 1, &[("a", "noop", &[], json!({}))])).await;
    api.publish(&definition("q", 1, &[("a", "fail", &[], json!({}))])).await;
    let mut before = BTreeSet::new();
    for _ in 0..7 {
        before.insert(api.start_run("p", json!({})).await);
    }
    let q = api.start_run("q", json!({}));
    let q = q.await;
    api.wait_run(&q).await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/runs?workflow=p&limit=3&cursor={c}"),
            None => "/api/v1/runs?workflow=p&limit=3".to_owned(),
        };
        let page = api.get_json(&path, 200).await;
        for item in page["items"].as_array().expect("items") {
            assert!(item.get("input").is_none() && item.get("output").is_none(), "{item:#}");
            seen.push(item["id"].as_str().expect("id").to_owned());
        }
        // Runs started between pages are newer: they never show up later.
        api.start_run("p", json!({})).await;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "a run twice: {seen:?}");
    assert_eq!(unique, before, "not every run once");

    // Filters: state (OR when repeated), workflow, time.
    let failed = api.get_json("/api/v1/runs?state=failed", 200).await;
    let ids: Vec<&str> = failed["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(ids, vec![q.as_str()]);
    let both = api.get_json("/api/v1/runs?workflow=p&workflow=q&limit=500", 200).await;
    assert!(both["items"].as_array().expect("items").len() > 8);
    let none = api
        .get_json("/api/v1/runs?created_before=2000-01-01T00:00:00Z", 200)
        .await;
    assert_eq!(none["items"], json!([]));
    assert_eq!(none["next_cursor"], Value::Null);
    for bad in [
        "limit=0",
        "limit=501",
        "colour=red",
        "state=done",
        "cursor=zz",
        "created_after=yesterday",
    ] {
        let problem = api.get_json(&format!("/api/v1/runs?{bad}"), 400).await;
        assert_eq!(problem["code"], "bad_request", "{bad}: {problem:#}");
    }
});

on_both!(a_failed_run_is_retried_over_the_api, &[], |api| {
    api.publish(&definition(
        "flaky",
        1,
        &[
            ("first", "echo", &[], json!({})),
            ("flaky", "fail", &["first"], json!({"fail_times": 1})),
            ("after", "echo", &["flaky"], json!({})),
        ],
    ))
    .await;
    let id = api.start_run("flaky", json!({"n": 1})).await;
    let failed = api.wait_run(&id).await;
    assert_eq!(failed["state"], "failed", "{failed:#}");
    let retry = format!("/api/v1/runs/{id}/retry");

    // The dry run names the set and writes nothing.
    let response = api
        .post(&retry, &json!({"dry_run": true}))
        .send()
        .await
        .expect("answers");
    assert_eq!(
        json_of(response, 202).await,
        json!({"id": id, "generation": 2, "applied": false, "tasks": [
            {"key": "flaky", "from": "failed", "to": "ready"},
            {"key": "after", "from": "cancelled", "to": "pending"}
        ]})
    );
    assert_eq!(api.get_json(&format!("/api/v1/runs/{id}"), 200).await, failed);
    let response = api
        .post(&retry, &json!({"from": ["zz"]}))
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 422).await["code"], "retry_refused");

    // Two retries at once: one opens generation 2, the other is refused.
    let (a, b) = tokio::join!(api.post(&retry, &json!({})).send(), api.post(&retry, &json!({})).send());
    let mut codes = [
        a.expect("answers").status().as_u16(),
        b.expect("answers").status().as_u16(),
    ];
    codes.sort_unstable();
    assert_eq!(codes, [202, 409]);

    let report = api.wait_run(&id).await;
    assert_eq!(
        (&report["state"], &report["generation"]),
        (&json!("succeeded"), &json!(2)),
        "{report:#}"
    );
    assert_eq!(
        report["tasks"][0], failed["tasks"][0],
        "the succeeded task is kept as it was"
    );
    let attempts = api
        .get_json(&format!("/api/v1/runs/{id}/tasks/flaky/attempts"), 200)
        .await;
    let seen: Vec<(Value, Value, Value)> = attempts["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|a| (a["attempt"].clone(), a["generation"].clone(), a["state"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (json!(1), json!(1), json!("failed")),
            (json!(2), json!(2), json!("succeeded"))
        ],
        "{attempts:#}"
    );

    let response = api.post(&retry, &json!({})).send().await.expect("answers");
    assert_eq!(json_of(response, 409).await["code"], "run_not_retryable");
});

on_both!(a_compensated_run_is_retried_from_named_tasks_over_the_api, &[], |api| {
    api.publish(&json!({"name": "saga", "version": 1, "tasks": [
        {"key": "reserve", "task_type": "echo"},
        {"key": "ship", "task_type": "fail", "depends_on": ["reserve"], "config": {"fail_times": 2}},
        {"key": "release", "task_type": "echo", "compensate_for": "reserve"}
    ]}))
    .await;
    let id = api.start_run("saga", json!({})).await;
    let failed = api.wait_run(&id).await;
    assert_eq!(
        (&failed["state"], &failed["compensations"][0]["state"]),
        (&json!("failed"), &json!("succeeded")),
        "{failed:#}"
    );
    let retry = format!("/api/v1/runs/{id}/retry");

    // What the run kept was undone: only a retry from named tasks says what
    // to do again, and the compensated task is in its set by rule.
    let response = api.post(&retry, &json!({})).send().await.expect("answers");
    assert_eq!(json_of(response, 409).await["code"], "run_compensated");
    let response = api
        .post(&retry, &json!({"from": ["ship"]}))
        .send()
        .await
        .expect("answers");
    assert_eq!(
        json_of(response, 202).await,
        json!({"id": id, "generation": 2, "applied": true, "tasks": [
            {"key": "reserve", "from": "succeeded", "to": "ready"},
            {"key": "ship", "from": "failed", "to": "pending"}
        ]})
    );

    // Generation 2 fails again and its rollback runs the compensator again.
    let second = api.wait_run(&id).await;
    assert_eq!(
        (&second["state"], &second["generation"]),
        (&json!("failed"), &json!(2)),
        "{second:#}"
    );
    let release = &second["compensations"][0];
    assert_eq!(
        (&release["state"], &release["attempt"], &release["generation"]),
        (&json!("succeeded"), &json!(2), &json!(2)),
        "{second:#}"
    );

    // Generation 3 gets past the failure.
    let response = api
        .post(&retry, &json!({"from": ["ship"]}))
        .send()
        .await
        .expect("answers");
    assert_eq!(json_of(response, 202).await["generation"], 3);
    let third = api.wait_run(&id).await;
    assert_eq!(
        (&third["state"], &third["generation"]),
        (&json!("succeeded"), &json!(3)),
        "{third:#}"
    );
    let ship = third["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["key"] == "ship")
        .expect("ship");
    assert_eq!(ship["output"], json!({"attempts": 3}));
});

on_both!(a_concurrency_key_the_input_lacks_refuses_the_start, &[], |api| {
    api.publish(&json!({"name": "limited", "version": 1,
        "concurrency": [{"key": "$.site", "max": 1}],
        "tasks": [{"key": "a", "task_type": "noop"}]}))
        .await;
    let response = api
        .post(
            "/api/v1/runs",
            &json!({"workflow": "limited", "input": {"region": "eu"}}),
        )
        .send()
        .await
        .expect("answers");
    let problem = json_of(response, 422).await;
    assert_eq!(problem["code"], "concurrency_key_unresolved", "{problem:#}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("$.concurrency[0]")),
        "{problem:#}"
    );
    let id = api.start_run("limited", json!({"site": "eu"})).await;
    assert_eq!(api.wait_run(&id).await["state"], "succeeded");
});

fn at(time: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(time.as_str().expect("a time")).expect("RFC 3339")
}

// A run of a limited workflow is retried through its gate
// (docs/design/concurrency.md#retries): the pool is shared by the
// workflow's versions, so version 1's `hold` keeps the one slot of `eu`
// while version 2's failed run is retried. The retry waits for the slot
// (its strategy does not turn it away again, though it still turns away a
// newcomer), and runs once the holder is cancelled.
on_both!(a_limited_run_is_retried_through_its_gate, &[], |api| {
    let limit = json!([{"key": "$.site", "max": 1, "strategy": "cancel_newest"}]);
    api.publish(&json!({"name": "exclusive", "version": 1, "concurrency": limit,
        "tasks": [{"key": "hold", "task_type": "sleep", "config": {"seconds": 600}}]}))
        .await;
    api.publish(
        &json!({"name": "exclusive", "version": 2, "concurrency": limit, "tasks": [
            {"key": "prepare", "task_type": "echo"},
            {"key": "deploy", "task_type": "fail", "config": {"fail_times": 1}, "depends_on": ["prepare"]}
        ]}),
    )
    .await;
    let retried = api.start_run("exclusive", json!({"site": "eu"})).await;
    assert_eq!(api.wait_run(&retried).await["state"], "failed");

    let response = api
        .post(
            "/api/v1/runs",
            &json!({"workflow": "exclusive", "version": 1, "input": {"site": "eu"}}),
        )
        .send()
        .await
        .expect("answers");
    let holder = json_of(response, 201).await["id"].as_str().expect("an id").to_owned();
    eventually("the holder to take the slot", || async {
        let report = api.get_json(&format!("/api/v1/runs/{holder}"), 200).await;
        (task(&report, "hold")["state"] == "running").then_some(())
    })
    .await;

    let response = api
        .post(&format!("/api/v1/runs/{retried}/retry"), &json!({}))
        .send()
        .await
        .expect("answers");
    assert_eq!(
        json_of(response, 202).await["tasks"],
        json!([{"key": "deploy", "from": "failed", "to": "pending"}]),
        "the retry waits at the run's gate, though its kept dependency succeeded"
    );
    let waiting = api.get_json(&format!("/api/v1/runs/{retried}"), 200).await;
    assert_eq!(
        (&waiting["state"], &waiting["generation"]),
        (&json!("running"), &json!(2))
    );
    assert_eq!(task(&waiting, "deploy")["blocked_by"], "concurrency:eu", "{waiting:#}");

    let newcomer = api.start_run("exclusive", json!({"site": "eu"})).await;
    let turned_away = api.wait_run(&newcomer).await;
    assert_eq!(
        (&turned_away["state"], &turned_away["cancel_reason"]),
        (&json!("cancelled"), &json!("concurrency_limit"))
    );
    let still = api.get_json(&format!("/api/v1/runs/{retried}"), 200).await;
    assert_eq!(still["state"], "running", "the retry is not turned away: {still:#}");

    let response = api
        .post(&format!("/api/v1/runs/{holder}/cancel"), &json!({}))
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status().as_u16(), 202);
    let held = api.wait_run(&holder).await;
    let done = api.wait_run(&retried).await;
    assert_eq!(
        (&done["state"], &done["generation"], &done["cancel_reason"]),
        (&json!("succeeded"), &json!(2), &Value::Null),
        "{done:#}"
    );
    let attempts = api
        .get_json(&format!("/api/v1/runs/{retried}/tasks/deploy/attempts"), 200)
        .await;
    let second = &attempts["items"][1];
    assert_eq!(
        (&second["generation"], &second["state"]),
        (&json!(2), &json!("succeeded"))
    );
    assert!(
        at(&held["finished_at"]) <= at(&second["started_at"]),
        "the retry started only once the holder let go: {held:#}\n{attempts:#}"
    );
});
