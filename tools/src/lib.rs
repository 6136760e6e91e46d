//! `strata-tools`: the code behind Strata's binaries, as a library so that integration tests drive it
//! directly. Today: `strata-bench alloc` and the fio-style block mode. The node (`strata-node`), the pool tool (`strata-pool`) and the
//! bench's block and KV modes land with their issues.
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod alloc_bench;
pub mod block_bench;
pub mod byte_size;
