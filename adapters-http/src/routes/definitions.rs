//! `/api/v1/definitions`: publish (validated twice, idempotent by
//! content) and read definitions.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flowforge_app::tokens::ApiScope;
use flowforge_domain::schema::{self, ParseError};
use serde_json::json;

use crate::auth::require;
use crate::body;
use crate::problem::{Problem, ProblemBody};
use crate::state::ApiState;
use crate::views::{DefinitionBody, DefinitionItem, DefinitionList};

fn invalid(e: &ParseError) -> Problem {
    if let ParseError::Json(message) = e {
        return Problem::new(StatusCode::BAD_REQUEST, "malformed_json", message.clone());
    }
    let errors: Vec<_> = e
        .problems()
        .into_iter()
        .map(|p| json!({"kind": p.kind.as_str(), "path": p.path, "task": p.task, "message": p.message}))
        .collect();
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_definition",
        format!("the definition is invalid: {e}"),
    )
    .with("errors", errors.into())
}

/// Publish a definition: 201 new, 200 identical to the published one.
#[utoipa::path(
    post, operation_id = "publishDefinition", path = "/definitions", tag = "definitions",
    request_body(content = Object, description = "The definition JSON (name, version, tasks, …)"),
    responses(
        (status = 201, description = "Published", body = DefinitionBody),
        (status = 200, description = "Already published with the same content", body = DefinitionBody),
        (status = 409, description = "definition_conflict: the name and version hold other content", body = ProblemBody),
        (status = 422, description = "invalid_definition: every error with its kind and JSONPath", body = ProblemBody),
    ),
    security(("bearer" = ["definitions:write"]))
)]
pub(crate) async fn publish(
    State(state): State<ApiState>,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::DefinitionsWrite).await?;
    body::require_json(&headers)?;
    let def = schema::parse_definition(&raw).map_err(|e| invalid(&e))?;
    let published = state.backend().publish(&def).await?;
    let status = if published.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(DefinitionBody::from(&published))).into_response())
}

/// Every published definition.
#[utoipa::path(
    get, operation_id = "listDefinitions", path = "/definitions", tag = "definitions",
    responses((status = 200, body = DefinitionList)),
    security(("bearer" = ["definitions:read"]))
)]
pub(crate) async fn list(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<DefinitionList>, Problem> {
    require(&state, &headers, ApiScope::DefinitionsRead).await?;
    let items = state.backend().definitions(None).await?;
    Ok(Json(DefinitionList {
        items: items.iter().map(DefinitionItem::from).collect(),
    }))
}

/// The versions of one workflow, newest first.
#[utoipa::path(
    get, operation_id = "listDefinitionVersions", path = "/definitions/{name}", tag = "definitions",
    params(("name" = String, Path, description = "Workflow name")),
    responses((status = 200, body = DefinitionList), (status = 404, body = ProblemBody)),
    security(("bearer" = ["definitions:read"]))
)]
pub(crate) async fn versions(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<DefinitionList>, Problem> {
    require(&state, &headers, ApiScope::DefinitionsRead).await?;
    let items = state.backend().definitions(Some(&name)).await?;
    if items.is_empty() {
        return Err(Problem::not_found(format!("workflow {name:?} is not published")));
    }
    Ok(Json(DefinitionList {
        items: items.iter().map(DefinitionItem::from).collect(),
    }))
}

/// One version: its fingerprint, dependency levels and JSON.
#[utoipa::path(
    get, operation_id = "getDefinitionVersion", path = "/definitions/{name}/versions/{version}", tag = "definitions",
    params(("name" = String, Path, description = "Workflow name"), ("version" = u32, Path, description = "Version")),
    responses((status = 200, body = DefinitionBody), (status = 404, body = ProblemBody)),
    security(("bearer" = ["definitions:read"]))
)]
pub(crate) async fn version(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<DefinitionBody>, Problem> {
    require(&state, &headers, ApiScope::DefinitionsRead).await?;
    let version: u32 = version
        .parse()
        .map_err(|_| Problem::not_found(format!("workflow {name:?} has no version {version:?}")))?;
    let published = state.backend().find(&name, Some(version)).await?;
    Ok(Json(DefinitionBody::from(&published)))
}
