//! `strata-client`: the shard-aware Rust client of a Strata node, or of a cluster of them.
//!
//! [`Client::connect`] says HELLO to any shard's port, learns the shard map (how many shards, the base
//! port) and opens one connection per shard; every key then goes straight to the shard that owns it
//! ([`strata_proto::shard_of`]). A batch is split by shard and sent to every shard before any reply is
//! read, so the shards work on it in parallel; each key gets its own result, so a caller recomputes exactly
//! the blocks that failed.
//!
//! [`Client::connect_cluster`] reads a cluster's members from etcd and keeps watching them; each key then
//! goes straight to the nodes that placement gives it (puts to every replica, reads to the first live one),
//! with no lookup on the way (`cluster.rs`; docs/PROTOCOL.md, "Routing in a cluster").
//!
//! Bytes are checked end to end: a put carries the value's crc32c, which the node checks before storing;
//! a get's reply carries the crc32c of the bytes sent (for a whole value, the one stored with it), which the
//! client checks after receiving. `get_into` reads the value from the socket straight into the caller's
//! buffer.
//!
//! A client on the node's host moves the values of a [`SharedBuffer`] through shared memory: the node
//! copies them between its DRAM and the buffer, and only headers cross a socket (`shared.rs`). With feature
//! `rdma`, the values of an `RdmaBuffer` move by RDMA: the node reads and writes the registered buffer, and
//! the TCP connection carries only headers (`rdma.rs`).
//!
//! The protocol logic (framing, batching, reply parsing) is written once, in the blocking [`Client`]
//! (`std::net`). [`AsyncClient`] is the async front over it: runtime-agnostic futures (they work on tokio),
//! the blocking client running on an I/O thread of its own, owned buffers in and out.
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod async_client;
mod client;
mod cluster;
mod error;
mod events;
mod members;
#[cfg(feature = "rdma")]
mod rdma;
mod scan;
mod shared;

pub use crate::async_client::{AsyncClient, AsyncProgressivePut, OwnedBlock};
pub use crate::client::{BlockPut, Client, ClientOptions, KeyRange, Location, ProgressivePut, VersionedValue};
pub use crate::cluster::ClusterOptions;
pub use crate::error::ClientError;
pub use crate::events::{EventBatch, EventStream, ShardEvent};
#[cfg(feature = "rdma")]
pub use crate::rdma::RdmaBuffer;
pub use crate::scan::ScanPage;
pub use crate::shared::{SharedBuffer, Transport};
pub use strata_cluster::{MembersDocument, MembersWatch};
pub use strata_proto::scan::ScanEntry;
pub use strata_proto::{Event, EventRef, Links, Pin, PutOptions, RemovalReason, Tier, Version, WritePolicy};
