//! Why an operation of the engine failed: [`EngineError`], with its cause (a device's error keeps the
//! operation, the device and the offset). The server maps it to a wire `Status` (`EngineError::status`),
//! and nothing below the server knows of statuses.

use std::sync::Arc;

use strata_nvme::BlockError;
use strata_proto::Status;

/// Why an operation of a shard failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EngineError {
    /// The key is not stored (or no longer).
    #[error("not found")]
    NotFound,
    /// A put (not an upsert) of a key that is stored.
    #[error("the key is stored already")]
    Exists,
    /// A versioned upsert of a key stored at that version or a newer one: the stored one is kept.
    #[error("a newer version of the key is stored")]
    Superseded,
    /// The object can never fit where it must go (the DRAM tier, a region of a durable put).
    #[error("too large: {0}")]
    TooLarge(&'static str),
    /// No room now, even after evicting what could be evicted.
    #[error("no space in the {0}")]
    NoSpace(&'static str),
    /// Over a quota: the node's pinned share, or the tenant's.
    #[error("over the {0} quota")]
    Quota(&'static str),
    /// A request the shard cannot serve as asked.
    #[error("invalid: {0}")]
    Invalid(&'static str),
    /// Stored bytes failed their checksum: the object was dropped, never served.
    #[error("stored bytes of a record at region {region}, offset {offset} failed their checksum")]
    Checksum {
        /// The region (the shard's numbering).
        region: u32,
        /// The record's offset in it.
        offset: u32,
    },
    /// A device operation failed.
    #[error("{0}")]
    Device(Arc<BlockError>),
    /// The NVMe tier failed a write before: it takes no more, and the shard takes no writes.
    #[error("the NVMe tier failed a write and takes no more")]
    Poisoned,
    /// The node is stopping.
    #[error("the node is stopping")]
    ShuttingDown,
}

impl EngineError {
    /// A device's error.
    pub fn device(error: BlockError) -> Self {
        EngineError::Device(Arc::new(error))
    }

    /// The wire status that tells a client what happened.
    pub fn status(&self) -> Status {
        match self {
            EngineError::NotFound => Status::NotFound,
            EngineError::Exists => Status::Exists,
            EngineError::Superseded => Status::Superseded,
            EngineError::TooLarge(_) => Status::TooLarge,
            EngineError::NoSpace(_) => Status::NoSpace,
            EngineError::Quota(_) => Status::Quota,
            EngineError::Invalid(_) => Status::Invalid,
            EngineError::Checksum { .. } => Status::Checksum,
            EngineError::Device(_) | EngineError::Poisoned => Status::Io,
            EngineError::ShuttingDown => Status::ShuttingDown,
        }
    }
}
