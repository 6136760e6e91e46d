//! Any of Strata's backends behind one type: the `BlockDevice` trait has async methods and so no `dyn`
//! form, and code that holds devices of several kinds in one table (the target's namespaces, the pool
//! tool's namespaces) dispatches through this enum instead.

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::BlockResult;
use crate::host::NvmfDevice;
use crate::memory::MemoryDevice;
use crate::uring::UringDevice;

/// A device of any backend, on this executor.
pub enum AnyDevice {
    /// A handle on a RAM namespace (shared by every clone).
    Memory(MemoryDevice),
    /// This executor's O_DIRECT handle on a file or block device.
    File(UringDevice),
    /// A namespace of a remote NVMe-oF controller (one I/O queue on this executor).
    Nvmf(Box<NvmfDevice>),
}

macro_rules! dispatch {
    ($self:ident, $device:ident => $call:expr) => {
        match $self {
            AnyDevice::Memory($device) => $call,
            AnyDevice::File($device) => $call,
            AnyDevice::Nvmf($device) => $call,
        }
    };
}

impl BlockDevice for AnyDevice {
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
