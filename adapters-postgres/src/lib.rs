//! FlowForge's store ports over PostgreSQL: the distributed source of truth.
//!
//! [`PgStore`] implements every store port of `flowforge-ports` with sqlx's
//! runtime API (no compile-time checked queries, so a build needs no
//! database). The rules it keeps:
//!
//! * Every task-run transition is ONE conditional `UPDATE … WHERE id = $ AND
//!   state = $ [AND fencing_token = $]`, decided by the database, with its
//!   event row written by the same statement (a data-modifying CTE on the
//!   `UPDATE … RETURNING`), so the event exists iff the row changed. No
//!   application lock, no retry loop; the one `SELECT … FOR UPDATE` on a
//!   task row is a finish handing on, which locks its own row before the
//!   rows it makes ready (docs/design/scheduler.md#handoff).
//! * Store time is the database clock plus the [`Clock`](flowforge_ports::Clock)
//!   offset, bound per statement; Rust's clock never enters the arithmetic.
//! * A scheduler pass holds its run with `FOR NO KEY UPDATE SKIP LOCKED`, so any
//!   number of schedulers run side by side; the outbox sweep does the same
//!   to its rows.
//! * Wake-ups travel by `LISTEN/NOTIFY`, sent right after the writing
//!   commit (never inside it: a notifying commit holds a global lock through
//!   its WAL flush), and wake this process's own waiters directly.
//!
//! The schema lives in `migrations/`, embedded in the binary; [`PgStore::connect`]
//! refuses a database whose migrations are not applied, and
//! [`PgStore::migrate`] applies them.
//!
//! The crate is laid out as the SQLite store is, file for file: SQL by
//! concern in `queries/`, row decoding in `rows.rs`, one file per port
//! implementation (ARCHITECTURE.md, "adapters-sqlite, adapters-postgres").

mod definitions;
mod error;
mod notify;
mod outbox;
mod pass;
pub mod queries;
mod rows;
mod runs;
mod schedules;
mod store;
mod tokens;
mod workers;

pub use notify::PgNotifier;
pub use outbox::PgSweep;
pub use pass::PgRunPass;
pub use store::{PgOptions, PgStore, UNCHECKED_IDLE};
