//! The API tokens (the token store): a digest per token, its scopes, and
//! its expiry and revocation, judged in store time.

use flowforge_ports::TokenStore;
use flowforge_ports::store::{self, NewToken, TokenError, TokenStatus, TokenView};

use crate::convert::{decode, duration_ms, json, opt_time, time};
use crate::error::{DecodeError, is_unique_violation};
use crate::store::{Failure, SqliteStore, padded, sql};

/// A token's columns, its status as of store now last (`?1` the offset):
/// a revocation outranks an expiry.
macro_rules! token_columns {
    () => {
        concat!(
            "name, hash, scopes, created_at, expires_at, revoked_at, \
             CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN expires_at <= ",
            now!(),
            " THEN 'expired' ELSE 'active' END AS status"
        )
    };
}

/// create_token in one call. `?2` name, `?3` hash, `?4` scopes (a JSON
/// array), `?5` lifetime in ms (NULL: until revoked). A taken name breaks
/// the primary key, which fails the call.
pub(crate) const CREATE: &str = concat!(
    "BEGIN IMMEDIATE; \
     INSERT INTO api_token (name, hash, scopes, created_at, expires_at) VALUES (?2, ?3, ?4, ",
    now!(),
    ", ",
    now!(),
    " + ?5) RETURNING ",
    token_columns!(),
    "; COMMIT"
);

/// token_by_hash (`uniq_apitoken_hash`). `?2` hash.
const BY_HASH: &str = concat!("SELECT ", token_columns!(), " FROM api_token WHERE hash = ?2");

/// list_tokens, by name (primary key).
const LIST: &str = concat!("SELECT ", token_columns!(), " FROM api_token ORDER BY name");

/// revoke_token in one call: only a token not yet revoked. `?2` name.
pub(crate) const REVOKE: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE api_token SET revoked_at = ",
    now!(),
    " WHERE name = ?2 AND revoked_at IS NULL RETURNING name; COMMIT"
);

#[derive(Debug, sqlx::FromRow)]
struct TokenRow {
    name: String,
    hash: String,
    scopes: String,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
    status: String,
}

impl TokenRow {
    fn into_view(self) -> Result<TokenView, DecodeError> {
        let scopes =
            serde_json::from_value(json("api_token.scopes", &self.scopes)?).map_err(|e| DecodeError::Json {
                column: "api_token.scopes",
                problem: e.to_string(),
            })?;
        let status = match self.status.as_str() {
            "active" => TokenStatus::Active,
            "expired" => TokenStatus::Expired,
            "revoked" => TokenStatus::Revoked,
            _ => {
                return Err(DecodeError::UnknownName {
                    column: "api_token status",
                    value: self.status,
                });
            }
        };
        Ok(TokenView {
            name: self.name,
            hash: self.hash,
            scopes,
            created_at: time("api_token.created_at", self.created_at)?,
            expires_at: opt_time("api_token.expires_at", self.expires_at)?,
            revoked_at: opt_time("api_token.revoked_at", self.revoked_at)?,
            status,
        })
    }
}

impl TokenStore for SqliteStore {
    async fn create_token(&self, token: &NewToken) -> Result<TokenView, TokenError> {
        let scopes = serde_json::to_string(&token.scopes).map_err(|e| store::Error::Other(e.to_string()))?;
        let offset = self.inner.offset();
        let called = self
            .inner
            .write()
            .await?
            .call_sqlx(padded(
                sql(CREATE)
                    .bind(offset)
                    .bind(token.name.clone())
                    .bind(token.hash.clone())
                    .bind(scopes)
                    .bind(token.expires_in.map(duration_ms)),
            ))
            .await;
        let rows = match called {
            Ok(rows) => rows,
            Err(Failure::Sqlx(e)) if is_unique_violation(&e) && e.to_string().contains("api_token.name") => {
                return Err(TokenError::NameTaken(token.name.clone()));
            }
            Err(e) => return Err(e.into_store().into()),
        };
        let Some(row) = rows.first() else {
            return Err(store::Error::Other("creating a token returned no row".into()).into());
        };
        Ok(decode::<TokenRow>(row)?.into_view().map_err(store::Error::from)?)
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenView>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(BY_HASH).bind(self.inner.offset()).bind(hash.to_owned()))
            .await?;
        rows.first()
            .map(|r| Ok(decode::<TokenRow>(r)?.into_view()?))
            .transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenView>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(LIST).bind(self.inner.offset()))
            .await?;
        rows.iter().map(|r| Ok(decode::<TokenRow>(r)?.into_view()?)).collect()
    }

    async fn revoke_token(&self, name: &str) -> Result<bool, store::Error> {
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(sql(REVOKE).bind(offset).bind(name.to_owned())))
            .await?;
        Ok(!rows.is_empty())
    }
}
