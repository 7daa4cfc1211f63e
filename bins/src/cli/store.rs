//! Opening the store `--db` names: SQLite (embedded, migrated on open) or
//! PostgreSQL (migrated by `flowforge migrate`). Commands are generic over
//! the store; [`with_store!`](crate::cli::store::with_store) picks the
//! concrete type from the URL.

use std::sync::Arc;

use anyhow::Context;
use flowforge::SqliteStore;
use flowforge_adapters_postgres::{PgOptions, PgStore};
use flowforge_ports::SystemClock;

/// Which kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `sqlite:`…
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
}

/// Classifies a `--db` URL, refusing anything else with a usage error.
pub(crate) fn kind(url: &str) -> Result<Kind, String> {
    if url.starts_with("sqlite:") {
        Ok(Kind::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Kind::Postgres)
    } else {
        Err(format!(
            "--db {:?} is not a store URL: use sqlite://path.db, sqlite::memory: or postgres://user@host/db",
            redact(url)
        ))
    }
}

/// Opens a SQLite store, creating and migrating it as needed.
pub(crate) async fn sqlite(url: &str) -> anyhow::Result<SqliteStore> {
    SqliteStore::connect(url, Arc::new(SystemClock))
        .await
        .with_context(|| format!("opening {}", redact(url)))
}

/// Opens a PostgreSQL store whose migrations are applied.
pub(crate) async fn postgres(url: &str, options: PgOptions) -> anyhow::Result<PgStore> {
    PgStore::connect(url, Arc::new(SystemClock), options)
        .await
        .with_context(|| format!("opening {}", redact(url)))
}

/// The URL without its password, for messages: the password of the user
/// info and the value of a `password=` query parameter become `***`. A
/// string that is no URL at all (`user:secret@host`) loses everything
/// between its first `:` and its last `@`.
pub(crate) fn redact(url: &str) -> String {
    let (head, query) = url.split_once('?').map_or((url, None), |(h, q)| (h, Some(q)));
    let (scheme, rest) = head.split_once("://").map_or(("", head), |(s, r)| (s, r));
    let end = if scheme.is_empty() {
        rest.len()
    } else {
        rest.find(['/', '#']).unwrap_or(rest.len())
    };
    let (authority, path) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let mut out = if scheme.is_empty() {
        authority
    } else {
        format!("{scheme}://{authority}")
    };
    out.push_str(path);
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

/// Opens the store `$global.db` names (tuned by `$global`'s PostgreSQL
/// options) as `$store` and evaluates `$body` with it; an unknown scheme
/// prints a usage error and evaluates to `Exit::Invalid`, a store that
/// cannot be opened to `Exit::Infrastructure`.
macro_rules! with_store {
    ($global:expr, |$store:ident| $body:expr) => {{
        let global: &$crate::cli::Global = $global;
        let url: &str = &global.db;
        match $crate::cli::store::kind(url) {
            Err(message) => {
                eprintln!("error: {message}");
                Ok($crate::cli::Exit::Invalid)
            }
            Ok($crate::cli::store::Kind::Sqlite) => match $crate::cli::store::sqlite(url).await {
                Ok($store) => $body,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    Ok($crate::cli::Exit::Infrastructure)
                }
            },
            Ok($crate::cli::store::Kind::Postgres) => {
                match $crate::cli::store::postgres(url, global.pg_options()).await {
                    Ok($store) => $body,
                    Err(e) => {
                        eprintln!("error: {e:#}");
                        Ok($crate::cli::Exit::Infrastructure)
                    }
                }
            }
        }
    }};
}
pub(crate) use with_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_classified_and_redacted() {
        assert_eq!(kind("sqlite::memory:"), Ok(Kind::Sqlite));
        assert_eq!(kind("postgresql://x/y"), Ok(Kind::Postgres));
        assert!(kind("mysql://x").is_err());
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=disable&password=secret"),
            "postgres://u@h/db?sslmode=disable&password=***"
        );
        assert_eq!(redact("postgres://u:a@b@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("u:secret@h/db"), "u:***@h/db");
        assert_eq!(
            redact("postgres://h/db?PASSWORD=secret"),
            "postgres://h/db?PASSWORD=***"
        );
        for url in ["mysql://u:secret@h/db", "x:secret@h"] {
            assert!(!kind(url).unwrap_err().contains("secret"), "{url}");
        }
    }
}
