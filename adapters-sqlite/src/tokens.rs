//! The API tokens (the token store): a digest per token, its scopes, and
//! its expiry and revocation, judged in store time.

use flowforge_ports::TokenStore;
use flowforge_ports::store::{self, NewToken, TokenError, TokenView};

use crate::error::is_unique_violation;
use crate::queries;
use crate::rows::TokenRow;
use crate::rows::{decode, duration_ms};
use crate::store::{Failure, SqliteStore, padded, sql};

impl TokenStore for SqliteStore {
    async fn create_token(&self, token: &NewToken) -> Result<TokenView, TokenError> {
        let scopes = serde_json::to_string(&token.scopes).map_err(|e| store::Error::Other(e.to_string()))?;
        let offset = self.inner.offset();
        let called = self
            .inner
            .write()
            .await?
            .call_sqlx(padded(
                sql(queries::CREATE_TOKEN)
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
            .call(
                sql(queries::TOKEN_BY_HASH)
                    .bind(self.inner.offset())
                    .bind(hash.to_owned()),
            )
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
            .call(sql(queries::LIST_TOKENS).bind(self.inner.offset()))
            .await?;
        rows.iter().map(|r| Ok(decode::<TokenRow>(r)?.into_view()?)).collect()
    }

    async fn revoke_token(&self, name: &str) -> Result<bool, store::Error> {
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(sql(queries::REVOKE_TOKEN).bind(offset).bind(name.to_owned())))
            .await?;
        Ok(!rows.is_empty())
    }
}
