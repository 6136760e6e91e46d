//! `strata-bench kv --log-avg-msec N`: the run's calls cut into intervals of N ms by completion time, each
//! with its own latency percentiles and error count (fio's `log_avg_msec`), so that a disturbance during
//! the run (a node killed, a drain) shows when it hurt and when it stopped hurting.

use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;

/// One interval of the run, over every connection.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct IntervalReport {
    /// When it starts, in ms from the run's start.
    pub start_ms: u64,
    /// Calls completed in it.
    pub calls: u64,
    /// Keys that failed in it (misses of a preloaded key included).
    pub errors: u64,
    /// Median latency of its calls.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Largest.
    pub max_ns: u64,
}

struct Bucket {
    histogram: Histogram<u64>,
    calls: u64,
    errors: u64,
}

/// One connection's intervals.
pub struct Timeline {
    started: Instant,
    interval: Duration,
    buckets: Vec<Bucket>,
}

impl Timeline {
    /// Intervals of `interval` from `started`.
    pub fn new(started: Instant, interval: Duration) -> Self {
        Self { started, interval: interval.max(Duration::from_millis(1)), buckets: Vec::new() }
    }

    fn current(&mut self) -> Option<&mut Bucket> {
        let index = (self.started.elapsed().as_nanos() / self.interval.as_nanos()) as usize;
        while self.buckets.len() <= index {
            let histogram = Histogram::new_with_bounds(1, 3_600_000_000_000, 3).ok()?;
            self.buckets.push(Bucket { histogram, calls: 0, errors: 0 });
        }
        self.buckets.get_mut(index)
    }

    /// A call that took `elapsed_ns` just completed.
    pub fn record(&mut self, elapsed_ns: u64) {
        if let Some(bucket) = self.current() {
            bucket.histogram.saturating_record(elapsed_ns.max(1));
            bucket.calls += 1;
        }
    }

    /// A key just failed.
    pub fn record_error(&mut self) {
        if let Some(bucket) = self.current() {
            bucket.errors += 1;
        }
    }
}

/// The connections' timelines merged, interval by interval.
pub fn merge(timelines: &[Timeline]) -> anyhow::Result<Vec<IntervalReport>> {
    let Some(interval) = timelines.first().map(|timeline| timeline.interval) else { return Ok(Vec::new()) };
    let count = timelines.iter().map(|timeline| timeline.buckets.len()).max().unwrap_or(0);
    let mut reports = Vec::with_capacity(count);
    for index in 0..count {
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).context("histogram")?;
        let (mut calls, mut errors) = (0, 0);
        for bucket in timelines.iter().filter_map(|timeline| timeline.buckets.get(index)) {
            histogram.add(&bucket.histogram).context("merging histograms")?;
            calls += bucket.calls;
            errors += bucket.errors;
        }
        reports.push(IntervalReport {
            start_ms: (interval * index as u32).as_millis() as u64,
            calls,
            errors,
            p50_ns: histogram.value_at_quantile(0.5),
            p99_ns: histogram.value_at_quantile(0.99),
            max_ns: histogram.max(),
        });
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_land_in_their_interval_and_merge_across_connections() {
        let started = Instant::now() - Duration::from_millis(250);
        let mut first = Timeline::new(started, Duration::from_millis(100));
        first.record(1_000);
        first.record_error();
        let mut second = Timeline::new(started, Duration::from_millis(100));
        second.record(3_000);
        let merged = merge(&[first, second]).unwrap();
        assert_eq!(merged.len(), 3, "the call 250 ms in is in the third interval");
        assert_eq!((merged[0].calls, merged[1].calls), (0, 0));
        let last = merged[2];
        assert_eq!((last.start_ms, last.calls, last.errors), (200, 2, 1));
        assert!(last.p50_ns >= 999 && last.p50_ns <= 1_001 && last.max_ns >= 2_990, "{last:?}");
    }
}
