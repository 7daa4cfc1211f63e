//! `flowforge tokens create|list|revoke`: the API's bearer tokens
//! (docs/design/server.md#tokens). A secret is printed once, at creation;
//! the store keeps only its SHA-256.

use std::time::Duration;

use flowforge_app::tokens::{self, ApiScope};
use flowforge_ports::Store;
use flowforge_ports::store::TokenStatus;

use super::common::parse_duration;
use super::store::with_store;
use super::{Exit, Global, fail, print_report};

/// `flowforge tokens …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Create a token and print its secret (shown only this once).
    Create {
        /// Its unique name.
        #[arg(long)]
        name: String,
        /// What it may do (repeat): definitions:read, definitions:write,
        /// runs:read, runs:write, workers:read, worker, admin.
        #[arg(long = "scope", required = true, value_parser = parse_scope)]
        scopes: Vec<ApiScope>,
        /// How long it is good for: a number with s, m, h or d (`30d`).
        /// Default: until revoked.
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        expires_in: Option<Duration>,
    },
    /// Every token: name, scopes, status (never a secret).
    List,
    /// Revoke a token by name; requests with it get 401 from then on.
    Revoke {
        /// The token's name.
        name: String,
    },
}

fn parse_scope(s: &str) -> Result<ApiScope, String> {
    s.parse().map_err(|e: tokens::UnknownScope| e.to_string())
}

/// Runs a `tokens` subcommand.
pub(crate) async fn run(global: &Global, command: Command) -> anyhow::Result<Exit> {
    with_store!(global, |store| execute(&store, command).await)
}

async fn execute<S: Store>(store: &S, command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Create {
            name,
            scopes,
            expires_in,
        } => match tokens::create(store, &name, &scopes, expires_in).await {
            Ok(minted) => {
                print_report(&format!("{}\n", minted.secret))?;
                eprintln!(
                    "token '{}' created with scopes {}{}; the secret above is not shown again",
                    minted.token.name,
                    minted.token.scopes.join(", "),
                    minted
                        .token
                        .expires_at
                        .map(|t| format!(", expiring {}", t.to_rfc3339()))
                        .unwrap_or_default()
                );
                Ok(Exit::Ok)
            }
            Err(e) => Ok(fail(&e)),
        },
        Command::List => {
            let mut text = format!("{:<24} {:<8} {:<26} {}\n", "NAME", "STATUS", "EXPIRES", "SCOPES");
            for t in store.list_tokens().await? {
                let status = match t.status {
                    TokenStatus::Active => "active",
                    TokenStatus::Expired => "expired",
                    TokenStatus::Revoked => "revoked",
                };
                let expires = t.expires_at.map_or_else(|| "never".to_owned(), |e| e.to_rfc3339());
                text.push_str(&format!(
                    "{:<24} {:<8} {:<26} {}\n",
                    t.name,
                    status,
                    expires,
                    t.scopes.join(",")
                ));
            }
            print_report(&text)?;
            Ok(Exit::Ok)
        }
        Command::Revoke { name } => {
            if store.revoke_token(&name).await? {
                eprintln!("token '{name}' revoked");
                Ok(Exit::Ok)
            } else {
                eprintln!("error: no active token named '{name}'");
                Ok(Exit::Invalid)
            }
        }
    }
}
