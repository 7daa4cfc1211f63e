//! The token matrix: 401 for missing, unknown, expired and revoked tokens,
//! 403 for a missing scope; `--no-auth` only on loopback.

use std::time::Duration;

use serde_json::json;

use super::{Api, On, definition, json_of, on_both};

on_both!(tokens_and_scopes, &[], |api| {
    let routes = [
        ("GET", "/api/v1/definitions", "definitions:read"),
        ("POST", "/api/v1/definitions", "definitions:write"),
        ("GET", "/api/v1/runs", "runs:read"),
        ("POST", "/api/v1/runs", "runs:write"),
        ("GET", "/api/v1/workers", "workers:read"),
        ("POST", "/api/v1/worker/claims", "worker"),
        ("POST", "/api/v1/worker/heartbeats", "worker"),
        ("POST", "/api/v1/worker/results", "worker"),
        ("GET", "/metrics", "admin"),
    ];
    let reader = api.token("reader", &["runs:read"]);
    let request = |method: &str, path: &str, token: Option<&str>| {
        let builder = if method == "GET" {
            api.http.get(api.url(path))
        } else {
            api.http.post(api.url(path)).json(&json!({}))
        };
        match token {
            Some(t) => builder.bearer_auth(t),
            None => builder,
        }
        .send()
    };
    for (i, (method, path, scope)) in routes.into_iter().enumerate() {
        let none = request(method, path, None).await.expect("answers");
        assert_eq!(none.status().as_u16(), 401, "{method} {path} without a token");
        assert!(none.headers().get("www-authenticate").is_some());
        let unknown = request(method, path, Some("ff_nope")).await.expect("answers");
        assert_eq!(unknown.status().as_u16(), 401, "{method} {path} unknown token");
        let scoped = api.token(&format!("only-{}-{i}", scope.replace(':', "-")), &[scope]);
        let allowed = request(method, path, Some(&scoped)).await.expect("answers");
        assert!(
            ![401, 403].contains(&allowed.status().as_u16()),
            "{method} {path} with {scope}: {}",
            allowed.status()
        );
        if scope != "runs:read" {
            let denied = request(method, path, Some(&reader)).await.expect("answers");
            let problem = json_of(denied, 403).await;
            assert_eq!(problem["required_scope"], scope);
        }
    }

    // Revoked, then expired: 401.
    let out = api.cli(["tokens", "revoke", "reader"]);
    assert_eq!(out.code, 0, "{out:?}");
    let revoked = request("GET", "/api/v1/runs", Some(&reader)).await.expect("answers");
    assert_eq!(json_of(revoked, 401).await["detail"], "the token was revoked");
    let out = api.cli(["tokens", "revoke", "reader"]);
    assert_eq!(out.code, 2, "{out:?}");
    let out = api.cli([
        "tokens",
        "create",
        "--name",
        "brief",
        "--scope",
        "runs:read",
        "--expires-in",
        "1s",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let brief = out.stdout.trim().to_owned();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let expired = request("GET", "/api/v1/runs", Some(&brief)).await.expect("answers");
    assert_eq!(json_of(expired, 401).await["detail"], "the token has expired");
    let list = api.cli(["tokens", "list"]);
    assert!(
        list.stdout.contains("revoked") && list.stdout.contains("expired"),
        "{list:?}"
    );
    assert!(!list.stdout.contains(&brief), "a secret in the list");
    let dup = api.cli(["tokens", "create", "--name", "brief", "--scope", "runs:read"]);
    assert_eq!(dup.code, 2, "{dup:?}");
    let bad = api.cli(["tokens", "create", "--name", "x", "--scope", "runs:delete"]);
    assert_eq!(bad.code, 2, "{bad:?}");

    // The secret never reaches the log.
    api.publish(&definition("t", 1, &[("a", "noop", &[], json!({}))])).await;
    assert!(!api.logs().contains(&api.admin));
});

#[tokio::test]
async fn no_auth_is_for_loopback_only() {
    let Some(api) = Api::start(On::Sqlite, "noauth", &["--no-auth"]).await else {
        unreachable!("SQLite needs no service")
    };
    let open = api.http.get(api.url("/api/v1/runs")).send().await.expect("answers");
    assert_eq!(open.status().as_u16(), 200);
    let out = api.cli(["server", "--no-auth", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("loopback"), "{out:?}");
}
