//! `flowforge migrate`: apply the store's migrations to `--db`.

use std::sync::Arc;

use flowforge_adapters_postgres::PgStore;
use flowforge_ports::SystemClock;

use super::store::{Kind, kind, redact, sqlite};
use super::{Exit, Global};

/// Arguments of `flowforge migrate` (none besides the global `--db`).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

/// `flowforge migrate`.
pub(crate) async fn run(global: &Global, _args: &Args) -> anyhow::Result<Exit> {
    let url = global.db.as_str();
    let result = match kind(url) {
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(Exit::Invalid);
        }
        // Opening a SQLite store applies its migrations.
        Ok(Kind::Sqlite) => sqlite(url).await.map(|_| ()),
        Ok(Kind::Postgres) => {
            async {
                let store = PgStore::connect_unchecked(url, Arc::new(SystemClock), global.pg_options()).await?;
                store.migrate().await?;
                anyhow::Ok(())
            }
            .await
        }
    };
    match result {
        Ok(()) => {
            println!("{} is migrated", redact(url));
            Ok(Exit::Ok)
        }
        Err(e) => {
            eprintln!("error: migrating {}: {e:#}", redact(url));
            Ok(Exit::Infrastructure)
        }
    }
}
