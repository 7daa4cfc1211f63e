//! The adapter's configuration, and its validation into the settings the
//! publisher and the queue run with.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lapin::types::ShortString;
use lapin::uri::{AMQPScheme, AMQPUri};

/// The dispatch exchange's default name.
pub const DEFAULT_EXCHANGE: &str = "flowforge";
/// The dispatch queue's default name.
pub const DEFAULT_QUEUE: &str = "flowforge.tasks";
/// The default routing key binding the queue to the exchange.
pub const DEFAULT_ROUTING_KEY: &str = "flowforge.tasks";
/// RabbitMQ's default `consumer_timeout`: a delivery left unacknowledged
/// this long closes its channel.
pub const DEFAULT_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// What [`RabbitConfig::max_task_timeout`] keeps below the consumer timeout:
/// time for the claim before the handler, and after it the handler's
/// cancellation grace, the outcome write and the ack.
pub const CONSUMER_TIMEOUT_MARGIN: Duration = Duration::from_secs(2 * 60);
/// The largest AMQP frame asked for, unless the URL sets `frame_max`. The
/// client keeps a receive and a send buffer of 32 frames each for the
/// whole life of a connection, so RabbitMQ's default of 128 KiB costs
/// 8 MiB per connection, resident as soon as the connection is tuned; a
/// dispatch is a few hundred bytes, and a body larger than a frame is
/// split across frames, so 16 KiB frames cost 1 MiB and no round trip.
pub const DEFAULT_FRAME_MAX: u32 = 16 * 1024;

/// How to reach RabbitMQ and what to declare there.
///
/// Build it with [`RabbitConfig::new`] and override fields as needed. The
/// URL's password is never printed by `Debug` nor carried in errors.
#[derive(Clone, PartialEq, Eq)]
pub struct RabbitConfig {
    /// `amqp://user:password@host:port/vhost` (percent-encode the vhost:
    /// `%2f` is `/`). A `heartbeat=SECONDS` query parameter sets the AMQP
    /// heartbeat. TLS (`amqps`) is not supported by this build.
    pub url: String,
    /// The dispatch exchange (durable, direct). Default `flowforge`.
    pub exchange: String,
    /// The dispatch queue (durable, quorum). Default `flowforge.tasks`.
    pub queue: String,
    /// The routing key dispatches are published with and the queue is bound
    /// with. Default `flowforge.tasks`.
    pub routing_key: String,
    /// Bounds each single broker operation once connected: writing one
    /// publish to the socket, one ack, one nack or reject. Default 5 s.
    pub publish_timeout: Duration,
    /// Bounds the wait for a whole batch's confirms, from the moment all of
    /// its publishes are written. Default 10 s.
    pub confirm_timeout: Duration,
    /// Bounds connecting (TCP and AMQP handshake) and each setup step
    /// (opening a channel, declaring, setting QoS, starting a consumer).
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// The connection name shown by `rabbitmqctl list_connections` and the
    /// management UI. Default `flowforge`.
    pub connection_name: String,
    /// The broker's consumer timeout (`consumer_timeout` in
    /// `rabbitmq.conf`): set it to what the broker is configured with.
    /// Default 30 min, RabbitMQ's default. See the crate docs.
    pub consumer_timeout: Duration,
    /// How many ready messages the publisher keeps in the queue; the rest
    /// wait in the outbox, which is swept in priority order. Default
    /// [`DispatchWindow::Consumers`]. See the crate docs.
    pub dispatch_window: DispatchWindow,
}

/// How many ready (delivered to nobody yet) messages the publisher keeps
/// in the queue. A quorum queue hands messages out in the order they came,
/// so work published ahead of a later, more urgent dispatch goes first:
/// the window bounds how much can (docs/design/priorities.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchWindow {
    /// One per consumer on the queue (at least one): every consumer that
    /// acks finds its next message waiting, and nothing more queues ahead.
    #[default]
    Consumers,
    /// At most this many (at least one).
    Fixed(u32),
    /// No bound: every row is published as it is swept, and priority
    /// orders only the rows that wait in the outbox.
    Unbounded,
}

impl DispatchWindow {
    /// The window for a queue with `consumers` consumers, or `None` when
    /// unbounded.
    pub fn size(self, consumers: u32) -> Option<u32> {
        match self {
            Self::Consumers => Some(consumers.max(1)),
            Self::Fixed(n) => Some(n.max(1)),
            Self::Unbounded => None,
        }
    }
}

impl std::str::FromStr for DispatchWindow {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "consumers" => Ok(Self::Consumers),
            "unbounded" => Ok(Self::Unbounded),
            n => match n.parse::<u32>() {
                Ok(n) if n > 0 => Ok(Self::Fixed(n)),
                _ => Err(format!(
                    "dispatch window must be 'consumers', 'unbounded' or a positive number of messages, not '{s}'"
                )),
            },
        }
    }
}

impl RabbitConfig {
    /// A configuration for `url` with every other field at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            exchange: DEFAULT_EXCHANGE.to_owned(),
            queue: DEFAULT_QUEUE.to_owned(),
            routing_key: DEFAULT_ROUTING_KEY.to_owned(),
            publish_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            connection_name: "flowforge".to_owned(),
            consumer_timeout: DEFAULT_CONSUMER_TIMEOUT,
            dispatch_window: DispatchWindow::default(),
        }
    }

    /// The longest task timeout a worker consuming from this broker may
    /// accept: the consumer timeout minus [`CONSUMER_TIMEOUT_MARGIN`]
    /// (28 min by default). A task allowed to run longer would outlive its
    /// delivery: the broker would close the channel and redeliver it while
    /// the handler still runs.
    pub fn max_task_timeout(&self) -> Duration {
        self.consumer_timeout.saturating_sub(CONSUMER_TIMEOUT_MARGIN)
    }

    /// Checks the configuration without touching the network.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Settings::from_config(self).map(|_| ())
    }
}

impl fmt::Debug for RabbitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitConfig")
            .field("url", &redact(&self.url))
            .field("exchange", &self.exchange)
            .field("queue", &self.queue)
            .field("routing_key", &self.routing_key)
            .field("publish_timeout", &self.publish_timeout)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("connection_name", &self.connection_name)
            .field("consumer_timeout", &self.consumer_timeout)
            .field("dispatch_window", &self.dispatch_window)
            .finish()
    }
}

/// Why a [`RabbitConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The URL does not parse as an AMQP URL.
    #[error("invalid AMQP URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password removed.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// `amqps` was asked for; this build has no TLS.
    #[error("TLS (amqps) is not supported by this build; use amqp://")]
    TlsUnsupported,
    /// A name that must be set is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// A name is longer than AMQP allows.
    #[error("{field} is {len} bytes long; AMQP names are at most 255 bytes")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A timeout is zero.
    #[error("{0} must be greater than zero")]
    ZeroTimeout(&'static str),
}

/// A validated configuration, in the types lapin wants.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) uri: AMQPUri,
    /// The URL without its password, for messages.
    pub(crate) display_url: String,
    pub(crate) exchange: ShortString,
    pub(crate) queue: ShortString,
    pub(crate) routing_key: ShortString,
    pub(crate) connection_name: String,
    pub(crate) publish_timeout: Duration,
    pub(crate) confirm_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) dispatch_window: DispatchWindow,
}

impl Settings {
    pub(crate) fn from_config(config: &RabbitConfig) -> Result<Self, ConfigError> {
        let display_url = redact(&config.url);
        let mut uri = AMQPUri::from_str(&config.url).map_err(|reason| ConfigError::InvalidUrl {
            url: display_url.clone(),
            reason,
        })?;
        if uri.scheme == AMQPScheme::AMQPS {
            return Err(ConfigError::TlsUnsupported);
        }
        // amq-protocol-uri reads the host with `Url::domain`, which is None
        // for an IP address, and then falls back to "localhost": an IP in
        // the URL would silently connect to this machine. Take the literal.
        if let Some(host) = literal_host(&config.url) {
            uri.authority.host = host;
        }
        uri.query.frame_max.get_or_insert(DEFAULT_FRAME_MAX);
        for (field, value) in [
            ("publish_timeout", config.publish_timeout),
            ("confirm_timeout", config.confirm_timeout),
            ("connect_timeout", config.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::ZeroTimeout(field));
            }
        }
        Ok(Self {
            uri,
            display_url,
            // The default exchange cannot be declared, and an empty queue
            // name asks the broker for a random one: neither is a topology.
            exchange: amqp_name("exchange", &config.exchange, false)?,
            queue: amqp_name("queue", &config.queue, false)?,
            routing_key: amqp_name("routing_key", &config.routing_key, true)?,
            connection_name: config.connection_name.clone(),
            publish_timeout: config.publish_timeout,
            confirm_timeout: config.confirm_timeout,
            connect_timeout: config.connect_timeout,
            dispatch_window: config.dispatch_window,
        })
    }

    /// The vhost, for operator commands.
    pub(crate) fn vhost(&self) -> &str {
        &self.uri.vhost
    }
}

fn amqp_name(field: &'static str, value: &str, may_be_empty: bool) -> Result<ShortString, ConfigError> {
    if value.is_empty() && !may_be_empty {
        return Err(ConfigError::Empty(field));
    }
    ShortString::try_new(value.to_owned()).map_err(|_| ConfigError::TooLong {
        field,
        len: value.len(),
    })
}

/// The host exactly as written in `url` when it is an IP address (brackets
/// of an IPv6 literal removed); `None` for a name, which the parser keeps.
fn literal_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split_once(']')?.0
    } else {
        host_port.split(':').next()?
    };
    host.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

/// `url` with the password of its user info, and the value of a
/// `password=` query parameter, replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let (head, query) = url.split_once('?').map_or((url, None), |(h, q)| (h, Some(q)));
    let mut out = redact_userinfo(head);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL: whatever sits between a `:` and an `@` may be one.
        return match (url.find(':'), url.rfind('@')) {
            (Some(colon), Some(at)) if colon < at => format!("{}:***{}", &url[..colon], &url[at..]),
            _ => url.to_owned(),
        };
    };
    let end = rest.find(['/', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_the_password() {
        assert_eq!(
            redact("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://guest@host/%2f"), "amqp://guest@host/%2f");
        assert_eq!(redact("amqp://host"), "amqp://host");
        assert_eq!(
            redact("amqp://guest@host/%2f?heartbeat=5&password=secret"),
            "amqp://guest@host/%2f?heartbeat=5&password=***"
        );
        assert_eq!(redact("guest:secret@host"), "guest:***@host");
        let debug = format!("{:?}", RabbitConfig::new("amqp://u:p4ss@h/v"));
        assert!(!debug.contains("p4ss"), "{debug}");
    }

    #[test]
    fn keeps_ip_hosts_the_parser_would_lose() {
        let settings = Settings::from_config(&RabbitConfig::new("amqp://u:p@10.1.2.3:5673/%2f")).unwrap();
        assert_eq!(settings.uri.authority.host, "10.1.2.3");
        assert_eq!(settings.uri.authority.port, 5673);
        assert_eq!(settings.vhost(), "/");
        let settings = Settings::from_config(&RabbitConfig::new("amqp://[::1]:5672/v")).unwrap();
        assert_eq!(settings.uri.authority.host, "::1");
        let settings = Settings::from_config(&RabbitConfig::new("amqp://rabbit.example:5672/v")).unwrap();
        assert_eq!(settings.uri.authority.host, "rabbit.example");
    }

    #[test]
    fn asks_for_small_frames_unless_the_url_says_otherwise() {
        let settings = Settings::from_config(&RabbitConfig::new("amqp://h/%2f")).unwrap();
        assert_eq!(settings.uri.query.frame_max, Some(DEFAULT_FRAME_MAX));
        let settings = Settings::from_config(&RabbitConfig::new("amqp://h/%2f?frame_max=131072")).unwrap();
        assert_eq!(settings.uri.query.frame_max, Some(131_072));
    }

    #[test]
    fn rejects_what_cannot_work() {
        let check = |f: fn(&mut RabbitConfig), expected: ConfigError| {
            let mut config = RabbitConfig::new("amqp://localhost/%2f");
            f(&mut config);
            assert_eq!(config.validate(), Err(expected));
        };
        check(|c| c.url = "amqps://localhost/%2f".into(), ConfigError::TlsUnsupported);
        check(|c| c.exchange.clear(), ConfigError::Empty("exchange"));
        check(|c| c.queue.clear(), ConfigError::Empty("queue"));
        check(
            |c| c.queue = "q".repeat(256),
            ConfigError::TooLong {
                field: "queue",
                len: 256,
            },
        );
        check(
            |c| c.confirm_timeout = Duration::ZERO,
            ConfigError::ZeroTimeout("confirm_timeout"),
        );
        check(
            |c| c.publish_timeout = Duration::ZERO,
            ConfigError::ZeroTimeout("publish_timeout"),
        );
        assert!(matches!(
            RabbitConfig::new("nope").validate(),
            Err(ConfigError::InvalidUrl { .. })
        ));
        assert!(RabbitConfig::new("amqp://localhost/%2f").validate().is_ok());
    }

    #[test]
    fn max_task_timeout_keeps_a_margin_below_the_consumer_timeout() {
        let mut config = RabbitConfig::new("amqp://localhost");
        assert_eq!(config.max_task_timeout(), Duration::from_secs(28 * 60));
        config.consumer_timeout = Duration::from_secs(60);
        assert_eq!(config.max_task_timeout(), Duration::ZERO);
    }
}
