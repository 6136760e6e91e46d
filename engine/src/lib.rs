//! `strata-engine`: the storage node — shards on glommio executors, the object index, the DRAM and NVMe
//! tiers (DRAM carved by `strata-alloc`), the region log, eviction and promotion, the KV protocol server.
//!
//! Empty until the storage-node issue lands. See `ARCHITECTURE.md`.
#![deny(missing_docs, unsafe_code)]
