//! A namespace as one executor sees it: the same backend enum for every namespace, so a queue can hold
//! them in one table (the `BlockDevice` trait has async methods and no `dyn` form).

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::BlockResult;
use crate::memory::MemoryDevice;
use crate::uring::UringDevice;

/// A namespace's device on this executor.
pub(crate) enum NamespaceDevice {
    /// A handle on a RAM namespace shared by all executors.
    Memory(MemoryDevice),
    /// This executor's own O_DIRECT handle on the file.
    File(UringDevice),
}

macro_rules! dispatch {
    ($self:ident, $device:ident => $call:expr) => {
        match $self {
            NamespaceDevice::Memory($device) => $call,
            NamespaceDevice::File($device) => $call,
        }
    };
}

impl BlockDevice for NamespaceDevice {
    fn name(&self) -> &str {
        dispatch!(self, device => device.name())
    }

    fn geometry(&self) -> Geometry {
        dispatch!(self, device => device.geometry())
    }

    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        dispatch!(self, device => device.alloc_buffer(len))
    }

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        dispatch!(self, device => device.read(buf, offset).await)
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        dispatch!(self, device => device.write(buf, offset).await)
    }

    async fn flush(&self) -> BlockResult<()> {
        dispatch!(self, device => device.flush().await)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        dispatch!(self, device => device.write_zeroes(offset, len).await)
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        dispatch!(self, device => device.deallocate(offset, len).await)
    }
}
