//! Any of Strata's backends behind one type: the `BlockDevice` trait has async methods and so no `dyn`
//! form, and code that holds devices of several kinds in one table (the target's namespaces, the pool
//! tool's namespaces) dispatches through this enum instead.

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry, IoTiming};
use crate::error::BlockResult;
use crate::host::NvmfDevice;
use crate::memory::MemoryDevice;
use crate::ring::{RingDevice, RingWait};
use crate::uring::UringDevice;

/// A device of any backend, on this executor.
pub enum AnyDevice {
    /// A handle on a RAM namespace (shared by every clone).
    Memory(MemoryDevice),
    /// This executor's O_DIRECT handle on a file or block device, through glommio's reactor.
    File(UringDevice),
    /// A busy-polled executor's O_DIRECT handle on a file or block device: a ring of its own, polled
    /// ([`FileIo::Polled`]).
    PolledFile(RingDevice),
    /// A namespace of a remote NVMe-oF controller (one I/O queue on this executor).
    Nvmf(Box<NvmfDevice>),
    /// A file with seeded faults injected (tests of what the layers above do with torn writes and errors).
    FaultyFile(Box<crate::faults::FaultDevice<UringDevice>>),
}

macro_rules! dispatch {
    ($self:ident, $device:ident => $call:expr) => {
        match $self {
            AnyDevice::Memory($device) => $call,
            AnyDevice::File($device) => $call,
            AnyDevice::PolledFile($device) => $call,
            AnyDevice::Nvmf($device) => $call,
            AnyDevice::FaultyFile($device) => $call,
        }
    };
}

/// Awaits an I/O of whichever device, the remote and fault-injecting kinds' futures on the heap. An
/// NVMe-oF command's future holds its PDU buffers (about 2.4 KiB), and an async caller's future holds
/// that of every device it may await: inline, every future up the engine's put and get paths would carry
/// those bytes and copy them at each call, I/O or not (a DRAM put moved ~7 KiB of future state for
/// it). One allocation per remote command, a network round trip, costs nothing by comparison.
macro_rules! dispatch_io {
    ($self:ident, $device:ident => $call:expr) => {
        match $self {
            AnyDevice::Memory($device) => $call.await,
            AnyDevice::File($device) => $call.await,
            AnyDevice::PolledFile($device) => $call.await,
            AnyDevice::Nvmf($device) => Box::pin($call).await,
            AnyDevice::FaultyFile($device) => Box::pin($call).await,
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
        dispatch_io!(self, device => device.read(buf, offset))
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        dispatch_io!(self, device => device.write(buf, offset))
    }

    async fn read_timed(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>, IoTiming) {
        dispatch_io!(self, device => device.read_timed(buf, offset))
    }

    async fn write_timed(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>, IoTiming) {
        dispatch_io!(self, device => device.write_timed(buf, offset))
    }

    async fn flush(&self) -> BlockResult<()> {
        dispatch_io!(self, device => device.flush())
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        dispatch_io!(self, device => device.write_zeroes(offset, len))
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        dispatch_io!(self, device => device.deallocate(offset, len))
    }
}

/// Where a device is, as Strata's tools and configs write it: `memory:SIZE`, `file:PATH[,size=SIZE]` or
/// `nvmf:trtype=tcp,traddr=...,trsvcid=...,subnqn=...,ns=N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A new RAM namespace of this many bytes.
    Memory {
        /// Its capacity.
        capacity_bytes: u64,
    },
    /// A file or block device, created or extended to `size_bytes` when given.
    File {
        /// Its path.
        path: std::path::PathBuf,
        /// Size to create or extend a regular file to.
        size_bytes: Option<u64>,
    },
    /// A namespace of an NVMe-oF/TCP controller.
    Nvmf(crate::host::NvmfAddress),
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The spec is malformed.
    #[error("device {0}")]
    Spec(String),
    /// A local device failed to open.
    #[error(transparent)]
    Block(#[from] crate::error::BlockError),
    /// The NVMe-oF controller could not be reached or used.
    #[error(transparent)]
    Nvmf(#[from] crate::host::NvmfError),
}

impl DeviceSpec {
    /// Parses a spec; `parse_size` reads sizes (`4GiB`, `512m`).
    pub fn parse(spec: &str, parse_size: impl Fn(&str) -> Option<u64>) -> Result<Self, OpenError> {
        let bad = |why: &str| OpenError::Spec(format!("{spec:?}: {why}"));
        if let Some(rest) = spec.strip_prefix("nvmf:") {
            let address = crate::host::NvmfAddress::parse(rest)?;
            return Ok(DeviceSpec::Nvmf(address));
        }
        if let Some(size) = spec.strip_prefix("memory:") {
            let capacity_bytes = parse_size(size).ok_or_else(|| bad("memory:SIZE needs a size such as 1GiB"))?;
            return Ok(DeviceSpec::Memory { capacity_bytes });
        }
        let Some(rest) = spec.strip_prefix("file:") else {
            return Err(bad(
                "expected file:PATH[,size=SIZE], memory:SIZE or nvmf:trtype=tcp,traddr=...,subnqn=...,ns=N",
            ));
        };
        let (path, size_bytes) = match rest.split_once(",size=") {
            Some((path, size)) => (path, Some(parse_size(size).ok_or_else(|| bad("size= needs a size such as 4GiB"))?)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(bad("file: needs a path"));
        }
        Ok(DeviceSpec::File { path: path.into(), size_bytes })
    }
}

/// How an executor drives the files it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileIo {
    /// Through glommio's reactor (`DmaFile`): an executor that parks when it has nothing to do.
    Reactor,
    /// On a ring of the file's own whose completions the executor polls for, never blocking: a busy-polled
    /// executor, whose sockets are polled too.
    Polled {
        /// The ring's entries: operations beyond them wait for one to complete.
        queue_depth: u32,
    },
}

impl AnyDevice {
    /// Opens `spec` on the current executor: a file through glommio's reactor, an NVMe-oF namespace with one
    /// I/O queue for this executor (`host` says how to connect), or a new RAM namespace.
    pub async fn open(spec: &DeviceSpec, host: &crate::host::HostOptions) -> Result<Self, OpenError> {
        Self::open_with(spec, host, FileIo::Reactor).await
    }

    /// Opens `spec` as [`open`](Self::open) does, a file driven as `files` says.
    pub async fn open_with(
        spec: &DeviceSpec,
        host: &crate::host::HostOptions,
        files: FileIo,
    ) -> Result<Self, OpenError> {
        Ok(match spec {
            DeviceSpec::Memory { capacity_bytes } => AnyDevice::Memory(MemoryDevice::new(*capacity_bytes, 4096)),
            DeviceSpec::File { path, size_bytes } => {
                let options = crate::uring::UringOptions { size_bytes: *size_bytes, read_only: false };
                match files {
                    FileIo::Reactor => AnyDevice::File(UringDevice::open(path, &options).await?),
                    FileIo::Polled { queue_depth } => {
                        AnyDevice::PolledFile(RingDevice::open_with(path, &options, queue_depth, RingWait::Polled)?)
                    }
                }
            }
            DeviceSpec::Nvmf(address) => AnyDevice::Nvmf(Box::new(NvmfDevice::connect(address, host, 1).await?)),
        })
    }
}
