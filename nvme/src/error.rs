//! The crate's one error type: what failed, on which device, at which offset, and why.

use std::fmt;

/// The operation an error happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOp {
    /// Opening or checking a device.
    Open,
    /// A read.
    Read,
    /// A write.
    Write,
    /// A flush (fdatasync / NVMe Flush).
    Flush,
    /// Write Zeroes.
    WriteZeroes,
    /// Deallocate (TRIM / NVMe Dataset Management).
    Deallocate,
}

impl fmt::Display for BlockOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockOp::Open => "open",
            BlockOp::Read => "read",
            BlockOp::Write => "write",
            BlockOp::Flush => "flush",
            BlockOp::WriteZeroes => "write-zeroes",
            BlockOp::Deallocate => "deallocate",
        })
    }
}

/// What went wrong, for callers to match on.
#[derive(Debug, thiserror::Error)]
pub enum BlockErrorKind {
    /// Offset or length not a multiple of the logical block size.
    #[error("offset {offset} / length {len} not aligned to the {block_bytes}-byte logical block")]
    Unaligned {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// The device's logical block size.
        block_bytes: u64,
    },
    /// The buffer's memory is not aligned as the device needs for direct I/O.
    #[error("buffer address not aligned to {alignment_bytes} bytes (allocate it with the device's alloc_buffer)")]
    MisalignedBuffer {
        /// The alignment the device needs.
        alignment_bytes: u64,
    },
    /// The range ends past the device's capacity.
    #[error("range {offset}+{len} is beyond the capacity of {capacity_bytes} bytes")]
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// The device's capacity.
        capacity_bytes: u64,
    },
    /// A transfer larger than the device accepts in one command.
    #[error("transfer of {len} bytes exceeds the device's maximum of {max_transfer_bytes}")]
    TooLarge {
        /// Requested length.
        len: u64,
        /// The device's limit.
        max_transfer_bytes: u64,
    },
    /// The kernel returned fewer bytes than asked (end of file, or a short transfer).
    #[error("short transfer: {done} of {len} bytes")]
    ShortTransfer {
        /// Bytes transferred.
        done: u64,
        /// Bytes asked for.
        len: u64,
    },
    /// The NVMe controller (a remote one, through the `nvmf` backend) completed the command with an error.
    #[error("controller returned {0}")]
    Nvme(crate::spec::NvmeStatus),
    /// The NVMe-oF connection failed; the message says how (a later command reconnects).
    #[error("NVMe-oF: {0}")]
    Remote(String),
    /// An error injected by the `faults` wrapper.
    #[error("injected fault")]
    Injected,
    /// The environment does not allow this device to work; the message names the fix.
    #[error("{0}")]
    Environment(String),
    /// An operating-system error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// An error of a block device: the kind, with the operation, the device and the offset it happened at.
#[derive(Debug, thiserror::Error)]
#[error("{op} on {device} at offset {offset}: {kind}")]
pub struct BlockError {
    /// The operation.
    pub op: BlockOp,
    /// The device's name (its path, or `memory:N`).
    pub device: String,
    /// The byte offset of the operation (0 for flush and open).
    pub offset: u64,
    /// What went wrong.
    #[source]
    pub kind: BlockErrorKind,
}

impl BlockError {
    /// An error of `op` on `device` at `offset`.
    pub fn new(op: BlockOp, device: &str, offset: u64, kind: BlockErrorKind) -> Self {
        Self { op, device: device.to_string(), offset, kind }
    }

    /// Whether the controller refused the command because another host holds the namespace's reservation:
    /// this host has been fenced off it (a node that took the namespace over preempted it).
    pub fn is_reservation_conflict(&self) -> bool {
        matches!(&self.kind, BlockErrorKind::Nvme(status) if status.with_dnr() == crate::spec::NvmeStatus::RESERVATION_CONFLICT.with_dnr())
    }
}

/// Shorthand for this crate's results.
pub type BlockResult<T> = Result<T, BlockError>;
