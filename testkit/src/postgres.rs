//! The PostgreSQL server of a test binary, and one database per test.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use crate::containers::{self, Service};

/// The PostgreSQL server to test against: `DATABASE_URL` when set, else
/// this binary's container; `None` (after a notice) to skip, a panic
/// instead when `REQUIRE_POSTGRES=1`.
pub fn postgres_url() -> Option<String> {
    static FOUND: OnceLock<Result<String, String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => {
            if reachable(&url) {
                Ok(url)
            } else {
                Err(format!("PostgreSQL at DATABASE_URL={url} is unreachable"))
            }
        }
        None => containers::shared(Service::Postgres),
    });
    crate::found_or_skip(found, "REQUIRE_POSTGRES", "DATABASE_URL")
}

/// Whether the server a URL names accepts connections (a socket folder
/// that exists, or a TCP port that answers).
fn reachable(url: &str) -> bool {
    url.parse::<sqlx::postgres::PgConnectOptions>()
        .is_ok_and(|o| match o.get_host() {
            socket if socket.starts_with('/') => std::path::Path::new(socket).exists(),
            host => (host, o.get_port())
                .to_socket_addrs()
                .is_ok_and(|mut addrs| addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(3)).is_ok())),
        })
}

/// `url` with its database replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    match query {
        Some(q) => format!("{scheme}://{authority}/{name}?{q}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

/// The address of the server a URL names (TCP only), for a proxy.
pub fn pg_address(url: &str) -> SocketAddr {
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    (options.get_host(), options.get_port())
        .to_socket_addrs()
        .expect("resolve the PostgreSQL host")
        .next()
        .expect("an address for the PostgreSQL host")
}

/// `url` pointed at `127.0.0.1:port` (a proxy) instead of the server.
pub fn pg_url_via(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority.rsplit_once('@').map(|(user, _)| format!("{user}@"));
    format!("{scheme}://{}127.0.0.1:{port}{tail}", userinfo.unwrap_or_default())
}

/// One test's own database on the server: created empty, dropped `WITH
/// (FORCE)` when this guard is dropped — when the test ends, passed or
/// failed — so tests run in parallel on one server.
#[derive(Debug)]
pub struct TestDatabase {
    /// The database's URL.
    pub url: String,
    name: String,
    admin_url: String,
}

impl TestDatabase {
    /// A fresh, empty database `<prefix>_<random>` on the server at
    /// `admin_url`.
    pub async fn create(admin_url: &str, prefix: &str) -> Self {
        let name = format!("{prefix}_{}", crate::suffix());
        let mut admin = PgConnection::connect(admin_url)
            .await
            .expect("connect to the PostgreSQL server");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("CREATE DATABASE");
        let _ = admin.close().await;
        Self {
            url: with_database(admin_url, &name),
            name,
            admin_url: admin_url.to_owned(),
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop may run inside the test's runtime, which must not be blocked
        // on: a thread with a runtime of its own drops the database.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut admin) = PgConnection::connect(&admin_url).await {
                    let dropped = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut admin)
                    .await;
                    if let Err(e) = dropped {
                        crate::notice(&format!("(cleanup) could not drop test database {name}: {e}"));
                    }
                    let _ = admin.close().await;
                }
            });
        });
        let _ = dropper.join();
    }
}
