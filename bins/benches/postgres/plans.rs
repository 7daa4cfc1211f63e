//! The plans of the scheduler's hot queries on a database with history:
//! EXPLAIN ANALYZE output, sequential scans of big tables, re-planned
//! prepared statements.

use super::*;

/// One hot query to EXPLAIN: its name, how to PREPARE and EXECUTE it, and
/// the indexes that serve it (one of each group must appear in its plan).
pub(crate) struct Hot {
    name: &'static str,
    text: &'static str,
    params: &'static str,
    args: String,
    indexes: &'static [&'static [&'static str]],
}

/// Whether `plan` scans a big table sequentially.
pub(crate) fn seq_scans_big_table(plan: &str) -> bool {
    plan.lines().any(|line| {
        line.split_once("Seq Scan on ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|table| ["task_run", "workflow_run", "outbox", "task_run_event"].contains(&table))
    })
}

/// The EXPLAIN ANALYZE plans (in a rolled-back transaction) of the
/// scheduler's hot queries, bound as the store binds them, with whether
/// each uses the index that serves it.
pub(crate) fn explain_hot_queries(db: &BenchDb, run: RunId, pair: WorkflowId) -> (String, bool) {
    let hot = [
        Hot {
            name: "runs_with_work",
            text: queries::RUNS_WITH_WORK,
            params: "interval, bigint, uuid[]",
            args: "'0', 10000, NULL".to_owned(),
            indexes: &[
                &["taskrun_needs_pass_idx"],
                &["taskrun_retry_due_idx", "taskrun_active_idx"],
                &["workflowrun_needs_pass_idx"],
                &["workflowrun_active_idx", "workflow_run_pkey"],
            ],
        },
        Hot {
            name: "reap_expired_leases (its candidates)",
            text: queries::REAP,
            params: "interval, bigint, uuid[]",
            args: "'0', 10000, NULL".to_owned(),
            indexes: &[&["taskrun_lease_expiry_idx", "taskrun_active_idx"]],
        },
        Hot {
            name: "next_deadline",
            text: queries::NEXT_DEADLINE,
            params: "interval, uuid[]",
            args: "'0', NULL".to_owned(),
            indexes: &[
                &["taskrun_retry_due_idx", "taskrun_active_idx"],
                &["taskrun_lease_expiry_idx", "taskrun_active_idx"],
            ],
        },
        Hot {
            name: "take_flagged",
            text: queries::TAKE_FLAGGED,
            params: "uuid",
            args: format!("'{run}'"),
            indexes: &[&["taskrun_needs_pass_idx"]],
        },
        Hot {
            name: "activity",
            text: queries::ACTIVITY,
            params: "uuid, boolean",
            args: format!("'{run}', false"),
            indexes: &[&["taskrun_active_idx"]],
        },
        Hot {
            name: "satisfy_dependencies (the promotion)",
            text: queries::LOWER_AND_PROMOTE,
            params: "interval, uuid, bigint, text[], int4[]",
            args: format!("'0', '{run}', {}, ARRAY['t1'], ARRAY[1]", pair.0),
            indexes: &[&["uniq_taskrun_run_key", "taskrun_active_idx"]],
        },
        Hot {
            name: "outbox sweep",
            text: queries::SWEEP,
            params: "bigint, uuid[], float8",
            args: "500, NULL, 300000000".to_owned(),
            indexes: &[&["outbox_pending_order_idx"]],
        },
    ];
    // Both kinds of plan: custom (the first five executions of a prepared
    // statement) and generic (what sqlx's cached statements then run).
    let mut script = String::new();
    for (i, q) in hot.iter().enumerate() {
        let _ = writeln!(script, "PREPARE q{i}({}) AS {};", q.params, q.text);
    }
    // Each kind of plan in its own rolled-back transaction, on the same state.
    for mode in ["force_custom_plan", "force_generic_plan"] {
        let _ = writeln!(script, "BEGIN;\nSET LOCAL plan_cache_mode = {mode};");
        for (i, q) in hot.iter().enumerate() {
            let _ = writeln!(
                script,
                "\\echo '### {mode} {i}'\nEXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) EXECUTE q{i}({});",
                q.args
            );
        }
        script.push_str("ROLLBACK;\n");
    }
    let output = db.sql(&script);
    let mut verdicts = Vec::new();
    let mut generic_plans = String::new();
    let mut all_ok = true;
    for (section, (mode, q)) in output.split("### ").skip(1).zip(
        ["custom", "generic"]
            .iter()
            .flat_map(|m| hot.iter().map(move |q| (*m, q))),
    ) {
        let plan = section.split_once('\n').map_or("", |(_, p)| p).trim_end();
        let missing: Vec<String> = q
            .indexes
            .iter()
            .filter(|group| !group.iter().any(|i| plan.contains(i)))
            .map(|group| group.join(" or "))
            .collect();
        let seq = seq_scans_big_table(plan);
        let ok = missing.is_empty() && !seq;
        all_ok &= ok;
        let verdict = match (missing.is_empty(), seq) {
            (true, false) => {
                "an index over active work (or a unique key), no sequential scan of a big table".to_owned()
            }
            (true, true) => "uses its index but ALSO scans a big table sequentially".to_owned(),
            (false, _) => format!("DOES NOT use {}", missing.join(", ")),
        };
        if !ok || mode == "custom" {
            verdicts.push(format!("{} ({mode} plan): {verdict}", q.name));
        }
        if mode == "generic" {
            let _ = write!(generic_plans, "\n-- {} (generic plan): {verdict}\n{plan}\n", q.name);
        } else if !ok {
            let _ = write!(generic_plans, "\n-- {} (custom plan): {verdict}\n{plan}\n", q.name);
        }
    }
    let notes = format!(
        "EXPLAIN ANALYZE of the scheduler's hot queries on the database with the history, bound as the store binds \
         them, in a rolled-back transaction while the round's 1 000 active runs are flagged; custom plans checked, \
         generic plans (what sqlx's cached prepared statements run in steady state) shown.\n{}\n{generic_plans}",
        verdicts.join("\n")
    );
    (notes, all_ok)
}

/// Which of the engine's hot prepared statements the server re-plans on
/// every execution: each is prepared and executed 12 times (in a
/// rolled-back transaction), then `pg_prepared_statements` says how many
/// generic and custom plans it got, and EXPLAIN how long planning takes.
pub(crate) fn plan_cache_report(db: &BenchDb, run: RunId, pair: WorkflowId) -> String {
    let wf = pair.0;
    let statements: [(&str, &str, &str, String); 16] = [
        (
            "claim",
            queries::CLAIM,
            "interval, bigint, bigint, text, interval",
            "'0', 0, 0, 'w', '600 s'".into(),
        ),
        (
            "task_inputs",
            queries::TASK_INPUTS,
            "uuid, text[]",
            format!("'{run}', ARRAY['t0']"),
        ),
        (
            "finish",
            queries::FINISH,
            "interval, bigint, bigint, text, text, text, jsonb, text, text",
            "'0', 0, 1, 'w', 'succeeded', 'succeed', '{}', NULL, NULL".into(),
        ),
        (
            "notify",
            queries::NOTIFY,
            "text[], text",
            "ARRAY['ff_bench_nobody'], 'x'".into(),
        ),
        (
            "runs_with_work",
            queries::RUNS_WITH_WORK,
            "interval, bigint, uuid[]",
            "'0', 500, NULL".into(),
        ),
        (
            "reap",
            queries::REAP,
            "interval, bigint, uuid[]",
            "'0', 500, NULL".into(),
        ),
        (
            "next_deadline",
            queries::NEXT_DEADLINE,
            "interval, uuid[]",
            "'0', NULL".into(),
        ),
        (
            "begin_pass_taking_flags",
            queries::BEGIN_PASS_TAKING_FLAGS,
            "uuid",
            format!("'{run}'"),
        ),
        ("take_flagged", queries::TAKE_FLAGGED, "uuid", format!("'{run}'")),
        (
            "lower_and_promote",
            queries::LOWER_AND_PROMOTE,
            "interval, uuid, bigint, text[], int4[]",
            format!("'0', '{run}', {wf}, ARRAY['t1'], ARRAY[1]"),
        ),
        (
            "promote_retries",
            queries::PROMOTE_RETRIES,
            "interval, uuid, bigint, boolean",
            format!("'0', '{run}', {wf}, false"),
        ),
        ("activity", queries::ACTIVITY, "uuid, boolean", format!("'{run}', true")),
        (
            "transition_run",
            queries::TRANSITION_RUN,
            "interval, uuid, text, text, text, boolean",
            format!("'0', '{run}', 'pending', 'running', 'start', false"),
        ),
        ("sweep", queries::SWEEP, "bigint, uuid[]", "500, NULL".into()),
        (
            "mark_published",
            queries::MARK_PUBLISHED,
            "interval, bigint[]",
            "'0', ARRAY[0]::bigint[]".into(),
        ),
        (
            "start_run",
            queries::START_RUN,
            "interval, uuid, bigint, jsonb",
            format!("'0', gen_random_uuid(), {wf}, '{{}}'"),
        ),
    ];
    let mut script = String::from("\\o /dev/null\nBEGIN;\n");
    for (name, text, params, _) in &statements {
        let _ = writeln!(script, "PREPARE {name}({params}) AS {text};");
    }
    for _ in 0..12 {
        for (name, _, _, args) in &statements {
            let _ = writeln!(script, "EXECUTE {name}({args});");
        }
    }
    script.push_str("\\o\n");
    for (name, _, _, args) in &statements {
        let _ = writeln!(
            script,
            "\\echo '### {name}'\nEXPLAIN (COSTS OFF, SUMMARY ON) EXECUTE {name}({args});"
        );
    }
    script.push_str(
        "\\echo '### counts'\nSELECT name || ' ' || generic_plans || ' ' || custom_plans FROM pg_prepared_statements;\n\
         ROLLBACK;\n",
    );
    let output = db.sql(&script);
    let mut planning: HashMap<String, String> = HashMap::new();
    let mut counts: HashMap<String, (u64, u64)> = HashMap::new();
    for section in output.split("### ").skip(1) {
        let (name, body) = section.split_once('\n').unwrap_or((section, ""));
        if name.trim() == "counts" {
            for l in body.lines() {
                let f: Vec<&str> = l.split_whitespace().collect();
                if let [n, g, c] = f[..] {
                    counts.insert(n.to_owned(), (g.parse().unwrap_or(0), c.parse().unwrap_or(0)));
                }
            }
        } else if let Some(t) = body.lines().find_map(|l| l.strip_prefix("Planning Time: ")) {
            planning.insert(name.trim().to_owned(), t.to_owned());
        }
    }
    let (mut replanned, mut cached) = (Vec::new(), Vec::new());
    for (name, _, _, _) in &statements {
        let (g, c) = counts.get(*name).copied().unwrap_or((0, 0));
        let plan_time = planning.get(*name).map_or("?", String::as_str);
        if c > 5 {
            replanned.push(format!("{name} ({c} custom / {g} generic; planning {plan_time})"));
        } else {
            cached.push(format!("{name} ({g} generic, planning {plan_time})"));
        }
    }
    format!(
        "Plan cache after 13 executions of each prepared statement (sqlx prepares and caches every statement per \
         connection; the server tries 5 custom plans, then keeps the generic plan unless it looks costlier): \
         re-planned on EVERY execution: {}; generic plan reused: {}.",
        if replanned.is_empty() {
            "none".to_owned()
        } else {
            replanned.join(", ")
        },
        cached.join(", ")
    )
}
