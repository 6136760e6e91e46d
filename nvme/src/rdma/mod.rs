//! The NVMe/RDMA transport binding's own bytes (NVM Express RDMA Transport Specification): the private
//! data of the RDMA_CM connection handshake ([`cm`]) and the Keyed SGL Data Block descriptor that names a
//! host buffer the controller reads or writes with RDMA ([`KeyedSgl`]). Sans-I/O, decoded with every
//! field checked, as the NVMe/TCP PDU codec is; the queue pairs and capsules are `strata-transfer`'s.

pub mod cm;
#[cfg(feature = "rdma")]
pub(crate) mod link;
mod sgl;

pub use sgl::{KeyedSgl, SglError};
