//! The crate's one error type.

/// Why an allocator operation failed. Every variant leaves the allocator unchanged and usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A request for zero bytes: there is nothing to place, and a zero-length handle would alias others.
    #[error("allocation of 0 bytes")]
    ZeroSize,
    /// The request can never fit: it is larger than the arena, or than the largest size the bins index.
    #[error("allocation of {size_bytes} bytes exceeds the largest possible allocation of {max_bytes} bytes")]
    TooLarge {
        /// The size asked for.
        size_bytes: u64,
        /// The largest size this allocator can ever hand out.
        max_bytes: u64,
    },
    /// No free extent (and no free slot of the request's size class) is large enough now.
    #[error("no space for {size_bytes} bytes: {free_bytes} bytes free in the arena, none in one piece that fits")]
    NoSpace {
        /// The size asked for.
        size_bytes: u64,
        /// Free bytes in the arena outside slabs, possibly fragmented.
        free_bytes: u64,
    },
    /// The configured bound on live allocations is reached.
    #[error("the limit of {max_allocations} live allocations is reached")]
    TooManyAllocations {
        /// The configured bound.
        max_allocations: u32,
    },
    /// The handle was made by another allocator.
    #[error("the allocation belongs to another allocator")]
    ForeignHandle,
    /// The handle predates a `reset` of this allocator, which already reclaimed its space.
    #[error("the allocation predates a reset of this allocator")]
    StaleHandle,
    /// The handle does not describe a live allocation of this allocator (its fields were forged or corrupted).
    #[error("the allocation handle does not match a live allocation")]
    InvalidHandle,
    /// The configuration cannot describe an arena.
    #[error("invalid allocator configuration: {reason}")]
    InvalidConfig {
        /// What is wrong, and the rule it breaks.
        reason: String,
    },
}
