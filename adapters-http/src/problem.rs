//! Errors as RFC 9457 problem documents (`application/problem+json`),
//! each with a stable `code` clients branch on, and the mapping from the
//! app's errors to them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flowforge_app::Error;
use flowforge_domain::retry::RetryRefusal;
use flowforge_ports::PublishError;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// A problem, as handlers return it (small: `Result<_, Problem>` is on
/// every path); rendered as a [`ProblemBody`].
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    code: &'static str,
    detail: String,
    extra: Box<serde_json::Map<String, Value>>,
}

/// A problem document as sent.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProblemBody {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened, for a person.
    pub detail: String,
    /// The stable, machine-readable code.
    pub code: String,
    /// More about this occurrence (errors with paths, fingerprints, …).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extra: serde_json::Map<String, Value>,
}

impl Problem {
    /// A problem with `status`, `code` and a detail.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
            extra: Box::default(),
        }
    }

    /// Adds a member.
    #[must_use]
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }

    /// 404 `not_found`.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// 400 `bad_request`.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// 500 `internal`: what a caller sees of a failure that is ours.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", detail)
    }

    /// The document.
    pub fn body(&self) -> ProblemBody {
        ProblemBody {
            kind: format!("https://flowforge.dev/problems/{}", self.code),
            title: self.status.canonical_reason().unwrap_or("Error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.to_owned(),
            extra: (*self.extra).clone(),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status;
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"flowforge\""),
            );
        }
        response
    }
}

impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        match &e {
            Error::Publish(PublishError::Conflict { existing, new, .. }) => {
                Self::new(StatusCode::CONFLICT, "definition_conflict", e.to_string())
                    .with("existing_fingerprint", Value::from(existing.as_str()))
                    .with("new_fingerprint", Value::from(new.as_str()))
            }
            Error::Publish(PublishError::LostRace { .. }) => {
                Self::new(StatusCode::CONFLICT, "publish_race", e.to_string())
            }
            Error::UnknownTaskTypes { types, .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_task_type", e.to_string())
                    .with("types", Value::from(types.clone()))
            }
            Error::Refused(_) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "refused_value", e.to_string()),
            Error::RunNotFound(_) | Error::WorkflowNotFound { .. } => Self::not_found(e.to_string()),
            Error::Load(flowforge_ports::LoadError::NotFound(_)) => Self::not_found(e.to_string()),
            Error::RunNotRetryable { state, .. } => Self::new(StatusCode::CONFLICT, "run_not_retryable", e.to_string())
                .with("state", state.to_string().into()),
            Error::RetryRefused {
                refusal: RetryRefusal::Compensated,
                ..
            } => Self::new(StatusCode::CONFLICT, "run_compensated", e.to_string()),
            Error::RetryRefused { .. } => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "retry_refused", e.to_string()),
            Error::RetryLost(_) => Self::new(StatusCode::CONFLICT, "retry_conflict", e.to_string()),
            Error::ConcurrencyKeyUnresolved(_) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "concurrency_key_unresolved",
                e.to_string(),
            ),
            Error::InvalidSchedule(_) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_schedule", e.to_string()),
            Error::ScheduleNameTaken(_) => Self::new(StatusCode::CONFLICT, "schedule_exists", e.to_string()),
            Error::ScheduleNotFound(_) => Self::not_found(e.to_string()),
            Error::BackfillRefused(_) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "backfill_refused", e.to_string()),
            Error::TimeoutTooLong(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_definition", e.to_string())
            }
            _ if e.is_infrastructure() => {
                tracing::error!(error = %e, "request failed on the infrastructure");
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.to_string())
            }
            _ => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.to_string()),
        }
    }
}
