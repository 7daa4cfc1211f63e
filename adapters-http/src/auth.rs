//! Bearer tokens on every `/api/v1` route: 401 for a missing, unknown,
//! expired or revoked token, 403 for one without the route's scope
//! (docs/design/server.md#tokens). The secret is never logged.

use axum::http::{HeaderMap, StatusCode, header};
use flowforge_app::tokens::{ApiScope, Verdict};

use crate::problem::Problem;
use crate::state::ApiState;

/// Whether requests must carry a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Every `/api/v1` route needs a token with its scope.
    Tokens,
    /// No checks (loopback only; the binary refuses it elsewhere).
    Disabled,
}

fn unauthorised(detail: &str) -> Problem {
    Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
}

/// Checks the request's token for `scope`.
pub(crate) async fn require(state: &ApiState, headers: &HeaderMap, scope: ApiScope) -> Result<(), Problem> {
    if state.auth() == AuthMode::Disabled {
        return Ok(());
    }
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(unauthorised(
            "this route needs a token: send Authorization: Bearer <token>",
        ));
    };
    let secret = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| unauthorised("the Authorization header must be `Bearer <token>`"))?;
    let verdict = state.backend().verify(secret).await?;
    match &verdict {
        Verdict::Unknown => Err(unauthorised("the token is not known")),
        Verdict::Expired => Err(unauthorised("the token has expired")),
        Verdict::Revoked => Err(unauthorised("the token was revoked")),
        Verdict::Granted { name, .. } if !verdict.allows(scope) => Err(Problem::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("token '{name}' lacks the scope {scope} this route needs"),
        )
        .with("required_scope", scope.as_str().into())),
        Verdict::Granted { .. } => Ok(()),
    }
}
