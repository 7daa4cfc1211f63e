//! Translation of sqlx's errors into the ports' [`store::Error`]: callers
//! decide on retrying from the variant, so the mapping is the contract.

use flowforge_ports::store;

/// Maps a driver error to the store error a caller can act on.
///
/// Connection and pool failures are `Unavailable` (transient); a missing
/// table or column means the schema is behind (`Migration`); a constraint
/// violation that no contract expects means stored data or a write broke an
/// invariant (`Corrupt`, naming the constraint).
pub(crate) fn store_error(e: sqlx::Error) -> store::Error {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = db.message().to_owned();
            database_error(&code, db.constraint(), &message)
        }
        sqlx::Error::Io(io) => store::Error::Unavailable(format!("i/o error talking to PostgreSQL: {io}")),
        sqlx::Error::Tls(tls) => store::Error::Unavailable(format!("TLS error talking to PostgreSQL: {tls}")),
        sqlx::Error::PoolTimedOut => {
            store::Error::Unavailable("timed out waiting for a PostgreSQL connection from the pool".to_owned())
        }
        sqlx::Error::PoolClosed => store::Error::Unavailable("the PostgreSQL connection pool is closed".to_owned()),
        sqlx::Error::WorkerCrashed => store::Error::Unavailable("the PostgreSQL connection worker crashed".to_owned()),
        sqlx::Error::Protocol(p) => store::Error::Unavailable(format!("PostgreSQL protocol error: {p}")),
        sqlx::Error::Migrate(m) => store::Error::Migration(m.to_string()),
        e @ (sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }) => store::Error::Corrupt(format!("a stored row does not decode: {e}")),
        other => store::Error::Other(other.to_string()),
    }
}

fn database_error(code: &str, constraint: Option<&str>, message: &str) -> store::Error {
    let class = code.get(..2).unwrap_or("");
    match code {
        // undefined_table, undefined_column, undefined_function,
        // invalid_schema_name: this binary expects a newer schema.
        "42P01" | "42703" | "42883" | "3F000" => store::Error::Migration(format!("{message} [{code}]")),
        // Constraint violations outside a contract: a bug or a manual edit.
        "23505" | "23514" | "23503" | "23502" | "23P01" => store::Error::Corrupt(format!(
            "constraint {} violated: {message} [{code}]",
            constraint.unwrap_or("(unnamed)")
        )),
        // query_canceled (statement_timeout), admin/crash shutdown,
        // cannot_connect_now: the server may answer later.
        "57014" | "57P01" | "57P02" | "57P03" => store::Error::Unavailable(format!("{message} [{code}]")),
        // deadlock_detected, serialization_failure: the server rolled this
        // transaction back to break a lock cycle (a run's event counter is
        // held until commit, docs/design/state-machines.md#event-history);
        // nothing was written, so the caller retries.
        "40P01" | "40001" => store::Error::Unavailable(format!("{message} [{code}]; retrying is safe")),
        _ if matches!(class, "08" | "53" | "58") => store::Error::Unavailable(format!("{message} [{code}]")),
        _ => store::Error::Other(format!("{message} [{code}]")),
    }
}

/// The SQLSTATE and constraint of a database error, to recognise the one
/// violation a contract expects (the first-publish race).
pub(crate) fn violated_constraint(e: &sqlx::Error) -> Option<(String, String)> {
    match e {
        sqlx::Error::Database(db) => Some((
            db.code().map(|c| c.into_owned()).unwrap_or_default(),
            db.constraint().unwrap_or_default().to_owned(),
        )),
        _ => None,
    }
}

/// A stored value this binary cannot interpret: named, never guessed around.
pub(crate) fn corrupt(what: impl std::fmt::Display) -> store::Error {
    store::Error::Corrupt(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_what_a_caller_can_do() {
        assert!(matches!(
            database_error("42P01", None, "relation \"task_run\" does not exist"),
            store::Error::Migration(_)
        ));
        let store::Error::Corrupt(msg) = database_error("23514", Some("taskrun_lease_iff_running"), "violates") else {
            panic!("a check violation is corruption");
        };
        assert!(msg.contains("taskrun_lease_iff_running"), "{msg}");
        assert!(database_error("57014", None, "canceling statement due to statement timeout").is_transient());
        assert!(database_error("08006", None, "connection failure").is_transient());
        assert!(database_error("53300", None, "too many connections").is_transient());
        assert!(database_error("40P01", None, "deadlock detected").is_transient());
        assert!(store_error(sqlx::Error::PoolTimedOut).is_transient());
    }
}
