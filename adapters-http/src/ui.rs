//! The web UI (docs/design/ui.md): plain ES modules and a stylesheet
//! compiled into the binary, served as they are — no build step, no CDN,
//! nothing fetched at run time but `/api/v1`. Every page URL answers with
//! the same shell; the modules route in the browser.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::problem::Problem;

/// The shareable page URLs (axum paths): each serves the shell. They are
/// pages, not API routes, so the OpenAPI document leaves them out.
pub const PAGES: [&str; 6] = [
    "/",
    "/runs/{id}",
    "/definitions",
    "/definitions/{name}",
    "/definitions/{name}/versions/{version}",
    "/schedules",
];

/// Where the assets are served.
pub const ASSETS: &str = "/ui/{file}";

/// The assets: name, media type, bytes; the shell first.
const FILES: [(&str, &str, &[u8]); 10] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../ui/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../ui/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/api.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/dom.js"),
    ),
    (
        "runs.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/runs.js"),
    ),
    (
        "run.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/run.js"),
    ),
    (
        "dag.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/dag.js"),
    ),
    (
        "definitions.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/definitions.js"),
    ),
    (
        "schedules.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/schedules.js"),
    ),
];

/// The UI's content security policy: its own scripts and styles only, and
/// no framing (the token lives in the page's session storage).
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// Each file's strong validator, hashed once.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        FILES
            .iter()
            .map(|(_, _, bytes)| {
                let digest = Sha256::digest(bytes);
                let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    })
}

fn serve(index: usize, headers: &HeaderMap) -> Response {
    let (_, media, bytes) = FILES[index];
    let tag = &etags()[index];
    // Revalidated on every load (`no-cache`), so a new binary's UI is
    // never mixed with an old one's modules; a match costs a 304.
    let common = [
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            ETAG,
            HeaderValue::from_str(tag).unwrap_or(HeaderValue::from_static("\"\"")),
        ),
        (
            HeaderName::from_static("x-content-type-options"),
            HeaderValue::from_static("nosniff"),
        ),
        (
            HeaderName::from_static("content-security-policy"),
            HeaderValue::from_static(POLICY),
        ),
    ];
    let matched = headers
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    if matched {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (common, [(CONTENT_TYPE, HeaderValue::from_static(media))], bytes).into_response()
}

/// `FILES[SHELL]` is `index.html`, which every page URL serves.
const SHELL: usize = 0;

async fn shell(headers: HeaderMap) -> Response {
    serve(SHELL, &headers)
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    match FILES.iter().position(|(name, _, _)| *name == file) {
        Some(index) => serve(index, &headers),
        None => Problem::not_found(format!("the UI has no file {file:?}")).into_response(),
    }
}

/// The UI's routes: the pages and the assets, no state needed.
pub fn router<S: Clone + Send + Sync + 'static>() -> axum::Router<S> {
    let mut router = axum::Router::new().route(ASSETS, get(asset));
    for page in PAGES {
        router = router.route(page, get(shell));
    }
    router
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    async fn fetch(path: &str, tag: Option<&str>) -> Response {
        let mut request = Request::get(path);
        if let Some(tag) = tag {
            request = request.header(IF_NONE_MATCH, tag);
        }
        router::<()>()
            .oneshot(request.body(Body::empty()).unwrap_or_default())
            .await
            .unwrap_or_else(|e| match e {})
    }

    #[tokio::test]
    async fn every_page_url_serves_the_shell_and_every_asset_is_served() {
        for page in [
            "/",
            "/runs/0190",
            "/definitions",
            "/definitions/a",
            "/definitions/a/versions/2",
        ] {
            let r = fetch(page, None).await;
            assert_eq!(r.status(), StatusCode::OK, "{page}");
            assert_eq!(r.headers()[CONTENT_TYPE], "text/html; charset=utf-8", "{page}");
            assert!(r.headers().contains_key("content-security-policy"), "{page}");
        }
        for (name, media, _) in FILES {
            let r = fetch(&format!("/ui/{name}"), None).await;
            assert_eq!(r.status(), StatusCode::OK, "{name}");
            assert_eq!(r.headers()[CONTENT_TYPE], media, "{name}");
        }
        assert_eq!(fetch("/ui/nope.js", None).await.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_matching_etag_is_answered_with_304() {
        let first = fetch("/ui/app.js", None).await;
        let tag = first.headers()[ETAG].to_str().unwrap_or_default().to_owned();
        assert_eq!(fetch("/ui/app.js", Some(&tag)).await.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(fetch("/ui/app.js", Some("\"other\"")).await.status(), StatusCode::OK);
    }

    /// The shell loads only files that exist, and every module imports only
    /// files that exist: a renamed module cannot ship a blank page.
    #[test]
    fn every_reference_between_the_files_resolves() {
        let names: Vec<&str> = FILES.iter().map(|(n, _, _)| *n).collect();
        for (name, _, bytes) in FILES {
            let text = String::from_utf8_lossy(bytes);
            for piece in text.split("/ui/").skip(1) {
                let file: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                    .collect();
                assert!(
                    names.contains(&file.as_str()),
                    "{name} refers to /ui/{file}, which is not served"
                );
            }
            for piece in text.split("from \"./").skip(1) {
                let file: String = piece.chars().take_while(|c| *c != '"').collect();
                assert!(
                    names.contains(&file.as_str()),
                    "{name} imports ./{file}, which is not served"
                );
            }
        }
    }
}
