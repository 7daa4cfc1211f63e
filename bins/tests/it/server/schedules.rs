//! Schedules through the API and the CLI (docs/design/schedules.md): on
//! SQLite the server fires them, on PostgreSQL the scheduler process does;
//! either way a run starts at the next minute with the fire's times in its
//! input, and the outcome is counted in the list, the CLI and the metrics.

use serde_json::{Value, json};

use crate::distributed::eventually;

use super::{definition, json_of, on_both};

on_both!(a_schedule_fires_and_is_managed_through_the_api, &[], |api| {
    api.publish(&definition(
        "tick",
        1,
        &[("a", "noop", &[], json!({"output": {"ok": true}}))],
    ))
    .await;
    let create = |body: Value| api.post("/api/v1/schedules", &body).send();

    // Each bad field is named.
    let bad = json_of(
        create(json!({"name": "bad", "workflow": "tick", "cron": "61 * * * *"}))
            .await
            .expect("answers"),
        422,
    )
    .await;
    assert_eq!(bad["code"], "invalid_schedule", "{bad:#}");
    assert!(bad["detail"].as_str().expect("detail").starts_with("cron: "), "{bad:#}");
    let bad = json_of(
        create(json!({"name": "bad", "workflow": "tick", "cron": "* * * * *", "timezone": "Mars/Base"}))
            .await
            .expect("answers"),
        422,
    )
    .await;
    assert!(
        bad["detail"].as_str().expect("detail").starts_with("timezone: "),
        "{bad:#}"
    );
    let missing = create(json!({"name": "bad", "workflow": "nope", "cron": "* * * * *"}))
        .await
        .expect("answers");
    assert_eq!(missing.status().as_u16(), 404);

    let created = json_of(
        create(json!({"name": "tick", "workflow": "tick", "cron": "* * * * *", "input": {"k": 1}}))
            .await
            .expect("answers"),
        201,
    )
    .await;
    assert_eq!(created["overlap"], "skip");
    assert_eq!(created["catchup_window_seconds"], 3600);
    assert!(created["next_fire"].is_string(), "{created:#}");
    let taken = json_of(
        create(json!({"name": "tick", "workflow": "tick", "cron": "0 * * * *"}))
            .await
            .expect("answers"),
        409,
    )
    .await;
    assert_eq!(taken["code"], "schedule_exists");

    // The next minute's fire starts a run, which runs to its end.
    let id = eventually("the schedule's first run", || async {
        let page = api.get_json("/api/v1/runs", 200).await;
        page["items"][0]["id"].as_str().map(str::to_owned)
    })
    .await;
    let report = api.wait_run(&id).await;
    assert_eq!(report["state"], "succeeded", "{report:#}");
    assert_eq!(report["input"]["k"], 1);
    assert_eq!(
        report["input"]["scheduled_for"]
            .as_str()
            .expect("scheduled_for")
            .get(17..),
        Some("00.000Z"),
        "fired for a whole minute: {report:#}"
    );
    assert!(report["input"]["fired_at"].is_string(), "{report:#}");

    let one = api.get_json("/api/v1/schedules/tick", 200).await;
    assert!(one["fires"]["started"].as_u64() >= Some(1), "{one:#}");
    let list = api.get_json("/api/v1/schedules", 200).await;
    assert_eq!(list["items"][0]["name"], "tick");
    // The CLI lists the same schedule from the same store.
    let cli = api.cli(["schedules", "list", "--output", "json"]);
    assert_eq!(cli.code, 0, "{cli:?}");
    let cli: Value = serde_json::from_str(&cli.stdout).expect("JSON");
    assert_eq!(cli[0]["name"], "tick");
    assert_eq!(cli[0]["cron"], "* * * * *");
    let metrics = api.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("flowforge_schedule_fires_total{") && l.contains("outcome=\"started\"")),
        "the fire is counted"
    );

    let paused = json_of(
        api.post("/api/v1/schedules/tick/pause", &json!({}))
            .send()
            .await
            .expect("answers"),
        200,
    )
    .await;
    assert_eq!(
        (paused["paused"].clone(), paused["next_fire"].clone()),
        (json!(true), Value::Null)
    );
    let resumed = json_of(
        api.post("/api/v1/schedules/tick/resume", &json!({}))
            .send()
            .await
            .expect("answers"),
        200,
    )
    .await;
    assert!(resumed["next_fire"].is_string(), "{resumed:#}");

    // A dry-run backfill of three whole minutes an hour ago.
    let scheduled = chrono::DateTime::parse_from_rfc3339(report["input"]["scheduled_for"].as_str().expect("time"))
        .expect("RFC 3339");
    let from = scheduled - chrono::TimeDelta::hours(1);
    let to = from + chrono::TimeDelta::minutes(2);
    let dry = json_of(
        api.post(
            "/api/v1/schedules/tick/backfill",
            &json!({"from": from.to_rfc3339(), "to": to.to_rfc3339(), "dry_run": true}),
        )
        .send()
        .await
        .expect("answers"),
        200,
    )
    .await;
    let fires = dry["fires"].as_array().expect("fires");
    assert_eq!(fires.len(), 3, "{dry:#}");
    assert!(fires.iter().all(|f| f["outcome"] == "would_start"), "{dry:#}");

    let deleted = api
        .http
        .delete(api.url("/api/v1/schedules/tick"))
        .bearer_auth(&api.admin)
        .send()
        .await
        .expect("answers");
    assert_eq!(deleted.status().as_u16(), 204);
    let gone = json_of(api.get("/api/v1/schedules/tick").send().await.expect("answers"), 404).await;
    assert_eq!(gone["code"], "not_found");
    let runs = api.get_json(&format!("/api/v1/runs/{id}"), 200).await;
    assert_eq!(runs["state"], "succeeded", "a deleted schedule's runs stay");
});
