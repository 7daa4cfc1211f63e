//! FlowForge's HTTP API (docs/design/server.md): an inbound adapter that
//! serves the app's use cases over axum — definitions, runs, a run's live
//! events, workers, tokens on every route, Prometheus metrics and the
//! OpenAPI document generated from the handlers — and the web UI that
//! uses them. It also holds the outbound side of HTTP: the `http` task
//! type's handler (`task`).

mod auth;
pub mod backend;
mod body;
pub mod metrics;
mod problem;
mod routes;
mod state;
pub mod task;
pub mod ui;
pub mod views;

use std::net::SocketAddr;
use std::time::Duration;

pub use auth::AuthMode;
pub use backend::{Backend, ServiceBackend};
pub use problem::{Problem, ProblemBody};
pub use routes::{PREFIX, openapi, router};
pub use state::{ApiConfig, ApiState};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Binds `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Serves `router` on `listener` until `shutdown` is cancelled; then
/// stops accepting, ends event streams (they see the same token) and
/// gives in-flight requests up to `grace` to finish.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
    grace: Duration,
) -> Result<(), Error> {
    let stop = shutdown.clone();
    let server = axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled().await });
    let server = std::pin::pin!(server.into_future());
    tokio::select! {
        result = server => result.map_err(Error::Serve),
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "in-flight requests did not finish within the grace period; stopping anyway");
            Ok(())
        }
    }
}
