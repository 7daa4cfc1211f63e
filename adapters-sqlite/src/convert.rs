//! Conversions between SQLite column values and the ports' types.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_ports::{Clock, RunId, Scope, store};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Row};

use crate::error::{DecodeError, store_error};

/// The longest duration bound into SQL: a century. Larger values would
/// overflow SQLite's 64-bit arithmetic into REAL, which a STRICT INTEGER
/// column refuses.
const MAX_DURATION_MS: u128 = 100 * 365 * 24 * 3600 * 1000;

/// A duration in whole milliseconds, clamped to [`MAX_DURATION_MS`].
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis().min(MAX_DURATION_MS)).unwrap_or(i64::MAX)
}

/// The clock's offset in milliseconds: bound as `?1` of every statement
/// that computes store time.
pub(crate) fn offset_ms(clock: &dyn Clock) -> i64 {
    clock.offset().num_milliseconds()
}

/// A stored time (milliseconds since the epoch).
pub(crate) fn time(column: &'static str, millis: i64) -> Result<DateTime<Utc>, DecodeError> {
    DateTime::from_timestamp_millis(millis).ok_or(DecodeError::Time { column, millis })
}

/// A nullable stored time.
pub(crate) fn opt_time(column: &'static str, millis: Option<i64>) -> Result<Option<DateTime<Utc>>, DecodeError> {
    millis.map(|m| time(column, m)).transpose()
}

/// A stored enum name (state, reason, transition).
pub(crate) fn name<T: FromStr>(column: &'static str, value: &str) -> Result<T, DecodeError> {
    value.parse().map_err(|_| DecodeError::UnknownName {
        column,
        value: value.to_owned(),
    })
}

/// A nullable stored enum name.
pub(crate) fn opt_name<T: FromStr>(column: &'static str, value: Option<&str>) -> Result<Option<T>, DecodeError> {
    value.map(|v| name(column, v)).transpose()
}

/// A stored run id.
pub(crate) fn run_id(value: &str) -> Result<RunId, DecodeError> {
    value.parse().map_err(|_| DecodeError::Uuid(value.to_owned()))
}

/// The text form a run id is stored in.
pub(crate) fn run_key(run: RunId) -> String {
    run.0.hyphenated().to_string()
}

/// A stored JSON document.
pub(crate) fn json(column: &'static str, text: &str) -> Result<Value, DecodeError> {
    serde_json::from_str(text).map_err(|e| DecodeError::Json {
        column,
        problem: e.to_string(),
    })
}

/// A stored non-negative number that must fit a `u32`.
pub(crate) fn u32_of(column: &'static str, value: i64) -> Result<u32, DecodeError> {
    u32::try_from(value).map_err(|_| DecodeError::Number { column, value })
}

/// A stored count.
pub(crate) fn u64_of(column: &'static str, value: i64) -> Result<u64, DecodeError> {
    u64::try_from(value).map_err(|_| DecodeError::Number { column, value })
}

/// The scope filter bound into queries: a JSON array of run keys, NULL for
/// every run.
pub(crate) fn scope_key(scope: &Scope) -> Option<String> {
    scope
        .run_ids()
        .map(|runs| Value::from(runs.into_iter().map(run_key).collect::<Vec<_>>()).to_string())
}

/// Decodes a row by column names, a decoding failure being corrupt data.
pub(crate) fn decode<'r, T: FromRow<'r, SqliteRow>>(row: &'r SqliteRow) -> Result<T, store::Error> {
    T::from_row(row).map_err(store_error)
}

/// One column of a row by position.
pub(crate) fn col<'r, T>(row: &'r SqliteRow, index: usize) -> Result<T, store::Error>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(index).map_err(store_error)
}
