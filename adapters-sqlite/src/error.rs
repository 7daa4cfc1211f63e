//! Translation of SQLite and sqlx failures into the ports' typed errors.

use flowforge_ports::store;
use sqlx::error::ErrorKind;

/// A stored value that does not decode into the ports' types: the row was
/// edited by hand or written by a bug. Reported as [`store::Error::Corrupt`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A state, transition or reason column holds an unknown name.
    #[error("{column} holds unknown value '{value}'")]
    UnknownName {
        /// The column.
        column: &'static str,
        /// What it holds.
        value: String,
    },
    /// A JSON column does not parse.
    #[error("{column} holds invalid JSON: {problem}")]
    Json {
        /// The column.
        column: &'static str,
        /// The parser's message.
        problem: String,
    },
    /// A time column is outside the representable range.
    #[error("{column} holds an out-of-range time ({millis} ms)")]
    Time {
        /// The column.
        column: &'static str,
        /// The stored milliseconds.
        millis: i64,
    },
    /// A run id is not a UUID.
    #[error("run id '{0}' is not a UUID")]
    Uuid(String),
    /// A count or number does not fit its type.
    #[error("{column} holds an out-of-range number ({value})")]
    Number {
        /// The column.
        column: &'static str,
        /// The stored number.
        value: i64,
    },
}

impl From<DecodeError> for store::Error {
    fn from(e: DecodeError) -> Self {
        store::Error::Corrupt(e.to_string())
    }
}

// SQLite primary result codes (the low byte of an extended code).
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_NOMEM: i64 = 7;
const SQLITE_READONLY: i64 = 8;
const SQLITE_IOERR: i64 = 10;
const SQLITE_CORRUPT: i64 = 11;
const SQLITE_FULL: i64 = 13;
const SQLITE_CANTOPEN: i64 = 14;
const SQLITE_NOTADB: i64 = 26;

/// Maps a sqlx error to the store's error: connectivity and locking are
/// transient (`Unavailable`), a missing table or column means the schema is
/// behind (`Migration`), a broken constraint means the data or the caller
/// broke an invariant (`Corrupt`).
pub(crate) fn store_error(e: sqlx::Error) -> store::Error {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
            let message = db.message().to_owned();
            match code & 0xff {
                SQLITE_BUSY | SQLITE_LOCKED | SQLITE_IOERR | SQLITE_FULL | SQLITE_CANTOPEN | SQLITE_READONLY
                | SQLITE_NOMEM => return store::Error::Unavailable(message),
                SQLITE_CORRUPT | SQLITE_NOTADB => return store::Error::Corrupt(message),
                _ => {}
            }
            if message.starts_with("no such table") || message.starts_with("no such column") {
                return store::Error::Migration(message);
            }
            if message.contains("outbox.task_type") {
                // The dispatch of a task run made ready found no task row
                // (see `task_type_of!`): refuse to commit a ready row that
                // would never run.
                return store::Error::Corrupt(format!(
                    "a task run made ready has no task row to dispatch from ({message})"
                ));
            }
            match db.kind() {
                ErrorKind::UniqueViolation
                | ErrorKind::ForeignKeyViolation
                | ErrorKind::NotNullViolation
                | ErrorKind::CheckViolation
                | ErrorKind::ExclusionViolation => store::Error::Corrupt(format!("constraint violated: {message}")),
                _ => store::Error::Other(message),
            }
        }
        sqlx::Error::PoolTimedOut => store::Error::Unavailable("timed out waiting for a database connection".into()),
        sqlx::Error::PoolClosed => store::Error::Unavailable("the database pool is closed".into()),
        sqlx::Error::WorkerCrashed => store::Error::Unavailable("the SQLite worker thread stopped".into()),
        sqlx::Error::Io(io) => store::Error::Unavailable(io.to_string()),
        sqlx::Error::Migrate(m) => store::Error::Migration(m.to_string()),
        sqlx::Error::ColumnNotFound(c) => store::Error::Migration(format!("column '{c}' is missing")),
        e @ (sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => store::Error::Corrupt(e.to_string()),
        other => store::Error::Other(other.to_string()),
    }
}

/// Whether an error is a unique-key violation (a lost insert race).
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.kind() == ErrorKind::UniqueViolation)
}

/// Maps a migration failure: every cause means the schema cannot be trusted.
pub(crate) fn migrate_error(e: sqlx::migrate::MigrateError) -> store::Error {
    match e {
        sqlx::migrate::MigrateError::Execute(inner) => match store_error(inner) {
            store::Error::Unavailable(m) => store::Error::Unavailable(m),
            other => store::Error::Migration(other.to_string()),
        },
        other => store::Error::Migration(other.to_string()),
    }
}
