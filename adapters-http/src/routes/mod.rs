//! The routes and the layers around them, built with utoipa-axum so the
//! OpenAPI document is generated from the very handlers the router serves
//! (a route cannot exist without its entry).

pub(crate) mod definitions;
pub(crate) mod events;
pub(crate) mod ops;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod worker;

use std::sync::OnceLock;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::problem::Problem;
use crate::state::ApiState;

/// The API's version prefix.
pub const PREFIX: &str = "/api/v1";

fn document_base() -> OpenApi {
    let mut doc = utoipa::openapi::OpenApiBuilder::new()
        .info(
            utoipa::openapi::InfoBuilder::new()
                .title("FlowForge")
                .version("1")
                .description(Some(
                    "Publish workflow definitions, start and watch runs. Errors are RFC 9457 problem documents \
                     with a stable `code`.",
                ))
                .build(),
        )
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
    );
    doc
}

/// The routes and their document, before state and layers.
fn parts() -> (axum::Router<ApiState>, axum::Router<ApiState>, OpenApi) {
    let (api, api_doc) = OpenApiRouter::<ApiState>::new()
        .routes(routes!(definitions::publish, definitions::list))
        .routes(routes!(definitions::versions))
        .routes(routes!(definitions::version))
        .routes(routes!(runs::start, runs::list))
        .routes(routes!(runs::get))
        .routes(routes!(runs::cancel))
        .routes(routes!(runs::retry))
        .routes(routes!(runs::attempts))
        .routes(routes!(schedules::create, schedules::list))
        .routes(routes!(schedules::get, schedules::delete))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::resume))
        .routes(routes!(schedules::backfill))
        .routes(routes!(ops::workers))
        .routes(routes!(worker::claims))
        .routes(routes!(worker::heartbeats))
        .routes(routes!(worker::results))
        .split_for_parts();
    // Event streams live apart: the request timeout must not end them.
    let (streams, streams_doc) = OpenApiRouter::<ApiState>::new()
        .routes(routes!(events::events))
        .split_for_parts();
    let (root, root_doc) = OpenApiRouter::<ApiState>::with_openapi(document_base())
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(openapi_json))
        .split_for_parts();
    let mut doc = root_doc;
    let mut nested = api_doc;
    nested.merge(streams_doc);
    doc = doc.nest(PREFIX, nested);
    let api = axum::Router::new().nest(PREFIX, api).merge(root);
    let streams = axum::Router::new().nest(PREFIX, streams);
    (api, streams, doc)
}

/// The generated OpenAPI 3.1 document.
pub fn openapi() -> &'static OpenApi {
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(|| parts().2)
}

/// The OpenAPI document of this API.
#[utoipa::path(get, operation_id = "openapi", path = "/openapi.json", tag = "operations", responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub(crate) async fn openapi_json(State(_): State<ApiState>) -> Json<&'static OpenApi> {
    Json(openapi())
}

fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a handler panicked".to_owned());
    tracing::error!(panic = %message, "a request handler panicked");
    Problem::internal("the server failed on this request; it is logged").into_response()
}

/// The whole API: routes, state and layers.
pub fn router(state: ApiState) -> axum::Router {
    let (api, streams, _) = parts();
    let config = state.config().clone();
    let timed = api.layer(TimeoutLayer::with_status_code(
        StatusCode::SERVICE_UNAVAILABLE,
        config.request_timeout,
    ));
    let header = axum::http::HeaderName::from_static("x-request-id");
    timed
        .merge(streams)
        .fallback(|| async { Problem::not_found("no such route; see /openapi.json") })
        .route_layer(axum::middleware::from_fn(crate::metrics::track))
        // The UI's pages and files: after the metrics layer, so the API's
        // request series count API calls only.
        .merge(crate::ui::router())
        .layer(axum::extract::DefaultBodyLimit::max(config.max_body))
        .layer(CompressionLayer::new())
        .layer(CatchPanicLayer::custom(panicked))
        .layer(PropagateRequestIdLayer::new(header.clone()))
        .layer(SetRequestIdLayer::new(header, MakeRequestUuid))
        .with_state(state)
}

#[cfg(test)]
mod tests;
