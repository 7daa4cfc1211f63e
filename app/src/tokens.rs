//! API tokens: what a token may do (its scopes), minting a secret that is
//! shown once, and deciding whether a presented secret grants a scope.
//! Only the secret's SHA-256 is ever stored (docs/design/server.md#tokens).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use flowforge_ports::store::{NewToken, TokenError, TokenStatus, TokenStore, TokenView};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::Error;

/// Every secret starts with this, so a leaked one is easy to recognise
/// (and to scan for).
pub const SECRET_PREFIX: &str = "ff_";

/// What a token may do. `admin` grants every scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiScope {
    /// Read definitions.
    DefinitionsRead,
    /// Publish definitions.
    DefinitionsWrite,
    /// Read runs, their attempts and events.
    RunsRead,
    /// Start and cancel runs.
    RunsWrite,
    /// Read the worker registry.
    WorkersRead,
    /// Claim, heartbeat and finish task runs as a remote worker
    /// (docs/design/handlers.md#remote-workers).
    Worker,
    /// Everything, metrics included.
    Admin,
}

impl ApiScope {
    /// Every scope, in the order they are documented.
    pub const ALL: [Self; 7] = [
        Self::DefinitionsRead,
        Self::DefinitionsWrite,
        Self::RunsRead,
        Self::RunsWrite,
        Self::WorkersRead,
        Self::Worker,
        Self::Admin,
    ];

    /// Its name, as written in `--scope` and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DefinitionsRead => "definitions:read",
            Self::DefinitionsWrite => "definitions:write",
            Self::RunsRead => "runs:read",
            Self::RunsWrite => "runs:write",
            Self::WorkersRead => "workers:read",
            Self::Worker => "worker",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for ApiScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A scope name that is not one of [`ApiScope::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown scope '{0}'; scopes are definitions:read, definitions:write, runs:read, runs:write, workers:read, worker, admin"
)]
pub struct UnknownScope(pub String);

impl FromStr for ApiScope {
    type Err = UnknownScope;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| UnknownScope(s.to_owned()))
    }
}

/// A token just created: the secret exists only here, once.
#[derive(Debug, Clone)]
pub struct Minted {
    /// The secret to hand to the client (`ff_` + 64 hex digits).
    pub secret: String,
    /// What was stored.
    pub token: TokenView,
}

/// Who a presented secret is, or why it is refused (each a 401).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A good token: its name and scopes.
    Granted {
        /// The token's name (safe to log; the secret never is).
        name: String,
        /// What it may do.
        scopes: Vec<ApiScope>,
    },
    /// No token has this secret.
    Unknown,
    /// The token is past its expiry.
    Expired,
    /// The token was revoked.
    Revoked,
}

impl Verdict {
    /// Whether a granted token may use a route needing `scope`.
    pub fn allows(&self, scope: ApiScope) -> bool {
        matches!(self, Self::Granted { scopes, .. } if scopes.iter().any(|s| *s == scope || *s == ApiScope::Admin))
    }
}

/// The SHA-256 of a secret, lower-case hex: what the store keeps.
pub fn digest(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Creates a token named `name` with `scopes`, good for `expires_in`
/// (`None`: until revoked). The secret comes from the operating system's
/// random source.
pub async fn create<S: TokenStore>(
    store: &S,
    name: &str,
    scopes: &[ApiScope],
    expires_in: Option<Duration>,
) -> Result<Minted, Error> {
    if name.is_empty() || name.len() > 100 || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::InvalidToken(format!(
            "a token name is 1 to 100 characters without spaces or control characters, not {name:?}"
        )));
    }
    if scopes.is_empty() {
        return Err(Error::InvalidToken("a token needs at least one --scope".to_owned()));
    }
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| Error::InvalidToken(format!("the system's random source failed: {e}")))?;
    let secret = format!("{SECRET_PREFIX}{}", hex(&raw));
    let mut names: Vec<String> = scopes.iter().map(|s| s.as_str().to_owned()).collect();
    names.sort();
    names.dedup();
    let token = store
        .create_token(&NewToken {
            name: name.to_owned(),
            hash: digest(&secret),
            scopes: names,
            expires_in,
        })
        .await
        .map_err(|e| match e {
            TokenError::NameTaken(name) => Error::TokenNameTaken(name),
            TokenError::Store(e) => Error::from(e),
        })?;
    Ok(Minted { secret, token })
}

/// Decides what `secret` grants. The stored digest is found by the
/// presented one's, then compared again in constant time, so neither
/// the lookup nor the comparison tells an attacker how close a guess was.
pub async fn verify<S: TokenStore>(store: &S, secret: &str) -> Result<Verdict, Error> {
    let presented = digest(secret);
    let Some(token) = store.token_by_hash(&presented).await? else {
        return Ok(Verdict::Unknown);
    };
    if !bool::from(token.hash.as_bytes().ct_eq(presented.as_bytes())) {
        return Ok(Verdict::Unknown);
    }
    Ok(match token.status {
        TokenStatus::Expired => Verdict::Expired,
        TokenStatus::Revoked => Verdict::Revoked,
        // A scope this binary does not know (written by a newer one)
        // grants nothing here rather than failing every request.
        TokenStatus::Active => Verdict::Granted {
            name: token.name,
            scopes: token.scopes.iter().filter_map(|s| s.parse().ok()).collect(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_round_trip_and_unknown_ones_are_named() {
        for scope in ApiScope::ALL {
            assert_eq!(scope.as_str().parse::<ApiScope>(), Ok(scope));
        }
        let err = "runs:delete".parse::<ApiScope>().unwrap_err();
        assert!(err.to_string().contains("'runs:delete'"), "{err}");
    }

    #[test]
    fn admin_allows_every_scope_and_others_only_their_own() {
        let admin = Verdict::Granted {
            name: "a".into(),
            scopes: vec![ApiScope::Admin],
        };
        let reader = Verdict::Granted {
            name: "r".into(),
            scopes: vec![ApiScope::RunsRead],
        };
        for scope in ApiScope::ALL {
            assert!(admin.allows(scope));
            assert_eq!(reader.allows(scope), scope == ApiScope::RunsRead);
            assert!(!Verdict::Revoked.allows(scope));
        }
    }

    #[test]
    fn the_digest_is_sha256_hex() {
        assert_eq!(
            digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
