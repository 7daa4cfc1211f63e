//! `flowforge server`: the HTTP API (docs/design/server.md). On SQLite it
//! is a whole deployment in one process — the API plus the embedded
//! engine's scheduler, publisher and worker slots serving every run; on
//! PostgreSQL it serves the API and the distributed processes run the
//! loops. SIGTERM stops accepting, ends event streams with a final event,
//! gives requests a bounded grace and exits 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flowforge::{BuiltinOptions, Embedded, HandlerRegistry};
use flowforge_adapters_http::{ApiConfig, ApiState, AuthMode, ServiceBackend};
use flowforge_app::remote::RemoteConfig;
use flowforge_app::{Service, TaskTypes};
use flowforge_ports::{Scope, Store, WorkerId};
use tokio_util::sync::CancellationToken;

use super::common::{host, interrupted};
use super::store::{Kind, kind, with_store};
use super::{Exit, Global};

/// Arguments of `flowforge server`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The address to serve on.
    #[arg(
        long,
        env = "FLOWFORGE_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub(crate) listen: SocketAddr,
    /// Serve without tokens. Refused unless the address is loopback.
    #[arg(long)]
    pub(crate) no_auth: bool,
    /// Serve `/metrics` without a token.
    #[arg(long, env = "FLOWFORGE_METRICS_OPEN")]
    pub(crate) metrics_open: bool,
    /// The largest request body, in bytes.
    #[arg(long, env = "FLOWFORGE_MAX_BODY", default_value_t = 2 * 1024 * 1024, value_name = "BYTES")]
    pub(crate) max_body: usize,
    /// How long a request may take (event streams excepted), in seconds.
    #[arg(long, default_value_t = 30, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) request_timeout_seconds: u64,
    /// How long in-flight requests get after SIGTERM, in seconds.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub(crate) shutdown_grace_seconds: u64,
    /// SQLite: worker slots of the in-process engine (default: CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: Option<u32>,
    /// SQLite: allow `command` tasks, which run programs on this host.
    #[arg(long)]
    pub(crate) allow_command: bool,
    /// SQLite: `http` tasks (`--allow-http`, `--http-allow HOST`).
    #[command(flatten)]
    pub(crate) http: super::processes::HttpArgs,
    #[command(flatten)]
    pub(crate) metrics: super::processes::MetricsArgs,
}

/// `flowforge server`.
pub(crate) async fn run(global: &Global, args: &Args) -> anyhow::Result<Exit> {
    if args.no_auth && !args.listen.ip().is_loopback() {
        eprintln!(
            "error: --no-auth serves the API to anyone who can reach {}; it is allowed only on a loopback address",
            args.listen
        );
        return Ok(Exit::Invalid);
    }
    let embedded = match kind(&global.db) {
        Ok(k) => k == Kind::Sqlite,
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(Exit::Invalid);
        }
    };
    with_store!(global, |store| serve(store, global, args, embedded).await)
}

async fn serve<S: Store>(store: S, global: &Global, args: &Args, embedded: bool) -> anyhow::Result<Exit> {
    let metrics = flowforge_adapters_http::metrics::install().map_err(anyhow::Error::msg)?;
    let shutdown = CancellationToken::new();
    args.metrics.expose(&shutdown).await?;
    let config = ApiConfig {
        auth: if args.no_auth {
            AuthMode::Disabled
        } else {
            AuthMode::Tokens
        },
        metrics_open: args.metrics_open,
        max_body: args.max_body,
        request_timeout: Duration::from_secs(args.request_timeout_seconds),
        ..ApiConfig::default()
    };
    // SQLite: the engine serves every run in this process.
    let (service, types, serving) = if embedded {
        let mut builder = Embedded::builder()
            .lease(global.lease())
            .limits(global.limits())
            .priority_aging(global.priority_aging())
            .worker_id(WorkerId(format!("server:{}:{}", host(), std::process::id())))
            .builtins(Some(BuiltinOptions {
                allow_command: args.allow_command,
                base_dir: std::env::current_dir()?,
                kill_grace: Duration::from_secs(5),
                output_limit: global.max_task_output_bytes,
            }));
        if let Some(n) = args.concurrency {
            builder = builder.concurrency(n as usize);
        }
        if args.http.allow_http {
            let mut http = HandlerRegistry::new();
            if let Err(e) = args.http.register(&mut http, global.max_task_output_bytes) {
                eprintln!("error: {e:#}");
                return Ok(Exit::Invalid);
            }
            builder = builder.handlers(http);
        }
        let engine = builder.build_on(store);
        let types = TaskTypes::Registered(engine.registry().task_types().map(str::to_owned).collect());
        let serving = engine.serve(Scope::All);
        (engine.service().clone(), types, Some(serving))
    } else {
        (
            Service::new(store).with_limits(global.limits()),
            TaskTypes::LiveWorkers,
            None,
        )
    };
    let remote = RemoteConfig {
        default_lease: global.lease(),
        limits: global.limits(),
        aging: global.priority_aging(),
        // A long poll ends before the request timeout would cut it.
        max_wait: Duration::from_secs(args.request_timeout_seconds.saturating_sub(5).clamp(1, 25)),
        ..RemoteConfig::default()
    };
    // SQLite: this process fires the schedules too; on PostgreSQL the
    // `flowforge scheduler` processes do (docs/design/schedules.md#firing).
    let firing = embedded.then(|| {
        let service = service.clone();
        let token = shutdown.clone();
        tokio::spawn(async move { service.fire_schedules_until(token).await })
    });
    let backend = Arc::new(ServiceBackend::new(service, types, remote));
    let state = ApiState::new(backend, config, Some(metrics), shutdown.clone());
    let listener = match flowforge_adapters_http::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Infrastructure);
        }
    };
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, auth = ?state_auth(args), embedded, "flowforge server listening");
    // Tests and scripts read the bound address (with --listen 127.0.0.1:0).
    eprintln!("flowforge server listening on http://{local}");
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        interrupted().await;
        tracing::info!("stopping gracefully");
        trigger.cancel();
    });
    let router = flowforge_adapters_http::router(state);
    let grace = Duration::from_secs(args.shutdown_grace_seconds);
    let served = flowforge_adapters_http::serve(listener, router, shutdown, grace).await;
    let mut stopped = match serving {
        Some(serving) => serving.stop().await,
        None => Ok(()),
    };
    if let Some(firing) = firing {
        let fired = firing.await.unwrap_or_else(|e| {
            Err(flowforge::Error::LoopPanicked {
                what: "schedule firing",
                message: e.to_string(),
            })
        });
        stopped = stopped.and(fired);
    }
    if let Err(e) = served {
        eprintln!("error: {e}");
        return Ok(Exit::Infrastructure);
    }
    if let Err(e) = stopped {
        return Ok(super::fail(&e));
    }
    Ok(Exit::Ok)
}

fn state_auth(args: &Args) -> &'static str {
    if args.no_auth { "off" } else { "tokens" }
}
