//! The containers tests run their services in: one per service and test
//! run, shared by its tests and left running until a later run sweeps it
//! away, and [`Dedicated`] ones a test owns and may stop, pause or restart
//! (removed when dropped).
//!
//! A test run is the process that started the test binaries — `cargo
//! test`, or `cargo nextest`, which runs every test in a process of its
//! own — so its binaries and test processes share one container per
//! service instead of starting one each. A file lock makes the first
//! process start it and the others wait and reuse it; the container is
//! labelled with the run's pid, and removed by the first test process that
//! finds that pid gone.

use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};

use crate::notice;

/// Every container this crate starts carries this label, and the pid of
/// the test run that started it (see [`run_pid`]) under [`PID_LABEL`].
const LABEL: &str = "flowforge.testkit";
const PID_LABEL: &str = "flowforge.testkit.pid";
/// A run's shared container of a service carries the service's name under
/// this label ([`Dedicated`] ones do not).
const SHARED_LABEL: &str = "flowforge.testkit.shared";

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

    /// The value of [`SHARED_LABEL`] on this service's shared container.
    fn label(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Rabbitmq => "rabbitmq",
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
            .with_label(PID_LABEL, run_pid().to_string())
            .with_startup_timeout(STARTUP);
        match host_port {
            Some(port) => request.with_mapped_port(port, self.port().tcp()),
            None => request.with_label(SHARED_LABEL, self.label()),
        }
    }
}

/// The pid of the test run this process belongs to: the process that
/// started it (`cargo test`, `cargo nextest`, or a shell running a test
/// binary by hand), alive for as long as the run is.
fn run_pid() -> u32 {
    std::os::unix::process::parent_id()
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

/// The URL of this test run's shared container of `service`: the one
/// another process of the run started, or one this process starts, under a
/// file lock so that only one is. It outlives the process (a thread of its
/// own keeps it while the process lives) and is removed by a later
/// [`sweep_orphans`] once the run has ended.
pub(crate) fn shared(service: Service) -> Result<String, String> {
    sweep_orphans();
    let lock_path = std::env::temp_dir().join(format!("flowforge-testkit-{}-{}.lock", run_pid(), service.label()));
    let lock = std::fs::File::create(&lock_path).map_err(|e| format!("the lock file {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
    if let Some((id, port)) = running_shared(service) {
        notice(&format!(
            "testkit: using this run's {} in container {id} at 127.0.0.1:{port}",
            service.name()
        ));
        return Ok(service.url(port));
    }
    // The lock is held until the container takes clients: dropping it
    // (at return) lets the next process find it.
    start_shared(service)
}

/// The id and host port of this run's shared container of `service`, if
/// one is running.
fn running_shared(service: Service) -> Option<(String, u16)> {
    let listed = Command::new("docker")
        .args([
            "ps",
            "--filter",
            &format!("label={PID_LABEL}={}", run_pid()),
            "--filter",
            &format!("label={SHARED_LABEL}={}", service.label()),
            "--format",
            "{{.ID}}",
        ])
        .output()
        .ok()?;
    let id = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .next()?
        .trim()
        .to_owned();
    let ports = Command::new("docker")
        .args(["port", &id, &format!("{}/tcp", service.port())])
        .output()
        .ok()?;
    // `0.0.0.0:32768` (and `[::]:32768`): the port after the last colon.
    let port = String::from_utf8_lossy(&ports.stdout)
        .lines()
        .next()?
        .rsplit_once(':')?
        .1
        .trim()
        .parse()
        .ok()?;
    Some((id, port))
}

/// Starts this run's shared container of `service`, held by a thread for
/// the rest of the process.
fn start_shared(service: Service) -> Result<String, String> {
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
                        // rest of the process; nothing runs at a process's
                        // exit, so the container outlives it.
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

/// Removes the containers of test runs that have ended: a shared
/// container outlives its processes, as nothing runs at a process's exit.
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
    // The lock files of ended runs too.
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let ended = name
            .to_str()
            .and_then(|n| n.strip_prefix("flowforge-testkit-"))
            .and_then(|rest| rest.split_once('-'))
            .is_some_and(|(pid, _)| !std::path::Path::new(&format!("/proc/{pid}")).exists());
        if ended {
            let _ = std::fs::remove_file(entry.path());
        }
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
