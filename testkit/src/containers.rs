//! The containers tests run their services in: one per service and test
//! binary, shared by its tests and left running until the next binary
//! sweeps it away, and [`Dedicated`] ones a test owns and may stop, pause
//! or restart (removed when dropped).

use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};

use crate::notice;

/// Every container this crate starts carries this label, and the pid of
/// the test process that started it under [`PID_LABEL`].
const LABEL: &str = "flowforge.testkit";
const PID_LABEL: &str = "flowforge.testkit.pid";

/// How long a container may take to start or come back.
const STARTUP: Duration = Duration::from_secs(180);

/// A service FlowForge's tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// PostgreSQL 15 (trust auth, user `postgres`).
    Postgres,
    /// RabbitMQ (guest/guest allowed from anywhere).
    Rabbitmq,
}

impl Service {
    /// The local image (`cargo xtask images --services` builds it).
    fn image(self) -> (&'static str, &'static str) {
        match self {
            Self::Postgres => ("flowforge-postgres", "15"),
            Self::Rabbitmq => ("flowforge-rabbitmq", "3"),
        }
    }

    fn port(self) -> u16 {
        match self {
            Self::Postgres => 5432,
            Self::Rabbitmq => 5672,
        }
    }

    /// The line the service prints once it takes clients.
    fn ready(self) -> WaitFor {
        match self {
            Self::Postgres => WaitFor::message_on_stderr("database system is ready to accept connections"),
            Self::Rabbitmq => WaitFor::message_on_stdout("Server startup complete"),
        }
    }

    /// The URL of the service listening on the host's `port`.
    fn url(self, port: u16) -> String {
        match self {
            Self::Postgres => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            Self::Rabbitmq => format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Rabbitmq => "RabbitMQ",
        }
    }

    /// The container to start, published on `host_port` (a free one the
    /// daemon picks when `None`).
    fn request(self, host_port: Option<u16>) -> ContainerRequest<GenericImage> {
        let (name, tag) = self.image();
        let request = GenericImage::new(name, tag)
            .with_exposed_port(self.port().tcp())
            .with_wait_for(self.ready())
            .with_label(LABEL, "1")
            .with_label(PID_LABEL, std::process::id().to_string())
            .with_startup_timeout(STARTUP);
        match host_port {
            Some(port) => request.with_mapped_port(port, self.port().tcp()),
            None => request,
        }
    }
}

/// Starts the container of `service`, returning it and its host port.
async fn start(service: Service, host_port: Option<u16>) -> Result<(ContainerAsync<GenericImage>, u16), String> {
    let (name, tag) = service.image();
    let container = service.request(host_port).start().await.map_err(|e| {
        format!(
            "{} is not configured and its container {name}:{tag} did not start ({e}); \
             build the image with `cargo xtask images --services`",
            service.name()
        )
    })?;
    let port = match host_port {
        Some(port) => port,
        None => container
            .get_host_port_ipv4(service.port().tcp())
            .await
            .map_err(|e| format!("the {} container's port: {e}", service.name()))?,
    };
    notice(&format!(
        "testkit: started {} in container {} ({name}:{tag}) at 127.0.0.1:{port}",
        service.name(),
        &container.id()[..12.min(container.id().len())]
    ));
    Ok((container, port))
}

/// The URL of this test binary's shared container of `service`, started
/// on first use. The container lives as long as the process: a thread of
/// its own keeps it, and the next test binary removes it (see
/// [`sweep_orphans`]).
pub(crate) fn shared(service: Service) -> Result<String, String> {
    sweep_orphans();
    let (sender, receiver) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("testkit-{}", service.name()))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = sender.send(Err(format!("a runtime for the container: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                match start(service, None).await {
                    Ok((container, port)) => {
                        let _ = sender.send(Ok(service.url(port)));
                        // Holds the container (and its runtime) for the
                        // rest of the process.
                        std::future::pending::<()>().await;
                        drop(container);
                    }
                    Err(why) => {
                        let _ = sender.send(Err(why));
                    }
                }
            });
        });
    if let Err(e) = thread {
        return Err(format!("a thread for the {} container: {e}", service.name()));
    }
    receiver
        .recv_timeout(STARTUP + Duration::from_secs(30))
        .map_err(|_| format!("the {} container did not start in time", service.name()))?
}

/// Removes the containers of test processes that have ended: a shared
/// container outlives its process, as nothing runs at a test binary's exit.
fn sweep_orphans() {
    let Ok(listed) = Command::new("docker")
        .args([
            "ps",
            "--all",
            "--filter",
            &format!("label={LABEL}"),
            "--format",
            &format!("{{{{.ID}}}} {{{{.Label \"{PID_LABEL}\"}}}}"),
        ])
        .output()
    else {
        return;
    };
    let orphans: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| {
            let (id, pid) = line.split_once(' ')?;
            let alive = std::path::Path::new(&format!("/proc/{}", pid.trim())).exists();
            (!alive).then(|| id.to_owned())
        })
        .collect();
    if !orphans.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "--force", "--volumes"])
            .args(&orphans)
            .output();
    }
}

/// A container of one test's own, which it may stop, pause or restart: its
/// host port stays the same across restarts, so URLs stay valid. Removed
/// when dropped.
pub struct Dedicated {
    service: Service,
    container: ContainerAsync<GenericImage>,
    port: u16,
}

impl std::fmt::Debug for Dedicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedicated")
            .field("service", &self.service)
            .field("id", &self.container.id())
            .field("port", &self.port)
            .finish()
    }
}

impl Dedicated {
    /// Starts a container of `service` for this test, or `None` (after a
    /// notice) to skip when Docker cannot start it — a failure instead
    /// under `REQUIRE_POSTGRES=1` / `REQUIRE_RABBITMQ=1`.
    pub async fn start(service: Service) -> Option<Self> {
        sweep_orphans();
        let started = match free_port() {
            Ok(port) => start(service, Some(port)).await,
            Err(e) => Err(e),
        };
        let (require, variable) = match service {
            Service::Postgres => ("REQUIRE_POSTGRES", "DATABASE_URL"),
            Service::Rabbitmq => ("REQUIRE_RABBITMQ", "AMQP_URL"),
        };
        match started {
            Ok((container, port)) => Some(Self {
                service,
                container,
                port,
            }),
            Err(why) => {
                crate::found_or_skip(
                    &Err(format!("a container of this test's own: {why}")),
                    require,
                    variable,
                );
                None
            }
        }
    }

    /// The service's URL (the same across restarts).
    pub fn url(&self) -> String {
        self.service.url(self.port)
    }

    /// The host port the service listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the service (its clients' connections close), as a crash or
    /// an operator's restart would.
    pub async fn stop(&self) {
        self.container
            .stop_with_timeout(Some(10))
            .await
            .unwrap_or_else(|e| panic!("stop the {} container: {e}", self.service.name()));
    }

    /// Starts the stopped service again and waits until it takes clients.
    pub async fn start_again(&self) {
        self.container
            .start()
            .await
            .unwrap_or_else(|e| panic!("start the {} container again: {e}", self.service.name()));
        self.wait_until_listening().await;
    }

    /// Stops then starts the service.
    pub async fn restart(&self) {
        self.stop().await;
        self.start_again().await;
    }

    /// Freezes the service (`docker pause`): its sockets stay open but it
    /// says nothing, as a stalled host or a dead link would.
    pub async fn pause(&self) {
        self.container
            .pause()
            .await
            .unwrap_or_else(|e| panic!("pause the {} container: {e}", self.service.name()));
    }

    /// Thaws a paused service.
    pub async fn unpause(&self) {
        self.container
            .unpause()
            .await
            .unwrap_or_else(|e| panic!("unpause the {} container: {e}", self.service.name()));
    }

    async fn wait_until_listening(&self) {
        let deadline = Instant::now() + STARTUP;
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            let probe = tokio::task::spawn_blocking(move || {
                TcpStream::connect_timeout(&address, Duration::from_secs(2)).is_ok()
            })
            .await
            .unwrap_or(false);
            if probe && self.answers().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the {} container did not come back within {STARTUP:?}",
                self.service.name()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the service answers as itself, not only accepts TCP (a
    /// database accepts connections before it takes queries).
    async fn answers(&self) -> bool {
        match self.service {
            Service::Postgres => {
                use sqlx::Connection as _;
                match sqlx::PgConnection::connect(&self.url()).await {
                    Ok(connection) => {
                        let _ = connection.close().await;
                        true
                    }
                    Err(_) => false,
                }
            }
            Service::Rabbitmq => true,
        }
    }
}

/// A port no one listens on now (the daemon binds it right after).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("a free port: {e}"))
}
