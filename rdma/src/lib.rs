//! `strata-transfer`: moving bytes between a storage node and a caller's buffers without the node's
//! socket copy. TCP needs nothing from here; RDMA verbs sit behind feature `rdma` ([`verbs`]).
//!
//! What crosses the wire is small and plain ([`Endpoint`], [`RemoteSpan`]): the owning buffers, queue pairs
//! and memory registrations stay on their side. Those tokens are always compiled, so the protocol carries
//! them whether or not this build can act on them.
#![deny(missing_docs, clippy::unwrap_used)]
#![cfg_attr(not(feature = "rdma"), deny(unsafe_code))]

mod error;
mod tokens;
#[cfg(feature = "rdma")]
pub mod verbs;

pub use error::TransferError;
pub use tokens::{Endpoint, PathMtu, RemoteSpan};

/// Whether this build can move bytes over RDMA (feature `rdma`); a node or client asked to without it
/// says so and names the feature.
pub const RDMA_BUILT: bool = cfg!(feature = "rdma");
