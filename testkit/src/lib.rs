//! Test support for FlowForge's integration tests (dev-only): where the
//! PostgreSQL server and the RabbitMQ broker are, one database per test,
//! containers a test may stop, pause or restart, and a TCP proxy a test
//! may cut or stall.
//!
//! A service comes from its environment variable when set
//! (`DATABASE_URL`, `AMQP_URL`); otherwise from a container this crate
//! starts with `testcontainers` — one per test binary, shared by its tests,
//! each test on its own database or queue names. Neither: the test is
//! skipped with a notice, unless `REQUIRE_POSTGRES=1` / `REQUIRE_RABBITMQ=1`
//! makes that a failure. The containers run the local images
//! `cargo xtask images --services` builds (no registry is needed).

mod containers;
mod postgres;
mod proxy;
mod rabbit;

use std::io::Write as _;

pub use containers::{Dedicated, Service};
pub use postgres::{TestDatabase, pg_address, pg_url_via, postgres_url, with_database};
pub use proxy::{Mode, Proxy};
pub use rabbit::{amqp_url, amqp_url_via, broker_address};

/// Says something about the test environment on the real stderr (the
/// test harness captures `eprintln!`, which would hide the line of a
/// passing test).
pub fn notice(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A random suffix for the names a test owns.
pub fn suffix() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The service's URL, or `None` (after a notice) to skip; panics instead
/// when `require` is set in the environment.
fn found_or_skip(found: &Result<String, String>, require: &str, variable: &str) -> Option<String> {
    match found {
        Ok(url) => Some(url.clone()),
        Err(why) => {
            assert!(std::env::var(require).as_deref() != Ok("1"), "{require}=1 but {why}");
            notice(&format!(
                "SKIPPED: {why}; set {variable} (and {require}=1 to fail instead)"
            ));
            None
        }
    }
}
