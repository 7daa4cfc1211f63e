//! A distributed worker of your own: two custom task types (one async,
//! one blocking) served from PostgreSQL and RabbitMQ beside the `flowforge`
//! scheduler and publisher, with the built-ins and `http` tasks. Stops
//! gracefully on Ctrl-C (finishes and acknowledges what it runs).
//!
//! ```text
//! FLOWFORGE_DB=postgres://postgres@127.0.0.1:5432/flowforge \
//! FLOWFORGE_AMQP=amqp://guest:guest@127.0.0.1:5672/%2f \
//!     cargo run --example worker
//! ```

// An example program talks to its user on the terminal.
#![allow(clippy::print_stdout)]

use flowforge::{HTTP_TASK_TYPE, HandlerError, HttpTask, HttpTaskOptions, TaskContext, Worker};
use serde_json::{Value, json};

/// An async handler: makes (here: pretends to make) a thumbnail. It
/// reports progress, stops when asked, and keys its side effect on the
/// idempotency key so a retried attempt does not make a second one.
async fn thumbnail(ctx: TaskContext) -> Result<Value, HandlerError> {
    let image = ctx.run_input["image"]
        .as_str()
        .ok_or_else(|| HandlerError::permanent("run input needs an `image`"))?
        .to_owned();
    for (done, size) in [64, 128, 256].into_iter().enumerate() {
        if ctx.cancel.is_cancelled() {
            return Err(HandlerError::retryable("stopped"));
        }
        ctx.progress(json!({ "sizes_done": done, "of": 3, "next": size }));
    }
    let thumbnails: Vec<String> = [64, 128, 256].iter().map(|s| format!("{image}@{s}")).collect();
    Ok(json!({ "thumbnails": thumbnails, "key": ctx.idempotency_key }))
}

/// A blocking handler: CPU work on a thread of its own, heartbeating while
/// it crunches.
fn checksum(ctx: TaskContext) -> Result<Value, HandlerError> {
    let names = ctx.inputs["thumbnail"]["thumbnails"]
        .as_array()
        .ok_or_else(|| HandlerError::permanent("no thumbnails"))?;
    let mut sum = 0u64;
    for name in names.iter().filter_map(Value::as_str) {
        sum = name.bytes().fold(sum, |acc, b| acc.rotate_left(5) ^ u64::from(b));
        ctx.heartbeat();
    }
    Ok(json!({ "checksum": format!("{sum:016x}") }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = std::env::var("FLOWFORGE_DB")?;
    let broker = std::env::var("FLOWFORGE_AMQP")?;
    let worker = Worker::builder()
        .database(database)
        .broker(broker)
        .queue("flowforge.tasks")
        .concurrency(4)
        .handler_fn("thumbnail", thumbnail)
        .blocking_handler("checksum", checksum)
        .handler(HTTP_TASK_TYPE, HttpTask::new(HttpTaskOptions::default())?)
        .build()
        .await?;
    println!("worker {} serving {}", worker.id(), worker.task_types().join(", "));
    worker
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!("stopped");
    Ok(())
}
