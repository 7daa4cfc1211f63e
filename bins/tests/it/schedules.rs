//! `flowforge schedules` on the default embedded store
//! (docs/design/schedules.md): each bad field refused with exit 2 naming
//! it, then create, list, pause, resume, a dry-run and a real backfill,
//! delete.

use serde_json::{Value, json};

use crate::run::Workdir;

fn one_task() -> Value {
    json!({"name": "tick", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]})
}

#[test]
fn schedules_are_created_listed_paused_backfilled_and_deleted_from_the_cli() {
    let w = Workdir::new();
    let def = w.json("tick.json", &one_task());
    // Publishes `tick` in the folder's default store.
    let ran = w.run(["run".as_ref(), def.as_os_str()]);
    assert_eq!(ran.code, 0, "{ran:?}");

    let create = |extra: &[&str]| {
        let mut args = vec!["schedules", "create", "nightly", "--workflow", "tick"];
        args.extend_from_slice(extra);
        w.run(args)
    };
    for (extra, says) in [
        (&["--cron", "0 25 * * *"][..], "cron: '0 25 * * *'"),
        (
            &["--cron", "0 3 * * *", "--timezone", "Europe/Atlantis"],
            "timezone: 'Europe/Atlantis'",
        ),
        (
            &["--cron", "0 3 * * *", "--input", "[1]"],
            "input: must be a JSON object",
        ),
        (
            &["--cron", "0 3 * * *", "--overlap", "sometimes"],
            "'sometimes' is not a policy",
        ),
        (&["--cron", "0 3 * * *", "--catchup-window", "30d"], "catchup_window:"),
    ] {
        let out = create(extra);
        assert_eq!(out.code, 2, "{extra:?}: {out:?}");
        assert!(
            out.stderr.contains(says),
            "{extra:?} should say {says:?}: {}",
            out.stderr
        );
    }
    let unknown = w.run(["schedules", "create", "x", "--workflow", "nope", "--cron", "0 3 * * *"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    assert!(
        unknown.stderr.contains("workflow 'nope' is not published"),
        "{}",
        unknown.stderr
    );

    let made = create(&[
        "--version",
        "1",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
        "--overlap",
        "buffer_one",
        "--input",
        r#"{"region": "eu"}"#,
    ]);
    assert_eq!(made.code, 0, "{made:?}");
    assert!(
        made.stderr.contains("schedule 'nightly' created; it next fires at"),
        "{}",
        made.stderr
    );
    let again = create(&["--cron", "0 4 * * *"]);
    assert_eq!(again.code, 2, "{again:?}");
    assert!(again.stderr.contains("already exists"), "{}", again.stderr);

    let list = w.run(["schedules", "list"]);
    assert_eq!(list.code, 0, "{list:?}");
    assert!(list.stdout.starts_with("NAME"), "{}", list.stdout);
    assert!(
        list.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("nightly") && l.contains("buffer_one")),
        "{}",
        list.stdout
    );
    let json_list = w.run(["schedules", "list", "--output", "json"]);
    let listed: Value = serde_json::from_str(&json_list.stdout).expect("JSON");
    assert_eq!(listed[0]["timezone"], "Europe/Paris");
    assert_eq!(listed[0]["version"], 1);
    assert_eq!(listed[0]["input"], json!({"region": "eu"}));
    assert_eq!(
        listed[0]["fires"],
        json!({"started": 0, "skipped_overlap": 0, "buffered": 0, "missed": 0})
    );

    assert_eq!(w.run(["schedules", "pause", "nightly"]).code, 0);
    let paused = w.run(["schedules", "list", "--output", "json"]);
    let paused: Value = serde_json::from_str(&paused.stdout).expect("JSON");
    assert_eq!(
        (paused[0]["paused"].clone(), paused[0]["next_fire"].clone()),
        (json!(true), Value::Null)
    );
    let resumed = w.run(["schedules", "resume", "nightly"]);
    assert!(resumed.stderr.contains("resumed; it next fires at"), "{resumed:?}");

    // 03:00 in Paris (UTC+1 in winter) is 02:00 UTC.
    let range = ["--from", "2026-01-10T00:00:00Z", "--to", "2026-01-12T23:00:00Z"];
    let dry = w.run([&["schedules", "backfill", "nightly", "--dry-run"][..], &range].concat());
    assert_eq!(dry.code, 0, "{dry:?}");
    assert_eq!(
        dry.stdout,
        "2026-01-10T02:00:00Z  would start a run\n\
         2026-01-11T02:00:00Z  would start a run\n\
         2026-01-12T02:00:00Z  would start a run\n"
    );
    let runs_before = w.run(["runs", "list", "--output", "json"]);
    let before: Value = serde_json::from_str(&runs_before.stdout).expect("JSON");
    let real = w.run([&["schedules", "backfill", "nightly"][..], &range].concat());
    assert_eq!(real.code, 0, "{real:?}");
    assert_eq!(real.stdout.matches("started run ").count(), 3, "{}", real.stdout);
    assert!(
        real.stderr.contains("3 run(s) started for 3 fire time(s)"),
        "{}",
        real.stderr
    );
    let runs_after = w.run(["runs", "list", "--output", "json"]);
    let after: Value = serde_json::from_str(&runs_after.stdout).expect("JSON");
    assert_eq!(
        after.as_array().map(Vec::len),
        before.as_array().map(|b| b.len() + 3),
        "three runs, whatever the overlap policy"
    );
    let twice = w.run([&["schedules", "backfill", "nightly"][..], &range].concat());
    assert_eq!(
        twice.stdout.matches("already started; nothing started").count(),
        3,
        "{}",
        twice.stdout
    );
    let too_many = w.run([
        "schedules",
        "backfill",
        "nightly",
        "--from",
        "2020-01-01T00:00:00Z",
        "--to",
        "2026-01-01T00:00:00Z",
    ]);
    assert_eq!(too_many.code, 2, "{too_many:?}");
    assert!(
        too_many.stderr.contains("split it into smaller ranges"),
        "{}",
        too_many.stderr
    );

    assert_eq!(w.run(["schedules", "delete", "nightly"]).code, 0);
    let gone = w.run(["schedules", "delete", "nightly"]);
    assert_eq!(gone.code, 2, "{gone:?}");
    assert!(gone.stderr.contains("schedule 'nightly' not found"), "{}", gone.stderr);
}
