//! The API tokens a server accepts: only a digest of each is stored, and
//! whether one is still good is decided in store time.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Error;

/// A token to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    /// Its unique name (how operators list and revoke it).
    pub name: String,
    /// The SHA-256 of the secret, lower-case hex; the secret itself is
    /// never given to the store.
    pub hash: String,
    /// What it may do.
    pub scopes: Vec<String>,
    /// How long from now (store time) it is good for; `None`: until revoked.
    pub expires_in: Option<Duration>,
}

/// Whether a token is good, as of store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStatus {
    /// Good.
    Active,
    /// Past its expiry.
    Expired,
    /// Revoked.
    Revoked,
}

/// A recorded token (never its secret).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenView {
    /// Its name.
    pub name: String,
    /// The SHA-256 of the secret, lower-case hex.
    pub hash: String,
    /// What it may do.
    pub scopes: Vec<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it stops being good, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Active, expired or revoked, as of store now.
    pub status: TokenStatus,
}

/// Why a token was not created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The name is taken (by a token of any status: names are never reused).
    #[error("a token named '{0}' already exists; pick another name")]
    NameTaken(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] Error),
}

/// API tokens.
pub trait TokenStore: Send + Sync + 'static {
    /// Records a token. Contract: a taken name MUST give
    /// [`TokenError::NameTaken`], also when two calls race for it.
    fn create_token(&self, token: &NewToken) -> impl Future<Output = Result<TokenView, TokenError>> + Send;

    /// The token whose digest is `hash`, with its status as of store now.
    fn token_by_hash(&self, hash: &str) -> impl Future<Output = Result<Option<TokenView>, Error>> + Send;

    /// Every token, by name.
    fn list_tokens(&self) -> impl Future<Output = Result<Vec<TokenView>, Error>> + Send;

    /// Revokes the token `name` as of store now. `Ok(false)`: no such
    /// token, or it was already revoked.
    fn revoke_token(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send;
}
