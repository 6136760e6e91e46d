//! `strata-engine`: the storage node — shards on glommio executors, the object index, the DRAM and NVMe
//! tiers (DRAM carved by `strata-alloc`), the region log, eviction and promotion, the KV protocol server
//! and metrics. See `ARCHITECTURE.md` for the design and `docs/PROTOCOL.md`, `docs/NVME_FORMAT.md` for the
//! formats.
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backend;
pub mod config;
pub mod dram;
pub mod error;
pub mod event_sender;
pub mod events;
pub mod forward;
pub mod index;
pub mod links;
pub mod log;
pub mod metrics;
pub mod node;
pub mod peer_limits;
pub mod record;
pub mod scan;
pub mod segment;
mod server;
pub mod shard;
pub mod sim;
mod sys;
pub mod tenants;
pub mod tier;

pub use crate::config::EngineConfig;
pub use crate::error::EngineError;
pub use crate::node::{Node, NodeError, NodeSummary, start};
