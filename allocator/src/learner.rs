//! Learning the dominant sizes of the request stream.
//!
//! A space-saving sketch (Metwally et al.) with a handful of counters finds the sizes that make up a large
//! share of recent requests in O(counters) per request and fixed memory. Each counter keeps the error bound it
//! inherited when it replaced another size, so a size is promoted only on its *guaranteed* count, never on an
//! overestimate: a stream of many distinct sizes (the `random` workload) promotes nothing. Counts are halved
//! every window, so the sketch follows the recent stream and forgets a model that is no longer served.

const COUNTERS: usize = 8;

#[derive(Clone, Copy, Debug, Default)]
struct Counter {
    size_units: u64,
    count: u32,
    error: u32,
}

/// What the front tunes the learner with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LearnerConfig {
    /// Requests per window; counts are halved at the end of each.
    pub(crate) window_requests: u32,
    /// Share of a window a size must reach, guaranteed, to be promoted.
    pub(crate) promote_share: f64,
}

pub(crate) struct SizeLearner {
    counters: [Counter; COUNTERS],
    requests_in_window: u32,
    window_requests: u32,
    promote_count: u32,
}

impl SizeLearner {
    pub(crate) fn new(config: LearnerConfig) -> Self {
        let window_requests = config.window_requests.max(1);
        let promote_count = ((f64::from(window_requests) * config.promote_share).ceil() as u32).max(2);
        Self { counters: [Counter::default(); COUNTERS], requests_in_window: 0, window_requests, promote_count }
    }

    /// Counts one request (every request, served by a class or not, moves the window on).
    pub(crate) fn tick(&mut self) {
        self.requests_in_window += 1;
        if self.requests_in_window >= self.window_requests {
            self.requests_in_window = 0;
            for counter in &mut self.counters {
                counter.count /= 2;
                counter.error /= 2;
            }
        }
    }

    /// Records a request of a size no class serves; returns true when that size is now dominant. The caller
    /// promotes it and calls [`SizeLearner::forget`].
    pub(crate) fn observe(&mut self, size_units: u64) -> bool {
        let mut smallest = 0;
        for index in 0..COUNTERS {
            let counter = &mut self.counters[index];
            if counter.count > 0 && counter.size_units == size_units {
                counter.count += 1;
                return counter.count - counter.error >= self.promote_count;
            }
            if counter.count < self.counters[smallest].count {
                smallest = index;
            }
        }
        let replaced = &mut self.counters[smallest];
        let inherited = replaced.count;
        *replaced = Counter { size_units, count: inherited + 1, error: inherited };
        false
    }

    /// Drops a size's counter (after promotion, so its slot serves other sizes).
    pub(crate) fn forget(&mut self, size_units: u64) {
        for counter in &mut self.counters {
            if counter.size_units == size_units {
                *counter = Counter::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: LearnerConfig = LearnerConfig { window_requests: 1024, promote_share: 1.0 / 16.0 };

    fn feed(learner: &mut SizeLearner, size: u64) -> bool {
        learner.tick();
        learner.observe(size)
    }

    #[test]
    fn a_dominant_size_is_promoted_after_its_share() {
        let mut learner = SizeLearner::new(CONFIG);
        let mut promoted_at = None;
        for request in 0..1000u64 {
            // Half the stream is one size, the other half all different sizes.
            let size = if request % 2 == 0 { 1098 } else { 10_000 + request };
            if feed(&mut learner, size) && size == 1098 {
                promoted_at = Some(request);
                break;
            }
        }
        let promoted_at = promoted_at.expect("the dominant size was never promoted");
        assert!(promoted_at < 300, "promoted late, at request {promoted_at}");
    }

    #[test]
    fn many_distinct_sizes_promote_nothing() {
        let mut learner = SizeLearner::new(CONFIG);
        for request in 0..100_000u64 {
            let size = 1 + (request * 7919) % 1024;
            assert!(!feed(&mut learner, size), "size {size} promoted at request {request}");
        }
    }

    #[test]
    fn counts_decay_so_an_old_size_is_forgotten() {
        let mut learner = SizeLearner::new(CONFIG);
        // 40 requests of one size: below the promotion count of 64.
        for _ in 0..40 {
            assert!(!feed(&mut learner, 7));
        }
        // Ten windows of other traffic halve the count to nothing; 40 more are again not enough.
        for request in 0..10 * 1024u64 {
            feed(&mut learner, 100 + request % 4096);
        }
        for _ in 0..40 {
            assert!(!feed(&mut learner, 7));
        }
    }
}
