//! The crate's one error type.

use std::io;

/// What went wrong moving bytes, or setting up the means to.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A token from a peer is malformed.
    #[error("malformed {what} from a peer: {reason}")]
    Malformed {
        /// Which token.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// libibverbs lists no RDMA device at all (no NIC, no soft-RoCE link, or no provider library).
    #[error(
        "no RDMA device on this machine (libibverbs lists none; for soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)"
    )]
    NoDevices,
    /// The named device is not among those libibverbs lists.
    #[error("no RDMA device named {name:?}; devices here: {available:?}")]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The names libibverbs lists.
        available: Vec<String>,
    },
    /// A verbs call failed.
    #[error("{call} on RDMA device {device}: {source}")]
    Verbs {
        /// The libibverbs function.
        call: &'static str,
        /// The device it was called on.
        device: String,
        /// errno, as the call left it.
        #[source]
        source: io::Error,
    },
    /// The device's port has no GID a connection can use.
    #[error("RDMA device {device} port {port} has no usable GID (is its network interface up?)")]
    NoUsableGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
    },
    /// A memory span lies outside the registration it names.
    #[error("span of {length} bytes at offset {offset} lies outside a registration of {registered} bytes")]
    OutOfRegion {
        /// Offset into the registration.
        offset: u64,
        /// Length of the span.
        length: u64,
        /// Length of the registration.
        registered: u64,
    },
    /// The send queue has no room for another work request.
    #[error("the queue pair's send queue is full ({capacity} work requests in flight)")]
    SendQueueFull {
        /// Work requests the queue holds.
        capacity: u32,
    },
    /// The peer refused the connection (RDMA_CM REJECT); what it said is in its private data.
    #[error("the peer rejected the connection ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The REJECT's private data.
        private_data: Vec<u8>,
    },
    /// The connection manager could not reach the peer, or gave up on an event.
    #[error("RDMA_CM: {0}")]
    Unreachable(String),
}
