//! Retry policies: as written (every field optional) and as resolved,
//! with the exponential backoff between attempts.

use std::time::Duration;

use super::MAX_SECONDS;
use serde::{Deserialize, Serialize};

/// A retry policy as written: every field optional, so the task's fields
/// override the workflow defaults field by field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Total attempts allowed, the first included (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Delay before the second attempt, in seconds (≥ 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<f64>,
    /// Multiplier applied per further attempt (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<f64>,
    /// Upper bound on any one delay, in seconds (≥ 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_seconds: Option<f64>,
}

/// The retry policy a task actually runs with
/// (docs/design/state-machines.md#attempts-and-retries).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetryPolicy {
    /// Total attempts allowed, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt, in seconds.
    pub delay_seconds: f64,
    /// Multiplier applied per further attempt.
    pub backoff: f64,
    /// Upper bound on any one delay, in seconds.
    pub max_delay_seconds: Option<f64>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 1,
            delay_seconds: 1.0,
            backoff: 2.0,
            max_delay_seconds: None,
        }
    }
}

impl RetryPolicy {
    /// Merges, field by field, the task's spec over the workflow's over the
    /// built-in defaults.
    pub fn resolve(task: Option<&RetrySpec>, workflow: Option<&RetrySpec>) -> Self {
        let base = Self::default();
        let pick = |f: fn(&RetrySpec) -> Option<f64>| task.and_then(f).or_else(|| workflow.and_then(f));
        Self {
            max_attempts: task
                .and_then(|s| s.max_attempts)
                .or_else(|| workflow.and_then(|s| s.max_attempts))
                .unwrap_or(base.max_attempts),
            delay_seconds: pick(|s| s.delay_seconds).unwrap_or(base.delay_seconds),
            backoff: pick(|s| s.backoff).unwrap_or(base.backoff),
            max_delay_seconds: pick(|s| s.max_delay_seconds),
        }
    }

    /// The wait after failed attempt `attempt` (1-based):
    /// `min(delay × backoff^(attempt−1), max_delay)`.
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let raw = self.delay_seconds * self.backoff.powi(exponent);
        let capped = match self.max_delay_seconds {
            Some(cap) => raw.min(cap),
            None => raw,
        };
        // backoff^999 overflows to infinity (and 0 × ∞ is NaN); clamping
        // keeps any policy, even a hand-built one, representable.
        let secs = if capped.is_nan() {
            0.0
        } else {
            capped.clamp(0.0, MAX_SECONDS)
        };
        Duration::from_secs_f64(secs)
    }

    /// Whether a failed attempt `attempt` gets another try, and after how
    /// long. Permanent failures never retry
    /// (docs/design/state-machines.md#permanent-failures).
    pub fn next_retry(&self, attempt: u32, permanent: bool) -> Option<Duration> {
        (!permanent && attempt < self.max_attempts).then(|| self.delay_after(attempt))
    }
}
