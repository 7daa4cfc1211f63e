//! Data flow (docs/design/data-flow.md#inputs): a task's
//! output reaches its dependents' `inputs` under its key, with the run
//! input beside it; an output over the size limit or not serialisable as
//! JSON is a failed attempt with a clear error, and a permanent one.

use std::collections::HashMap;

use flowforge::{HandlerError, RunState, TaskContext};
use flowforge_domain::TaskRunState;
use serde_json::{Map, Value, json};

use super::{Counter, Log, scenario, task_of, transitions};

/// What one handler call saw.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    key: String,
    inputs: Map<String, Value>,
    run_input: Value,
    idempotency_key: String,
    attempt: u32,
}

#[tokio::test]
async fn outputs_reach_the_dependents_inputs_with_the_run_input() {
    let seen: Log<Seen> = Log::default();
    let (a_log, b_log) = (seen.clone(), seen.clone());
    let s = scenario(move |b| {
        b.handler_fn("produce", move |ctx: TaskContext| {
            let log = a_log.clone();
            async move {
                log.push(Seen {
                    key: ctx.task_key.clone(),
                    inputs: ctx.inputs.clone(),
                    run_input: ctx.run_input.clone(),
                    idempotency_key: ctx.idempotency_key.clone(),
                    attempt: ctx.attempt,
                });
                let factor = ctx.run_input["factor"].as_i64().unwrap_or(0);
                Ok::<_, HandlerError>(json!({ "from": ctx.task_key, "value": factor * 10 }))
            }
        })
        // A blocking handler consumes the outputs: same context, off the runtime.
        .blocking_handler("combine", move |ctx: TaskContext| {
            b_log.push(Seen {
                key: ctx.task_key.clone(),
                inputs: ctx.inputs.clone(),
                run_input: ctx.run_input.clone(),
                idempotency_key: ctx.idempotency_key.clone(),
                attempt: ctx.attempt,
            });
            let sum: i64 = ctx.inputs.values().filter_map(|v| v["value"].as_i64()).sum();
            Ok(json!({ "sum": sum }))
        })
    })
    .await;
    let input = json!({"factor": 4, "note": "nightly"});
    let run = s
        .start(
            json!({
                "name": "data", "version": 1,
                "tasks": [
                    {"key": "a", "task_type": "produce"},
                    {"key": "b", "task_type": "produce"},
                    {"key": "unrelated", "task_type": "produce"},
                    {"key": "sum", "task_type": "combine", "depends_on": ["a", "b"]},
                    {"key": "report", "task_type": "echo", "depends_on": ["sum"]}
                ]
            }),
            input.clone(),
        )
        .await;
    s.settle(run).await;
    assert_eq!(s.run_state(run).await, RunState::Succeeded);

    let calls = seen.entries();
    let sum_call = calls.iter().find(|c| c.key == "sum").expect("sum ran");
    let expected: Map<String, Value> = [
        ("a".to_owned(), json!({"from": "a", "value": 40})),
        ("b".to_owned(), json!({"from": "b", "value": 40})),
    ]
    .into_iter()
    .collect();
    assert_eq!(sum_call.inputs, expected, "exactly the dependencies' outputs, by key");
    assert_eq!(sum_call.run_input, input);
    assert_eq!(sum_call.idempotency_key, format!("{run}:sum"));
    assert_eq!(sum_call.attempt, 1);
    for root in calls.iter().filter(|c| c.key != "sum") {
        assert!(
            root.inputs.is_empty(),
            "{} has no dependencies: {:?}",
            root.key,
            root.inputs
        );
        assert_eq!(root.run_input, input);
    }

    // The built-in echo shows the same context downstream.
    let d = s.detail(run).await;
    assert_eq!(task_of(&d, "sum").output, Some(json!({"sum": 80})));
    assert_eq!(
        task_of(&d, "report").output,
        Some(json!({"inputs": {"sum": {"sum": 80}}, "run_input": input}))
    );
    let report = s.report(run).await;
    assert_eq!(report.input, input);
    let out = report.tasks.iter().find(|t| t.key == "report").expect("report task");
    assert_eq!(out.output, task_of(&d, "report").output);
}

#[tokio::test]
async fn an_output_over_the_size_limit_is_a_permanent_failed_attempt() {
    let calls = Counter::default();
    let counter = calls.clone();
    let s = scenario(move |b| {
        b.handler_fn("huge", move |_ctx: TaskContext| {
            counter.hit();
            async move { Ok::<_, HandlerError>(json!({ "blob": "x".repeat(2 * 1024 * 1024) })) }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "huge", "version": 1,
                "tasks": [
                    {"key": "huge", "task_type": "huge", "retry": {"max_attempts": 3}},
                    {"key": "after", "task_type": "echo", "depends_on": ["huge"]}
                ]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    let d = s.detail(run).await;
    let huge = task_of(&d, "huge");
    assert_eq!((huge.state, huge.attempt), (TaskRunState::Failed, 1), "no retry");
    assert_eq!(huge.output, None, "nothing of the output is stored");
    let error = huge.error.as_deref().expect("an error");
    assert!(
        error.starts_with("the task's output is 20971")
            && error.ends_with("bytes of JSON; the limit (max_task_output_bytes) is 1048576 bytes"),
        "{error}"
    );
    assert_eq!(transitions(&d, "huge"), ["claim", "fail"]);
    assert_eq!(calls.get(), 1);
    assert_eq!(task_of(&d, "after").state, TaskRunState::Cancelled);
    assert_eq!(d.summary.state, RunState::Failed);
}

#[tokio::test]
async fn an_output_that_is_not_json_is_a_permanent_failed_attempt() {
    let calls = Counter::default();
    let counter = calls.clone();
    let s = scenario(move |b| {
        b.handler_fn("typed", move |_ctx: TaskContext| {
            counter.hit();
            async move {
                // A map with non-string keys has no JSON form.
                let mut by_bytes: HashMap<Vec<u8>, u32> = HashMap::new();
                by_bytes.insert(vec![0xde, 0xad], 1);
                flowforge::to_output(&by_bytes)
            }
        })
    })
    .await;
    let run = s
        .start(
            json!({
                "name": "typed", "version": 1,
                "tasks": [{"key": "typed", "task_type": "typed", "retry": {"max_attempts": 3}}]
            }),
            json!({}),
        )
        .await;
    s.settle(run).await;
    let d = s.detail(run).await;
    let typed = task_of(&d, "typed");
    assert_eq!((typed.state, typed.attempt), (TaskRunState::Failed, 1), "no retry");
    let error = typed.error.as_deref().expect("an error");
    assert!(error.starts_with("output is not JSON-serialisable: "), "{error}");
    assert_eq!(transitions(&d, "typed"), ["claim", "fail"]);
    assert_eq!(calls.get(), 1);
    assert_eq!(d.summary.state, RunState::Failed);
}
