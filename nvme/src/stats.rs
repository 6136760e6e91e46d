//! The `stats` wrapper: counts, bytes, errors and a latency histogram per operation, around any device.

use std::cell::RefCell;
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, forward_device_identity};
use crate::error::BlockResult;

/// A histogram of latencies in nanoseconds: 1 ns to 1 hour, 3 significant digits (0.1% resolution).
pub fn latency_histogram() -> Histogram<u64> {
    // Constant bounds that satisfy the crate's rules (low ≥ 1, high ≥ 2 × low, 0 ≤ digits ≤ 5): cannot fail.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("constant histogram bounds are valid")
}

/// What one kind of operation did.
#[derive(Clone, Debug)]
pub struct OpStats {
    /// Operations completed, failed ones included.
    pub count: u64,
    /// Bytes moved (or zeroed / deallocated) by the successful ones.
    pub bytes: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Completion latency in nanoseconds, 3 significant digits.
    pub latency_ns: Histogram<u64>,
}

impl Default for OpStats {
    fn default() -> Self {
        Self { count: 0, bytes: 0, errors: 0, latency_ns: latency_histogram() }
    }
}

impl OpStats {
    fn record<T>(&mut self, started: Instant, bytes: u64, result: &BlockResult<T>) {
        self.count += 1;
        match result {
            Ok(_) => self.bytes += bytes,
            Err(_) => self.errors += 1,
        }
        let _ = self.latency_ns.record((started.elapsed().as_nanos() as u64).max(1));
    }
}

/// Per-operation statistics of a device.
#[derive(Clone, Debug, Default)]
pub struct DeviceStats {
    /// Reads.
    pub read: OpStats,
    /// Writes.
    pub write: OpStats,
    /// Flushes.
    pub flush: OpStats,
    /// Write Zeroes.
    pub write_zeroes: OpStats,
    /// Deallocates.
    pub deallocate: OpStats,
}

/// Wraps a device and records [`DeviceStats`].
pub struct StatsDevice<D> {
    inner: D,
    stats: RefCell<DeviceStats>,
}

impl<D: BlockDevice> StatsDevice<D> {
    /// Wraps `inner`.
    pub fn new(inner: D) -> Self {
        Self { inner, stats: RefCell::new(DeviceStats::default()) }
    }

    /// A copy of the statistics so far.
    pub fn stats(&self) -> DeviceStats {
        self.stats.borrow().clone()
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: BlockDevice> BlockDevice for StatsDevice<D> {
    forward_device_identity!(inner);

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let started = Instant::now();
        let len = buf.len() as u64;
        let (buf, result) = self.inner.read(buf, offset).await;
        self.stats.borrow_mut().read.record(started, len, &result);
        (buf, result)
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let started = Instant::now();
        let len = buf.len() as u64;
        let (buf, result) = self.inner.write(buf, offset).await;
        self.stats.borrow_mut().write.record(started, len, &result);
        (buf, result)
    }

    async fn flush(&self) -> BlockResult<()> {
        let started = Instant::now();
        let result = self.inner.flush().await;
        self.stats.borrow_mut().flush.record(started, 0, &result);
        result
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        let started = Instant::now();
        let result = self.inner.write_zeroes(offset, len).await;
        self.stats.borrow_mut().write_zeroes.record(started, len, &result);
        result
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        let started = Instant::now();
        let result = self.inner.deallocate(offset, len).await;
        self.stats.borrow_mut().deallocate.record(started, len, &result);
        result
    }
}
