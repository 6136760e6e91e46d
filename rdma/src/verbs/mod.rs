//! RDMA verbs over libibverbs: a device, protection domains and memory registrations, completion queues
//! whose completion channel can be awaited, and reliable-connected queue pairs that RDMA-READ and -WRITE.
//!
//! **Binding.** `rdma-sys` (0.3): bindgen over the system's own `infiniband/verbs.h`, so the build links
//! the rdma-core that the machine runs (Debian's, in CI and in the lab guest) and picks its provider
//! libraries at run time (`librxe` for soft-RoCE, `libmlx5` …). It also writes out by hand the inline
//! functions bindgen cannot (`ibv_post_send`, `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_query_port`). The
//! alternative, `ibverbs-sys`, vendors and builds its own rdma-core with cmake: a second libibverbs beside
//! the system's, and minutes of CI, for nothing we use.
//!
//! **Ownership.** Each handle owns its verbs object and holds (by `Arc`) what that object depends on, so
//! they are destroyed in the order verbs requires: queue pairs before their completion queue, memory
//! registrations before their protection domain, all of them before the device context. libibverbs
//! objects may be used from several threads (its providers lock where needed), hence `Send + Sync`.
//!
//! **Connection setup.** Queue pairs are connected by exchanging an [`Endpoint`](crate::Endpoint) over
//! a connection the caller already has (the node's TCP connection), not through `rdma_cm`: it needs no
//! second listener, and the connection that authenticated the tenant is the one that names the peer.
#![allow(unsafe_code)]

mod cm;
mod cm_connect;
mod completion;
mod device;
mod memory;
mod queue_pair;

pub use cm::{CmEvent, CmListener, CmRequest};
pub use cm_connect::CmConnection;
pub use completion::{Completion, CompletionKind, CompletionQueue, WorkRequestError};
pub use device::{Device, PortInfo};
pub use memory::{Access, LocalSpan, MemoryRegion, ProtectionDomain, RegisteredBuffer};
pub use queue_pair::{QueuePair, QueuePairOptions};

use std::io;

use crate::TransferError;

/// The error of a verbs call that returned failure and left errno.
fn last_error(call: &'static str, device: &str) -> TransferError {
    TransferError::Verbs { call, device: device.to_owned(), source: io::Error::last_os_error() }
}

/// The error of a verbs call that returns its errno (`ibv_post_send`, `ibv_modify_qp` …).
fn returned_error(call: &'static str, device: &str, errno: i32) -> TransferError {
    TransferError::Verbs { call, device: device.to_owned(), source: io::Error::from_raw_os_error(errno) }
}
