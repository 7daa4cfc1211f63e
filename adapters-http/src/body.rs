//! Reading request bodies: the content type must be JSON (415 otherwise)
//! and malformed JSON is a 400 that says where; nesting deeper than 128
//! levels is refused by the parser, also as a 400.

use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// Whether the request says its body is JSON (`application/json` or a
/// `+json` type, any parameters).
pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), Problem> {
    let ok = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .is_some_and(|m| m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")));
    if ok {
        Ok(())
    } else {
        Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON: send Content-Type: application/json",
        ))
    }
}

/// A JSON parse failure as a 400 naming line and column.
pub(crate) fn malformed(e: &serde_json::Error) -> Problem {
    let detail = if e.to_string().starts_with("recursion limit exceeded") {
        format!(
            "the JSON is nested deeper than 128 levels (line {}, column {})",
            e.line(),
            e.column()
        )
    } else {
        format!("malformed JSON: {e}")
    };
    Problem::new(StatusCode::BAD_REQUEST, "malformed_json", detail)
        .with("line", e.line().into())
        .with("column", e.column().into())
}

/// The body as `T`: JSON required, errors located.
pub(crate) fn json<T: DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> Result<T, Problem> {
    require_json(headers)?;
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", format!("{e}"))
        } else {
            malformed(&e)
        }
    })
}
