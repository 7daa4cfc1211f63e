//! The `http` task type against a local axum server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap as ServerHeaders, Method as ServerMethod, StatusCode as ServerStatus};
use axum::response::IntoResponse;
use axum::routing::any;
use flowforge_ports::{FailureKind, RunId};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;

const SECRET_VAR: &str = "FLOWFORGE_TEST_SECRET_HTTP_TASK_7F3A";
const SECRET: &str = "tok-5e1c0a9d77b2";

fn test_env(name: &str) -> Option<String> {
    (name == SECRET_VAR).then(|| SECRET.to_owned())
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: ServerHeaders,
    body: Bytes,
}

#[derive(Debug, Default)]
struct Server {
    seen: Mutex<Vec<Seen>>,
    flaky_calls: AtomicUsize,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn respond(
    State(server): State<Arc<Server>>,
    method: ServerMethod,
    uri: axum::http::Uri,
    headers: ServerHeaders,
    body: Bytes,
) -> axum::response::Response {
    let path = uri.path().to_owned();
    server.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        path: path.clone(),
        headers: headers.clone(),
        body: body.clone(),
    });
    match path.as_str() {
        "/echo" => axum::Json(json!({"received": serde_json::from_slice::<Value>(&body).ok()})).into_response(),
        "/flaky" => {
            if server.flaky_calls.fetch_add(1, Ordering::SeqCst) == 0 {
                (ServerStatus::SERVICE_UNAVAILABLE, [("retry-after", "7")], "try later").into_response()
            } else {
                axum::Json(json!({"ok": true})).into_response()
            }
        }
        "/bad" => (
            ServerStatus::BAD_REQUEST,
            format!("field x is wrong{}", "!".repeat(500)),
        )
            .into_response(),
        "/busy" => (ServerStatus::TOO_MANY_REQUESTS, "slow down").into_response(),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            "late".into_response()
        }
        // A server that quotes the credentials it was given.
        "/leak" => {
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            (ServerStatus::INTERNAL_SERVER_ERROR, format!("denied for {auth}")).into_response()
        }
        "/text" => "plain words".into_response(),
        "/empty" => ServerStatus::NO_CONTENT.into_response(),
        "/big" => "x".repeat(10_000).into_response(),
        "/redirect" => (ServerStatus::FOUND, [("location", "/echo")]).into_response(),
        _ => ServerStatus::NOT_FOUND.into_response(),
    }
}

/// A server on 127.0.0.1 and its base URL.
async fn server() -> (Arc<Server>, String) {
    let state = Arc::new(Server::default());
    let router = Router::new().fallback(any(respond)).with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (state, format!("http://{addr}"))
}

fn task() -> HttpTask {
    HttpTask::new(HttpTaskOptions::default()).unwrap().with_env(test_env)
}

fn ctx(config: Value) -> TaskContext {
    TaskContext {
        run_id: RunId(Default::default()),
        task_key: "call".into(),
        task_type: HTTP_TASK_TYPE.into(),
        attempt: 1,
        token: 1,
        idempotency_key: "run-1:call".into(),
        run_input: json!({"who": "run"}),
        inputs: Map::new(),
        config: config.as_object().cloned().unwrap(),
        item: None,
        cancel: CancellationToken::new(),
        pulse: Default::default(),
    }
}

#[tokio::test]
async fn a_post_sends_the_inputs_and_the_idempotency_key_and_outputs_the_json() {
    let (server, base) = server().await;
    let mut c = ctx(
        json!({"method": "post", "url": format!("{base}/echo"), "body_from": "inputs",
        "headers": {"X-A": "literal"}}),
    );
    c.inputs.insert("up".into(), json!({"n": 41}));
    let out = task().run(c).await.unwrap();
    assert_eq!(out, json!({"received": {"up": {"n": 41}}}));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.method, "POST");
    assert_eq!(
        serde_json::from_slice::<Value>(&req.body).unwrap(),
        json!({"up": {"n": 41}})
    );
    assert_eq!(req.headers["idempotency-key"], "run-1:call");
    assert_eq!(req.headers["content-type"], "application/json");
    assert_eq!(req.headers["x-a"], "literal");
    assert_eq!(
        req.headers["user-agent"],
        concat!("flowforge/", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn run_input_bodies_get_and_non_json_outputs() {
    let (server, base) = server().await;
    let out = task()
        .run(ctx(
            json!({"method": "PUT", "url": format!("{base}/echo"), "body_from": "run_input"}),
        ))
        .await
        .unwrap();
    assert_eq!(out, json!({"received": {"who": "run"}}));
    let get = ctx(json!({"url": format!("{base}/echo")}));
    assert_eq!(task().run(get).await.unwrap(), json!({"received": null}));
    let seen = server.seen();
    assert_eq!(seen[1].method, "GET");
    assert!(seen[1].body.is_empty() && !seen[1].headers.contains_key("content-type"));
    let text = task().run(ctx(json!({"url": format!("{base}/text")}))).await.unwrap();
    assert_eq!(text, json!("plain words"));
    let empty = task().run(ctx(json!({"url": format!("{base}/empty")}))).await.unwrap();
    assert_eq!(empty, Value::Null);
}

#[tokio::test]
async fn a_503_with_retry_after_is_retryable_after_it_then_the_retry_succeeds() {
    let (server, base) = server().await;
    let t = task();
    let config = json!({"method": "POST", "url": format!("{base}/flaky")});
    let err = t.run(ctx(config.clone())).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::Retryable);
    assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
    assert!(
        err.message.contains("503 Service Unavailable: try later"),
        "{}",
        err.message
    );
    let mut again = ctx(config);
    again.attempt = 2;
    assert_eq!(t.run(again).await.unwrap(), json!({"ok": true}));
    // The same key on every attempt: the server can tell a retry.
    let keys: Vec<_> = server
        .seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].clone())
        .collect();
    assert_eq!(keys, ["run-1:call", "run-1:call"]);
}

#[tokio::test]
async fn a_400_is_permanent_with_an_excerpt_and_a_429_is_retryable() {
    let (_server, base) = server().await;
    let err = task()
        .run(ctx(json!({"url": format!("{base}/bad")})))
        .await
        .unwrap_err();
    assert!(err.is_permanent());
    let excerpt = err.message.split_once("400 Bad Request: ").unwrap().1;
    assert!(excerpt.starts_with("field x is wrong!!"), "{}", err.message);
    assert_eq!(excerpt.chars().count(), EXCERPT_CHARS + 1, "{excerpt}");
    assert!(excerpt.ends_with('…'));

    let busy = task()
        .run(ctx(json!({"url": format!("{base}/busy")})))
        .await
        .unwrap_err();
    assert_eq!(busy.kind, FailureKind::Retryable);
    assert_eq!(busy.retry_after, None);
    assert!(
        busy.message.contains("429 Too Many Requests: slow down"),
        "{}",
        busy.message
    );
}

#[tokio::test]
async fn redirects_are_not_followed_and_unlisted_codes_fail() {
    let (server, base) = server().await;
    let err = task()
        .run(ctx(json!({"url": format!("{base}/redirect")})))
        .await
        .unwrap_err();
    assert!(
        err.is_permanent() && err.message.contains("302 Found"),
        "{}",
        err.message
    );
    let paths: Vec<_> = server.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/redirect"], "the redirect was followed");
    let listed = ctx(json!({"url": format!("{base}/text"), "success_codes": [201]}));
    assert!(task().run(listed).await.unwrap_err().is_permanent());
}

#[tokio::test]
async fn a_body_over_the_output_limit_is_a_permanent_failure() {
    let (_server, base) = server().await;
    let small = HttpTask::new(HttpTaskOptions {
        output_limit: 1000,
        ..HttpTaskOptions::default()
    })
    .unwrap();
    let err = small.run(ctx(json!({"url": format!("{base}/big")}))).await.unwrap_err();
    assert!(err.is_permanent());
    assert!(
        err.message.contains("larger than the task output limit of 1000 bytes"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_slow_server_times_out_retryably() {
    let (_server, base) = server().await;
    let err = task()
        .run(ctx(json!({"url": format!("{base}/slow"), "timeout_seconds": 0.2})))
        .await
        .unwrap_err();
    assert_eq!(err.kind, FailureKind::Retryable);
    assert!(err.message.contains("timed out"), "{}", err.message);
}

#[tokio::test]
async fn cancellation_stops_the_attempt() {
    let (server, base) = server().await;
    let c = ctx(json!({"url": format!("{base}/slow")}));
    let cancel = c.cancel.clone();
    let attempt = tokio::spawn(async move { task().run(c).await });
    // Cancel once the request is in flight, so it is the wait that stops.
    while server.seen().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    let err = tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .expect("the attempt ignored its cancellation")
        .unwrap()
        .unwrap_err();
    assert_eq!(err, HandlerError::retryable("http: cancelled"));
}

#[tokio::test]
async fn refused_addresses_are_permanent_and_never_contacted() {
    for url in [
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:169.254.169.254]/latest/meta-data",
        "http://[fe80::1]:8080/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://2852039166/",
    ] {
        let err = task().run(ctx(json!({"url": url}))).await.unwrap_err();
        assert!(err.is_permanent(), "{url}: {}", err.message);
        assert!(err.message.starts_with("http: refused "), "{url}: {}", err.message);
    }

    let (server, base) = server().await;
    let listed = HttpTask::new(HttpTaskOptions {
        allow_hosts: Some(vec!["api.example.com".into()]),
        ..HttpTaskOptions::default()
    })
    .unwrap();
    let err = listed
        .run(ctx(json!({"url": format!("{base}/echo")})))
        .await
        .unwrap_err();
    assert!(err.is_permanent());
    assert!(
        err.message.contains("is not one of the allowed hosts"),
        "{}",
        err.message
    );
    assert!(server.seen().is_empty());

    // Named hosts go through the guarded resolver.
    let port = base.rsplit(':').next().unwrap();
    let by_name = HttpTask::new(HttpTaskOptions {
        allow_hosts: Some(vec!["LOCALHOST".into()]),
        ..HttpTaskOptions::default()
    })
    .unwrap();
    let out = by_name
        .run(ctx(json!({"url": format!("http://localhost:{port}/text")})))
        .await
        .unwrap();
    assert_eq!(out, json!("plain words"));
}

#[test]
fn a_link_local_host_named_in_allow_hosts_passes_the_check() {
    let allow = AllowList::new(Some(&["169.254.169.254".to_owned()])).unwrap();
    assert_eq!(allow.check_host("169.254.169.254"), Ok(()));
    assert!(AllowList::default().check_host("169.254.169.254").is_err());
}

/// A resolver that refuses every name, as the guarded one does a name
/// whose addresses are all refused.
struct RefuseAll;

impl reqwest::dns::Resolve for RefuseAll {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let refused = Refused::MetadataName {
            host: name.as_str().to_owned(),
        };
        Box::pin(async move { Err(refused.into()) })
    }
}

#[tokio::test]
async fn a_refusal_at_resolution_is_found_in_the_error_chain() {
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config().unwrap())
        .dns_resolver(Arc::new(RefuseAll))
        .no_proxy()
        .build()
        .unwrap();
    let e = client.get("http://somewhere.example/").send().await.unwrap_err();
    assert_eq!(
        refusal(&e),
        Some(&Refused::MetadataName {
            host: "somewhere.example".into()
        })
    );
    let spec = Spec::from_config(&ctx(json!({"url": "http://somewhere.example/"})).config).unwrap();
    let err = spec.transport_error(e);
    assert!(
        err.is_permanent() && err.message.starts_with("http: refused GET"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn connection_failures_and_tls_errors_are_retryable() {
    // A port nothing listens on: bound, then closed.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = task()
        .run(ctx(json!({"url": format!("http://{addr}/")})))
        .await
        .unwrap_err();
    assert_eq!(err.kind, FailureKind::Retryable, "{}", err.message);
    // https to a plain-HTTP server: the TLS handshake runs (rustls with
    // ring, no global provider needed) and fails.
    let (_server, base) = server().await;
    let https = base.replace("http://", "https://");
    let err = task()
        .run(ctx(json!({"url": format!("{https}/echo")})))
        .await
        .unwrap_err();
    assert_eq!(err.kind, FailureKind::Retryable, "{}", err.message);
    assert!(err.message.contains("failed: "), "{}", err.message);
}

#[tokio::test]
async fn a_secret_header_is_sent_and_never_reported() {
    let (server, base) = server().await;
    let config =
        |path: &str| json!({"url": format!("{base}{path}"), "headers": {"Authorization": {"env": SECRET_VAR}}});
    task().run(ctx(config("/echo"))).await.unwrap();
    assert_eq!(server.seen()[0].headers["authorization"], SECRET);

    // The server quotes the secret back in its error body.
    let err = task().run(ctx(config("/leak"))).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::Retryable);
    assert!(!err.message.contains(SECRET), "{}", err.message);
    assert!(err.message.contains("denied for [redacted]"), "{}", err.message);
    assert!(!format!("{err:?}").contains(SECRET));

    let missing = json!({"url": format!("{base}/echo"),
        "headers": {"Authorization": {"env": "FLOWFORGE_TEST_SECRET_HTTP_TASK_UNSET"}}});
    let err = task().run(ctx(missing)).await.unwrap_err();
    assert!(err.is_permanent());
    assert_eq!(
        err.message,
        "http: config.headers.Authorization: the environment variable FLOWFORGE_TEST_SECRET_HTTP_TASK_UNSET is not set on this worker"
    );
    assert_eq!(server.seen().len(), 2, "nothing is sent without the secret");
}

#[test]
fn secrets_are_redacted_whole_even_at_the_excerpts_end() {
    let secrets = vec![SECRET.to_owned()];
    let body = format!("{}{SECRET} tail", "a".repeat(EXCERPT_CHARS - 3));
    let text = excerpt(body.as_bytes(), &secrets);
    assert_eq!(text, format!("{}[re…", "a".repeat(EXCERPT_CHARS - 3)));
    // Multi-byte characters are never cut.
    assert_eq!(
        excerpt("é".repeat(300).as_bytes(), &[]).chars().count(),
        EXCERPT_CHARS + 1
    );
}

#[test]
fn retry_after_takes_seconds_or_a_date() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
    let header = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
        h
    };
    assert_eq!(retry_after(&header("7"), now), Some(Duration::from_secs(7)));
    assert_eq!(retry_after(&header(" 120 "), now), Some(Duration::from_secs(120)));
    // 2015-10-21T07:28:00Z is `now`; the header says 90 s later.
    assert_eq!(
        retry_after(&header("Wed, 21 Oct 2015 07:29:30 GMT"), now),
        Some(Duration::from_secs(90))
    );
    assert_eq!(
        retry_after(&header("Wed, 21 Oct 2015 07:00:00 GMT"), now),
        Some(Duration::ZERO)
    );
    assert_eq!(retry_after(&header("99999999999"), now), Some(MAX_RETRY_AFTER));
    assert_eq!(retry_after(&header("soon"), now), None);
    assert_eq!(retry_after(&HeaderMap::new(), now), None);
}

#[test]
fn bad_config_fields_are_permanent_and_named() {
    for (config, expected) in [
        (json!({}), "http: config.url: required"),
        (json!({"url": 3}), "http: config.url: expected a string"),
        (json!({"url": "not a url"}), "http: config.url: not a URL"),
        (
            json!({"url": "ftp://example.com/"}),
            "http: config.url: the scheme must be http or https",
        ),
        (
            json!({"url": "https://u:p@example.com/"}),
            "http: config.url: must not carry credentials",
        ),
        (
            json!({"url": "https://example.com/", "method": "BREW"}),
            "http: config.method: \"BREW\" is not one of",
        ),
        (
            json!({"url": "https://example.com/", "method": 1}),
            "http: config.method: expected a string",
        ),
        (
            json!({"url": "https://example.com/", "headers": {"Authorization": {"vault": "X"}}}),
            "http: config.headers.Authorization: expected a string or {\"env\": NAME}",
        ),
        (
            json!({"url": "https://example.com/", "headers": {"X-A": 1}}),
            "http: config.headers.X-A: expected a string or {\"env\": NAME}",
        ),
        (
            json!({"url": "https://example.com/", "headers": {"Bad Name": "x"}}),
            "http: config.headers.Bad Name: not a valid header name",
        ),
        (
            json!({"url": "https://example.com/", "headers": {"Idempotency-Key": "x"}}),
            "http: config.headers.Idempotency-Key: set by the http task type itself",
        ),
        (
            json!({"url": "https://example.com/", "headers": []}),
            "http: config.headers: expected an object",
        ),
        (
            json!({"url": "https://example.com/", "body_from": "stdin"}),
            "http: config.body_from: expected",
        ),
        (
            json!({"url": "https://example.com/", "timeout_seconds": 0}),
            "http: config.timeout_seconds: expected a positive",
        ),
        (
            json!({"url": "https://example.com/", "timeout_seconds": "5"}),
            "http: config.timeout_seconds: expected a positive",
        ),
        (
            json!({"url": "https://example.com/", "timeout_seconds": 1e300}),
            "http: config.timeout_seconds: expected a positive",
        ),
        (
            json!({"url": "https://example.com/", "success_codes": []}),
            "http: config.success_codes: expected a non-empty",
        ),
        (
            json!({"url": "https://example.com/", "success_codes": [200, 600]}),
            "http: config.success_codes[1]: expected a status code",
        ),
        (
            json!({"url": "https://example.com/", "header": {}}),
            "http: config.header: unknown field",
        ),
    ] {
        let err = Spec::from_config(config.as_object().unwrap()).unwrap_err();
        assert!(err.is_permanent(), "{config}");
        assert!(err.message.starts_with(expected), "{config}: {}", err.message);
    }
}

#[tokio::test]
async fn a_literal_header_value_that_is_invalid_is_permanent_and_not_quoted() {
    let config = json!({"url": "https://example.com/", "headers": {"X-Token": "abc\ndef"}});
    let err = task().run(ctx(config)).await.unwrap_err();
    assert_eq!(
        err,
        HandlerError::permanent("http: config.headers.X-Token: not a valid header value")
    );
}

#[test]
fn other_reqwest_clients_can_be_built_once_the_provider_is_installed() {
    // Without a default provider this panics inside reqwest (the feature
    // this crate enables applies to every reqwest client in the binary).
    install_default_tls_provider();
    install_default_tls_provider();
    assert!(reqwest::Client::builder().build().is_ok());
}

#[test]
fn a_bad_allow_hosts_entry_fails_construction() {
    let err = HttpTask::new(HttpTaskOptions {
        allow_hosts: Some(vec!["https://example.com".into()]),
        ..HttpTaskOptions::default()
    })
    .unwrap_err();
    assert!(matches!(err, HttpTaskError::AllowedHost(_)), "{err}");
}
