//! Embedding FlowForge: a program registers its own async and blocking
//! handlers and an observer, runs a workflow in-process, and reads the
//! report. Run it with `cargo run --example embed`.

// An example program talks to its user on the terminal.
#![allow(clippy::print_stdout)]

use std::sync::Arc;

use flowforge::{Embedded, HandlerError, Observer, RunEvent, TaskContext, TaskEvent, parse_definition};
use serde_json::{Value, json};

/// Prints the lifecycle of every task as it happens.
struct Printer;

impl Observer for Printer {
    fn on_task_start(&self, e: &TaskEvent) {
        println!("  start  {} (attempt {})", e.task_key, e.attempt);
    }
    fn on_task_succeeded(&self, e: &TaskEvent) {
        println!(
            "  done   {} -> {}",
            e.task_key,
            e.output.as_ref().unwrap_or(&Value::Null)
        );
    }
    fn on_workflow_done(&self, e: &RunEvent) {
        println!("  run {} {}", e.run_id, e.state);
    }
}

/// An async handler: fetches (here: makes up) the prices of the cart.
async fn price(ctx: TaskContext) -> Result<Value, HandlerError> {
    let items = ctx.run_input["items"]
        .as_array()
        .ok_or_else(|| HandlerError::permanent("run input needs an `items` array"))?;
    let prices: Vec<u64> = items
        .iter()
        .map(|i| 100 * i.as_str().map_or(1, |s| s.len() as u64))
        .collect();
    Ok(json!({ "prices": prices }))
}

/// A blocking handler: CPU work runs off the async runtime.
fn total(ctx: TaskContext) -> Result<Value, HandlerError> {
    let prices = ctx.inputs["price"]["prices"]
        .as_array()
        .ok_or_else(|| HandlerError::permanent("missing prices"))?;
    let cents: u64 = prices.iter().filter_map(Value::as_u64).sum();
    Ok(json!({ "total_cents": cents }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Embedded::builder()
        .database("sqlite::memory:")
        .handler_fn("price", price)
        .blocking_handler("total", total)
        .observer(Arc::new(Printer))
        .build()
        .await?;
    let def = parse_definition(
        br#"{
            "name": "checkout", "version": 1,
            "tasks": [
                {"key": "price", "task_type": "price"},
                {"key": "total", "task_type": "total", "depends_on": ["price"]},
                {"key": "receipt", "task_type": "echo", "depends_on": ["total"]}
            ]
        }"#,
    )?;
    println!("running checkout:");
    let report = engine.run(&def, json!({ "items": ["tea", "biscuits"] })).await?;
    println!("state: {}", report.state);
    println!("receipt: {}", serde_json::to_string(&report.tasks[2].output)?);
    Ok(())
}
