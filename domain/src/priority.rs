//! Dispatch priority: the 0–9 scale, and the order key that serves ready
//! work highest priority first, FIFO within a priority, with aging so that
//! no waiting task starves (docs/design/priorities.md).
//!
//! A waiting task's effective priority is `priority + waited / aging`. Of
//! two tasks `a` and `b`, at any instant `a` outranks `b` exactly when
//! `ready_a - priority_a × aging < ready_b - priority_b × aging`: the waits
//! grow at the same rate, so the comparison does not depend on when it is
//! made. That static [`order_key`] is what every queue sorts by, and it
//! bounds starvation: work that becomes ready more than
//! `(priority_b - priority_a) × aging` after `a` is served after `a`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A run's or a task's priority: 0 (lowest) to 9 (highest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "u8")]
pub struct Priority(u8);

impl Priority {
    /// The lowest priority.
    pub const MIN: Self = Self(0);
    /// The highest priority.
    pub const MAX: Self = Self(9);
    /// What a run or task gets when it names none.
    pub const DEFAULT: Self = Self(5);

    /// The priority `value`, when it is on the scale.
    pub fn new(value: i64) -> Result<Self, PriorityError> {
        u8::try_from(value)
            .ok()
            .filter(|v| *v <= Self::MAX.0)
            .map(Self)
            .ok_or(PriorityError(value))
    }

    /// Its number.
    pub fn get(self) -> u8 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl TryFrom<i64> for Priority {
    type Error = PriorityError;
    fn try_from(value: i64) -> Result<Self, PriorityError> {
        Self::new(value)
    }
}

impl From<Priority> for u8 {
    fn from(p: Priority) -> u8 {
        p.0
    }
}

/// A number off the 0–9 scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("priority must be an integer from 0 to 9, not {0}")]
pub struct PriorityError(pub i64);

/// How long a waiting task takes to gain one priority level, by default.
pub const DEFAULT_AGING_MICROS: i64 = 300 * 1_000_000;

/// The dispatch order key of work that became ready at `ready_micros`
/// (microseconds since the epoch, store time) with `priority`, when one
/// level is gained per `aging_micros` of waiting: smaller goes first; ties
/// go to the older dispatch. An aging below one microsecond counts as one;
/// the key saturates rather than overflowing.
pub fn order_key(ready_micros: i64, priority: Priority, aging_micros: i64) -> i64 {
    ready_micros.saturating_sub(i64::from(priority.0).saturating_mul(aging_micros.max(1)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn priority() -> impl Strategy<Value = Priority> {
        (0i64..=9).prop_map(|p| Priority::new(p).unwrap())
    }

    #[test]
    fn the_scale_is_zero_to_nine() {
        assert_eq!(Priority::new(0), Ok(Priority::MIN));
        assert_eq!(Priority::new(9), Ok(Priority::MAX));
        assert_eq!(Priority::new(10), Err(PriorityError(10)));
        assert_eq!(Priority::new(-1), Err(PriorityError(-1)));
        assert_eq!(Priority::default().get(), 5);
        assert!(serde_json::from_value::<Priority>(serde_json::json!(12)).is_err());
        assert_eq!(serde_json::to_value(Priority::MAX).unwrap(), serde_json::json!(9));
    }

    proptest! {
        /// Within one priority, the older ready time goes first.
        #[test]
        fn fifo_within_a_priority(p in priority(), a in 0i64..1 << 50, d in 1i64..1 << 40, aging in 1i64..1 << 30) {
            prop_assert!(order_key(a, p, aging) < order_key(a + d, p, aging));
        }

        /// Ready at the same time, the higher priority goes first.
        #[test]
        fn higher_first_when_ready_together(lo in priority(), hi in priority(), t in 0i64..1 << 50, aging in 1i64..1 << 30) {
            prop_assume!(hi > lo);
            prop_assert!(order_key(t, hi, aging) < order_key(t, lo, aging));
        }

        /// The starvation bound: work ready more than (difference of
        /// priorities) × aging after `a` is served after `a`, whatever
        /// its priority; anything sooner and higher may go first.
        #[test]
        fn starvation_is_bounded(pa in priority(), pb in priority(), a in 0i64..1 << 50, aging in 1i64..1 << 30, extra in 1i64..1 << 30) {
            let gap = i64::from(pb.get().saturating_sub(pa.get())) * aging;
            prop_assert!(order_key(a, pa, aging) < order_key(a + gap + extra, pb, aging));
        }
    }
}
