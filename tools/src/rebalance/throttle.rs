//! A bandwidth limit on the bytes a pass copies: after each batch, wait until the bytes sent so far fit
//! the rate since the pass began.

use std::time::{Duration, Instant};

/// Bytes per second, over the life of one pass.
pub struct Throttle {
    rate: u64,
    started: Instant,
    sent: u64,
}

impl Throttle {
    /// A limit of `rate` bytes per second (at least 1).
    pub fn new(rate: u64) -> Self {
        Self { rate: rate.max(1), started: Instant::now(), sent: 0 }
    }

    /// The largest batch worth sending at once: a quarter second of the rate, at least one 4 MiB block.
    pub fn batch_bytes(&self) -> u64 {
        (self.rate / 4).clamp(4 << 20, 64 << 20)
    }

    /// How long to wait after sending `bytes` more.
    pub fn after(&mut self, bytes: u64) -> Duration {
        self.sent += bytes;
        let due = Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
        due.saturating_sub(self.started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_keeps_the_rate() {
        let mut throttle = Throttle::new(100 << 20);
        let wait = throttle.after(50 << 20);
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500), "{wait:?}");
        assert_eq!(Throttle::new(1 << 40).after(1), Duration::ZERO);
    }
}
