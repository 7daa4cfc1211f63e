//! What every route shares: the use cases, the auth mode, the limits and
//! the process's shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::AuthMode;
use crate::backend::Backend;

/// The server's settings.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Whether requests need tokens.
    pub auth: AuthMode,
    /// `/metrics` without a token.
    pub metrics_open: bool,
    /// The largest request body, in bytes.
    pub max_body: usize,
    /// How long a request may take (event streams excepted).
    pub request_timeout: Duration,
    /// How often an event stream looks for new events when it found none.
    pub events_poll: Duration,
    /// The keep-alive comment interval of an event stream.
    pub keep_alive: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            auth: AuthMode::Tokens,
            metrics_open: false,
            max_body: 2 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            events_poll: Duration::from_millis(100),
            keep_alive: Duration::from_secs(15),
        }
    }
}

/// The routes' shared state (cheap to clone).
#[derive(Clone)]
pub struct ApiState(Arc<Inner>);

struct Inner {
    backend: Arc<dyn Backend>,
    config: ApiConfig,
    metrics: Option<PrometheusHandle>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// State over `backend`; `metrics` renders `/metrics` (none: 404);
    /// `shutdown` ends event streams with a final event.
    pub fn new(
        backend: Arc<dyn Backend>,
        config: ApiConfig,
        metrics: Option<PrometheusHandle>,
        shutdown: CancellationToken,
    ) -> Self {
        Self(Arc::new(Inner {
            backend,
            config,
            metrics,
            shutdown,
        }))
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.0.backend.as_ref()
    }

    pub(crate) fn auth(&self) -> AuthMode {
        self.0.config.auth
    }

    pub(crate) fn config(&self) -> &ApiConfig {
        &self.0.config
    }

    pub(crate) fn metrics(&self) -> Option<&PrometheusHandle> {
        self.0.metrics.as_ref()
    }

    pub(crate) fn shutdown(&self) -> &CancellationToken {
        &self.0.shutdown
    }
}
