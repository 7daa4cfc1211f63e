//! The RabbitMQ broker of a test binary.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

use crate::containers::{self, Service};

/// The broker to test against: `AMQP_URL` when set, else this binary's
/// container; `None` (after a notice) to skip, a panic instead when
/// `REQUIRE_RABBITMQ=1`.
pub fn amqp_url() -> Option<String> {
    static FOUND: OnceLock<Result<String, String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| match std::env::var("AMQP_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => match broker_address(&url) {
            Some(address) if TcpStream::connect_timeout(&address, Duration::from_secs(3)).is_ok() => Ok(url),
            _ => Err(format!("RabbitMQ at AMQP_URL={} is unreachable", redact(&url))),
        },
        None => containers::shared(Service::Rabbitmq),
    });
    crate::found_or_skip(found, "REQUIRE_RABBITMQ", "AMQP_URL")
}

/// The `user:password@host:port` part of an AMQP URL, split.
fn authority(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    Some((scheme, authority))
}

/// The host and port an AMQP URL names (5672 when it names none).
pub fn broker_address(url: &str) -> Option<SocketAddr> {
    let (_, authority) = authority(url)?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (host_port, 5672),
    };
    let host = if host.is_empty() { "localhost" } else { host };
    (host, port).to_socket_addrs().ok()?.next()
}

/// `url` pointed at `127.0.0.1:port` (a proxy) instead of the broker.
pub fn amqp_url_via(url: &str, port: u16) -> String {
    let Some((scheme, authority)) = authority(url) else {
        return url.to_owned();
    };
    let tail = &url[scheme.len() + 3 + authority.len()..];
    let userinfo = authority.rsplit_once('@').map(|(user, _)| format!("{user}@"));
    format!("{scheme}://{}127.0.0.1:{port}{tail}", userinfo.unwrap_or_default())
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = url[scheme + 3..at].split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_pointed_at_a_proxy() {
        assert_eq!(
            amqp_url_via("amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=2", 4000),
            "amqp://guest:guest@127.0.0.1:4000/%2f?heartbeat=2"
        );
        assert_eq!(amqp_url_via("amqp://h/%2f", 4000), "amqp://127.0.0.1:4000/%2f");
        assert_eq!(
            broker_address("amqp://guest:guest@127.0.0.1:5673/%2f"),
            Some(SocketAddr::from(([127, 0, 0, 1], 5673)))
        );
        assert_eq!(redact("amqp://u:secret@h/%2f"), "amqp://u:***@h/%2f");
    }
}
