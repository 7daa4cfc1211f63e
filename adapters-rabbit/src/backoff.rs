//! The reconnect backoff: exponential with full jitter, capped at 30 s.

use std::time::Duration;

/// The first attempt's ceiling.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// No wait is ever longer.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// How long to wait before reconnect attempt `attempt` (0 for the first
/// retry): a uniformly random duration between zero and
/// [`backoff_ceiling`]`(attempt)`. Full jitter spreads the reconnects of
/// many workers cut off by the same outage, so they do not all hit the
/// broker in the same instant when it returns.
pub fn backoff(attempt: u32) -> Duration {
    backoff_ceiling(attempt).mul_f64(fastrand::f64())
}

/// The longest wait before attempt `attempt`: 100 ms doubled per attempt,
/// capped at 30 s.
pub fn backoff_ceiling(attempt: u32) -> Duration {
    // 2^9 × 100 ms already passes the cap; clamping the exponent keeps the
    // multiplication far from overflow.
    let factor = 1u32 << attempt.min(16);
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_doubles_then_caps() {
        let ceilings: Vec<u128> = (0..12).map(|a| backoff_ceiling(a).as_millis()).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000]
        );
        assert_eq!(backoff_ceiling(u32::MAX), BACKOFF_CAP);
    }

    #[test]
    fn the_wait_stays_under_its_ceiling() {
        for attempt in [0, 1, 5, 9, 40, u32::MAX] {
            for _ in 0..200 {
                assert!(backoff(attempt) <= backoff_ceiling(attempt));
            }
        }
    }
}
