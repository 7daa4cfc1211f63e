//! `--otlp-endpoint`: the spans of a run reach an OTLP/HTTP collector (a
//! stub here), in the trace whose id is the run's id
//! (docs/design/server.md#traces).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::flowforge;

/// What the stub received: each request's first line and body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Accepts OTLP/HTTP exports and keeps their bodies.
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stub collector");
    let addr = listener.local_addr().expect("an address");
    let received = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone the socket"));
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_ok() {
                store.lock().expect("lock").push((request_line.trim().to_owned(), body));
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    (format!("http://{addr}"), received)
}

#[test]
fn a_runs_spans_reach_the_collector_in_the_runs_trace() {
    let (endpoint, received) = collector();
    let dir = tempfile::tempdir().expect("a temp folder");
    let db = format!("sqlite://{}", dir.path().join("ff.db").display());
    let output = flowforge([
        "--db",
        &db,
        "--otlp-endpoint",
        &endpoint,
        "run",
        "examples/diamond.json",
        "--output",
        "json",
    ])
    .env_remove("RUST_LOG")
    .output()
    .expect("flowforge runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    let run: uuid::Uuid = report["run_id"].as_str().expect("run_id").parse().expect("a UUID");

    // The exporter flushed before the process exited.
    let received = received.lock().expect("lock");
    assert!(!received.is_empty(), "nothing reached the collector");
    assert!(
        received.iter().all(|(line, _)| line.starts_with("POST /v1/traces ")),
        "{:?}",
        received.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    let everything: Vec<u8> = received.iter().flat_map(|(_, body)| body.clone()).collect();
    let contains = |needle: &[u8]| everything.windows(needle.len()).any(|w| w == needle);
    assert!(contains(b"flowforge.task.execute"), "no task span exported");
    // The trace id is the run id's 16 bytes.
    assert!(contains(run.as_bytes()), "no span in the run's trace {run}");
}
