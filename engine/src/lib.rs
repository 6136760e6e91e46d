//! `strata-engine`: the storage node — shards on glommio executors, the object index, the DRAM and NVMe
//! tiers (DRAM carved by `strata-alloc`), the region log, eviction and promotion, the KV protocol server
//! and metrics. See `ARCHITECTURE.md` for the design and `docs/PROTOCOL.md`, `docs/NVME_FORMAT.md` for the
//! formats.
//!
//! The public surface is the node (`start`, `Node`, its configuration and errors), its metrics, the event
//! log and the on-disk record and scan decoders (benchmarked and fuzzed on their own), and the seeded
//! simulation (`sim`). Everything else is the crate's own.
//!
//! `unsafe` lives in `segment.rs` (the DRAM mapping and the slices of its ranges) and the two guards that
//! hand those slices out (`shard::reads::DramPin`, `shard::put::PutReservation`); the rest is system calls
//! and a prefetch hint: `sys.rs` (sockets), `event_sender.rs` (a subscriber's socket written off the
//! shard's core), `server/watch.rs` (`TCP_INFO`), `node.rs` (the scheduling policy), `index.rs` (the
//! prefetch instruction). Each block carries its SAFETY comment.
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backend;
pub mod config;
pub(crate) mod dram;
pub mod error;
pub(crate) mod event_sender;
pub mod events;
pub(crate) mod forward;
pub(crate) mod index;
pub(crate) mod join;
pub(crate) mod links;
pub(crate) mod log;
pub mod metrics;
pub mod node;
pub mod ownership;
pub mod peer_limits;
pub mod record;
pub mod reports;
pub mod scan;
pub(crate) mod segment;
mod server;
pub(crate) mod shard;
pub mod sim;
mod sys;
pub mod tenants;
pub(crate) mod tier;

pub use crate::config::{ConfigError, EngineConfig, EventCpus};
pub use crate::dram::DramError;
pub use crate::error::EngineError;
pub use crate::node::{Node, NodeError, NodeSummary, ShardStartError, start};
pub use crate::peer_limits::PeerLimits;
pub use crate::segment::PageKind;
pub use crate::shard::{RecoveryError, RecoveryReport};
pub use crate::tenants::{TenantConfig, TenantError};
pub use crate::tier::TierError;
