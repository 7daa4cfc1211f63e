//! The API tokens (the token store): a digest per token, its scopes, and
//! its expiry and revocation, judged in store time.

use flowforge_ports::TokenStore;
use flowforge_ports::store::{self, NewToken, TokenError, TokenView};

use crate::error::store_error;
use crate::queries;
use crate::rows::TokenRow;
use crate::store::{PgStore, interval};

impl TokenStore for PgStore {
    async fn create_token(&self, token: &NewToken) -> Result<TokenView, TokenError> {
        let lifetime = token.expires_in.map(interval).transpose()?;
        let row: Option<TokenRow> = sqlx::query_as(queries::CREATE_TOKEN)
            .bind(self.offset())
            .bind(&token.name)
            .bind(&token.hash)
            .bind(&token.scopes)
            .bind(lifetime)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        match row {
            Some(row) => Ok(row.into_view()?),
            None => Err(TokenError::NameTaken(token.name.clone())),
        }
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenView>, store::Error> {
        let row: Option<TokenRow> = sqlx::query_as(queries::TOKEN_BY_HASH)
            .bind(self.offset())
            .bind(hash)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        row.map(TokenRow::into_view).transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenView>, store::Error> {
        let rows: Vec<TokenRow> = sqlx::query_as(queries::LIST_TOKENS)
            .bind(self.offset())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(TokenRow::into_view).collect()
    }

    async fn revoke_token(&self, name: &str) -> Result<bool, store::Error> {
        let done = sqlx::query(queries::REVOKE_TOKEN)
            .bind(self.offset())
            .bind(name)
            .execute(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(done.rows_affected() > 0)
    }
}
