//! The web UI in a real browser (docs/design/ui.md): headless Chromium
//! driven over WebDriver against a real `flowforge server` on SQLite. The
//! page is read through its `data-*` attributes, the contract the UI keeps
//! for tests and users' scripts; waits poll a condition, never a clock.

use std::time::Duration;

use serde_json::{Value, json};

use crate::browser::{Browser, save_screenshot};
use crate::server::{Api, On, definition};

/// A server and a browser, or `None` when either is absent and not required.
async fn setup(test: &str, extra: &[&str]) -> Option<(Api, Browser)> {
    let api = Api::start(On::Sqlite, test, extra).await?;
    let browser = Browser::start().await?;
    Some((api, browser))
}

/// Opens `path` with the admin token in the tab's session storage, as the
/// token prompt leaves it.
async fn open(api: &Api, browser: &Browser, path: &str) {
    browser.goto(&api.url("/healthz")).await;
    browser
        .js(
            "sessionStorage.setItem('flowforge.token', arguments[0])",
            vec![json!(api.admin)],
        )
        .await;
    browser.goto(&api.url(path)).await;
}

/// Records every state each DAG node shows, in order, from now on, across
/// in-page navigation (`window.__seen[key]`).
async fn record_states(browser: &Browser) {
    browser
        .js(
            r"
            window.__seen = {};
            const note = (el) => {
              if (!el.matches || !el.matches('.node[data-task-key]')) return;
              const list = (window.__seen[el.dataset.taskKey] ??= []);
              if (list[list.length - 1] !== el.dataset.state) list.push(el.dataset.state);
            };
            new MutationObserver((changes) => {
              for (const c of changes) {
                note(c.target);
                for (const n of c.addedNodes) {
                  note(n);
                  if (n.querySelectorAll) n.querySelectorAll('.node[data-task-key]').forEach(note);
                }
              }
            }).observe(document.getElementById('app'),
              { subtree: true, childList: true, attributes: true, attributeFilter: ['data-state'] });
            window.__kept = 'no reload since';
            ",
            vec![],
        )
        .await;
}

/// Publishes `def`, runs it to its end through the API, and opens its
/// page once the graph is drawn; the run's id.
async fn finished_run_page(api: &Api, browser: &Browser, def: &Value) -> String {
    api.publish(def).await;
    let workflow = def["name"].as_str().expect("a name");
    let id = api.start_run(workflow, json!({})).await;
    api.wait_run(&id).await;
    open(api, browser, &format!("/runs/{id}")).await;
    browser.wait_for("#dag[data-ready]").await;
    id
}

/// Milliseconds from navigation to the run page's graph answering clicks,
/// as the page records it.
async fn time_to_interactive(browser: &Browser) -> Value {
    browser.js("return window.__flowforge.readyAtMs", vec![]).await
}

async fn seen(browser: &Browser) -> Value {
    browser.js("return window.__seen", vec![]).await
}

/// The page was not reloaded since `record_states`.
async fn assert_not_reloaded(browser: &Browser) {
    assert_eq!(
        browser.js("return window.__kept ?? null", vec![]).await,
        json!("no reload since"),
        "the page reloaded"
    );
}

fn sleep(seconds: f64) -> Value {
    json!({"seconds": seconds})
}

/// The diamond, slowed down so its states can be watched: start, then
/// left and right side by side, then join.
fn slow_diamond() -> Value {
    definition(
        "slow-diamond",
        1,
        &[
            ("start", "noop", &[], json!({"output": {"items": 3}})),
            ("left", "sleep", &["start"], sleep(6.0)),
            ("right", "sleep", &["start"], sleep(6.0)),
            ("join", "echo", &["left", "right"], json!({})),
        ],
    )
}

#[tokio::test]
async fn a_new_run_appears_on_the_runs_page_and_its_dag_goes_live_to_succeeded() {
    let Some((api, browser)) = setup("ui-live", &[]).await else {
        return;
    };
    api.publish(&slow_diamond()).await;
    open(&api, &browser, "/").await;
    browser.wait_for("#runs").await;
    record_states(&browser).await;
    let id = api.start_run("slow-diamond", json!({})).await;
    // The runs page lists it without a reload; its link opens the run.
    let link = format!("tr[data-run-id=\"{id}\"] a");
    browser.wait_for(&link).await;
    browser.click(&link).await;
    browser.wait_for("#dag[data-ready]").await;
    browser
        .wait_until_js(
            "document.querySelector('#run-header')?.dataset.runState === 'succeeded' && \
             [...document.querySelectorAll('.node[data-task-key]')].every(n => n.dataset.state === 'succeeded')",
            "the run and its four tasks to show succeeded",
        )
        .await;
    assert_not_reloaded(&browser).await;
    let seen = seen(&browser).await;
    for key in ["start", "left", "right", "join"] {
        let states = seen[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} never drawn: {seen}"));
        assert_eq!(states.last(), Some(&json!("succeeded")), "{key}: {states:?}");
    }
    // The page opened while the sleeps ran: join was drawn waiting, and
    // the sleeps were seen running, before all succeeded.
    assert_ne!(seen["join"][0], json!("succeeded"), "{seen}");
    assert!(
        seen["left"].as_array().is_some_and(|s| s.contains(&json!("running"))),
        "{seen}"
    );
    // The runs page again (in-page navigation): the run's row is succeeded.
    browser.click("nav a[data-nav=\"runs\"]").await;
    browser
        .wait_for(&format!("tr[data-run-id=\"{id}\"][data-state=\"succeeded\"]"))
        .await;
    assert_not_reloaded(&browser).await;
    browser.close().await;
}

#[tokio::test]
async fn screenshot_of_a_failed_saga_shows_its_compensators_and_every_attempt() {
    let Some((api, browser)) = setup("ui-saga", &[]).await else {
        return;
    };
    let saga: Value = serde_json::from_str(include_str!("../../../examples/saga.json")).expect("saga.json");
    finished_run_page(&api, &browser, &saga).await;
    browser.wait_for("#run-header[data-run-state=\"failed\"]").await;
    // Compensators sit in their own lane, each naming what it undoes.
    for (key, undoes, state) in [
        ("release_inventory", "reserve_inventory", "succeeded"),
        ("refund_payment", "charge_payment", "succeeded"),
        ("cancel_shipment", "ship_order", "none"),
    ] {
        browser
            .wait_for(&format!(
                ".node[data-task-key=\"{key}\"][data-compensates=\"{undoes}\"][data-state=\"{state}\"]"
            ))
            .await;
    }
    browser
        .wait_for(".node[data-task-key=\"notify_customer\"][data-state=\"cancelled\"][data-reason=\"upstream_failed\"]")
        .await;
    // A task's output in its panel.
    browser.click(".node[data-task-key=\"charge_payment\"]").await;
    browser
        .wait_until_js(
            "document.querySelector('#task-panel[data-task-key=\"charge_payment\"] pre.output')?.textContent.includes('CH-2002')",
            "charge_payment's output in its panel",
        )
        .await;
    // A task's panel: one tab per attempt, the last one open (this is
    // the screenshot's panel).
    browser.click(".node[data-task-key=\"ship_order\"]").await;
    browser
        .wait_for("#task-panel[data-task-key=\"ship_order\"] [role=tab][data-attempt=\"2\"]")
        .await;
    let tabs = browser
        .js(
            "return document.querySelectorAll('#task-panel [role=tab]').length",
            vec![],
        )
        .await;
    assert_eq!(tabs, json!(2));
    browser.click("#task-panel [role=tab][data-attempt=\"1\"]").await;
    browser
        .wait_until_js(
            "!document.querySelector('#pane-1').hidden && \
             document.querySelector('#pane-1 pre.error').textContent.includes('attempt 1')",
            "attempt 1's error to show",
        )
        .await;
    // The timeline has a bar for each attempt of ship_order.
    let bars = browser
        .js(
            "return document.querySelectorAll('#timeline g[data-task-key=\"ship_order\"]').length",
            vec![],
        )
        .await;
    assert_eq!(bars, json!(2));
    save_screenshot("saga-run", &browser.screenshot_png().await);
    browser.close().await;
}

/// The Retry button of a failed run shows the dry-run set in its
/// confirmation first (docs/design/retry.md); confirmed, the run's next
/// generation runs and the page follows it to its end.
#[tokio::test]
async fn a_failed_run_is_retried_from_the_page_after_its_set_is_shown() {
    let Some((api, browser)) = setup("ui-retry", &[]).await else {
        return;
    };
    let def = definition(
        "flaky",
        1,
        &[
            ("flaky", "fail", &[], json!({"fail_times": 1})),
            ("after", "noop", &["flaky"], json!({})),
        ],
    );
    let id = finished_run_page(&api, &browser, &def).await;
    browser.wait_for("#run-header[data-run-state=\"failed\"]").await;
    browser.click("#retry-run").await;
    browser.wait_for("dialog#confirm[open]").await;
    let text = browser
        .js("return document.getElementById('confirm-text').textContent", vec![])
        .await;
    let text = text.as_str().expect("the confirmation's text");
    assert!(
        text.contains("generation 2") && text.contains("flaky (failed → ready), after (cancelled → pending)"),
        "{text}"
    );
    browser.click("#confirm-yes").await;
    browser.wait_for("#run-header[data-run-state=\"succeeded\"]").await;
    browser
        .wait_for(".node[data-task-key=\"after\"][data-state=\"succeeded\"]")
        .await;
    let report = api.wait_run(&id).await;
    assert_eq!(
        (&report["state"], &report["generation"]),
        (&json!("succeeded"), &json!(2))
    );
    assert_eq!(
        browser.js("return document.querySelector('#retry-run')", vec![]).await,
        Value::Null,
        "no retry button on a succeeded run"
    );
    browser.close().await;
}

/// A compensated run is retried from its failed tasks, and the confirmation
/// names the compensated task that runs again (docs/design/retry.md#compensated-runs).
#[tokio::test]
async fn a_compensated_run_is_retried_from_the_page_with_what_its_rollback_undid() {
    let Some((api, browser)) = setup("ui-retry-saga", &[]).await else {
        return;
    };
    let def = json!({"name": "saga", "version": 1, "tasks": [
        {"key": "reserve", "task_type": "echo"},
        {"key": "ship", "task_type": "fail", "depends_on": ["reserve"], "config": {"fail_times": 1}},
        {"key": "release", "task_type": "echo", "compensate_for": "reserve"}
    ]});
    let id = finished_run_page(&api, &browser, &def).await;
    browser.wait_for("#run-header[data-run-state=\"failed\"]").await;
    browser.click("#retry-run").await;
    browser.wait_for("dialog#confirm[open]").await;
    let text = browser
        .js("return document.getElementById('confirm-text').textContent", vec![])
        .await;
    let text = text.as_str().expect("the confirmation's text");
    assert!(
        text.contains("generation 2")
            && text.contains("reserve (succeeded → ready), ship (failed → pending)")
            && text.contains("compensated"),
        "{text}"
    );
    browser.click("#confirm-yes").await;
    browser.wait_for("#run-header[data-run-state=\"succeeded\"]").await;
    let report = api.wait_run(&id).await;
    assert_eq!(
        (&report["state"], &report["generation"]),
        (&json!("succeeded"), &json!(2))
    );
    browser.close().await;
}

#[tokio::test]
async fn a_run_waiting_for_a_concurrency_slot_says_so_and_goes_live_when_it_gets_one() {
    let Some((api, browser)) = setup("ui-limit", &[]).await else {
        return;
    };
    api.publish(&json!({"name": "exclusive", "version": 1,
        "concurrency": [{"key": "$.site", "max": 1}],
        "tasks": [{"key": "nap", "task_type": "sleep", "config": sleep(600.0)}]}))
        .await;
    let holder = api.start_run("exclusive", json!({"site": "eu"})).await;
    let waiter = api.start_run("exclusive", json!({"site": "eu"})).await;
    open(&api, &browser, &format!("/runs/{waiter}")).await;
    browser
        .wait_for(".node[data-task-key=\"nap\"][data-state=\"pending\"][data-reason=\"concurrency:eu\"]")
        .await;
    browser.click(".node[data-task-key=\"nap\"]").await;
    browser
        .wait_for("#task-panel[data-task-key=\"nap\"] [data-blocked-by=\"concurrency:eu\"]")
        .await;
    for run in [&holder, &waiter] {
        let response = api
            .post(&format!("/api/v1/runs/{run}/cancel"), &json!({}))
            .send()
            .await
            .expect("answers");
        assert_eq!(response.status().as_u16(), 202, "cancel {run}");
        if run == &holder {
            // The freed slot lets the waiter start, live on its page.
            browser
                .wait_for(".node[data-task-key=\"nap\"][data-state=\"running\"]")
                .await;
        }
    }
    assert_eq!(api.wait_run(&waiter).await["state"], json!("cancelled"));
    browser.close().await;
}

#[tokio::test]
async fn a_sleeping_run_is_cancelled_from_the_page_and_a_reload_shows_the_same() {
    let Some((api, browser)) = setup("ui-cancel", &[]).await else {
        return;
    };
    api.publish(&definition(
        "sleepy",
        1,
        &[
            ("nap", "sleep", &[], sleep(600.0)),
            ("after", "noop", &["nap"], json!({})),
        ],
    ))
    .await;
    let id = api.start_run("sleepy", json!({})).await;
    open(&api, &browser, &format!("/runs/{id}")).await;
    browser
        .wait_for(".node[data-task-key=\"nap\"][data-state=\"running\"]")
        .await;
    browser.click("#cancel-run").await;
    browser.wait_for("dialog#confirm[open]").await;
    browser.click("#confirm-yes").await;
    browser.wait_for("#run-header[data-run-state=\"cancelled\"]").await;
    browser
        .wait_for(".node[data-task-key=\"nap\"][data-state=\"cancelled\"]")
        .await;
    assert_eq!(api.wait_run(&id).await["state"], json!("cancelled"));
    browser.refresh().await;
    browser.wait_for("#run-header[data-run-state=\"cancelled\"]").await;
    browser
        .wait_for(".node[data-task-key=\"nap\"][data-state=\"cancelled\"]")
        .await;
    browser
        .wait_for(".node[data-task-key=\"after\"][data-state=\"cancelled\"]")
        .await;
    assert_eq!(
        browser.js("return document.querySelector('#cancel-run')", vec![]).await,
        Value::Null,
        "no cancel button on a finished run"
    );
    browser.close().await;
}

#[tokio::test]
async fn the_page_catches_up_after_the_server_restarts() {
    let Some((mut api, browser)) = setup("ui-restart", &["--lease-seconds", "3", "--allow-command"]).await else {
        return;
    };
    // The first task runs until the test lets it go, so the run is still
    // live when the page opens however long opening takes.
    api.publish(&json!({"name": "two-naps", "version": 1, "tasks": [
        {"key": "first", "task_type": "command", "timeout_seconds": 300,
         "config": {"argv": ["sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; echo '{}'"]}},
        {"key": "second", "task_type": "sleep", "depends_on": ["first"], "config": sleep(2.0)}
    ]}))
    .await;
    let id = api.start_run("two-naps", json!({})).await;
    open(&api, &browser, &format!("/runs/{id}")).await;
    browser.wait_for("#live[data-live=\"open\"]").await;
    std::fs::write(api.dir().join("go"), b"").expect("release the first task");
    record_states(&browser).await;
    browser
        .js(
            "window.__drops = 0; new MutationObserver(() => { \
               if (document.querySelector('#live').dataset.live === 'closed') window.__drops += 1; \
             }).observe(document.querySelector('#live'), { attributes: true });",
            vec![],
        )
        .await;
    api.restart().await;
    browser
        .wait_until_js(
            "document.querySelector('#run-header')?.dataset.runState === 'succeeded' && \
             document.querySelector('.node[data-task-key=\"second\"]')?.dataset.state === 'succeeded'",
            "the page to catch up with the finished run",
        )
        .await;
    assert_not_reloaded(&browser).await;
    let drops = browser.js("return window.__drops", vec![]).await;
    assert!(
        drops.as_u64().is_some_and(|d| d >= 1),
        "the stream never dropped: {drops}"
    );
    // Each attempt is drawn once: no event was applied twice.
    let report = api.wait_run(&id).await;
    let attempts: u64 = report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["attempt"].as_u64().unwrap_or(0))
        .sum();
    // The timeline redraws after the graph: wait for its bars, then check
    // that no attempt was drawn twice.
    browser
        .wait_until_js(
            &format!("document.querySelectorAll('#timeline g').length >= {attempts}"),
            "the timeline to draw every attempt",
        )
        .await;
    let bars = browser
        .js("return document.querySelectorAll('#timeline g').length", vec![])
        .await;
    assert_eq!(bars, json!(attempts), "{report:#}");
    browser.close().await;
}

#[tokio::test]
async fn the_token_prompt_asks_for_a_token_and_keeps_it_out_of_the_url() {
    let Some((api, browser)) = setup("ui-token", &[]).await else {
        return;
    };
    browser.goto(&api.url("/")).await;
    browser.wait_for("dialog#token-dialog[open]").await;
    browser
        .js(
            "document.getElementById('token-input').value = arguments[0]; \
             document.getElementById('token-save').click();",
            vec![json!(api.admin)],
        )
        .await;
    browser.wait_for("#runs tbody tr").await;
    let (url, kept) = (
        browser.js("return location.href", vec![]).await,
        browser
            .js("return sessionStorage.getItem('flowforge.token')", vec![])
            .await,
    );
    assert_eq!(kept, json!(api.admin));
    assert!(!url.to_string().contains(&api.admin), "{url}");
    browser.close().await;
}

#[tokio::test]
async fn the_definitions_pages_show_versions_the_graph_and_the_fingerprint() {
    let Some((api, browser)) = setup("ui-definitions", &[]).await else {
        return;
    };
    let published = api.publish(&slow_diamond()).await;
    open(&api, &browser, "/definitions").await;
    browser.click("a[href=\"/definitions/slow-diamond\"]").await;
    browser.click("a[href=\"/definitions/slow-diamond/versions/1\"]").await;
    browser.wait_for("#dag[data-ready]").await;
    let fingerprint = browser
        .js("return document.getElementById('fingerprint').textContent", vec![])
        .await;
    assert_eq!(fingerprint, published["fingerprint"]);
    let nodes = browser
        .js(
            "return [...document.querySelectorAll('.node[data-task-key]')].map(n => n.dataset.taskKey)",
            vec![],
        )
        .await;
    assert_eq!(nodes, json!(["start", "left", "right", "join"]));
    browser.close().await;
}

/// A fan-out of `width` no-op tasks between a split and a merge.
fn fanout(name: &str, width: usize) -> Value {
    let parts: Vec<String> = (0..width).map(|i| format!("part_{i:04}")).collect();
    let mut tasks = vec![json!({"key": "split", "task_type": "noop"})];
    tasks.extend(
        parts
            .iter()
            .map(|p| json!({"key": p, "task_type": "noop", "depends_on": ["split"]})),
    );
    tasks.push(json!({"key": "merge", "task_type": "noop", "depends_on": parts}));
    json!({"name": name, "version": 1, "tasks": tasks})
}

#[tokio::test]
async fn screenshot_of_a_1000_task_fan_out_groups_the_wide_level() {
    let Some((api, browser)) = setup("ui-fanout", &[]).await else {
        return;
    };
    finished_run_page(&api, &browser, &fanout("fanout-1000", 998)).await;
    browser
        .wait_for(".node.group[data-group-level=\"1\"][data-state=\"succeeded\"]")
        .await;
    let drawn = browser
        .js("return document.querySelectorAll('.node').length", vec![])
        .await;
    assert_eq!(drawn, json!(3), "split, the group of 998, merge");
    save_screenshot("fanout-1000-run", &browser.screenshot_png().await);
    browser.close().await;
}

/// Time to interactive of a 2 000-task run's page is printed (the figure
/// BENCHMARKS.md records); the test asserts what makes it interactive.
#[tokio::test]
async fn a_2000_task_run_page_is_interactive_and_walkable_by_keyboard() {
    let Some((api, browser)) = setup("ui-2000", &[]).await else {
        return;
    };
    finished_run_page(&api, &browser, &fanout("fanout-2000", 1_998)).await;
    let ready = time_to_interactive(&browser).await;
    println!("ui time_to_interactive_2000_tasks_ms={ready}");
    // The wide level opens on click; each task is then a node of its own.
    browser.click(".node.group[data-group-level=\"1\"]").await;
    browser
        .wait_for(".node[data-task-key=\"part_1997\"][data-state=\"succeeded\"]")
        .await;
    browser.click(".node[data-task-key=\"part_0100\"]").await;
    browser
        .wait_for("#task-panel[data-task-key=\"part_0100\"] [role=tab]")
        .await;
    // Arrow keys walk the graph: down the level, then right to the merge.
    browser
        .js(
            "document.querySelector('.node[data-task-key=\"part_0100\"]').focus()",
            vec![],
        )
        .await;
    browser.keys("\u{e015}").await; // ArrowDown
    assert_eq!(
        browser
            .js("return document.activeElement.dataset.taskKey", vec![])
            .await,
        json!("part_0101")
    );
    browser.keys("\u{e014}").await; // ArrowRight
    assert_eq!(
        browser
            .js("return document.activeElement.dataset.taskKey", vec![])
            .await,
        json!("merge")
    );
    browser.close().await;
}

/// A 10 000-task fan-out watched live: its 30 000 events stream into the
/// page, which stays usable meanwhile (a click opens a panel) and ends
/// with the wide level as one group node showing every task succeeded.
#[tokio::test]
async fn a_10000_task_run_stays_responsive_while_its_events_stream_in() {
    let Some((api, browser)) = setup("ui-10000", &[]).await else {
        return;
    };
    api.publish(&fanout("fanout-10000", 9_998)).await;
    let id = api.start_run("fanout-10000", json!({})).await;
    open(&api, &browser, &format!("/runs/{id}")).await;
    browser.wait_for("#dag[data-ready]").await;
    browser.click(".node[data-task-key=\"split\"]").await;
    browser.wait_for("#task-panel[data-task-key=\"split\"]").await;
    // 10 000 tasks through a debug build's embedded engine while the page
    // streams them: minutes on a 2-core machine busy with other tests.
    api.wait_run_within(&id, Duration::from_secs(600)).await;
    browser
        .wait_until_js(
            "document.querySelector('#run-header')?.dataset.runState === 'succeeded' && \
             document.querySelector('.node.group[data-group-level=\"1\"]')?.dataset.state === 'succeeded' && \
             document.querySelector('.node[data-task-key=\"merge\"]')?.dataset.state === 'succeeded'",
            "the page to show the finished 10 000-task run",
        )
        .await;
    let label = browser
        .js(
            "return document.querySelector('.node.group .label').textContent",
            vec![],
        )
        .await;
    assert!(label.to_string().contains("9998 succeeded"), "{label}");
    assert_eq!(
        browser
            .js("return document.querySelectorAll('.node').length", vec![])
            .await,
        json!(3)
    );
    browser.close().await;
}

/// A 2 000-task run none of whose levels is grouped (100 levels of 20,
/// each task after the one above it), so every task is drawn at load:
/// its time to interactive is printed (BENCHMARKS.md), and the page
/// answers a click on its last task.
#[tokio::test]
async fn a_2000_task_run_drawn_node_by_node_is_interactive() {
    let Some((api, browser)) = setup("ui-grid", &[]).await else {
        return;
    };
    let key = |level: usize, lane: usize| format!("t{level:03}_{lane:02}");
    let mut tasks = Vec::new();
    for level in 0..100 {
        for lane in 0..20 {
            let deps: Vec<String> = if level == 0 { vec![] } else { vec![key(level - 1, lane)] };
            tasks.push(json!({"key": key(level, lane), "task_type": "noop", "depends_on": deps}));
        }
    }
    let grid = json!({"name": "grid-2000", "version": 1, "tasks": tasks});
    finished_run_page(&api, &browser, &grid).await;
    let ready = time_to_interactive(&browser).await;
    println!("ui time_to_interactive_2000_tasks_drawn_ms={ready}");
    assert_eq!(
        browser
            .js("return document.querySelectorAll('.node').length", vec![])
            .await,
        json!(2000)
    );
    browser.click(".node[data-task-key=\"t099_19\"]").await;
    browser
        .wait_for("#task-panel[data-task-key=\"t099_19\"] [role=tab]")
        .await;
    browser.close().await;
}

#[tokio::test]
async fn the_schedules_page_lists_a_schedule_and_pauses_and_resumes_it() {
    let Some((api, browser)) = setup("ui-schedules", &[]).await else {
        return;
    };
    api.publish(&slow_diamond()).await;
    let created = api
        .post(
            "/api/v1/schedules",
            &json!({"name": "nightly", "workflow": "slow-diamond", "cron": "0 3 * * *", "timezone": "Europe/Paris"}),
        )
        .send()
        .await
        .expect("answers");
    assert_eq!(created.status().as_u16(), 201);
    open(&api, &browser, "/").await;
    browser.click("nav a[data-nav=\"schedules\"]").await;
    browser
        .wait_for("tr[data-schedule=\"nightly\"][data-paused=\"false\"]")
        .await;
    let next = browser
        .js(
            "return document.querySelector('tr[data-schedule=\"nightly\"] td[data-next-fire]').dataset.nextFire",
            vec![],
        )
        .await;
    let listed = api.get_json("/api/v1/schedules/nightly", 200).await;
    assert_eq!(next, listed["next_fire"], "the page shows the API's next fire time");
    browser
        .click("tr[data-schedule=\"nightly\"] button[data-action=\"pause\"]")
        .await;
    browser
        .wait_for("tr[data-schedule=\"nightly\"][data-paused=\"true\"]")
        .await;
    assert_eq!(api.get_json("/api/v1/schedules/nightly", 200).await["paused"], true);
    browser
        .click("tr[data-schedule=\"nightly\"] button[data-action=\"resume\"]")
        .await;
    browser
        .wait_for("tr[data-schedule=\"nightly\"][data-paused=\"false\"]")
        .await;
    assert_eq!(api.get_json("/api/v1/schedules/nightly", 200).await["paused"], false);
    browser.close().await;
}
