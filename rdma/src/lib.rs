//! `strata-transfer`: moving bytes between a storage node and a caller's (GPU) buffer — TCP always, RDMA
//! behind feature `rdma`, GPU buffers behind feature `cuda` — and the remote-buffer token.
//!
//! Empty until the transfer work lands. See `ARCHITECTURE.md`.
#![deny(missing_docs, unsafe_code)]
