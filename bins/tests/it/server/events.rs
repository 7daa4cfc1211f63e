//! A run's event stream: resuming with Last-Event-ID after a dropped
//! connection sees every event exactly once; the long poll; SIGTERM ends
//! an open stream with a final event and exits 0.

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::{Api, definition, on_both};

/// One parsed server-sent event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    id: Option<u64>,
    data: String,
}

/// Reads events from `response` until `stop` says so or the stream ends.
async fn read(response: reqwest::Response, mut stop: impl FnMut(&Sse) -> bool) -> Vec<Sse> {
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut out = Vec::new();
    while let Some(chunk) = tokio::time::timeout(super::PATIENCE, stream.next())
        .await
        .expect("the stream goes quiet for too long")
    {
        let Ok(chunk) = chunk else { break };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut e = Sse {
                event: "message".to_owned(),
                id: None,
                data: String::new(),
            };
            let mut any = false;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    e.event = v.trim().to_owned();
                    any = true;
                } else if let Some(v) = line.strip_prefix("id:") {
                    e.id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    e.data.push_str(v.trim_start());
                    any = true;
                }
            }
            if !any {
                continue; // a keep-alive comment
            }
            let done = stop(&e);
            out.push(e);
            if done {
                return out;
            }
        }
    }
    out
}

fn chain(name: &str) -> Value {
    definition(
        name,
        1,
        &[
            ("a", "sleep", &[], json!({"seconds": 0.3})),
            ("b", "sleep", &["a"], json!({"seconds": 0.3})),
            ("c", "noop", &["b"], json!({})),
        ],
    )
}

on_both!(a_dropped_stream_resumes_with_no_gap_and_no_repeat, &[], |api| {
    api.publish(&chain("chain")).await;
    let id = api.start_run("chain", json!({})).await;
    let path = format!("/api/v1/runs/{id}/events");

    // Read three events, then drop the connection.
    let response = api.get(&path).send().await.expect("answers");
    assert_eq!(
        response.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"text/event-stream"[..])
    );
    let mut count = 0;
    let first = read(response, |_| {
        count += 1;
        count == 3
    })
    .await;
    assert_eq!(first.len(), 3);
    let last = first.last().and_then(|e| e.id).expect("an id");

    let resumed = api
        .get(&path)
        .header("last-event-id", last.to_string())
        .send()
        .await
        .expect("answers");
    let rest = read(resumed, |e| e.event == "end").await;
    assert_eq!(rest.last().map(|e| e.event.as_str()), Some("end"), "{rest:?}");

    let seqs: Vec<u64> = first.iter().chain(&rest).filter_map(|e| e.id).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every event exactly once, in order");
    let report = api.wait_run(&id).await;
    assert_eq!(report["events"].as_array().map(Vec::len), Some(seqs.len()));
    let terminal: Value = serde_json::from_str(&rest[rest.len() - 2].data).expect("JSON");
    assert_eq!(terminal["task"], Value::Null);
    assert_eq!(terminal["to"], "succeeded");

    // After the end: a new reader gets everything, then `end`.
    let again = read(api.get(&path).send().await.expect("answers"), |e| e.event == "end").await;
    assert_eq!(again.len(), seqs.len() + 1);

    // The long poll.
    let polled: Value = api
        .get(&format!("{path}?after=2&wait=5"))
        .header("accept", "application/json")
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(polled["events"][0]["seq"], 3);
    assert_eq!(polled["finished"], true);
    assert_eq!(polled["last_seq"], seqs.len() as u64);
});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_streams_and_exits_zero() {
    let Some(mut api) = Api::start(super::On::Sqlite, "sigterm", &[]).await else {
        unreachable!("SQLite needs no service")
    };
    // A task still running at SIGTERM: the engine drains it (2 s).
    api.publish(&definition("long", 1, &[("nap", "sleep", &[], json!({"seconds": 2}))]))
        .await;
    let id = api.start_run("long", json!({})).await;
    let response = api
        .get(&format!("/api/v1/runs/{id}/events"))
        .send()
        .await
        .expect("answers");
    let (open, mut opened) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(read(response, move |e| {
        let _ = open.send(());
        e.event == "shutdown"
    }));
    // The stream is open once it has carried an event.
    opened.recv().await.expect("a first event");
    api.sigterm();
    let events = reader.await.expect("join");
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("shutdown"), "{events:?}");
    assert_eq!(api.wait_exit().await, 0, "{}", api.logs());
}
