//! The token store's statements.

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
pub(crate) const CREATE_TOKEN: &str = concat!(
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
pub(crate) const TOKEN_BY_HASH: &str = concat!("SELECT ", token_columns!(), " FROM api_token WHERE hash = ?2");

/// list_tokens, by name (primary key).
pub(crate) const LIST_TOKENS: &str = concat!("SELECT ", token_columns!(), " FROM api_token ORDER BY name");

/// revoke_token in one call: only a token not yet revoked. `?2` name.
pub(crate) const REVOKE_TOKEN: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE api_token SET revoked_at = ",
    now!(),
    " WHERE name = ?2 AND revoked_at IS NULL RETURNING name; COMMIT"
);
