//! `strata-tools`: the code behind Strata's binaries, as a library so that integration tests drive it
//! directly. Today: `strata-bench alloc`, the fio-style block mode (engines uring, ring, nvmf) and
//! `strata-pool` (`target`, `discover`). The node (`strata-node`) and the bench's KV mode land with their
//! issues.
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod alloc_bench;
pub mod block_bench;
pub mod byte_size;
pub mod kv_bench;
pub mod node;
pub mod pool;
pub mod stall_bench;
