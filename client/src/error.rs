//! The client's error type: one variant per thing a caller may want to handle differently.

use strata_proto::Status;

/// Why an operation (or one key of a batch) failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The key is not stored (recompute it).
    #[error("not found")]
    NotFound,
    /// The stored bytes failed their checksum on the node, or the bytes received failed theirs here; nothing
    /// damaged was returned.
    #[error("checksum mismatch")]
    Checksum,
    /// The node's storage failed.
    #[error("the node's storage failed")]
    Io,
    /// No room on the node.
    #[error("no space on the node")]
    NoSpace,
    /// The key or value is over the node's bounds.
    #[error("too large: {0}")]
    TooLarge(String),
    /// The node refused the request as invalid (e.g. a range outside the value).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The caller's buffer is shorter than the value.
    #[error("buffer of {available} bytes is too small for {needed} bytes")]
    BufferTooSmall {
        /// Bytes the value has.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The node did not answer in time (the connection is reopened on the next call).
    #[error("timed out")]
    Timeout,
    /// The connection failed or was closed (it is reopened on the next call).
    #[error("connection: {0}")]
    Connection(String),
    /// The node refused the token (or none was given and the node needs one).
    #[error("not authenticated")]
    Unauthenticated,
    /// The node answered something this client does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The node is shutting down.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A put (not an upsert) of a key that is stored already; the stored version was kept.
    #[error("the key is stored already (use upsert to replace it)")]
    Exists,
    /// Over a limit of the node (e.g. its bytes of pinned objects); nothing was stored.
    #[error("over the node's quota")]
    Quota,
    /// A versioned upsert (every upsert of a cluster client) found the key at that version or a newer one,
    /// which it kept: under last-writer-wins this upsert is ordered before the one stored, so nothing a
    /// reader should see was lost.
    #[error("a newer version of the key is stored")]
    Superseded,
    /// The value could not be moved by RDMA (the queue pair to the node failed, or the node's access to the
    /// buffer was refused); for a get, the span's bytes are not to be trusted.
    #[error("the RDMA transfer failed")]
    Transfer,
    /// The node no longer holds the key under the cluster's membership, which moved to `epoch`; nothing
    /// was done. A cluster client re-reads the members and retries once before reporting it.
    #[error("the key moved to other nodes (cluster epoch {epoch})")]
    Moved {
        /// The node's cluster epoch (0: not given).
        epoch: u64,
    },
}

impl ClientError {
    /// The error for a status other than `Ok`.
    pub fn from_status(status: Status) -> Self {
        match status {
            Status::Ok => ClientError::Protocol("status ok reported as an error".into()),
            Status::NotFound => ClientError::NotFound,
            Status::Checksum | Status::TransferChecksum => ClientError::Checksum,
            Status::Io => ClientError::Io,
            Status::NoSpace => ClientError::NoSpace,
            Status::TooLarge => ClientError::TooLarge("over the node's bounds".into()),
            Status::Invalid => ClientError::Invalid("refused by the node".into()),
            Status::Unauthenticated => ClientError::Unauthenticated,
            Status::Version => ClientError::Protocol("the node speaks another protocol version".into()),
            Status::ShuttingDown => ClientError::ShuttingDown,
            Status::Exists => ClientError::Exists,
            Status::Quota => ClientError::Quota,
            Status::Moved => ClientError::Moved { epoch: 0 },
            Status::Superseded => ClientError::Superseded,
            Status::Transfer => ClientError::Transfer,
        }
    }

    pub(crate) fn from_io(error: &std::io::Error) -> Self {
        match error.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ClientError::Timeout,
            _ => ClientError::Connection(error.to_string()),
        }
    }
}
