//! FlowForge's store ports over SQLite: the embedded store (DESIGN §4, §5).
//!
//! [`SqliteStore`] implements every store port — definitions, runs and task
//! runs, the scheduler pass, the outbox and the worker registry — over one
//! database file in WAL mode (or one shared in-memory connection).
//!
//! SQLite has a single writer per database. Rather than let in-process
//! writers collide on the file lock and sleep through `SQLITE_BUSY` retries,
//! every write goes through ONE writer connection, so writers queue
//! asynchronously in the pool; reads use a separate small pool and see the
//! last committed state (WAL snapshots). Every write transaction starts
//! with `BEGIN IMMEDIATE`, so another process's writer makes it wait on the
//! busy timeout at `BEGIN` instead of failing half-way through.
//!
//! Store time is SQLite's own clock plus the [`Clock`](flowforge_ports::Clock)
//! offset, computed inside each statement (`?1` of every query that needs
//! it); times are stored as INTEGER milliseconds since the Unix epoch.
//!
//! A consequence of the single writer: while a [`SqlitePass`] is open it
//! holds the writer, so the task that opened it must not call another
//! writing method of the store before committing or dropping it (it would
//! wait for itself until the pool's acquire timeout).

/// The store-time expression: SQLite's clock in milliseconds plus the
/// Clock port's offset, bound as `?1` in every statement that uses it.
macro_rules! now {
    () => {
        "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?1)"
    };
}

/// The last id of the run's history: both event tables draw their ids from
/// one sequence, so ordering the merged history by id is commit order.
/// Millisecond store time cannot order it (a pass's run transition and the
/// next task transition often share a millisecond), and since every write
/// is serialised, max + 1 under the write lock is a safe next id.
macro_rules! next_event_id {
    () => {
        "(SELECT COALESCE(MAX(m), 0) FROM (SELECT MAX(id) AS m FROM task_run_event \
         UNION ALL SELECT MAX(id) AS m FROM workflow_run_event))"
    };
}

mod convert;
mod definitions;
mod error;
mod notify;
mod outbox;
mod pass;
#[cfg(test)]
mod plans;
mod runs;
mod store;
mod workers;

pub use error::DecodeError;
pub use notify::SqliteNotifier;
pub use outbox::SqliteSweep;
pub use pass::SqlitePass;
pub use store::SqliteStore;
