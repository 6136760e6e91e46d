//! `strata-nvme`: block devices (io_uring O_DIRECT, memory, NVMe-oF host, SPDK), NVMe command and structure
//! types, the NVMe/TCP PDU codec, and the NVMe-oF target, host and discovery.
//!
//! Empty until the block-layer issue lands: no code here pretends to do I/O. See `ARCHITECTURE.md`.
#![deny(missing_docs, unsafe_code)]
