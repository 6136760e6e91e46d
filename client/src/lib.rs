//! `strata-client`: the shard-aware Rust client of a Strata node, and (later) the Python package on it.
//!
//! Empty until the storage-node issue lands. See `ARCHITECTURE.md`.
#![deny(missing_docs, unsafe_code)]
