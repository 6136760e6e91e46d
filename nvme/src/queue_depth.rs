//! The queue-depth bound: at most `queue_depth_max` operations in flight on a device, per executor.
//!
//! A limit on everything (STYLE.md): a burst of requests waits here instead of over-filling the ring and the
//! registered-memory pool.

use glommio::sync::Semaphore;

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, forward_device_identity};
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};

/// Wraps a device and bounds its operations in flight.
pub struct QueueDepthLimit<D> {
    inner: D,
    queue_depth_max: u64,
    slots: Semaphore,
}

impl<D: BlockDevice> QueueDepthLimit<D> {
    /// Wraps `inner`, allowing `queue_depth_max` (≥ 1) operations in flight.
    pub fn new(inner: D, queue_depth_max: u64) -> Self {
        let queue_depth_max = queue_depth_max.max(1);
        Self { inner, queue_depth_max, slots: Semaphore::new(queue_depth_max) }
    }

    /// The bound.
    pub fn queue_depth_max(&self) -> u64 {
        self.queue_depth_max
    }

    /// Operations that could start now without waiting.
    pub fn available(&self) -> u64 {
        self.slots.available()
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn closed(&self, op: BlockOp, offset: u64) -> BlockError {
        let kind = BlockErrorKind::Environment("the device's queue was closed".into());
        BlockError::new(op, self.inner.name(), offset, kind)
    }
}

impl<D: BlockDevice> BlockDevice for QueueDepthLimit<D> {
    forward_device_identity!(inner);

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let Ok(_slot) = self.slots.acquire_permit(1).await else {
            return (buf, Err(self.closed(BlockOp::Read, offset)));
        };
        self.inner.read(buf, offset).await
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let Ok(_slot) = self.slots.acquire_permit(1).await else {
            return (buf, Err(self.closed(BlockOp::Write, offset)));
        };
        self.inner.write(buf, offset).await
    }

    async fn flush(&self) -> BlockResult<()> {
        let _slot = self.slots.acquire_permit(1).await.map_err(|_| self.closed(BlockOp::Flush, 0))?;
        self.inner.flush().await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        let _slot = self.slots.acquire_permit(1).await.map_err(|_| self.closed(BlockOp::WriteZeroes, offset))?;
        self.inner.write_zeroes(offset, len).await
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        let _slot = self.slots.acquire_permit(1).await.map_err(|_| self.closed(BlockOp::Deallocate, offset))?;
        self.inner.deallocate(offset, len).await
    }
}
