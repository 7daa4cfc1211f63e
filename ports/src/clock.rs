//! The Clock port: an offset added to the store's own clock
//! (docs/design/leases-and-fencing.md#store-time). Zero in production; tests
//! move it to expire leases and bring retries due without sleeping.

use chrono::TimeDelta;

/// Supplies the offset every store adds to its database clock.
pub trait Clock: Send + Sync + 'static {
    /// The offset to add to the database's `now()`.
    fn offset(&self) -> TimeDelta;
}

/// The production clock: the database's time, unshifted.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn offset(&self) -> TimeDelta {
        TimeDelta::zero()
    }
}

/// A clock whose offset tests move forward by hand.
#[cfg(feature = "test-util")]
#[derive(Debug, Default)]
pub struct ManualClock {
    offset_ms: std::sync::atomic::AtomicI64,
}

#[cfg(feature = "test-util")]
impl ManualClock {
    /// Moves store time forward by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(feature = "test-util")]
impl Clock for ManualClock {
    fn offset(&self) -> TimeDelta {
        TimeDelta::milliseconds(self.offset_ms.load(std::sync::atomic::Ordering::SeqCst))
    }
}
