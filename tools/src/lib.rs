//! `strata-tools`: the code behind Strata's binaries, as a library so that integration tests drive it
//! directly: `strata-node`'s options (`node`), `strata-bench` (`alloc`, the fio-style block mode with
//! engines uring, ring and nvmf, `kv` with its windowed subscriber, `stalls`) and `strata-pool` (`target`,
//! `discover`).
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod alloc_bench;
pub mod block_bench;
pub mod byte_size;
pub mod cluster_settings;
pub mod cluster_status;
pub mod file_dirs;
pub mod kv_bench;
pub mod kv_events;
pub mod kv_timeline;
pub mod logging;
pub mod memcpy_bench;
pub mod node;
pub mod pool;
pub mod rebalance;
pub mod stall_bench;
pub mod subscribe_windows;
pub mod takeover;
