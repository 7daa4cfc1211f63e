//! The `http` task type (docs/design/handlers.md#the-http-task-type): each
//! attempt sends one HTTP request described by the task's config, and the
//! response body becomes the task's output.
//!
//! A worker's network position is not the definition author's: hosts are
//! checked before sending and every resolved address at connection time
//! (`address`), redirects are not followed, and header values taken from
//! the worker's environment never reach a message or an output.

mod address;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flowforge_domain::limits::DEFAULT_TASK_OUTPUT_BYTES;
use flowforge_ports::{Handler, HandlerError, TaskContext};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, Response, StatusCode, Url};
use serde_json::{Map, Value};

use self::address::{AllowList, GuardedResolver, Refused};

/// The task type this handler is registered under.
pub const HTTP_TASK_TYPE: &str = "http";

/// The config fields; any other is refused, so a misspelt `headers` cannot
/// silently send a request without its credentials.
const FIELDS: [&str; 6] = [
    "method",
    "url",
    "headers",
    "body_from",
    "timeout_seconds",
    "success_codes",
];
const DEFAULT_SUCCESS_CODES: [u16; 4] = [200, 201, 202, 204];
const METHODS: [Method; 7] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];
/// Headers the handler owns (the idempotency key) or that frame the
/// request, which a definition must not be able to garble.
const RESERVED_HEADERS: [&str; 5] = [
    "idempotency-key",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
];
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// How much of a failed response's body its error quotes.
const EXCERPT_CHARS: usize = 200;
/// Enough bytes for `EXCERPT_CHARS` characters of any UTF-8.
const EXCERPT_BYTES: usize = 4 * EXCERPT_CHARS;
/// A `Retry-After` is honoured up to this: a server's mistake (or malice)
/// must not park a task for years.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// How the `http` task type behaves in this process.
#[derive(Debug, Clone)]
pub struct HttpTaskOptions {
    /// `None`: any host (except link-local / metadata addresses).
    /// `Some(list)`: only these hosts (exact, case-insensitive; an entry
    /// may be an IP literal). A host named here explicitly is allowed even
    /// if it is link-local/metadata.
    pub allow_hosts: Option<Vec<String>>,
    /// Largest response body kept as output (bytes of its text); larger →
    /// permanent failure.
    pub output_limit: usize,
}

impl Default for HttpTaskOptions {
    /// Any host but the refused ones; the engine's task output limit
    /// (docs/design/data-flow.md#limits), since a larger output would be
    /// refused after the request anyway.
    fn default() -> Self {
        Self {
            allow_hosts: None,
            output_limit: DEFAULT_TASK_OUTPUT_BYTES,
        }
    }
}

/// Why an [`HttpTask`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpTaskError {
    /// An `allow_hosts` entry is neither a host name nor an IP address.
    #[error("allow_hosts: {0:?} is not a host name or an IP address")]
    AllowedHost(String),
    /// The TLS configuration was refused.
    #[error("cannot configure TLS for the http task type: {0}")]
    Tls(#[source] rustls::Error),
    /// The HTTP client could not be built.
    #[error("cannot build the http task type's client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Reads a variable of the worker's environment.
pub type EnvLookup = fn(&str) -> Option<String>;

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The `http` task type's handler: one client (connection pool, TLS and
/// resolver) shared by every attempt.
#[derive(Debug)]
pub struct HttpTask {
    client: reqwest::Client,
    allow: Arc<AllowList>,
    output_limit: usize,
    env: EnvLookup,
}

impl HttpTask {
    /// Builds the handler and its client, and makes sure the process has
    /// a default TLS provider ([`install_default_tls_provider`]).
    pub fn new(options: HttpTaskOptions) -> Result<Self, HttpTaskError> {
        install_default_tls_provider();
        let allow = Arc::new(AllowList::new(options.allow_hosts.as_deref()).map_err(HttpTaskError::AllowedHost)?);
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config().map_err(HttpTaskError::Tls)?)
            .dns_resolver(Arc::new(GuardedResolver {
                allow: Arc::clone(&allow),
            }))
            // A redirect would go to an address nobody checked, and a proxy
            // would resolve the target where our resolver cannot see it.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("flowforge/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(HttpTaskError::Client)?;
        Ok(Self {
            client,
            allow,
            output_limit: options.output_limit,
            env: process_env,
        })
    }

    /// Reads `{"env": NAME}` header values with `lookup` instead of the
    /// process environment (tests; an embedder's secret store).
    #[must_use]
    pub fn with_env(self, lookup: EnvLookup) -> Self {
        Self { env: lookup, ..self }
    }

    async fn attempt(&self, ctx: &TaskContext) -> Result<Value, HandlerError> {
        let spec = Spec::from_config(&ctx.config)?;
        let target = spec.target();
        if let Some(host) = spec.url.host_str() {
            self.allow
                .check_host(host)
                .map_err(|refused| HandlerError::permanent(format!("http: refused {target}: {refused}")))?;
        }
        let (mut headers, secrets) = self.headers(&spec)?;
        let key = HeaderValue::from_str(&ctx.idempotency_key).map_err(|_| {
            HandlerError::permanent(format!(
                "http: the idempotency key {:?} is not a valid header value",
                ctx.idempotency_key
            ))
        })?;
        headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY), key);
        let body = match spec.body_from {
            None => None,
            Some(BodyFrom::Inputs) => Some(serde_json::to_vec(&ctx.inputs)),
            Some(BodyFrom::RunInput) => Some(serde_json::to_vec(&ctx.run_input)),
            Some(BodyFrom::Item) => match &ctx.item {
                Some(item) => Some(serde_json::to_vec(&item.item)),
                None => {
                    return Err(HandlerError::permanent(
                        "http: body_from \"item\" sends a mapped task's item, and this task is not mapped",
                    ));
                }
            },
        }
        .transpose()
        .map_err(|e| HandlerError::permanent(format!("http: cannot encode the request body: {e}")))?;
        let mut request = self.client.request(spec.method.clone(), spec.url.clone());
        if let Some(body) = body {
            headers
                .entry(CONTENT_TYPE)
                .or_insert(HeaderValue::from_static("application/json"));
            request = request.body(body);
        }
        request = request.headers(headers);
        if let Some(timeout) = spec.timeout {
            request = request.timeout(timeout);
        }
        let response = request.send().await.map_err(|e| spec.transport_error(e))?;
        let status = response.status();
        if spec.success_codes.contains(&status.as_u16()) {
            let body = read_body(response, self.output_limit).await.map_err(|e| match e {
                BodyError::TooLarge => HandlerError::permanent(format!(
                    "http: the response to {target} is larger than the task output limit of {limit} bytes",
                    limit = self.output_limit
                )),
                BodyError::Read(e) => spec.transport_error(e),
            })?;
            return Ok(output(&body));
        }
        Err(failure(&target, status, response, &secrets).await)
    }

    /// The config's headers, and the values taken from the environment
    /// (redacted from anything the server echoes back).
    fn headers(&self, spec: &Spec) -> Result<(HeaderMap, Vec<String>), HandlerError> {
        let mut map = HeaderMap::new();
        let mut secrets = Vec::new();
        for (name, parsed, source) in &spec.headers {
            let mut value = match source {
                HeaderSource::Literal(value) => HeaderValue::from_str(value).map_err(|_| {
                    HandlerError::permanent(format!("http: config.headers.{name}: not a valid header value"))
                })?,
                HeaderSource::Env(var) => {
                    let secret = (self.env)(var).ok_or_else(|| {
                        HandlerError::permanent(format!(
                            "http: config.headers.{name}: the environment variable {var} is not set on this worker"
                        ))
                    })?;
                    let value = HeaderValue::from_str(&secret).map_err(|_| {
                        HandlerError::permanent(format!(
                            "http: config.headers.{name}: the environment variable {var} is not a valid header value"
                        ))
                    })?;
                    secrets.push(secret);
                    value
                }
            };
            value.set_sensitive(true);
            map.append(parsed.clone(), value);
        }
        Ok((map, secrets))
    }
}

impl Handler for HttpTask {
    async fn run(&self, ctx: TaskContext) -> Result<Value, HandlerError> {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(HandlerError::retryable("http: cancelled")),
            result = self.attempt(&ctx) => result,
        }
    }
}

/// Makes ring the process's default rustls provider, unless one is set.
///
/// Cargo unifies features: once this crate is linked, every reqwest
/// client in the binary is built with rustls but without a provider of its
/// own, and reqwest panics when building a client (an OTLP exporter's, a
/// test's) while no default is installed. A binary that builds other
/// reqwest clients calls this before them; [`HttpTask::new`] calls it too.
/// Idempotent.
pub fn install_default_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which is all we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// rustls over ring with Mozilla's roots, handed to reqwest whole: no
/// process-wide crypto provider is installed or needed.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // reqwest speaks only HTTP/1 here (no `http2` feature).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFrom {
    Inputs,
    RunInput,
    /// A child of a mapped task: its item (docs/design/map.md#children).
    Item,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HeaderSource {
    Literal(String),
    /// The name of a variable of the worker's environment.
    Env(String),
}

/// A validated `http` config.
#[derive(Debug, Clone)]
struct Spec {
    method: Method,
    url: Url,
    /// As written (messages name it so), parsed, and its value.
    headers: Vec<(String, HeaderName, HeaderSource)>,
    body_from: Option<BodyFrom>,
    timeout: Option<Duration>,
    success_codes: Vec<u16>,
}

fn bad(field: impl fmt::Display, what: impl fmt::Display) -> HandlerError {
    HandlerError::permanent(format!("http: config.{field}: {what}"))
}

impl Spec {
    /// Reads the task's config. A bad field is a permanent failure naming
    /// it: no retry can fix a definition.
    fn from_config(config: &Map<String, Value>) -> Result<Self, HandlerError> {
        if let Some(unknown) = config.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(bad(
                unknown,
                format!("unknown field (expected one of {})", FIELDS.join(", ")),
            ));
        }
        let method = match config.get("method") {
            None | Some(Value::Null) => Method::GET,
            Some(Value::String(m)) => METHODS
                .iter()
                .find(|known| known.as_str().eq_ignore_ascii_case(m))
                .cloned()
                .ok_or_else(|| {
                    bad(
                        "method",
                        format!("{m:?} is not one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
                    )
                })?,
            Some(_) => return Err(bad("method", "expected a string")),
        };
        let url = match config.get("url") {
            Some(Value::String(url)) => Url::parse(url).map_err(|e| bad("url", format!("not a URL: {e}")))?,
            Some(_) => return Err(bad("url", "expected a string")),
            None => return Err(bad("url", "required")),
        };
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(
                "url",
                format!("the scheme must be http or https, not {}", url.scheme()),
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("url", "has no host"));
        }
        // Credentials in a URL would sit in the stored definition and in
        // every error quoting it; a header can take them from the worker.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad(
                "url",
                "must not carry credentials; use a header with {\"env\": NAME}",
            ));
        }
        let headers = match config.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(map)) => map.iter().map(|(n, v)| header(n, v)).collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("headers", "expected an object")),
        };
        let body_from = match config.get("body_from") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "inputs" => Some(BodyFrom::Inputs),
            Some(Value::String(s)) if s == "run_input" => Some(BodyFrom::RunInput),
            Some(Value::String(s)) if s == "item" => Some(BodyFrom::Item),
            Some(other) => {
                return Err(bad(
                    "body_from",
                    format!("expected \"inputs\", \"run_input\", \"item\" or null, not {other}"),
                ));
            }
        };
        let timeout = match config.get("timeout_seconds") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|s| *s > 0.0)
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| {
                        bad(
                            "timeout_seconds",
                            format!("expected a positive number of seconds, not {v}"),
                        )
                    })?,
            ),
        };
        let success_codes = match config.get("success_codes") {
            None | Some(Value::Null) => DEFAULT_SUCCESS_CODES.to_vec(),
            Some(Value::Array(codes)) if !codes.is_empty() => codes
                .iter()
                .enumerate()
                .map(|(i, code)| {
                    code.as_u64()
                        .filter(|c| (100..=599).contains(c))
                        .and_then(|c| u16::try_from(c).ok())
                        .ok_or_else(|| {
                            bad(
                                format_args!("success_codes[{i}]"),
                                format!("expected a status code 100..=599, not {code}"),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("success_codes", "expected a non-empty array of status codes")),
        };
        Ok(Self {
            method,
            url,
            headers,
            body_from,
            timeout,
            success_codes,
        })
    }

    /// `METHOD url`, as messages name the request.
    fn target(&self) -> String {
        format!("{} {}", self.method, self.url)
    }

    /// A request that got no (complete) response. Retryable — the network
    /// or the server may recover — except an address refused at
    /// connection time.
    fn transport_error(&self, e: reqwest::Error) -> HandlerError {
        let target = self.target();
        if let Some(refused) = refusal(&e) {
            return HandlerError::permanent(format!("http: refused {target}: {refused}"));
        }
        if e.is_timeout() {
            let after = self
                .timeout
                .map(|t| format!(" after {}s", t.as_secs_f64()))
                .unwrap_or_default();
            return HandlerError::retryable(format!("http: {target} timed out{after}"));
        }
        HandlerError::retryable(format!("http: {target} failed: {}", causes(e)))
    }
}

/// One `config.headers` entry.
fn header(name: &str, value: &Value) -> Result<(String, HeaderName, HeaderSource), HandlerError> {
    let field = format!("headers.{name}");
    let parsed = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad(&field, "not a valid header name"))?;
    if RESERVED_HEADERS.contains(&parsed.as_str()) {
        return Err(bad(&field, "set by the http task type itself"));
    }
    let source = match value {
        Value::String(s) => HeaderSource::Literal(s.clone()),
        Value::Object(o) => match (o.len(), o.get("env")) {
            (1, Some(Value::String(var))) if !var.is_empty() && !var.contains(['=', '\0']) => {
                HeaderSource::Env(var.clone())
            }
            _ => return Err(bad(&field, "expected a string or {\"env\": NAME}")),
        },
        _ => return Err(bad(&field, "expected a string or {\"env\": NAME}")),
    };
    Ok((name.to_owned(), parsed, source))
}

/// The address refusal behind a failed connection, if that is what it was:
/// the resolver's error travels in reqwest's chain of sources.
fn refusal(e: &reqwest::Error) -> Option<&Refused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(refused) = err.downcast_ref::<Refused>() {
            return Some(refused);
        }
        source = err.source();
    }
    None
}

/// An error and its sources, `: `-separated: reqwest's own message alone
/// ("error sending request") does not say what went wrong.
fn causes(e: reqwest::Error) -> String {
    // The message names the URL already.
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(err) = source {
        let next = err.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = err.source();
    }
    text
}

#[derive(Debug)]
enum BodyError {
    TooLarge,
    Read(reqwest::Error),
}

/// The body, read chunk by chunk and given up on as soon as it passes
/// `limit`, so an endless response costs no more than that.
async fn read_body(mut response: Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    if response
        .content_length()
        .is_some_and(|n| usize::try_from(n).map_or(true, |n| n > limit))
    {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
        if chunk.len() > limit - body.len() {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Up to `limit` bytes of the body; whatever was read if reading fails.
async fn read_prefix(mut response: Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(limit);
    body
}

/// The output a successful response gives: its JSON; `null` for an empty
/// body; the text as a string when it is not JSON.
fn output(body: &[u8]) -> Value {
    if body.trim_ascii().is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// A response whose status is not a success code: 5xx and 429 may pass,
/// anything else will not.
async fn failure(target: &str, status: StatusCode, response: Response, secrets: &[String]) -> HandlerError {
    let retry_after = retry_after(response.headers(), SystemTime::now());
    // A secret straddling the excerpt's end is read whole, so it is
    // redacted whole rather than cut into a quotable prefix.
    let longest = secrets.iter().map(String::len).max().unwrap_or(0);
    let body = read_prefix(response, EXCERPT_BYTES + longest).await;
    let excerpt = excerpt(&body, secrets);
    let message = if excerpt.is_empty() {
        format!("http: {target} returned {status}")
    } else {
        format!("http: {target} returned {status}: {excerpt}")
    };
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        match retry_after {
            Some(after) => HandlerError::retryable_after(message, after),
            None => HandlerError::retryable(message),
        }
    } else {
        HandlerError::permanent(message)
    }
}

/// The first `EXCERPT_CHARS` characters of a body, secrets redacted.
fn excerpt(body: &[u8], secrets: &[String]) -> String {
    let mut text = String::from_utf8_lossy(body).into_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "[redacted]");
    }
    let text = text.trim();
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => format!("{}…", text[..end].trim_end()),
        None => text.to_owned(),
    }
}

/// A `Retry-After` header: delta-seconds or an HTTP-date (a date already
/// past is no wait), capped at `MAX_RETRY_AFTER`.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}
