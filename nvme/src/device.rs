//! The block-device interface every backend implements, and the geometry checks they share.
//!
//! A device knows its geometry; its I/O methods move owned buffers (`read(buf, at) -> (buf, result)`), so
//! a buffer lent to the kernel or to the network stays owned by the operation until it completes. The trait
//! has no `Send` bound: a device belongs to one executor (one core), which owns its queues.

use std::time::Instant;

use crate::buffer::IoBuffer;
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};

/// What a device is, for the code that places data on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Addressable bytes.
    pub capacity_bytes: u64,
    /// Offsets and lengths are multiples of this.
    pub logical_block_bytes: u64,
    /// The largest transfer of one command.
    pub max_transfer_bytes: u64,
    /// Buffer memory must start at a multiple of this (direct I/O, DMA).
    pub buffer_alignment_bytes: u64,
}

impl Geometry {
    /// Checks a range (and a buffer, for reads and writes) against the geometry.
    pub fn check(
        &self,
        op: BlockOp,
        device: &str,
        offset: u64,
        len: u64,
        buffer: Option<&IoBuffer>,
    ) -> BlockResult<()> {
        let error = |kind| Err(BlockError::new(op, device, offset, kind));
        let block_bytes = self.logical_block_bytes;
        if !offset.is_multiple_of(block_bytes) || !len.is_multiple_of(block_bytes) || len == 0 {
            return error(BlockErrorKind::Unaligned { offset, len, block_bytes });
        }
        if offset.checked_add(len).is_none_or(|end| end > self.capacity_bytes) {
            return error(BlockErrorKind::OutOfRange { offset, len, capacity_bytes: self.capacity_bytes });
        }
        if let Some(buffer) = buffer {
            if len > self.max_transfer_bytes {
                return error(BlockErrorKind::TooLarge { len, max_transfer_bytes: self.max_transfer_bytes });
            }
            if !buffer.is_aligned_to(self.buffer_alignment_bytes) {
                return error(BlockErrorKind::MisalignedBuffer { alignment_bytes: self.buffer_alignment_bytes });
            }
        }
        Ok(())
    }
}

/// A block device: its geometry and its I/O. All offsets and lengths are in bytes.
///
/// Contract, checked by the conformance suite for every backend: reads return what the last write to the
/// same blocks wrote; ranges must be block-aligned and inside the capacity, buffers aligned to
/// `buffer_alignment_bytes`, or the operation fails with a typed error and changes nothing; after
/// `write_zeroes` or `deallocate` the range reads as zeroes.
#[allow(async_fn_in_trait)]
pub trait BlockDevice {
    /// A name for messages: the path, or `memory:<size>`.
    fn name(&self) -> &str;

    /// The geometry.
    fn geometry(&self) -> Geometry;

    /// A buffer of `len` bytes suited to this device (for `uring`: from the executor's registered memory).
    fn alloc_buffer(&self, len: usize) -> IoBuffer;

    /// Reads `buf.len()` bytes at `offset`. The buffer returned holds the data; it may be another allocation
    /// than the one passed in (see [`IoBuffer`]).
    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>);

    /// Writes `buf` at `offset`, and gives the buffer back.
    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>);

    /// Makes completed writes durable.
    async fn flush(&self) -> BlockResult<()>;

    /// Sets a range to zeroes.
    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()>;

    /// Tells the device a range holds nothing worth keeping; it reads as zeroes afterwards.
    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()>;

    /// [`read`](Self::read), and when the operation was handed to the device and when its completion was
    /// seen. A backend that cannot see its submission (glommio's reactor submits when it parks) keeps this
    /// default: submitted is the call, so the whole wait counts as completion latency.
    async fn read_timed(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>, IoTiming) {
        let submitted = Instant::now();
        let (buf, result) = self.read(buf, offset).await;
        (buf, result, IoTiming { submitted, completed: Instant::now() })
    }

    /// [`write`](Self::write), timed as [`read_timed`](Self::read_timed).
    async fn write_timed(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>, IoTiming) {
        let submitted = Instant::now();
        let (buf, result) = self.write(buf, offset).await;
        (buf, result, IoTiming { submitted, completed: Instant::now() })
    }
}

/// When one operation was handed to the device and when its completion was seen, as fio splits latency:
/// from the caller's call to `submitted` is fio's submission latency (`slat`), from `submitted` to
/// `completed` its completion latency (`clat`). The time from `completed` to the caller running again
/// (waking its task) is in neither, as in fio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoTiming {
    /// After the submission call returned (for io_uring: after `io_uring_enter` took the entry).
    pub submitted: Instant,
    /// When the completion was reaped.
    pub completed: Instant,
}

/// Forwards a wrapper's identity (`name`, `geometry`, `alloc_buffer`) to the device in its field `$inner`:
/// wrappers change behaviour, never what the device is.
macro_rules! forward_device_identity {
    ($inner:ident) => {
        fn name(&self) -> &str {
            self.$inner.name()
        }

        fn geometry(&self) -> $crate::device::Geometry {
            self.$inner.geometry()
        }

        fn alloc_buffer(&self, len: usize) -> $crate::buffer::IoBuffer {
            self.$inner.alloc_buffer(len)
        }
    };
}
pub(crate) use forward_device_identity;
