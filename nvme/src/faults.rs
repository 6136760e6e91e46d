//! The `faults` wrapper: seeded, reproducible I/O errors, torn writes and added latency around any device.
//!
//! One seed reproduces a run: every decision comes from one ChaCha8 stream, drawn in operation order.
//! A *torn write* persists only a prefix of the write's logical blocks (possibly none) and still reports
//! success, which is what a power cut during a write leaves behind; only checksums can catch it.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, forward_device_identity};
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};

/// What to inject.
#[derive(Clone, Debug, Default)]
pub struct FaultConfig {
    /// Seed of every decision.
    pub seed: u64,
    /// Probability that a read, write or flush fails.
    pub error_probability: f64,
    /// Byte ranges where every read or write that touches them fails.
    pub error_ranges: Vec<Range<u64>>,
    /// Byte ranges where every read that touches them fails, while writes succeed (a medium error that a
    /// write repairs, as a remapped block is).
    pub read_error_ranges: Vec<Range<u64>>,
    /// Probability that a write is torn.
    pub torn_write_probability: f64,
    /// Latency added before every operation.
    pub added_latency: Duration,
    /// Each operation first yields to its executor a seeded number of times, up to this many: latency in
    /// scheduler turns rather than time, so that a simulation's operations complete in a seeded order that
    /// replays exactly.
    pub max_yields: u32,
}

/// What was injected so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Operations failed on purpose.
    pub injected_errors: u64,
    /// Writes torn on purpose.
    pub torn_writes: u64,
}

/// Wraps a device and injects faults as configured.
pub struct FaultDevice<D> {
    inner: D,
    config: FaultConfig,
    rng: RefCell<ChaCha8Rng>,
    stats: Cell<FaultStats>,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// Wraps `inner`.
    pub fn new(inner: D, config: FaultConfig) -> Self {
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(config.seed));
        Self { inner, config, rng, stats: Cell::new(FaultStats::default()) }
    }

    /// What was injected so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.stats.get()
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    async fn delay(&self) {
        if !self.config.added_latency.is_zero() {
            glommio::timer::sleep(self.config.added_latency).await;
        }
        if self.config.max_yields > 0 {
            let yields = self.rng.borrow_mut().random_range(0..=self.config.max_yields);
            for _ in 0..yields {
                futures_lite::future::yield_now().await;
            }
        }
    }

    /// Decides whether this operation fails; counts it if so.
    fn injects_error(&self, op: BlockOp, offset: u64, len: u64) -> Option<BlockError> {
        let touches = |range: &Range<u64>| offset < range.end && range.start < offset + len;
        let in_range = self.config.error_ranges.iter().any(touches)
            || (op == BlockOp::Read && self.config.read_error_ranges.iter().any(touches));
        let by_chance = self.config.error_probability > 0.0
            && self.rng.borrow_mut().random_bool(self.config.error_probability.min(1.0));
        if !(in_range || by_chance) {
            return None;
        }
        let mut stats = self.stats.get();
        stats.injected_errors += 1;
        self.stats.set(stats);
        Some(BlockError::new(op, self.inner.name(), offset, BlockErrorKind::Injected))
    }
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    forward_device_identity!(inner);

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        self.delay().await;
        if let Some(error) = self.injects_error(BlockOp::Read, offset, buf.len() as u64) {
            return (buf, Err(error));
        }
        self.inner.read(buf, offset).await
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        self.delay().await;
        if let Some(error) = self.injects_error(BlockOp::Write, offset, buf.len() as u64) {
            return (buf, Err(error));
        }
        let tears = self.config.torn_write_probability > 0.0
            && self.rng.borrow_mut().random_bool(self.config.torn_write_probability.min(1.0));
        if !tears {
            return self.inner.write(buf, offset).await;
        }
        // Validate as the real write would, so a torn write is never reported for a request that is invalid.
        let geometry = self.inner.geometry();
        if let Err(error) = geometry.check(BlockOp::Write, self.inner.name(), offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let mut stats = self.stats.get();
        stats.torn_writes += 1;
        self.stats.set(stats);
        let blocks = buf.len() as u64 / geometry.logical_block_bytes;
        let kept_blocks = self.rng.borrow_mut().random_range(0..blocks);
        if kept_blocks == 0 {
            return (buf, Ok(()));
        }
        let kept_bytes = (kept_blocks * geometry.logical_block_bytes) as usize;
        let mut prefix = self.inner.alloc_buffer(kept_bytes);
        prefix.as_mut_slice().copy_from_slice(&buf.as_slice()[..kept_bytes]);
        let (_, result) = self.inner.write(prefix, offset).await;
        (buf, result)
    }

    async fn flush(&self) -> BlockResult<()> {
        self.delay().await;
        if let Some(error) = self.injects_error(BlockOp::Flush, 0, 0) {
            return Err(error);
        }
        self.inner.flush().await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.delay().await;
        self.inner.write_zeroes(offset, len).await
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.delay().await;
        self.inner.deallocate(offset, len).await
    }
}
