//! FlowForge's store ports over SQLite: the embedded store
//! (docs/design/data-model.md#tables, docs/design/scheduler.md#the-pass).
//!
//! [`SqliteStore`] implements every store port — definitions, runs and task
//! runs, the scheduler pass, the outbox, the worker registry and the API
//! tokens — over one database file in WAL mode (or one shared in-memory
//! connection).
//!
//! SQLite has a single writer per database. Rather than let in-process
//! writers collide on the file lock and sleep through `SQLITE_BUSY` retries,
//! every write goes through ONE writer connection behind an async mutex, so
//! writers queue in process; reads use a few other connections and see the
//! last committed state (WAL snapshots). Every write transaction starts
//! with `BEGIN IMMEDIATE`, so another process's writer makes it wait on the
//! busy timeout at `BEGIN` instead of failing half-way through.
//!
//! Each statement costs a round trip to the connection's worker thread,
//! which dwarfs SQLite's own work, so every single-shot write is ONE call
//! from `BEGIN IMMEDIATE` to `COMMIT` (see the `store` module). SQLite
//! has no data-modifying CTEs; a transition's event row is written in the
//! same call either by the statement after the UPDATE, guarded by
//! `changes()` (the rows the UPDATE changed), or, for a batch, by an INSERT
//! placed before the UPDATE with the very same time-free WHERE: under the
//! write lock nothing else changes the rows in between, so both see the
//! same rows. Claims and finishes that wait for the writer while it is
//! busy commit together, each still its own conditional statements with
//! its own answer (see the `group` module).
//!
//! Two more costs are kept off the path from one task to the next: WAL
//! checkpoints (each copies pages back and fsyncs twice) run on a
//! connection of their own beside the writer instead of inside whichever
//! commit crosses SQLite's threshold, and `task_inputs` answers from the
//! run inputs and succeeded outputs this store already wrote or read, which
//! never change (see the `inputs` module).
//!
//! Store time is SQLite's own clock plus the [`Clock`](flowforge_ports::Clock)
//! offset, computed inside each statement (`?1` of every query that needs
//! it); times are stored as INTEGER milliseconds since the Unix epoch.
//!
//! A consequence of the single writer: while a [`SqlitePass`] is open it
//! holds the writer, so the task that opened it must not call another
//! writing method of the store before committing or dropping it (it would
//! wait for itself until the acquire timeout).
//!
//! The crate is laid out as the PostgreSQL store is, file for file: SQL by
//! concern in `queries/`, row decoding in `rows.rs`, one file per port
//! implementation (ARCHITECTURE.md, "adapters-sqlite, adapters-postgres").

#[macro_use]
mod queries;

mod definitions;
mod error;
mod group;
mod inputs;
mod notify;
mod outbox;
mod pass;
#[cfg(test)]
mod plans;
mod rows;
mod runs;
mod schedules;
mod store;
mod tokens;
mod workers;

pub use error::DecodeError;
pub use notify::SqliteNotifier;
pub use outbox::SqliteSweep;
pub use pass::SqlitePass;
pub use store::SqliteStore;
