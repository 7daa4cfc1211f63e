//! The token store's statements.

/// A token's columns, its status as of store now last (`$1` the offset): a
/// revocation outranks an expiry.
macro_rules! token_columns {
    () => {
        concat!(
            "name, hash, scopes, created_at, expires_at, revoked_at,
       CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN expires_at <= ",
            now!(),
            " THEN 'expired' ELSE 'active' END AS status"
        )
    };
}

/// create_token: nothing when the name is taken (also by a concurrent
/// insert, once it commits). `$1` offset, `$2` name, `$3` hash, `$4`
/// scopes, `$5` lifetime (NULL: until revoked).
pub const CREATE_TOKEN: &str = concat!(
    "INSERT INTO api_token (name, hash, scopes, created_at, expires_at)
VALUES ($2, $3, $4, ",
    now!(),
    ", ",
    now!(),
    " + $5::interval)
ON CONFLICT (name) DO NOTHING
RETURNING ",
    token_columns!()
);

/// token_by_hash (`uniq_apitoken_hash`). `$1` offset, `$2` hash.
pub const TOKEN_BY_HASH: &str = concat!("SELECT ", token_columns!(), " FROM api_token WHERE hash = $2");

/// list_tokens, by name (primary key). `$1` offset.
pub const LIST_TOKENS: &str = concat!("SELECT ", token_columns!(), " FROM api_token ORDER BY name");

/// revoke_token: only a token not yet revoked. `$1` offset, `$2` name.
pub const REVOKE_TOKEN: &str = concat!(
    "UPDATE api_token SET revoked_at = ",
    now!(),
    " WHERE name = $2 AND revoked_at IS NULL"
);
